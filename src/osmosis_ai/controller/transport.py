"""How the OpenAI-compatible upstream's request bytes travel, and its answer comes back.

Every model call crosses this hop. A plain ``http`` upstream (vLLM, SGLang or any server
on this machine or network, where the hop's own cost shows) gets the lean client of
:mod:`~osmosis_ai.controller.http1`; anything else (``https`` providers, where TLS and a
remote model dwarf it) gets the general httpx client of :func:`async_client`. Both retry
once on a fresh connection when a pooled one turns out closed, and raise
:class:`UpstreamConnectionError` naming the URL when no HTTP answer comes.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from typing import Protocol

import httpx

from osmosis_ai.controller.errors import UpstreamConnectionError
from osmosis_ai.rollout.http import async_client


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


class Transport(Protocol):
    """POSTs JSON bytes to one URL with fixed headers over a keep-alive pool, created on
    first use on the calling event loop."""

    async def post(self, content: bytes) -> Answer: ...

    async def aclose(self) -> None: ...


def open_transport(
    target: str,
    headers: Mapping[str, str],
    *,
    timeout: float,
    connect_timeout: float,
    max_connections: int,
) -> Transport:
    """The transport for ``target``: the lean HTTP/1.1 client for ``http://``, else httpx.

    ``timeout`` bounds waiting for a pooled connection and for each read;
    ``connect_timeout`` bounds opening a connection.
    """
    if target[:7].lower() == "http://":
        from osmosis_ai.controller.http1 import Http1Transport

        return Http1Transport(
            target,
            headers,
            timeout=timeout,
            connect_timeout=connect_timeout,
            max_connections=max_connections,
        )
    return HttpxTransport(
        target,
        headers,
        timeout=timeout,
        connect_timeout=connect_timeout,
        max_connections=max_connections,
    )


def connection_error(target: str, exc: BaseException, during: str) -> UpstreamConnectionError:
    """``exc`` (no HTTP answer) as the error the proxy relays: what, where, and when."""
    detail = str(exc) or "no detail"
    if isinstance(exc, TimeoutError | httpx.TimeoutException):
        detail = f"timed out ({detail})"
    return UpstreamConnectionError(
        f"cannot reach the model upstream {target} {during}: {type(exc).__name__}: {detail}",
        url=target,
    )


class HttpxTransport:
    """One ``httpx.AsyncClient`` from :func:`async_client` (on aiohttp's pool when
    ``httpx-aiohttp`` is installed)."""

    def __init__(
        self,
        target: str,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
        max_connections: int,
    ) -> None:
        self._target = target
        # Built once, not per call with client.build_request: URL, headers and timeout
        # never change, so per-call merging would be wasted work.
        self._url = httpx.URL(target)
        self._headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._extensions = {"timeout": self._timeout.as_dict()}
        self._max_connections = max_connections
        self._client: httpx.AsyncClient | None = None

    async def post(self, content: bytes) -> Answer:
        if self._client is None:
            self._client = async_client(
                max_connections=self._max_connections, timeout=self._timeout
            )
        request = httpx.Request(
            "POST", self._url, headers=self._headers, content=content, extensions=self._extensions
        )
        try:
            return ResponseAnswer(await self._client.send(request, stream=True), self._target)
        except (httpx.RemoteProtocolError, httpx.ReadError):
            pass  # a pooled connection the server closed as it was reused: once more, fresh
        except httpx.TransportError as exc:
            raise connection_error(self._target, exc, "while sending the request") from exc
        try:
            return ResponseAnswer(await self._client.send(request, stream=True), self._target)
        except httpx.TransportError as exc:
            raise connection_error(self._target, exc, "while sending the request") from exc

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None


class ResponseAnswer:
    """An :class:`Answer` over an ``httpx.Response`` whose body has not been read yet."""

    __slots__ = ("_response", "_target")

    def __init__(self, response: httpx.Response, target: str) -> None:
        self._response = response
        self._target = target

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
            raise connection_error(self._target, exc, "while reading the answer") from exc
        finally:
            await self._response.aclose()

    async def chunks(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._response.aiter_bytes():
                yield chunk
        except httpx.TransportError as exc:
            raise connection_error(self._target, exc, "mid-stream") from exc

    async def aclose(self) -> None:
        await self._response.aclose()
