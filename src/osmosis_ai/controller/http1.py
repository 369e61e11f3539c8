"""A lean HTTP/1.1 client for the proxy's hop to a plain-``http`` upstream (vLLM, SGLang, a
local server): keep-alive connections on asyncio's protocol API, the request head built
once, one write per call, the answer parsed as it arrives (content-length, chunked or
read-to-close; gzip and deflate decoded). It does one job, at about a quarter of aiohttp's
cost per request, which was most of the proxy's overhead on a model call.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Mapping
from urllib.parse import urlsplit

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.controller.transport import Answer, connection_error
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.http1 import Connection as _Connection
from osmosis_ai.rollout.http1 import RemoteProtocolError

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
