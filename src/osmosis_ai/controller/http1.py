"""A lean HTTP/1.1 client for the proxy's hop to a plain-``http`` upstream (vLLM, SGLang, a
local server): keep-alive connections on asyncio's protocol API, the request head built
once, one write per call, the answer parsed as it arrives (content-length, chunked or
read-to-close; gzip and deflate decoded). It does one job, at about a quarter of aiohttp's
cost per request, which was most of the proxy's overhead on a model call.
"""

from __future__ import annotations

import asyncio
import zlib
from collections import deque
from collections.abc import AsyncIterator, Mapping
from typing import cast
from urllib.parse import urlsplit

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.controller.transport import Answer, connection_error
from osmosis_ai.errors import UsageError

_MAX_HEAD_BYTES = 64 * 1024
_PAUSE_BYTES = 1024 * 1024  # stop reading while this much body waits for the caller

# Body framing (RFC 9112 §6.3) and the chunked decoder's steps.
_HEAD, _LENGTH, _CHUNKED, _UNTIL_CLOSE, _DONE = range(5)
_SIZE, _DATA, _DATA_END, _TRAILER = range(4)


class RemoteProtocolError(Exception):
    """The upstream's bytes are not a well-formed HTTP/1.1 answer, or it hung up early."""


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
        url = urlsplit(target)
        if url.scheme != "http" or not url.hostname:
            raise UsageError(f"{target!r} is not an http:// URL with a host")
        self._target = target
        self._host = url.hostname
        self._port = url.port or 80
        path = (url.path or "/") + (f"?{url.query}" if url.query else "")
        lines = [f"POST {path} HTTP/1.1", f"host: {url.netloc.rpartition('@')[2]}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append(f"user-agent: osmosis-ai/{PACKAGE_VERSION}")
        lines.append("accept-encoding: identity")  # compressing on a local hop costs time
        self._head = ("\r\n".join(lines) + "\r\ncontent-length: ").encode("latin-1")
        self._timeout = timeout
        self._connect_timeout = connect_timeout
        self._max_connections = max_connections
        self._loop: asyncio.AbstractEventLoop | None = None
        self._idle: list[_Connection] = []
        self._open = 0
        self._waiters: deque[asyncio.Future[_Connection | None]] = deque()

    async def post(self, content: bytes) -> Answer:
        request = b"%b%d\r\n\r\n%b" % (self._head, len(content), content)
        connection = await self._acquire()
        reused = connection.used
        try:
            await self._start(connection, request)
        except RemoteProtocolError as exc:
            if not (reused and connection.untouched):
                raise connection_error(self._target, exc, "while sending the request") from exc
            # A pooled connection the server closed as it was reused: once more, fresh.
            connection = await self._acquire(fresh=True)
            try:
                await self._start(connection, request)
            except (RemoteProtocolError, TimeoutError) as again:
                raise connection_error(self._target, again, "while sending the request") from again
        except TimeoutError as exc:
            raise connection_error(self._target, exc, "while waiting for the answer") from exc
        return _Http1Answer(self, connection, self._target)

    async def aclose(self) -> None:
        idle, self._idle = self._idle, []
        for connection in idle:
            connection.close()
        self._open -= len(idle)
        await asyncio.sleep(0)  # let the transports finish closing

    async def _start(self, connection: _Connection, request: bytes) -> None:
        try:
            await connection.request(request)
        except BaseException:
            connection.close()
            self._release(connection)
            raise

    # -- the pool -----------------------------------------------------------------------------

    async def _acquire(self, *, fresh: bool = False) -> _Connection:
        loop = asyncio.get_running_loop()
        if loop is not self._loop:  # connections belong to the loop that opened them
            self._loop, self._idle, self._open, self._waiters = loop, [], 0, deque()
        while self._idle and not fresh:
            connection = self._idle.pop()
            if connection.reusable:
                return connection
            self._open -= 1
        if self._open >= self._max_connections:
            waiter: asyncio.Future[_Connection | None] = loop.create_future()
            self._waiters.append(waiter)
            try:
                async with asyncio.timeout(self._timeout):
                    handed = await waiter
            except BaseException as exc:
                self._pass_on(waiter)
                if isinstance(exc, TimeoutError):
                    during = f"while waiting for one of its {self._open} connections"
                    raise connection_error(self._target, exc, during) from exc
                raise
            if handed is not None:
                return handed
        self._open += 1
        try:
            return await self._connect(loop)
        except BaseException:
            self._open -= 1
            self._hand_over(None)
            raise

    async def _connect(self, loop: asyncio.AbstractEventLoop) -> _Connection:
        try:
            async with asyncio.timeout(self._connect_timeout):
                _, connection = await loop.create_connection(
                    lambda: _Connection(loop, self._timeout), self._host, self._port
                )
        except (OSError, TimeoutError) as exc:
            raise connection_error(self._target, exc, "while connecting") from exc
        return connection

    def _release(self, connection: _Connection) -> None:
        if connection.reusable and connection.loop is self._loop:
            if not self._hand_over(connection):
                self._idle.append(connection)
            return
        connection.close()
        if connection.loop is self._loop:
            self._open -= 1
            self._hand_over(None)

    def _pass_on(self, waiter: asyncio.Future[_Connection | None]) -> None:
        """A caller gave up waiting: what it was handed goes to the next one."""
        if not waiter.done():
            waiter.cancel()
        elif not waiter.cancelled():
            handed = waiter.result()
            if handed is None:
                self._hand_over(None)
            else:
                self._release(handed)

    def _hand_over(self, connection: _Connection | None) -> bool:
        """Give a waiting caller ``connection``, or (``None``) leave to open a new one."""
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(connection)
                return True
        return False


class _Http1Answer:
    __slots__ = ("_connection", "_released", "_target", "_transport")

    def __init__(self, transport: Http1Transport, connection: _Connection, target: str) -> None:
        self._transport = transport
        self._connection = connection
        self._target = target
        self._released = False

    @property
    def status(self) -> int:
        return self._connection.status

    @property
    def content_type(self) -> str:
        return self._connection.headers.get("content-type", "")

    async def read(self) -> bytes:
        connection = self._connection
        parts: list[bytes] = []
        try:
            while True:
                if connection.pending:
                    parts.append(connection.take())
                if connection.finished:
                    break
                await connection.wait()
        except (RemoteProtocolError, TimeoutError) as exc:
            raise connection_error(self._target, exc, "while reading the answer") from exc
        finally:
            self._give_back()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def chunks(self) -> AsyncIterator[bytes]:
        connection = self._connection
        try:
            while True:
                if connection.pending:
                    yield connection.take()
                elif connection.finished:
                    break
                else:
                    await connection.wait()
        except (RemoteProtocolError, TimeoutError) as exc:
            raise connection_error(self._target, exc, "mid-stream") from exc
        finally:
            self._give_back()

    async def aclose(self) -> None:
        self._give_back()

    def _give_back(self) -> None:  # sync: also runs in finally blocks while cancelled
        if not self._released:
            self._released = True
            if not self._connection.finished:
                self._connection.close()  # the rest of the body would block the next call
            self._transport._release(self._connection)  # pyright: ignore[reportPrivateUsage]


class _Connection(asyncio.Protocol):
    """One keep-alive connection; parses one answer at a time as its bytes arrive."""

    def __init__(self, loop: asyncio.AbstractEventLoop, timeout: float) -> None:
        self.loop = loop
        self._timeout = timeout
        self._transport: asyncio.Transport | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._error: RemoteProtocolError | None = None
        self._paused = False
        self.used = False
        self.untouched = True  # no answer byte arrived for the current request
        self._keep_alive = True
        self.status = 0  # of the current answer, and so on below
        self.headers: dict[str, str] = {}
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

    async def request(self, data: bytes) -> None:
        """Send one request and wait for the head of its answer."""
        assert self._transport is not None
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
        timer = self.loop.call_later(self._timeout, _expire, waiter)
        try:
            await waiter
        finally:
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
                if len(self._buffer) > _MAX_HEAD_BYTES:
                    raise RemoteProtocolError(f"answer head is over {_MAX_HEAD_BYTES} bytes")
                return False
            head = bytes(self._buffer[:end])
            del self._buffer[: end + 4]
            status, headers, http11 = _parse_head(head)
            if 100 <= status < 200:
                continue
            self.status, self.headers = status, headers
            self._frame(status, headers, http11)
            return True

    def _frame(self, status: int, headers: dict[str, str], http11: bool) -> None:
        connection = headers.get("connection", "").lower()
        self._keep_alive = "close" not in connection if http11 else "keep-alive" in connection
        encoding = headers.get("content-encoding", "identity").strip().lower()
        if encoding == "gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == "deflate":
            self._decoder = zlib.decompressobj()
        elif encoding != "identity":
            raise RemoteProtocolError(f"unsupported content-encoding {encoding!r}")
        transfer = headers.get("transfer-encoding", "").lower()
        length = headers.get("content-length")
        if status in (204, 304):
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
                if len(buffer) > _MAX_HEAD_BYTES:
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


def _parse_head(head: bytes) -> tuple[int, dict[str, str], bool]:
    status_line, *lines = head.split(b"\r\n")
    version, _, rest = status_line.partition(b" ")
    code = rest[:3]
    if not version.startswith(b"HTTP/1.") or len(code) != 3 or not code.isdigit():
        raise RemoteProtocolError(f"not an HTTP/1.x status line: {status_line[:100]!r}")
    headers: dict[str, str] = {}
    for line in lines:
        name, colon, value = line.partition(b":")
        if not colon or not name or name != name.strip():
            raise RemoteProtocolError(f"malformed header line: {line[:100]!r}")
        key = name.lower().decode("latin-1")
        text = value.strip().decode("latin-1")
        headers[key] = f"{headers[key]}, {text}" if key in headers else text
    return int(code), headers, version != b"HTTP/1.0"


def _chunk_size(line: bytes) -> int:
    size = line.partition(b";")[0].strip()
    if not size or size.strip(b"0123456789abcdefABCDEF"):
        raise RemoteProtocolError(f"bad chunk size line: {line[:100]!r}")
    return int(size, 16)


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer bytes within the read timeout"))
