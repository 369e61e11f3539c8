"""Errors of the controller: the model upstream failing, as the provider reported it.

``OsmosisError`` > ``ControllerError`` > ``UpstreamError`` > ``UpstreamAuthError`` (401/403),
``UpstreamNotFoundError`` (404), ``UpstreamConnectionError`` (no HTTP answer: refused, DNS,
TLS, timeout) > ``UpstreamTimeoutError`` (no progress within the model call deadline),
``UpstreamRequestError`` (any other error status, or not a completion);
``ControllerError`` > ``WeightSyncTimeoutError`` (the local policy's weights were not in
place within the weight sync deadline); ``ControllerError`` > ``DialectError`` (in
``dialect.py``: a Responses or Messages request with no chat-completions equivalent)."""

from __future__ import annotations

import json

from osmosis_ai.errors import DeadlineError, OsmosisError

_MESSAGE_LIMIT = 1000


class ControllerError(OsmosisError):
    """Root of the errors the controller raises at run time."""


class UpstreamError(ControllerError):
    """The upstream model answered with an error, or did not answer.

    ``status_code`` and ``body`` are the provider's HTTP status and raw body (``None`` and
    ``b""`` when there was no HTTP answer); ``provider_message`` is its own error text.
    """

    def __init__(
        self,
        message: str,
        *,
        url: str,
        status_code: int | None = None,
        body: bytes = b"",
        provider_message: str | None = None,
    ) -> None:
        super().__init__(message)
        self.url = url
        self.status_code = status_code
        self.body = body
        self.provider_message = provider_message


class UpstreamAuthError(UpstreamError):
    """The upstream rejected the API key (HTTP 401 or 403)."""


class UpstreamNotFoundError(UpstreamError):
    """The upstream does not know the model or the path (HTTP 404)."""


class UpstreamConnectionError(UpstreamError):
    """The upstream could not be reached: refused, DNS, TLS, or timed out."""


class UpstreamTimeoutError(UpstreamConnectionError, DeadlineError):
    """The upstream made no progress (connect, send, or answer bytes) within the model call
    deadline (``OSMOSIS_MODEL_TIMEOUT_S``)."""


class UpstreamRequestError(UpstreamError):
    """The upstream answered another error status, or a body that is not a chat completion."""


def provider_message(body: bytes) -> str:
    """The provider's own error text from an error body: OpenAI-style, ``detail``, or raw."""
    text = body.decode("utf-8", "replace").strip()
    try:
        parsed: object = json.loads(text)
    except ValueError:
        return text[:_MESSAGE_LIMIT] or "(empty body)"
    found: object = parsed
    if isinstance(parsed, dict):
        found = parsed.get("error", parsed.get("detail", parsed.get("message", parsed)))
        if isinstance(found, dict):
            found = found.get("message", found)
    message = found if isinstance(found, str) else json.dumps(found)
    return message[:_MESSAGE_LIMIT]


def error_for_status(status_code: int, body: bytes, *, url: str, model: str) -> UpstreamError:
    """The :class:`UpstreamError` subclass for an HTTP error answer, with the real message."""
    said = provider_message(body)
    if status_code in (401, 403):
        kind: type[UpstreamError] = UpstreamAuthError
        hint = "check the API key for this provider"
    elif status_code == 404:
        kind = UpstreamNotFoundError
        hint = f"check the model name {model!r} and the base URL"
    else:
        kind = UpstreamRequestError
        hint = "see the provider's message"
    return kind(
        f"model upstream {url} answered HTTP {status_code}: {said} ({hint})",
        url=url,
        status_code=status_code,
        body=body,
        provider_message=said,
    )


class WeightSyncTimeoutError(ControllerError, DeadlineError):
    """The served policy's weights were not in place in time: the trainer did not ask for
    the next step while the local policy held that step's model calls, or a generation
    batch kept the model from the optimizer's update (``OSMOSIS_WEIGHT_SYNC_TIMEOUT_S``)."""
