"""HTTP clients that stay fast under concurrency.

httpx's own connection pool costs O(connections²) per request, which dominates a server
making hundreds of concurrent calls. The clients here keep httpx's API but send plain
``http://`` requests (the rollout protocol, the policy proxy, local model servers) over the
lean keep-alive connections of :mod:`osmosis_ai.rollout.http1`, and everything else
(``https``) over aiohttp's pool when ``httpx-aiohttp`` is installed (extra ``server``), else
httpx's own.

``async_client()`` makes a new client (its ``verify`` reaches the ``https`` pool);
``shared_transport()`` is one pooled transport per event loop for code that would otherwise
build a client (a TLS context, a pool, fresh connections) for every rollout, as agent
frameworks do. ``post_json()`` is one JSON call on that transport without httpx's client
layer: the cheapest way for a workflow to call the rollout's model endpoint.
"""

from __future__ import annotations

import asyncio
import json
import ssl
import weakref
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, Self, cast

import httpx

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.asgi import JSON_ENCODER

DEFAULT_MAX_CONNECTIONS = 512
# httpx.AsyncClient options that configure its own transport, which these clients replace.
_TRANSPORT_OPTIONS = {
    "transport": "async_client chooses the transport: build httpx.AsyncClient(transport=...) "
    "yourself to use another",
    "limits": "pass max_connections= instead",
    "http2": "the fast transport speaks HTTP/1.1 only: leave http2 unset",
    "cert": "pass verify=ssl.create_default_context() with load_cert_chain(...) instead",
}

_shared: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, httpx.AsyncBaseTransport] = (
    weakref.WeakKeyDictionary()
)


def async_client(
    *,
    max_connections: int = DEFAULT_MAX_CONNECTIONS,
    verify: ssl.SSLContext | bool = True,
    **options: Any,
) -> httpx.AsyncClient:
    """A new ``httpx.AsyncClient`` on the fastest transport available here.

    ``verify`` is how ``https`` servers are checked, as in httpx: ``True`` (the system's
    trusted certificates), an ``ssl.SSLContext`` (such as
    ``ssl.create_default_context(cafile=...)`` for a private CA or a self-signed server), or
    ``False`` (no check). ``options`` go to ``httpx.AsyncClient`` (``timeout``,
    ``headers``, ``base_url``, ...); those that configure httpx's own transport
    (``transport``, ``limits``, ``http2``, ``cert``) raise :class:`UsageError`. Create it
    inside a running event loop and close it with ``aclose()``.
    """
    _check_connections(max_connections)
    if not isinstance(cast(object, verify), bool | ssl.SSLContext):
        raise UsageError(
            f"verify must be True, False or an ssl.SSLContext, got {type(verify).__name__} "
            f"{verify!r}: for a CA file pass ssl.create_default_context(cafile=...)"
        )
    for name, fix in _TRANSPORT_OPTIONS.items():
        if name in options:
            raise UsageError(f"async_client does not take {name}={options[name]!r}: {fix}")
    transport = _transport(max_connections, verify)
    return fast_cookies(httpx.AsyncClient(transport=transport, verify=verify, **options))


class HttpClientOwner:
    """Base of an object that talks through one ``httpx.AsyncClient``: the one it was given
    (its caller closes it) or one it makes itself on first use (inside the event loop) and
    closes in :meth:`aclose`. It is an async context manager that closes what it owns."""

    _given_http: httpx.AsyncClient | None
    _make_http: Callable[[], httpx.AsyncClient]
    _made_http: httpx.AsyncClient | None

    def _init_http(
        self, given: httpx.AsyncClient | None, make: Callable[[], httpx.AsyncClient]
    ) -> None:
        self._given_http = given
        self._make_http = make
        self._made_http = None

    @property
    def http_client(self) -> httpx.AsyncClient:
        """The client given, else this object's own (made now if this is the first use)."""
        if self._given_http is not None:
            return self._given_http
        if self._made_http is None:
            self._made_http = self._make_http()
        return self._made_http

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client this object made; a given one stays its owner's."""
        made, self._made_http = self._made_http, None
        if made is not None:
            await made.aclose()


async def post_json(
    url: str,
    body: Any,
    *,
    headers: Mapping[str, str] | None = None,
    timeout: float = 120.0,  # noqa: ASYNC109 (each wait, as httpx's timeout; not a deadline)
) -> Any:
    """POST ``body`` as JSON to ``url`` and return the decoded JSON answer.

    It goes over the running loop's shared pool (:func:`shared_transport`) with no client
    layer (no cookies, redirects or auth hooks): ``http://`` URLs (the rollout's chat
    endpoint, local servers) as one lean exchange, others through the pool's ``https``
    connections. ``timeout`` bounds connecting and each wait for answer bytes. A non-2xx
    answer raises ``httpx.HTTPStatusError`` (with the answer's status and body); a body
    that is not JSON raises ``ValueError``.
    """
    from osmosis_ai.rollout.http1 import LeanTransport

    if not url.lower().startswith(("http://", "https://")):
        raise UsageError(f"post_json needs an http:// or https:// URL, got {url!r}")
    number = cast(object, timeout)
    if isinstance(number, bool) or not isinstance(number, int | float) or not number > 0:
        raise UsageError(f"post_json timeout must be a number of seconds > 0, got {timeout!r}")
    content = JSON_ENCODER.encode(body).encode()
    sent = {"content-type": "application/json", "accept": "application/json", **(headers or {})}
    timeouts = httpx.Timeout(timeout).as_dict()
    transport = shared_transport()
    if url.startswith("http://") and isinstance(transport, LeanTransport):
        answer = await transport.quick(
            "POST", url, headers=sent, content=content, timeouts=timeouts
        )
        status, data = answer.status_code, answer.content
    else:
        request = httpx.Request(
            "POST", url, headers=sent, content=content, extensions={"timeout": timeouts}
        )
        response = await transport.handle_async_request(request)
        try:
            status, data = response.status_code, await response.aread()
        finally:
            await response.aclose()
    if not 200 <= status < 300:
        request = httpx.Request("POST", url, headers=sent, content=content)
        response = httpx.Response(status, content=data, request=request)
        detail = data.decode("utf-8", "replace")[:500]
        raise httpx.HTTPStatusError(
            f"POST {url} answered {status}: {detail}", request=request, response=response
        )
    return json.loads(data)


def fast_cookies(client: httpx.AsyncClient) -> httpx.AsyncClient:
    """``client``, reading answers for cookies only when they carry ``Set-Cookie``.

    httpx parses every answer through the stdlib cookie jar, which cost as much as the
    lean connection itself on a loopback call. Assigning ``client.cookies`` later puts
    httpx's own store back.
    """
    client._cookies = _Cookies(client.cookies)  # pyright: ignore[reportPrivateUsage]
    return client


class _Cookies(httpx.Cookies):
    """A client's cookie store that reads an answer only when it carries ``Set-Cookie``."""

    def extract_cookies(self, response: httpx.Response) -> None:
        if "set-cookie" in response.headers:
            super().extract_cookies(response)


def _transport(
    max_connections: int, verify: ssl.SSLContext | bool = True
) -> httpx.AsyncBaseTransport:
    from osmosis_ai.rollout.http1 import LeanTransport

    def fallback() -> httpx.AsyncBaseTransport:
        transport = _aiohttp_transport(max_connections, verify)
        if transport is None:
            limits = httpx.Limits(
                max_connections=max_connections, max_keepalive_connections=max_connections
            )
            transport = httpx.AsyncHTTPTransport(verify=verify, limits=limits)
        return transport

    return LeanTransport(max_connections=max_connections, fallback=fallback)


def _aiohttp_transport(
    max_connections: int, verify: ssl.SSLContext | bool
) -> httpx.AsyncBaseTransport | None:
    try:
        import aiohttp
        from httpx_aiohttp import AiohttpTransport
    except ImportError:
        return None

    def session() -> aiohttp.ClientSession:
        # ssl=True is aiohttp's own check against the system's trusted certificates.
        connector = aiohttp.TCPConnector(limit=max_connections, limit_per_host=0, ssl=verify)
        return aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout())

    return _ConnectFailures(
        AiohttpTransport(client=session),
        refused=aiohttp.ClientConnectorError,
        untrusted=aiohttp.ClientConnectorCertificateError,
    )


class _ConnectFailures(httpx.AsyncBaseTransport):
    """aiohttp's transport, with a failure to connect raised as ``httpx.ConnectError``
    (httpx-aiohttp raises a refused connection and an untrusted certificate as
    ``ConnectTimeout``), an untrusted certificate saying how to trust it."""

    def __init__(
        self,
        inner: httpx.AsyncBaseTransport,
        *,
        refused: type[BaseException],
        untrusted: type[BaseException],
    ) -> None:
        self._inner = inner
        self._refused = refused
        self._untrusted = untrusted

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        try:
            return await self._inner.handle_async_request(request)
        except httpx.ConnectTimeout as exc:
            cause = exc.__cause__
            if isinstance(cause, self._untrusted):
                origin = f"{request.url.scheme}://{request.url.netloc.decode('ascii')}"
                raise httpx.ConnectError(
                    f"{origin} presented a certificate this client does not trust ({cause}): "
                    "pass async_client(verify=ssl.create_default_context(cafile=...)) with "
                    "the CA that signed it",
                    request=request,
                ) from cause
            if isinstance(cause, self._refused):
                raise httpx.ConnectError(str(exc), request=request) from cause
            raise

    async def aclose(self) -> None:
        await self._inner.aclose()


def _check_connections(max_connections: int) -> None:
    value = cast(object, max_connections)
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise UsageError(f"max_connections must be a whole number >= 1, got {max_connections!r}")


def shared_transport() -> httpx.AsyncBaseTransport:
    """The running event loop's shared pooled transport, created on first use.

    Wrap it rather than hand it to a client that closes its transport: it lives until
    :func:`aclose_shared_transport` (the rollout server calls it at shutdown) or until its
    loop is collected.
    """
    loop = asyncio.get_running_loop()
    transport = _shared.get(loop)
    if transport is None:
        transport = _shared[loop] = _transport(DEFAULT_MAX_CONNECTIONS)
    return transport


async def aclose_shared_transport() -> None:
    """Close the running loop's shared transport, if it has one; the next use makes a new one."""
    transport = _shared.pop(asyncio.get_running_loop(), None)
    if transport is not None:
        await transport.aclose()
