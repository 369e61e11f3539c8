"""An upstream's answer as the proxy reads it, and the error when none comes.

Both transports of :mod:`~osmosis_ai.controller.transport` (the lean HTTP/1.1 client of
:mod:`~osmosis_ai.controller.http1` and the httpx one) hand back an :class:`Answer`, and
raise :func:`connection_error`'s :class:`UpstreamConnectionError` naming the URL when no
HTTP answer comes. This module sits under both, so neither imports the other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Protocol

import httpx

from osmosis_ai.controller.errors import UpstreamConnectionError, UpstreamTimeoutError
from osmosis_ai.deadlines import MODEL_CALL


class Answer(Protocol):
    """An upstream answer whose status and headers have arrived; the body is read once,
    whole (:meth:`read`) or as it arrives (:meth:`chunks`)."""

    @property
    def status(self) -> int: ...

    @property
    def content_type(self) -> str: ...

    async def read(self) -> bytes:
        """The whole body; the connection goes back to the pool."""
        ...

    def chunks(self) -> AsyncIterator[bytes]:
        """Body bytes as they arrive (decoded from chunked transfer and compression)."""
        ...

    async def aclose(self) -> None:
        """Give the connection back, or close it when the body was not read to its end."""
        ...


def connection_error(
    target: str, exc: BaseException, during: str, deadline_s: float | None = None
) -> UpstreamConnectionError:
    """``exc`` (no HTTP answer) as the error the proxy relays: what, where, and when. A
    timeout under the model call deadline ``deadline_s`` is an :class:`UpstreamTimeoutError`
    that names the deadline and its setting."""
    detail = str(exc) or "no detail"
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        if deadline_s is not None:
            return MODEL_CALL.error(
                UpstreamTimeoutError,
                f"the model upstream {target} timed out {during} ({type(exc).__name__})",
                deadline_s,
                url=target,
            )
        detail = f"timed out ({detail})"
    return UpstreamConnectionError(
        f"cannot reach the model upstream {target} {during}: {type(exc).__name__}: {detail}",
        url=target,
    )


class ResponseAnswer:
    """An :class:`Answer` over an ``httpx.Response`` whose body has not been read yet."""

    __slots__ = ("_deadline_s", "_response", "_target")

    def __init__(
        self, response: httpx.Response, target: str, deadline_s: float | None = None
    ) -> None:
        self._response = response
        self._target = target
        self._deadline_s = deadline_s

    @property
    def status(self) -> int:
        return self._response.status_code

    @property
    def content_type(self) -> str:
        return self._response.headers.get("content-type", "")

    async def read(self) -> bytes:
        try:
            return await self._response.aread()
        except httpx.TransportError as exc:
            raise connection_error(
                self._target, exc, "while reading the answer", self._deadline_s
            ) from exc
        finally:
            await self._response.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.TransportError as exc:
            raise connection_error(self._target, exc, "mid-stream", self._deadline_s) from exc

    async def aclose(self) -> None:
        await self._response.aclose()
