"""A lean HTTP/1.1 client for the proxy's hop to a plain-``http`` upstream (vLLM, SGLang, a
local server): the request head built (and checked) once, one write per call, on the
keep-alive pools of :class:`~osmosis_ai.rollout.http1.LeanTransport` (answers parsed by
llhttp as they arrive, gzip and deflate decoded). It does one job, at about a quarter of
aiohttp's cost per request, which was most of the proxy's overhead on a model call.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.controller.answer import Answer, ResponseAnswer, connection_error
from osmosis_ai.rollout.http1 import (
    LeanTransport,
    RemoteProtocolError,
    check_header_fields,
    split_url,
)

__all__ = ["Http1Transport", "RemoteProtocolError"]


class Http1Transport:
    """POSTs to one ``http://`` URL over up to ``max_connections`` keep-alive connections.

    ``timeout`` bounds waiting for a free connection, each wait for the upstream to take
    in request bytes and each wait for answer bytes; ``connect_timeout`` bounds opening a
    connection. A URL or header that cannot go on the wire is a
    :class:`~osmosis_ai.errors.UsageError` here, before anything is sent. A call is sent
    once more on a fresh connection when a reused one closes before answering: a chat
    completion changes no state on the model server.
    """

    def __init__(
        self,
        target: str,
        headers: Mapping[str, str],
        *,
        timeout: float,
        connect_timeout: float,
        max_connections: int,
    ) -> None:
        self._host, self._port, path, authority = split_url(target)
        check_header_fields(headers)
        self._target = target
        lines = [f"POST {path} HTTP/1.1", f"host: {authority}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"user-agent: osmosis-ai/{PACKAGE_VERSION}")
        lines.append("accept-encoding: identity")  # compressing on a local hop costs time
        self._head = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")
        self._timeouts = {
            "connect": connect_timeout,
            "read": timeout,
            "write": timeout,
            "pool": timeout,
        }
        self._lean = LeanTransport(max_connections=max_connections)
        self._deadline_s = timeout

    async def post(self, content: bytes) -> Answer:
        request = b"%b%d\r\n\r\n%b" % (self._head, len(content), content)
        try:
            response = await self._lean.send_raw(
                self._host, self._port, request, timeouts=self._timeouts, idempotent=True
            )
        except httpx.TransportError as exc:
            raise connection_error(self._target, exc, _during(exc), self._deadline_s) from exc
        return ResponseAnswer(response, self._target, self._deadline_s)

    async def aclose(self) -> None:
        await self._lean.aclose()


def _during(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.PoolTimeout):
        return "while waiting for a free connection"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "while connecting"
    if isinstance(exc, httpx.WriteTimeout | httpx.WriteError):
        return "while sending the request"
    return "while waiting for the answer"
