"""Raw ASGI plumbing shared by our servers: the callable types, body reading, whole answers,
their compact JSON, server-sent-event headers and the lifespan handshake.

Plain functions on ``receive`` and ``send``, importing no framework: the rollout server's
guard and routes, the controller's proxy and listener, the local policy server and the
scripted model server all sit on hot request paths where a routing framework costs more
than it gives, and some processes that use them never load FastAPI.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping, Sequence
from typing import Any

__all__ = [
    "JSON_ENCODER",
    "SSE_HEADERS",
    "ASGIApp",
    "Message",
    "Receive",
    "Scope",
    "Send",
    "lifespan",
    "read_body",
    "send_body",
]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

SSE_HEADERS: list[tuple[bytes, bytes]] = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # proxies in front must pass each event on as it comes
]
"""The response headers of a server-sent-event stream."""

JSON_ENCODER = json.JSONEncoder(separators=(",", ":"), ensure_ascii=False)
"""Compact JSON, non-ASCII text as UTF-8: ``JSON_ENCODER.encode(value).encode()`` is a body
our servers answer with, and the requests our clients send to them. One encoder made once,
as ``json.dumps`` with options builds a new one on every call."""


async def read_body(receive: Receive, limit: int | None = None) -> bytes | None:
    """The whole request body; ``None`` when the client hung up before its end, or when
    the body runs past ``limit`` bytes (then the rest is left unread)."""
    message = await receive()
    if message["type"] == "http.disconnect":
        return None
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body if limit is None or len(body) <= limit else None
    chunks = [body]
    size = len(body)
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return None
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if limit is not None and size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body"):
            return b"".join(chunks)


async def send_body(
    send: Send,
    status: int,
    body: bytes,
    headers: Sequence[tuple[bytes, bytes]] = (),
    *,
    content_type: bytes = b"application/json",
) -> None:
    """Answer with the whole ``body`` at once: its content type and length, then ``headers``."""
    head = [(b"content-type", content_type), (b"content-length", b"%d" % len(body)), *headers]
    await send({"type": "http.response.start", "status": status, "headers": head})
    await send({"type": "http.response.body", "body": body})


async def lifespan(receive: Receive, send: Send) -> None:
    """Acknowledge a ``lifespan`` scope's start-up and shut-down; nothing to set up."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
