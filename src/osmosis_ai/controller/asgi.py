"""The controller's OpenAI-style answers over the shared ASGI plumbing of
:mod:`osmosis_ai.rollout.asgi`: compact JSON, error bodies, and an upstream's refusal.

Kept framework-free on purpose: the proxy sits on every model call, and a plain ASGI
callable served by uvicorn costs less per request than a routing framework.
"""

from __future__ import annotations

import json

from osmosis_ai.controller.errors import (
    UpstreamConnectionError,
    UpstreamError,
    UpstreamRequestError,
)
from osmosis_ai.rollout.asgi import JSON_ENCODER

_ERROR_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    422: "invalid_request_error",
}


def dumps(payload: object) -> bytes:
    """``payload`` as the compact JSON body of :data:`~osmosis_ai.rollout.asgi.JSON_ENCODER`."""
    return JSON_ENCODER.encode(payload).encode()


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


def error_reply(status: int, message: str, code: str | None = None) -> tuple[int, bytes]:
    """The status and OpenAI-style error body of an answer the proxy gives on its own."""
    return status, error_body(message, _ERROR_TYPES[status], code)
