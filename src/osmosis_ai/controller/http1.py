"""A lean HTTP/1.1 client for the proxy's hop to a plain-``http`` upstream (vLLM, SGLang, a
local server): the request head built once, one write per call, on the keep-alive pools of
:class:`~osmosis_ai.rollout.http1.LeanTransport` (answers parsed as they arrive, gzip and
deflate decoded). It does one job, at about a quarter of aiohttp's cost per request, which
was most of the proxy's overhead on a model call.
"""

from __future__ import annotations

from collections.abc import Mapping

import httpx

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.controller.transport import Answer, ResponseAnswer, connection_error
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.http1 import LeanTransport, RemoteProtocolError, split_url

__all__ = ["Http1Transport", "RemoteProtocolError"]


class Http1Transport:
    """POSTs to one ``http://`` URL over up to ``max_connections`` keep-alive connections.

    ``timeout`` bounds waiting for a free connection and each wait for answer bytes;
    ``connect_timeout`` bounds opening a connection.
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
        try:
            self._host, self._port, path, authority = split_url(target)
        except ValueError:
            raise UsageError(f"{target!r} is not an http:// URL with a host") from None
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

    async def post(self, content: bytes) -> Answer:
        request = b"%b%d\r\n\r\n%b" % (self._head, len(content), content)
        try:
            response = await self._lean.send_raw(
                self._host, self._port, request, timeouts=self._timeouts
            )
        except httpx.TransportError as exc:
            raise connection_error(self._target, exc, _during(exc)) from exc
        return ResponseAnswer(response, self._target)

    async def aclose(self) -> None:
        await self._lean.aclose()


def _during(exc: httpx.TransportError) -> str:
    if isinstance(exc, httpx.PoolTimeout):
        return "while waiting for a free connection"
    if isinstance(exc, httpx.ConnectError | httpx.ConnectTimeout):
        return "while connecting"
    if isinstance(exc, httpx.ReadTimeout):
        return "while waiting for the answer"
    return "while sending the request"
