"""Relays one upstream stream to the agent as server-sent events, as it arrives.

Payloads are forwarded without waiting for the rest (what has already arrived goes out in
one write), ``: keep-alive`` comments cover quiet upstreams, and an upstream failure ends
the stream with ``event: error`` and ``[DONE]``. A client that goes away cancels the call.
An empty payload means the upstream accepted the call: the headers go out then, while the
first tokens are still on their way.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from osmosis_ai.controller.asgi import upstream_error_reply
from osmosis_ai.controller.calls import CallRecorder
from osmosis_ai.controller.dialect import StreamWriter, error_message
from osmosis_ai.controller.errors import UpstreamError
from osmosis_ai.rollout.asgi import SSE_HEADERS, Receive, Send, send_body

_SSE_START = {"type": "http.response.start", "status": 200, "headers": SSE_HEADERS}
_KEEPALIVE = b": keep-alive\n\n"
_DONE = b"data: [DONE]\n\n"
_WATCH_AFTER_SEC = 0.05  # how late a client that went away may be noticed
_OPEN = object()
_END = object()
_DISCONNECT = object()
_TICK = object()


async def relay_stream(
    payloads: AsyncIterator[bytes],
    recorder: CallRecorder,
    receive: Receive,
    send: Send,
    *,
    keepalive_interval: float,
    hide_usage: bool,
    writer: StreamWriter | None = None,
) -> None:
    """Answer one streaming call from ``payloads``. An error before anything was sent keeps
    its HTTP status; ``hide_usage`` drops the usage-only chunk the caller did not ask for.
    A ``writer`` rewrites the chat chunks as another API's events (and its errors)."""
    inbox = _Inbox()
    pump = _Pump(inbox, keepalive_interval)
    reader = asyncio.create_task(pump.read(payloads))
    watch = _DisconnectWatch(receive, inbox)
    started = False
    received: list[bytes] = []  # recorded once the agent has its answer
    rewrite = None if writer is None else _Rewrite(writer)
    try:
        while True:
            out: list[bytes] = []
            last = _collect(
                await inbox.take(), out, received, recorder, hide_usage, rewrite=rewrite
            )
            if last is _DISCONNECT:
                recorder.fail(499, "the client disconnected before the stream ended")
                return
            finished = last is _END
            if isinstance(last, UpstreamError):
                whole = _failed(last, recorder, rewrite, out, started=started)
                if whole is not None:
                    await send_body(send, *whole)
                    return
                finished = True
            if not started and (out or last is _OPEN):
                started = True
                await send(_SSE_START)
            if out:
                body = out[0] if len(out) == 1 else b"".join(out)
                await send({"type": "http.response.body", "body": body, "more_body": not finished})
            if finished:
                return
    finally:
        recorder.answered()
        if rewrite is None:
            recorder.chunks(received)
        else:
            recorder.parsed_chunks(rewrite.decoded)
        pump.stop()
        if not pump.ended:  # left early: stop the upstream call
            reader.cancel()
        # past [DONE] the reader only tidies up its connection: let it
        await asyncio.gather(reader, *watch.stop(), return_exceptions=True)


def _collect(
    items: list[object],
    out: list[bytes],
    received: list[bytes],
    recorder: CallRecorder,
    hide_usage: bool,
    *,
    rewrite: _Rewrite | None,
) -> object:
    """Append to ``out`` the SSE bytes for ``items`` (rewritten when ``rewrite`` is given)
    and to ``received`` their payloads, up to what ends the stream (``[DONE]`` or the
    rewritten stream's closing events are written here). Returns that end (``_END``,
    ``_DISCONNECT`` or an :class:`UpstreamError`), else ``_OPEN`` if the upstream accepted
    the call, else ``None``."""
    opened = None
    for item in items:
        if type(item) is bytes:
            if not received:
                recorder.arrived()
            received.append(item)
            if rewrite is not None:
                rewrite.pending.append(item)
            elif not (hide_usage and _usage_only(item)):
                out.append(b"data: " + item + b"\n\n")
            continue
        if rewrite is not None:
            rewrite.flush(out)
        if item is _OPEN:
            opened = _OPEN
        elif item is _TICK:
            out.append(_KEEPALIVE)
        elif item is _END:
            out.append(_DONE if rewrite is None else rewrite.writer.end())
            return _END
        elif item is _DISCONNECT or isinstance(item, UpstreamError):
            return item
    if rewrite is not None:
        rewrite.flush(out)
    return opened


def _failed(
    error: UpstreamError,
    recorder: CallRecorder,
    rewrite: _Rewrite | None,
    out: list[bytes],
    *,
    started: bool,
) -> tuple[int, bytes] | None:
    """Record the upstream's failure. Before anything was sent: the whole error answer, with
    the upstream's status; else the error event that ends the stream goes to ``out``."""
    status, payload = upstream_error_reply(error)
    recorder.fail(status, str(error))
    if not started and not out:
        return status, payload if rewrite is None else rewrite.writer.refusal(status, payload)
    if rewrite is None:
        out.append(b"event: error\ndata: " + payload + b"\n\n" + _DONE)
    else:
        out.append(rewrite.writer.error(status, error_message(payload)))
    return None


class _Rewrite:
    """Feeds a stream's chat payloads to a :class:`StreamWriter`, each batch that arrived
    together parsed at once and written in one piece, and keeps what it parsed for the
    recorder."""

    __slots__ = ("decoded", "pending", "writer")

    def __init__(self, writer: StreamWriter) -> None:
        self.writer = writer
        self.pending: list[bytes] = []
        self.decoded: list[tuple[bytes, object]] = []

    def flush(self, out: list[bytes]) -> None:
        if not self.pending:
            return
        batch, self.pending = self.pending, []
        parsed = _parse_all(batch)
        self.decoded.extend(zip(batch, parsed, strict=True))
        chunks: list[dict[str, Any]] = [
            c for c in parsed if isinstance(c, dict) and "error" not in c
        ]
        if chunks:
            events = self.writer.feed_all(chunks)
            if events:
                out.append(events)


def _parse_all(payloads: list[bytes]) -> list[object]:
    """Each payload's JSON (``None`` for one that is not), in one parse when all are."""
    try:
        parsed: object = json.loads(b"[" + b",".join(payloads) + b"]")
    except ValueError:
        parsed = None
    if isinstance(parsed, list) and len(parsed) == len(payloads):
        return parsed
    values: list[object] = []
    for payload in payloads:
        try:
            values.append(json.loads(payload))
        except ValueError:
            values.append(None)
    return values


def ask_usage(body: dict[str, Any]) -> bool:
    """Ask the upstream for the usage chunk; whether the caller had not (so it is hidden)."""
    options = body.get("stream_options")
    if isinstance(options, dict):
        if options.get("include_usage"):
            return False
        body["stream_options"] = {**options, "include_usage": True}
    else:
        body["stream_options"] = {"include_usage": True}
    return True


def _usage_only(payload: bytes) -> bool:
    if b'"usage"' not in payload or b'"usage":null' in payload:  # cheap: most chunks
        return False
    try:
        chunk: object = json.loads(payload)
    except ValueError:
        return False
    return isinstance(chunk, dict) and "usage" in chunk and not chunk.get("choices")


class _Inbox:
    """What the relay has to act on, in arrival order; cheaper than an ``asyncio.Queue``
    for one reader that takes everything at once."""

    __slots__ = ("_items", "_waiter")

    def __init__(self) -> None:
        self._items: list[object] = []
        self._waiter: asyncio.Future[None] | None = None

    def put(self, item: object) -> None:
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    async def take(self) -> list[object]:
        """Everything that arrived, waiting for something when nothing has."""
        while not self._items:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await self._waiter
            finally:
                self._waiter = None
        items, self._items = self._items, []
        return items


class _Pump:
    """Moves upstream payloads into the inbox, and ticks when the upstream stays quiet."""

    def __init__(self, inbox: _Inbox, interval: float) -> None:
        self._inbox = inbox
        self._interval = interval
        self._active = False
        self.ended = False
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(interval, self._tick)

    def _tick(self) -> None:
        if not self._active:
            self._inbox.put(_TICK)
        self._active = False
        self._timer = self._loop.call_later(self._interval, self._tick)

    def stop(self) -> None:
        self._timer.cancel()

    def _finish(self, last: object) -> None:
        if not self.ended:
            self.ended = True
            self._inbox.put(last)

    async def read(self, payloads: AsyncIterator[bytes]) -> None:
        try:
            async for payload in payloads:
                if self.ended:
                    continue
                if payload == b"[DONE]":  # the end, though the iterator may still tidy up:
                    self._finish(_END)
                    await asyncio.sleep(0)  # let the relay answer before that tidying
                    continue
                self._active = True
                self._inbox.put(payload if payload else _OPEN)
            self._finish(_END)
        except UpstreamError as exc:
            self._finish(exc)
        except Exception as exc:  # an upstream bug must end the stream, not hang it
            error = f"model upstream failed: {type(exc).__name__}: {exc}"
            self._finish(UpstreamError(error, url=""))
        finally:
            self.stop()
            close = getattr(payloads, "aclose", None)
            if close is not None:
                await close()


class _DisconnectWatch:
    """Tells the relay when the client goes away, so the upstream call is cancelled. Armed
    only once the call has run a moment: the watch costs a task, and most calls to a fast
    model are over sooner."""

    def __init__(self, receive: Receive, inbox: _Inbox) -> None:
        self._receive = receive
        self._inbox = inbox
        self._loop = asyncio.get_running_loop()
        self._task: asyncio.Task[None] | None = None
        self._timer = self._loop.call_later(_WATCH_AFTER_SEC, self._arm)

    def _arm(self) -> None:
        self._task = self._loop.create_task(self._watch())

    async def _watch(self) -> None:
        while True:
            message = await self._receive()
            if message["type"] == "http.disconnect":
                self._inbox.put(_DISCONNECT)
                return

    def stop(self) -> list[asyncio.Task[None]]:
        """Disarm; returns the watching task, cancelled, for the caller to await."""
        self._timer.cancel()
        if self._task is None:
            return []
        self._task.cancel()
        return [self._task]
