"""The raw ASGI plumbing of the proxy: body reading, JSON and OpenAI-style error answers.

Kept framework-free on purpose: the proxy sits on every model call, and a plain ASGI
callable served by uvicorn costs less per request than a routing framework.
"""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from osmosis_ai.controller.errors import (
    UpstreamConnectionError,
    UpstreamError,
    UpstreamRequestError,
)

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
}


def dumps(payload: object) -> bytes:
    return json.dumps(payload, separators=(",", ":")).encode()


def error_body(message: str, kind: str, code: str | None) -> bytes:
    """An OpenAI-style error body: ``{"error": {"message", "type", "code"}}``."""
    return dumps({"error": {"message": message, "type": kind, "code": code}})


def refused(
    message: str, *, status: int, kind: str, url: str, context: str | None = None
) -> UpstreamRequestError:
    """An upstream's refusal of one call, carrying the OpenAI-style error body it answers
    with; ``context`` (what refused) prefixes the exception's text, not the body's."""
    return UpstreamRequestError(
        message if context is None else f"{context}: {message}",
        url=url,
        status_code=status,
        body=error_body(message, kind, None),
        provider_message=message,
    )


def upstream_error_reply(exc: UpstreamError) -> tuple[int, bytes]:
    """The upstream's own status and error body, or 502 with a body naming the upstream."""
    if exc.status_code is not None and exc.status_code >= 400:
        try:
            parsed: object = json.loads(exc.body)
        except ValueError:
            parsed = None
        if isinstance(parsed, dict) and "error" in parsed:
            return exc.status_code, exc.body
        return exc.status_code, error_body(str(exc), "upstream_error", None)
    code = "upstream_unreachable" if isinstance(exc, UpstreamConnectionError) else "upstream_error"
    return 502, error_body(str(exc), "upstream_error", code)


async def read_body(receive: Receive, limit: int) -> bytes | None:
    """The whole request body, or ``None`` when it is over ``limit`` bytes."""
    message = await receive()
    body: bytes = message.get("body", b"")
    if not message.get("more_body"):
        return body if len(body) <= limit else None
    chunks = [body]
    size = len(body)
    while message.get("more_body"):
        message = await receive()
        chunk: bytes = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


async def send_json(send: Send, status: int, body: bytes) -> None:
    headers = [(b"content-type", b"application/json"), (b"content-length", b"%d" % len(body))]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body})


async def send_error(send: Send, status: int, message: str, code: str | None = None) -> None:
    await send_json(send, status, error_body(message, _ERROR_TYPES[status], code))


async def lifespan(receive: Receive, send: Send) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return
