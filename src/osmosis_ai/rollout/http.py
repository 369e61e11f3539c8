"""``async_client()``: an ``httpx.AsyncClient`` that stays fast under concurrency.

httpx's own connection pool costs O(connections²) per request, which dominates a server
making hundreds of concurrent calls. When ``httpx-aiohttp`` is installed (extra
``server``), the client keeps httpx's API but runs on aiohttp's connection pool.
"""

from __future__ import annotations

from typing import Any

import httpx

DEFAULT_MAX_CONNECTIONS = 512


def async_client(
    *, max_connections: int = DEFAULT_MAX_CONNECTIONS, **options: Any
) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` on the fastest transport available here.

    ``options`` go to ``httpx.AsyncClient`` (``timeout``, ``headers``, ``base_url``, ...).
    Create it inside a running event loop and close it with ``aclose()``.
    """
    transport = _aiohttp_transport(max_connections)
    if transport is None:
        limits = httpx.Limits(
            max_connections=max_connections, max_keepalive_connections=max_connections
        )
        return httpx.AsyncClient(limits=limits, **options)
    return httpx.AsyncClient(transport=transport, **options)


def _aiohttp_transport(max_connections: int) -> httpx.AsyncBaseTransport | None:
    try:
        import aiohttp
        from httpx_aiohttp import AiohttpTransport
    except ImportError:
        return None

    def session() -> aiohttp.ClientSession:
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout())

    return AiohttpTransport(client=session)
