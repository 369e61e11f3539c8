"""The HTTP/1.1 client connection both lean clients use: keep-alive on asyncio's protocol
API, each answer parsed by llhttp (through ``httptools``) as it arrives (content-length,
chunked or read-to-close; gzip and deflate decoded unless the caller decodes).
:mod:`osmosis_ai.rollout.http` builds an httpx transport on it, and the controller its hop
to model upstreams.

What goes out is checked before a byte is sent: a header name must be an HTTP token and a
value must hold no line break, NUL or other control character (:class:`UsageError` naming
the header, the value redacted). What comes in must be one well-formed answer: a status in
100–599 (no ``101``: nothing here asks to switch protocols), a numeric ``content-length``,
and ``chunked`` as the only transfer coding; an answer framed both ways is read as chunked
and its connection closed (RFC 9112 §6.3). Anything else is a :class:`RemoteProtocolError`
naming the offending bytes. A request is sent again on a fresh connection only when it
never left, or when a reused connection closed before any answer byte and the request is
idempotent (by method, or as its caller declares): a POST the server may have applied is
never repeated behind its caller's back.
"""

from __future__ import annotations

import asyncio
import functools
import json
import re
import zlib
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from typing import Any, cast
from urllib.parse import urlsplit

import httptools
import httpx

from osmosis_ai.errors import OsmosisError, ProtocolError, UsageError

MAX_HEAD_BYTES = 64 * 1024
_PAUSE_BYTES = 1024 * 1024  # stop reading while this much body waits for the caller
IDEMPOTENT_METHODS = frozenset({"GET", "HEAD", "OPTIONS", "PUT", "DELETE", "TRACE"})
_NO_BODY_METHODS = ("GET", "HEAD", "DELETE", "OPTIONS")

# Where the current answer is: its head, its body (framed by length or chunks, which llhttp
# follows, or running to the connection's close), or done.
_HEAD, _BODY, _UNTIL_CLOSE, _DONE = range(4)

_TOKEN_CHARS = frozenset(
    "!#$%&'*+-.^_`|~0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
)
_CONTROL = re.compile(r"[\x00-\x08\x0a-\x1f\x7f]")  # every control character but HTAB
_CONTROL_BYTES = re.compile(rb"[\x00-\x08\x0a-\x1f\x7f]")
_HEADER_LINE = re.compile(rb"[!#$%&'*+\-.^_`|~0-9A-Za-z]+:[\t\x20-\x7e\x80-\xff]*")


class RemoteProtocolError(ProtocolError):
    """The server's bytes are not a well-formed HTTP/1.1 answer, or it hung up early."""


class WriteTimeoutError(OsmosisError, TimeoutError):
    """The server took in none of the request's bytes within the write timeout."""


class _NotSentError(RemoteProtocolError):
    """The connection was found closed before any of the request was written."""


class _AbandonError(OsmosisError):
    """Raised inside a parser callback to stop parsing: the answer is complete without
    what llhttp would still wait for (a ``HEAD`` answer's announced body), or what follows
    the answer is not ours to read."""


# -- what goes out ---------------------------------------------------------------------------


def check_header_fields(headers: Mapping[str, str]) -> None:
    """Raise :class:`UsageError` when a header could not go on the wire as it is: a name
    that is not an HTTP token, or a value with a line break, NUL or other control
    character (the value is redacted from the message; it may be a secret)."""
    for name, value in headers.items():
        _check_name(name)
        if not (value.isprintable() and value.isascii()):
            _check_value(name, value)


@functools.lru_cache(maxsize=1024)
def _check_name(name: str) -> None:
    if not name or not _TOKEN_CHARS.issuperset(name):
        shown = name if len(name) <= 40 else f"{name[:40]}..."
        raise UsageError(
            f"header name {shown!r} is not an HTTP token (letters, digits and !#$%&'*+-.^_`|~ "
            "only): pass the name alone, without ':' or spaces"
        )


def _check_value(name: str, value: str) -> None:
    found = _CONTROL.search(value)
    if found is not None:
        where = "ends with" if found.start() == len(value.rstrip("\r\n")) else "contains"
        what = {"\r": "a carriage return", "\n": "a line feed", "\x00": "a NUL byte"}.get(
            found.group(), f"the control character {found.group()!r}"
        )
        raise UsageError(
            f"header {name!r} has a value that {where} {what} (value redacted): a header "
            "value must be one line; a key read from a file keeps its trailing newline, so "
            "strip it (e.g. key.strip())"
        )
    try:
        value.encode("latin-1")
    except UnicodeEncodeError:
        raise UsageError(
            f"header {name!r} has a value with a character outside Latin-1 (value redacted), "
            "which HTTP/1.1 cannot carry: encode it first (e.g. percent-encoding)"
        ) from None


def _check_raw_headers(raw: Iterable[tuple[bytes, bytes]]) -> None:
    for name, value in raw:
        text = name.decode("latin-1")
        _check_name(text)
        if _CONTROL_BYTES.search(value) is not None:
            _check_value(text, value.decode("latin-1"))


# -- what comes in ---------------------------------------------------------------------------


class Connection(asyncio.Protocol):
    """One keep-alive connection; parses one answer at a time as its bytes arrive.

    ``timeout`` bounds each wait for answer bytes and ``write_timeout`` each wait for the
    server to take in request bytes (``None``: no bound). ``decode=False`` leaves gzip and
    deflate bodies as they came. Callers may change all three per request.
    """

    def __init__(
        self,
        loop: asyncio.AbstractEventLoop,
        timeout: float | None,
        *,
        decode: bool = True,
        write_timeout: float | None = None,
    ) -> None:
        self.loop = loop
        self.timeout = timeout
        self.write_timeout = write_timeout
        self.decode = decode
        self._head_only = False
        self._transport: asyncio.Transport | None = None
        self._parser: httptools.HttpResponseParser | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._drained: asyncio.Future[None] | None = None
        self._error: RemoteProtocolError | None = None
        self._paused = False
        self._write_paused = False
        self.used = False
        self.untouched = True  # no answer byte arrived for the current request
        self._keep_alive = True
        self.status = 0  # of the current answer, and so on below
        self.raw_headers: list[tuple[bytes, bytes]] = []
        self.reason = b""
        self._state = _DONE
        self._interim = False
        self._head_parts: list[bytes] = []
        self._head_size = 0  # bytes fed while the head is incomplete
        self._header_bytes = 0  # the current answer's header fields
        self._length: bytes | None = None
        self._transfer: bytes | None = None
        self._encoding: bytes | None = None
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

    def headers(self) -> dict[str, str]:
        """The answer's headers: lower-case names, repeats joined with ", "."""
        joined: dict[str, str] = {}
        for raw_name, raw_value in self.raw_headers:
            name, value = raw_name.decode("latin-1").lower(), raw_value.decode("latin-1")
            joined[name] = f"{joined[name]}, {value}" if name in joined else value
        return joined

    async def request(self, data: bytes, *, head_only: bool = False) -> None:
        """Send one request and wait for the head of its answer (``head_only``: the answer
        has no body, as for ``HEAD``). :class:`RemoteProtocolError`, :class:`TimeoutError`
        (:class:`WriteTimeoutError` while the request is being taken in)."""
        transport = self._transport
        assert transport is not None
        self._head_only = head_only
        self.untouched = True  # until an answer byte arrives
        if transport.is_closing() or not self._keep_alive:
            raise _NotSentError("the server closed the connection before the request was sent")
        self.used = True
        self.status, self.raw_headers, self.reason = 0, [], b""
        self._state, self._interim, self._body, self._body_bytes = _HEAD, False, [], 0
        self._head_parts, self._head_size = [], 0
        self._length = self._transfer = self._encoding = None
        if self._parser is None:
            self._parser = httptools.HttpResponseParser(self)
            # Both framings at once are read as chunked (and the connection then closed)
            # instead of refused: RFC 9112 §6.3.
            self._parser.set_dangerous_leniencies(lenient_chunked_length=True)
        transport.write(data)
        if self._write_paused:
            await self._drain()
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

    async def _drain(self) -> None:
        """Until the server has taken in enough of the request for writing to go on."""
        while self._write_paused and self._error is None and self._state == _HEAD:
            drained = self._drained = self.loop.create_future()
            limit = self.write_timeout
            timer = None if limit is None else self.loop.call_later(limit, _expire_write, drained)
            try:
                await drained
            finally:
                if timer is not None:
                    timer.cancel()
                self._drained = None

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
            when = "before answering" if self.untouched else "mid-answer"
            self._fail(RemoteProtocolError(f"the server closed the connection {when}{reason}"))
        self._wake()

    def eof_received(self) -> bool | None:
        self.connection_lost(None)
        return None  # and close our side

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def data_received(self, data: bytes) -> None:
        self.untouched = False
        parser = self._parser
        if self._state == _DONE or parser is None:
            self._keep_alive = False  # bytes nobody asked for: never reuse this connection
            return
        reading_head = self._state == _HEAD
        if reading_head:
            self._head_parts.append(data)
            self._head_size += len(data)
        try:
            parser.feed_data(data)
        except httptools.HttpParserError as exc:
            self._parse_failed(exc, data, reading_head)
        else:
            if self._state == _HEAD and self._head_size > MAX_HEAD_BYTES:
                self._fail(RemoteProtocolError(f"answer head is over {MAX_HEAD_BYTES} bytes"))
        self._wake()

    # -- llhttp's callbacks ------------------------------------------------------------------

    def on_message_begin(self) -> None:
        if self._state != _HEAD:  # a second answer, or bytes after the end of ours
            self._keep_alive = False
            raise _AbandonError
        self.raw_headers, self.reason, self._header_bytes = [], b"", 0
        self._length = self._transfer = self._encoding = None

    def on_status(self, reason: bytes) -> None:
        self.reason += reason

    def on_header(self, name: bytes, value: bytes) -> None:
        if self._state != _HEAD:
            return  # a chunked body's trailer fields: not headers of the answer
        self._header_bytes += len(name) + len(value) + 4
        value = value.strip()
        self.raw_headers.append((name, value))
        if len(name) in (14, 16, 17):  # the headers that frame or encode the body
            lowered = name.lower()
            if lowered == b"content-length":
                self._length = value
            elif lowered == b"transfer-encoding":
                self._transfer = value if self._transfer is None else self._transfer + b"," + value
            elif lowered == b"content-encoding":
                self._encoding = value

    def on_headers_complete(self) -> None:
        parser = self._parser
        assert parser is not None
        status = parser.get_status_code()
        if 100 <= status < 200:
            if status == 101:
                raise RemoteProtocolError(
                    "the server answered 101 Switching Protocols, but no upgrade was asked for"
                )
            self._interim = True  # 100 Continue, 103 Early Hints: the answer follows
            return
        if not 200 <= status <= 599:
            raise RemoteProtocolError(f"the answer's status {status} is outside 100-599")
        if self._header_bytes > MAX_HEAD_BYTES:
            raise RemoteProtocolError(f"answer head is over {MAX_HEAD_BYTES} bytes")
        self.status = status
        self._keep_alive = parser.should_keep_alive()
        self._head_parts = []
        no_body = self._head_only or status in (204, 304)
        transfer = self._transfer
        if transfer is not None and not no_body:
            self._check_chunked(transfer)
        if self.decode and self._encoding is not None:
            self._set_decoder(self._encoding)
        if self._head_only:
            self._end()
            raise _AbandonError  # llhttp would wait for the body a content-length announces
        if transfer is None and self._length is None and not no_body:
            self._state, self._keep_alive = _UNTIL_CLOSE, False
        else:
            self._state = _BODY

    def on_body(self, body: bytes) -> None:
        self._deliver(body)

    def on_message_complete(self) -> None:
        if self._interim:
            self._interim = False
            return
        self._end()

    # -- parsing -----------------------------------------------------------------------------

    def _parse_failed(self, exc: httptools.HttpParserError, data: bytes, in_head: bool) -> None:
        cause = exc.__context__
        if isinstance(cause, _AbandonError):
            # The answer is whole; what llhttp would read next is not part of it.
            self._parser = None
            if self._state != _DONE:
                self._end()
            return
        if isinstance(cause, RemoteProtocolError):
            self._fail(cause)
            return
        reason = str(exc) or type(exc).__name__
        if self._state == _HEAD:  # failed in the head: name the line at fault
            near = _offending_line(b"".join(self._head_parts), reason)
        else:  # in the body: what came after the head, when the head came with it
            near = (data.partition(b"\r\n\r\n")[2] if in_head else data)[:80]
        self._fail(RemoteProtocolError(f"malformed answer: {reason} (at {near!r})"))

    def _check_chunked(self, transfer: bytes) -> None:
        codings = [c.strip() for c in transfer.lower().split(b",") if c.strip()]
        if codings != [b"chunked"]:
            shown = transfer.decode("latin-1")
            raise RemoteProtocolError(
                f"unsupported transfer-encoding {shown!r}: only 'chunked' is read"
            )
        if self._length is not None:  # framed both ways: read as chunked, then close
            self._keep_alive = False

    def _set_decoder(self, content_encoding: bytes) -> None:
        encoding = content_encoding.lower()
        if encoding == b"gzip":
            self._decoder = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif encoding == b"deflate":
            self._decoder = zlib.decompressobj()
        elif encoding != b"identity":
            shown = content_encoding.decode("latin-1")
            raise RemoteProtocolError(f"unsupported content-encoding {shown!r}")

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
        self._parser = None
        if self._transport is not None:
            self._transport.close()
        drained = self._drained
        if drained is not None and not drained.done():
            drained.set_result(None)

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)


def _offending_line(head: bytes, reason: str) -> bytes:
    """The line of an answer head that llhttp refused, for the error message: the framing
    header its reason names, else the status line or the first line that is not a header."""
    lines = head.split(b"\r\n\r\n", 1)[0].split(b"\r\n")
    lowered = reason.lower()
    for name in (b"content-length", b"transfer-encoding"):
        if name.decode() in lowered:
            named = [line for line in lines[1:] if line.lower().startswith(name)]
            if named:
                return named[-1][:120]
    if "status" in lowered or "http/" in lowered or "version" in lowered or len(lines) == 1:
        return lines[0][:120]
    for line in lines[1:]:
        if not _HEADER_LINE.fullmatch(line):
            return line[:120]
    return head[:120]


def _expire(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(TimeoutError("no answer bytes within the read timeout"))


def _expire_write(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_exception(
            WriteTimeoutError("the server took in no request bytes within the write timeout")
        )


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

IDEMPOTENT_EXTENSION = "osmosis_idempotent"
"""An httpx request extension: ``True`` declares a request safe to send twice whatever its
method (a stale pooled connection may then cost a second send); ``False`` forbids it."""


class LeanTransport(httpx.AsyncBaseTransport):
    """An ``httpx`` transport that sends ``http://`` requests over :class:`Connection`
    pools (one per origin, up to ``max_connections`` each) and hands anything else
    (``https``, proxies) to ``fallback``, built on first need (without one, such requests
    fail with ``httpx.UnsupportedProtocol``).

    A request's body is sent whole with a ``content-length``; its ``timeout`` extension
    bounds connecting, waiting for a pooled connection, each wait for the server to take
    in request bytes and each wait for answer bytes. A pooled connection found closed is
    replaced; one that closes after the request went out, before any answer byte, is
    retried once on a fresh connection only for an idempotent request (the method, or the
    :data:`IDEMPOTENT_EXTENSION` extension): anything else raises
    ``httpx.RemoteProtocolError``, since the server may have applied it.
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
        idempotent = request.extensions.get(IDEMPOTENT_EXTENSION)
        if idempotent is None:
            idempotent = request.method in IDEMPOTENT_METHODS
        connection = await _exchange(
            pool,
            data,
            timeouts,
            head_only=request.method == "HEAD",
            decode=False,
            idempotent=bool(idempotent),
            request=request,
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
        idempotent: bool = False,
    ) -> httpx.Response:
        """Send pre-built request bytes to ``host:port`` on this transport's pools; the
        answer streams its body, already decoded (for callers that build the request head
        once, checked, and skip httpx's client layer). ``idempotent``: the request may be
        sent twice (see the class)."""
        pool = self._pool(host, port)
        connection = await _exchange(
            pool,
            data,
            timeouts,
            head_only=head_only,
            decode=True,
            idempotent=idempotent,
            request=None,
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
        idempotent: bool | None = None,
    ) -> QuickAnswer:
        """One whole exchange with an ``http://`` server, without httpx's client layer (no
        cookies, redirects, auth hooks or proxies): for the hot calls of a protocol client
        on loopback. The answer is read in full (decoded) before it returns; failures are
        httpx's exceptions, but a URL or header that cannot go on the wire is a
        :class:`UsageError`. ``idempotent`` (default: by method) allows a second send
        when a reused connection closes before answering."""
        host, port, target, authority = split_url(url)
        check_header_fields(headers)
        lines = [f"{method} {target} HTTP/1.1", f"host: {authority}"]
        lines += [f"{name}: {value}" for name, value in headers.items()]
        lines.append("accept-encoding: identity")
        if content or method not in _NO_BODY_METHODS:
            lines.append(f"content-length: {len(content)}")
        data = ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + content
        pool = self._pool(host, port)
        if idempotent is None:
            idempotent = method in IDEMPOTENT_METHODS
        connection = await _exchange(
            pool,
            data,
            timeouts,
            head_only=method == "HEAD",
            decode=True,
            idempotent=idempotent,
            request=None,
        )
        chunks = [chunk async for chunk in _Body(pool, connection, None)]
        body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
        answer_headers = connection.headers()
        answer_headers.pop("content-encoding", None)  # decoded here already
        return QuickAnswer(connection.status, answer_headers, body)

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
    if _CONTROL_BYTES.search(target) is not None or b" " in target:
        raise UsageError(f"the request target {target[:100]!r} has a space or control character")
    raw = request.headers.raw
    _check_raw_headers(raw)
    lines = [b"%b %b HTTP/1.1" % (request.method.encode("ascii"), target)]
    for name, value in raw:
        lowered = name.lower()
        if lowered in (b"content-length", b"transfer-encoding"):
            continue  # the whole body goes with its length
        lines.append(b"%b: %b" % (name, value))
    if body or request.method not in _NO_BODY_METHODS:
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
    dropped); :class:`UsageError` for anything else, or for a URL with spaces, control or
    non-ASCII characters (percent-encode those). Only the origin is parsed in full, once
    per origin: the targets of the hot protocol calls differ in every call."""
    if not (url.isascii() and url.isprintable()) or " " in url:
        raise UsageError(
            f"{_shown_url(url)!r} has a space, control or non-ASCII character: "
            "percent-encode it (and strip a trailing newline)"
        )
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
    try:
        parts = urlsplit(origin)
        port = parts.port
    except ValueError:
        parts, port = None, None
    if parts is None or parts.scheme.lower() != "http" or not parts.hostname:
        raise UsageError(f"{_shown_url(origin)!r} is not an http:// URL with a host and port")
    return parts.hostname, port or 80, parts.netloc.rpartition("@")[2]


def _shown_url(url: str) -> str:
    """``url`` for a message: any user and password replaced, a long one cut."""
    scheme, sep, rest = url.partition("://")
    authority, slash, path = rest.partition("/")
    if "@" in authority:
        authority = "***@" + authority.rpartition("@")[2]
    shown = f"{scheme}{sep}{authority}{slash}{path}"
    return shown if len(shown) <= 200 else f"{shown[:200]}..."


async def _exchange(
    pool: _Pool,
    data: bytes,
    timeouts: Mapping[str, float | None],
    *,
    head_only: bool,
    decode: bool,
    idempotent: bool,
    request: httpx.Request | None,
) -> Connection:
    """Send ``data`` on a pooled connection and return it once the answer's head has
    arrived; once more on a fresh connection when the pooled one was found closed, or,
    for an ``idempotent`` request, closed before answering."""
    connection = await pool.acquire(timeouts)
    reused = connection.used
    try:
        await _send(pool, connection, data, head_only=head_only, decode=decode, timeouts=timeouts)
        return connection
    except _NotSentError:
        pass
    except RemoteProtocolError as exc:
        if not (reused and connection.untouched and idempotent):
            raise _httpx_error(exc, request, reused=reused and connection.untouched) from exc
    except TimeoutError as exc:
        raise _httpx_error(exc, request) from exc
    connection = await pool.acquire(timeouts, fresh=True)
    try:
        await _send(pool, connection, data, head_only=head_only, decode=decode, timeouts=timeouts)
    except (RemoteProtocolError, TimeoutError) as again:
        raise _httpx_error(again, request) from again
    return connection


def _httpx_error(
    exc: RemoteProtocolError | TimeoutError, request: httpx.Request | None, *, reused: bool = False
) -> httpx.TransportError:
    message = str(exc) or "timed out"
    if isinstance(exc, WriteTimeoutError):
        return httpx.WriteTimeout(message, request=request)
    if isinstance(exc, TimeoutError):
        return httpx.ReadTimeout(message, request=request)
    if reused:
        message += (
            " (a reused keep-alive connection; the request is not idempotent, so it was not "
            "sent again: the server may have applied it)"
        )
    return httpx.RemoteProtocolError(message, request=request)


async def _send(
    pool: _Pool,
    connection: Connection,
    data: bytes,
    *,
    head_only: bool,
    decode: bool,
    timeouts: Mapping[str, float | None],
) -> None:
    connection.timeout, connection.decode = timeouts.get("read"), decode
    connection.write_timeout = timeouts.get("write")
    try:
        await connection.request(data, head_only=head_only)
    except BaseException:
        connection.close()
        pool.release(connection)
        raise


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
        except (RemoteProtocolError, TimeoutError) as exc:
            raise _httpx_error(exc, self._request) from exc
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
