"""Relays one upstream stream to the agent as server-sent events, as it arrives.

Payloads are forwarded without waiting for the rest (what has already arrived goes out in
one write), ``: keep-alive`` comments cover quiet upstreams, and an upstream failure ends
the stream with ``event: error`` and ``[DONE]``. A client that goes away cancels the call.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator
from typing import Any

from osmosis_ai.controller.asgi import Receive, Send, send_json, upstream_error_reply
from osmosis_ai.controller.calls import CallRecorder
from osmosis_ai.controller.errors import UpstreamError

_SSE_START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [
        (b"content-type", b"text/event-stream; charset=utf-8"),
        (b"cache-control", b"no-cache"),
        (b"x-accel-buffering", b"no"),
    ],
}
_KEEPALIVE = b": keep-alive\n\n"
_DONE = b"data: [DONE]\n\n"
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
) -> None:
    """Answer one streaming call from ``payloads``. An error before anything was sent keeps
    its HTTP status; ``hide_usage`` drops the usage-only chunk the caller did not ask for."""
    queue: asyncio.Queue[object] = asyncio.Queue()
    pump = _Pump(queue, keepalive_interval)
    reader = asyncio.create_task(pump.read(payloads))
    watcher = asyncio.create_task(_watch_disconnect(receive, queue))
    started = False
    received: list[bytes] = []  # recorded once the agent has its answer
    try:
        while True:
            items = [await queue.get()]
            while not queue.empty():
                items.append(queue.get_nowait())
            out: list[bytes] = []
            finished = False
            for item in items:
                if type(item) is bytes:
                    if not received:
                        recorder.arrived()
                    received.append(item)
                    if not (hide_usage and _usage_only(item)):
                        out.append(b"data: " + item + b"\n\n")
                elif item is _TICK:
                    out.append(_KEEPALIVE)
                elif item is _END:
                    out.append(_DONE)
                    finished = True
                    break
                elif item is _DISCONNECT:
                    recorder.fail(499, "the client disconnected before the stream ended")
                    return
                elif isinstance(item, UpstreamError):
                    status, payload = upstream_error_reply(item)
                    recorder.fail(status, str(item))
                    if not started and not out:
                        await send_json(send, status, payload)
                        return
                    out.append(b"event: error\ndata: " + payload + b"\n\n" + _DONE)
                    finished = True
                    break
            if not started and out:
                started = True
                await send(_SSE_START)
            if out:
                body = out[0] if len(out) == 1 else b"".join(out)
                await send({"type": "http.response.body", "body": body, "more_body": not finished})
            if finished:
                return
    finally:
        recorder.answered()
        for payload in received:
            recorder.chunk(payload)
        pump.stop()
        if not pump.ended:  # left early: stop the upstream call
            reader.cancel()
        watcher.cancel()  # past [DONE] the reader only tidies up its connection: let it
        await asyncio.gather(reader, watcher, return_exceptions=True)


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
    if b'"usage"' not in payload:  # cheap: most chunks carry no usage
        return False
    try:
        chunk: object = json.loads(payload)
    except ValueError:
        return False
    return isinstance(chunk, dict) and "usage" in chunk and not chunk.get("choices")


class _Pump:
    """Moves upstream payloads into the queue, and ticks when the upstream stays quiet."""

    def __init__(self, queue: asyncio.Queue[object], interval: float) -> None:
        self._queue = queue
        self._interval = interval
        self._active = False
        self.ended = False
        self._loop = asyncio.get_running_loop()
        self._timer = self._loop.call_later(interval, self._tick)

    def _tick(self) -> None:
        if not self._active:
            self._queue.put_nowait(_TICK)
        self._active = False
        self._timer = self._loop.call_later(self._interval, self._tick)

    def stop(self) -> None:
        self._timer.cancel()

    def _finish(self, last: object) -> None:
        if not self.ended:
            self.ended = True
            self._queue.put_nowait(last)

    async def read(self, payloads: AsyncIterator[bytes]) -> None:
        try:
            async for payload in payloads:
                if self.ended:
                    continue
                if payload == b"[DONE]":  # the end, though the iterator may still tidy up
                    self._finish(_END)
                    continue
                self._active = True
                self._queue.put_nowait(payload)
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


async def _watch_disconnect(receive: Receive, queue: asyncio.Queue[object]) -> None:
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            queue.put_nowait(_DISCONNECT)
            return
