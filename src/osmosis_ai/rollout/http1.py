"""The HTTP/1.1 client connection both lean clients use: keep-alive on asyncio's protocol
API, the answer parsed as it arrives (content-length, chunked or read-to-close; gzip and
deflate decoded unless the caller decodes). :mod:`osmosis_ai.rollout.http` builds an httpx
transport on it, and the controller its hop to model upstreams.
"""

from __future__ import annotations

import asyncio
import functools
import json
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import httpx

MAX_HEAD_BYTES = 64 * 1024
_PAUSE_BYTES = 1024 * 1024  # stop reading while this much body waits for the caller

# Body framing (RFC 9112 §6.3) and the chunked decoder's steps.
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class RemoteProtocolError(Exception):
    """The server's bytes are not a well-formed HTTP/1.1 answer, or it hung up early."""


class Connection(asyncio.Protocol):
    """One keep-alive connection; parses one answer at a time as its bytes arrive.

    ``timeout`` bounds each wait for answer bytes (``None``: no bound). ``decode=False``
    leaves gzip and deflate bodies as they came. Callers may change both per request.
    """

    def __init__(
        self, loop: asyncio.AbstractEventLoop, timeout: float | None, *, decode: bool = True
    ) -> None:
        self.loop = loop
        self.timeout = timeout
        self.decode = decode
        self._head_only = False
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._error: RemoteProtocolError | None = None
        self._paused = False
        self.used = False
        self.untouched = True  # no answer byte arrived for the current request
        self._keep_alive = True
        self.status = 0  # of the current answer, and so on below
        self.headers: dict[str, str] = {}
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self._state = _DONE
        self._buffer = bytearray()
        self._left = 0
        self._step = _SIZE
        self._decoder: zlib._Decompress | None = None  # pyright: ignore[reportPrivateUsage]
        self._body: list[bytes] = []
        self._body_bytes = 0

    # -- what the transport and the answer ask -----------------------------------------------

    @property
    def reusable(self) -> bool:
        closed = self._transport is None or self._transport.is_closing()
        return not closed and self._keep_alive and self._error is None and self._state == _DONE

    @property
    def finished(self) -> bool:
        return self._state == _DONE

    @property
    def pending(self) -> bool:
        return bool(self._body)

    async def request(self, data: bytes, *, head_only: bool = False) -> None:
        """Send one request and wait for the head of its answer (``head_only``: the answer
        has no body, as for ``HEAD``)."""
        assert self._transport is not None
        self._head_only = head_only
        self.untouched = True  # until an answer byte arrives
        if self._transport.is_closing():
            raise RemoteProtocolError("the server closed the connection")
        self.used = True
        self.status, self.headers = 0, {}
        self._state, self._body, self._body_bytes = _HEAD, [], 0
        self._buffer.clear()
        self._transport.write(data)
        while self._state == _HEAD:
            await self.wait()

    def take(self) -> bytes:
        """The body bytes that arrived since the last take."""
        body = self._body[0] if len(self._body) == 1 else b"".join(self._body)
        self._body, self._body_bytes = [], 0
        if self._paused and self._transport is not None:
            self._paused = False
            self._transport.resume_reading()
        return body

    async def wait(self) -> None:
        """Until more of the answer arrives (:class:`RemoteProtocolError`, TimeoutError)."""
        if self._error is not None:
            raise self._error
        waiter = self._waiter = self.loop.create_future()
        timeout = self.timeout
        timer = None if timeout is None else self.loop.call_later(timeout, _expire, waiter)
        try:
            await waiter
        finally:
            if timer is not None:
                timer.cancel()
            self._waiter = None

    def close(self) -> None:
        self._keep_alive = False
        if self._transport is not None:
            self._transport.close()

    # -- asyncio.Protocol --------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = cast(asyncio.Transport, transport)  # uvloop's is not a subclass

    def connection_lost(self, exc: Exception | None) -> None:
        self._keep_alive = False
        if self._state == _UNTIL_CLOSE:
            self._end()
        elif self._state != _DONE:
            reason = f": {exc}" if exc else ""
            self._fail(RemoteProtocolError(f"the server closed the connection mid-answer{reason}"))
        self._wake()

    def eof_received(self) -> bool | None:
        self.connection_lost(None)
        return None  # and close our side

    def data_received(self, data: bytes) -> None:
        self.untouched = False
        try:
            if self._state == _HEAD:
                self._buffer += data
                if not self._read_head():
                    return
                data, self._buffer = bytes(self._buffer), bytearray()
            if data:
                self._feed(data)
        except RemoteProtocolError as exc:
            self._fail(exc)
        self._wake()

    # -- parsing -----------------------------------------------------------------------------

    def _read_head(self) -> bool:
        """Parse the head once it is whole; skips interim (1xx) answers."""
        while True:
            end = self._buffer.find(b"\r\n\r\n")
            if end < 0:
                if len(self._buffer) > MAX_HEAD_BYTES:
                    raise RemoteProtocolError(f"answer head is over {MAX_HEAD_BYTES} bytes")
                return False
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            status, headers, http11, raw, reason = _parse_head(head)
            if 100 <= status < 200:
                continue
            self.status, self.headers, self.raw_headers, self.reason = status, headers, raw, reason
            self._frame(status, headers, http11)
            return True

    def _frame(self, status: int, headers: dict[str, str], http11: bool) -> None:
        connection = headers.get("connection", "").lower()
        self._keep_alive = "close" not in connection if http11 else "keep-alive" in connection
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if not self.decode:
            pass
        elif encoding == "gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        elif encoding != "identity":
            raise RemoteProtocolError(f"unsupported content-encoding {encoding!r}")
        transfer = headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if status in (204, 304) or self._head_only:
            self._end()
        elif transfer:
            if not transfer.endswith("chunked"):
                raise RemoteProtocolError(f"unsupported transfer-encoding {transfer!r}")
            self._state, self._step = _CHUNKED, _SIZE
        elif length is not None:
            if not length.isdigit():
                raise RemoteProtocolError(f"bad content-length {length!r}")
            self._state, self._left = _LENGTH, int(length)
            if self._left == 0:
                self._end()
        else:
            self._state, self._keep_alive = _UNTIL_CLOSE, False

    def _feed(self, data: bytes) -> None:
        if self._state == _LENGTH:
            if len(data) > self._left:
                self._keep_alive = False  # bytes past the answer: never reuse this connection
                data = data[: self._left]
            self._left -= len(data)
            self._deliver(data)
            if self._left == 0:
                self._end()
        elif self._state == _CHUNKED:
            self._buffer += data
            self._dechunk()
        elif self._state == _UNTIL_CLOSE:
            self._deliver(data)
        else:
            self._keep_alive = False  # bytes nobody asked for

    def _dechunk(self) -> None:
        buffer = self._buffer
        while buffer:
            if self._step == _DATA:
                piece = bytes(buffer[: self._left])
                del buffer[: len(piece)]
                self._left -= len(piece)
                self._deliver(piece)
                if self._left == 0:
                    self._step = _DATA_END
                continue
            end = buffer.find(b"\r\n")
            if end < 0:
                if len(buffer) > MAX_HEAD_BYTES:
                    raise RemoteProtocolError("chunked framing line is too long")
                return
            line = bytes(buffer[:end])
            del buffer[: end + 2]
            if self._step == _SIZE:
                self._left = _chunk_size(line)
                self._step = _DATA if self._left else _TRAILER
            elif self._step == _DATA_END:
                if line:
                    raise RemoteProtocolError("chunk data does not end with CRLF")
                self._step = _SIZE
            elif not line:  # the empty line after the trailers ends the body
                if buffer:
                    self._keep_alive = False
                self._end()
                return

    def _deliver(self, data: bytes) -> None:
        if self._decoder is not None:
            try:
                data = self._decoder.decompress(data)
            except zlib.error as exc:
                raise RemoteProtocolError(f"answer body does not decompress: {exc}") from exc
        if data:
            self._body.append(data)
            self._body_bytes += len(data)
            if self._body_bytes > _PAUSE_BYTES and not self._paused and self._transport:
                self._paused = True
                self._transport.pause_reading()

    def _end(self) -> None:
        decoder, self._decoder = self._decoder, None
        self._state = _DONE
        if decoder is not None:
            rest = decoder.flush()
            if rest:
                self._body.append(rest)

    def _fail(self, error: RemoteProtocolError) -> None:
        if self._error is None:  # the first failure is the cause; closing follows from it
            self._error = error
        self._keep_alive = False
        if self._transport is not None:
            self._transport.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _parse_head(
    head: bytes,
) -> tuple[int, dict[str, str], bool, list[tuple[bytes, bytes]], bytes]:
    """Status, headers (lower-case names, repeats joined with ", "), HTTP/1.1 or not, the
    raw header pairs and the reason phrase."""
    status_line, *lines = head.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise RemoteProtocolError(f"not an HTTP/1.x status line: {status_line[:100]!r}")
    headers: dict[str, str] = {}
    raw: list[tuple[bytes, bytes]] = []
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise RemoteProtocolError(f"malformed header line: {line[:100]!r}")
        value = value.strip()
        raw.append((name, value))
        key = name.lower().decode("latin-1")
        text = value.decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(code), headers, version != b"HTTP/1.0", raw, rest[4:]


def _chunk_size(line: bytes) -> int:
    size = line.partition(b";")[0].strip()
    if not size or size.strip(b"0123456789abcdefABCDEF"):
        raise RemoteProtocolError(f"bad chunk size line: {line[:100]!r}")
    return int(size, 16)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer bytes within the read timeout"))


class QuickAnswer:
    """A whole answer from :meth:`LeanTransport.quick`: the parts of an ``httpx.Response``
    a protocol client reads (``headers`` has lower-case names, repeats joined)."""

    __slots__ = ("content", "headers", "status_code")

    def __init__(self, status_code: int, headers: Mapping[str, str], content: bytes) -> None:
        self.status_code = status_code
        self.headers = headers
        self.content = content

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")

    def json(self) -> Any:
        return json.loads(self.content)

    def __repr__(self) -> str:
        return f"<QuickAnswer [{self.status_code}]>"


# -- an httpx transport on these connections --------------------------------------------------


class LeanTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` transport that sends ``http://`` requests over :class:`Connection`
    pools (one per origin, up to ``max_connections`` each) and hands anything else
    (``https``, proxies) to ``fallback``, built on first need (without one, such requests
    fail with ``httpx.UnsupportedProtocol``).

    A request's body is sent whole with a ``content-length``; its ``timeout`` extension
    bounds connecting, waiting for a pooled connection and each wait for answer bytes.
    A pooled connection the server closed as it was reused is retried once, fresh.
    """

    def __init__(
        self,
        *,
        max_connections: int,
        fallback: Callable[[], httpx.AsyncBaseTransport] | None = None,
    ) -> None:
        self._max_connections = max_connections
        self._make_fallback = fallback
        self._fallback: httpx.AsyncBaseTransport | None = None
        self._pools: dict[tuple[str, int], _Pool] = {}
        self._loop: asyncio.AbstractEventLoop | None = None

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        url = request.url
        if url.scheme != "http" or "proxy" in request.extensions:
            if self._make_fallback is None:
                raise httpx.UnsupportedProtocol(f"{url.scheme}:// needs a fallback transport")
            if self._fallback is None:
                self._fallback = self._make_fallback()
            return await self._fallback.handle_async_request(request)
        pool = self._pool(url.host, url.port or 80)
        timeouts: dict[str, float | None] = request.extensions.get("timeout", {})
        body = await request.aread()
        data = _request_bytes(request, body)
        connection = await _exchange(
            pool, data, timeouts, head_only=request.method == "HEAD", decode=False, request=request
        )
        return _response(pool, connection, request)

    async def send_raw(
        self,
        host: str,
        port: int,
        data: bytes,
        *,
        timeouts: Mapping[str, float | None],
        head_only: bool = False,
    ) -> httpx.Response:
        """Send pre-built request bytes to ``host:port`` on this transport's pools; the
        answer streams its body, already decoded (for callers that build the request head
        once and skip httpx's client layer)."""
        pool = self._pool(host, port)
        connection = await _exchange(
            pool, data, timeouts, head_only=head_only, decode=True, request=None
        )
        return _response(pool, connection, None)

    async def quick(
        self,
        method: str,
        url: str,
        *,
        headers: Mapping[str, str],
        content: bytes = b"",
        timeouts: Mapping[str, float | None],
    ) -> QuickAnswer:
        """One whole exchange with an ``http://`` server, without httpx's client layer (no
        cookies, redirects, auth hooks or proxies): for the hot calls of a protocol client
        on loopback. The answer is read in full (decoded) before it returns; failures are
        httpx's exceptions."""
        host, port, target, authority = split_url(url)
        lines = [f"{method} {target} HTTP/1.1", f"host: {authority}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append("accept-encoding: identity")
        if content or method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
            lines.append(f"content-length: {len(content)}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content
        pool = self._pool(host, port)
        connection = await _exchange(
            pool, data, timeouts, head_only=method == "HEAD", decode=True, request=None
        )
        chunks = [chunk async for chunk in _Body(pool, connection, None)]
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        headers = connection.headers
        if "content-encoding" in headers:  # decoded here already
            headers = {k: v for k, v in headers.items() if k != "content-encoding"}
        return QuickAnswer(connection.status, headers, body)

    def _pool(self, host: str, port: int) -> _Pool:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._loop, self._pools = loop, {}
        pool = self._pools.get((host, port))
        if pool is None:
            pool = self._pools[(host, port)] = _Pool(loop, host, port, self._max_connections)
        return pool

    async def aclose(self) -> None:
        pools, self._pools = self._pools, {}
        for pool in pools.values():
            pool.close_idle()
        if self._fallback is not None:
            fallback, self._fallback = self._fallback, None
            await fallback.aclose()
        await asyncio.sleep(0)  # let the transports finish closing


def _request_bytes(request: httpx.Request, body: bytes) -> bytes:
    url = request.url
    target = url.raw_path or b"/"
    lines = [b"%b %b HTTP/1.1" % (request.method.encode("ascii"), target)]
    for name, value in request.headers.raw:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            continue  # the whole body goes with its length
        lines.append(b"%b: %b" % (name, value))
    if body or request.method not in ("GET", "HEAD", "DELETE", "OPTIONS"):
        lines.append(b"content-length: %d" % len(body))
    return b"\r\n".join(lines) + b"\r\n\r\n" + body


def _response(pool: _Pool, connection: Connection, request: httpx.Request | None) -> httpx.Response:
    """The answer whose head has arrived on ``connection``, its body streaming from it."""
    headers = connection.raw_headers
    if connection.decode:  # the connection decoded the body: httpx must not do it again
        headers = [(k, v) for k, v in headers if k.lower() != b"content-encoding"]
    return httpx.Response(
        connection.status,
        headers=headers,
        stream=_Body(pool, connection, request),
        extensions={"http_version": b"HTTP/1.1", "reason_phrase": connection.reason},
        request=request,
    )


def split_url(url: str) -> tuple[str, int, str, str]:
    """``(host, port, request target, authority)`` of an ``http://`` URL (its fragment
    dropped). Only the origin is parsed in full, once per origin: the targets of the hot
    protocol calls differ in every call."""
    scheme, sep, rest = url.partition("://")
    end = len(rest)
    for mark in "/?#":
        found = rest.find(mark, 0, end)
        if found >= 0:
            end = found
    host, port, authority = _origin(f"{scheme}{sep}{rest[:end]}")
    target = rest[end:].partition("#")[0]
    return host, port, target if target.startswith("/") else f"/{target}", authority


@functools.lru_cache(maxsize=256)
def _origin(origin: str) -> tuple[str, int, str]:
    parts = urlsplit(origin)
    if parts.scheme.lower() != "http" or not parts.hostname:
        raise ValueError(f"{origin!r} is not an http:// URL with a host")
    return parts.hostname, parts.port or 80, parts.netloc.rpartition("@")[2]


async def _exchange(
    pool: _Pool,
    data: bytes,
    timeouts: Mapping[str, float | None],
    *,
    head_only: bool,
    decode: bool,
    request: httpx.Request | None,
) -> Connection:
    """Send ``data`` on a pooled connection (once more on a fresh one when a reused one
    turns out closed) and return it once the answer's head has arrived."""
    connection = await pool.acquire(timeouts)
    reused = connection.used
    try:
        await _send(
            pool, connection, data, head_only=head_only, decode=decode, read=timeouts.get("read")
        )
    except RemoteProtocolError as exc:
        if not (reused and connection.untouched):
            raise httpx.RemoteProtocolError(str(exc), request=request) from exc
        connection = await pool.acquire(timeouts, fresh=True)
        try:
            await _send(
                pool,
                connection,
                data,
                head_only=head_only,
                decode=decode,
                read=timeouts.get("read"),
            )
        except RemoteProtocolError as again:
            raise httpx.RemoteProtocolError(str(again), request=request) from again
        except TimeoutError as again:
            raise httpx.ReadTimeout(_timed_out(again), request=request) from again
    except TimeoutError as exc:
        raise httpx.ReadTimeout(_timed_out(exc), request=request) from exc
    return connection


async def _send(
    pool: _Pool,
    connection: Connection,
    data: bytes,
    *,
    head_only: bool,
    decode: bool,
    read: float | None,
) -> None:
    connection.timeout, connection.decode = read, decode
    try:
        await connection.request(data, head_only=head_only)
    except BaseException:
        connection.close()
        pool.release(connection)
        raise


def _timed_out(exc: BaseException) -> str:
    return str(exc) or "timed out"


class _Body(httpx.AsyncByteStream):
    """The answer's body as httpx reads it; the connection goes back to its pool at the end
    (or is closed, when the body was not read to its end)."""

    def __init__(self, pool: _Pool, connection: Connection, request: httpx.Request | None) -> None:
        self._pool = pool
        self._connection = connection
        self._request = request
        self._released = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        connection = self._connection
        try:
            while True:
                if connection.pending:
                    yield connection.take()
                elif connection.finished:
                    break
                else:
                    await connection.wait()
        except RemoteProtocolError as exc:
            raise httpx.RemoteProtocolError(str(exc), request=self._request) from exc
        except TimeoutError as exc:
            raise httpx.ReadTimeout(_timed_out(exc), request=self._request) from exc
        finally:
            self._give_back()

    async def aclose(self) -> None:
        self._give_back()

    def _give_back(self) -> None:  # sync: also runs in finally blocks while cancelled
        if not self._released:
            self._released = True
            if not self._connection.finished:
                self._connection.close()  # the rest of the body would block the next call
            self._pool.release(self._connection)


class _Pool:
    """Keep-alive connections to one origin: idle ones are reused newest first; callers
    past ``limit`` wait for one to come back."""

    def __init__(self, loop: asyncio.AbstractEventLoop, host: str, port: int, limit: int) -> None:
        self.loop = loop
        self.host = host
        self.port = port
        self.limit = limit
        self.idle: list[Connection] = []
        self.open = 0
        self.waiters: deque[asyncio.Future[Connection | None]] = deque()

    async def acquire(
        self, timeouts: Mapping[str, float | None], *, fresh: bool = False
    ) -> Connection:
        while self.idle and not fresh:
            connection = self.idle.pop()
            if connection.reusable:
                return connection
            self.open -= 1
        if self.open >= self.limit:
            waiter: asyncio.Future[Connection | None] = self.loop.create_future()
            self.waiters.append(waiter)
            try:
                async with asyncio.timeout(timeouts.get("pool")):
                    handed = await waiter
            except BaseException as exc:
                self._pass_on(waiter)
                if isinstance(exc, TimeoutError):
                    raise httpx.PoolTimeout(
                        f"no free connection to {self.host}:{self.port} among {self.open}"
                    ) from exc
                raise
            if handed is not None:
                return handed
        self.open += 1
        try:
            return await self._connect(timeouts.get("connect"))
        except BaseException:
            self.open -= 1
            self._hand_over(None)
            raise

    async def _connect(self, limit: float | None) -> Connection:
        loop = self.loop
        try:
            async with asyncio.timeout(limit):
                _, connection = await loop.create_connection(
                    lambda: Connection(loop, None, decode=False), self.host, self.port
                )
        except TimeoutError as exc:
            raise httpx.ConnectTimeout(f"connecting to {self.host}:{self.port}") from exc
        except OSError as exc:
            raise httpx.ConnectError(f"{self.host}:{self.port}: {exc}") from exc
        return connection

    def release(self, connection: Connection) -> None:
        if connection.reusable:
            if not self._hand_over(connection):
                self.idle.append(connection)
            return
        connection.close()
        self.open -= 1
        self._hand_over(None)

    def close_idle(self) -> None:
        idle, self.idle = self.idle, []
        for connection in idle:
            connection.close()
        self.open -= len(idle)

    def _pass_on(self, waiter: asyncio.Future[Connection | None]) -> None:
        """A caller gave up waiting: what it was handed goes to the next one."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled():
            handed = waiter.result()
            if handed is None:
                self._hand_over(None)
            else:
                self.release(handed)

    def _hand_over(self, connection: Connection | None) -> bool:
        """Give a waiting caller ``connection``, or (``None``) leave to open a new one."""
        while self.waiters:
            waiter = self.waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return True
        return False
