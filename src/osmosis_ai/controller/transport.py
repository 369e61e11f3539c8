"""How the OpenAI-compatible upstream's request bytes travel, and its answer comes back.

Every model call crosses this hop. A plain ``http`` upstream (vLLM, SGLang or any server
on this machine or network, where the hop's own cost shows) gets the lean client of
:mod:`~osmosis_ai.controller.http1`; anything else (``https`` providers, where TLS and a
remote model dwarf it) gets the general httpx client of :func:`async_client`. Headers that
could not go on the wire as they are (a key with a trailing newline) are refused when the
transport is made. Both send a call once more on a fresh connection when a pooled one
closes before answering: a chat completion changes no state on the model server, so a
second send can cost compute, never correctness. Both raise
:class:`~osmosis_ai.controller.errors.UpstreamConnectionError` naming the URL when no
HTTP answer comes.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Protocol

import httpx

from osmosis_ai.controller.answer import Answer, ResponseAnswer, connection_error
from osmosis_ai.controller.http1 import Http1Transport
from osmosis_ai.rollout.http import async_client
from osmosis_ai.rollout.http1 import check_header_fields

__all__ = [
    "Answer",
    "HttpxTransport",
    "ResponseAnswer",
    "Transport",
    "connection_error",
    "open_transport",
]


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
        check_header_fields(headers)
        self._target = target
        # Built once, not per call with client.build_request: URL, headers and timeout
        # never change, so per-call merging would be wasted work.
        self._url = httpx.URL(target)
        self._headers = [(k.lower().encode(), v.encode()) for k, v in headers.items()]
        self._timeout = httpx.Timeout(timeout, connect=connect_timeout)
        self._deadline_s = timeout
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
            return ResponseAnswer(
                await self._client.send(request, stream=True), self._target, self._deadline_s
            )
        except (httpx.RemoteProtocolError, httpx.ReadError):
            pass  # closed before answering (a stale pooled connection): once more, fresh
        except httpx.TransportError as exc:
            raise connection_error(
                self._target, exc, "while sending the request", self._deadline_s
            ) from exc
        try:
            return ResponseAnswer(
                await self._client.send(request, stream=True), self._target, self._deadline_s
            )
        except httpx.TransportError as exc:
            raise connection_error(
                self._target, exc, "while sending the request", self._deadline_s
            ) from exc

    async def aclose(self) -> None:
        if self._client is not None:
            await self._client.aclose()
            self._client = None
