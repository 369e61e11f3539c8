"""What the platform refuses before any route runs: oversized bodies and header floods, and
callers of unauthenticated routes that ask too often.

:class:`RequestLimitMiddleware` answers before authentication and parsing:

* a body longer than its path's cap is 413 ``PAYLOAD_TOO_LARGE``. A ``Content-Length`` over
  the cap is answered at once, unread; a chunked body is counted as it streams and cut where
  it passes the cap (the route sees a disconnect, the client the 413). The cap is the
  server's ``max_body_bytes`` (``--max-body-bytes``, default 1 MiB) for the API and the
  dashboard, :data:`INFERENCE_BODY_BYTES` for the OpenAI-compatible ``/v1`` routes, and none
  for ``/objects``, whose signed URLs carry their own (the declared size);
* more than :data:`MAX_HEADERS` header lines is 431. Their total size is bounded earlier, by
  the HTTP parser the server is started with (:data:`MAX_HEADER_BYTES`).

A refusal closes the connection (``Connection: close``), so the rest of a refused body is
never read. :class:`RateLimiter` keeps a sliding window of recent calls per client address.
"""

from __future__ import annotations

import json
import math
import threading
import time
from collections import deque
from collections.abc import Callable

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.settings import DEFAULT_MAX_BODY_BYTES

INFERENCE_BODY_BYTES = 64 * 1024 * 1024  # a long prompt with its chat history
MAX_HEADERS = 100
MAX_HEADER_BYTES = 64 * 1024  # the request line and every header together
UNCAPPED_PREFIXES = ("/objects/",)  # signed uploads: the URL's signed size is the cap
INFERENCE_PREFIX = "/v1/"


class PayloadTooLargeError(PlatformError):
    status_code = 413
    default_code = "PAYLOAD_TOO_LARGE"


class HeadersTooLargeError(PlatformError):
    status_code = 431
    default_code = "HEADERS_TOO_LARGE"


class RateLimitedError(PlatformError):
    """Too many calls from one address; ``retry_after`` (seconds) goes out as ``Retry-After``."""

    status_code = 429
    default_code = "RATE_LIMITED"

    def __init__(self, message: str, *, retry_after: int) -> None:
        super().__init__(message, details={"retry_after": retry_after})
        self.retry_after = retry_after


def body_cap(path: str, max_body_bytes: int) -> int | None:
    """The most body bytes a request to ``path`` may send; ``None`` when its route caps it."""
    if path.startswith(UNCAPPED_PREFIXES):
        return None
    if path.startswith(INFERENCE_PREFIX):
        return max(INFERENCE_BODY_BYTES, max_body_bytes)
    return max_body_bytes


def _too_large(cap: int, what: str) -> PayloadTooLargeError:
    return PayloadTooLargeError(
        f"The request body {what} is over this server's limit of {cap} bytes. Send less, or "
        "start the server with a larger --max-body-bytes; files go through upload URLs.",
        details={"max_body_bytes": cap},
    )


async def _refuse(send: Send, error: PlatformError) -> None:
    body = json.dumps(error.envelope()).encode()
    await send(
        {
            "type": "http.response.start",
            "status": error.status_code,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode()),
                (b"connection", b"close"),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class RequestLimitMiddleware:
    """Refuses oversized bodies (413) and header floods (431) before the app sees them."""

    def __init__(self, app: ASGIApp, *, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        self.app = app
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers: list[tuple[bytes, bytes]] = scope.get("headers", [])
        if len(headers) > MAX_HEADERS:
            await _refuse(
                send,
                HeadersTooLargeError(
                    f"The request has {len(headers)} headers; this server takes at most "
                    f"{MAX_HEADERS}.",
                ),
            )
            return
        cap = body_cap(str(scope.get("path", "")), self.max_body_bytes)
        if cap is None:
            await self.app(scope, receive, send)
            return
        for name, value in headers:
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0  # the HTTP parser refuses these before here
                if declared > cap:
                    await _refuse(send, _too_large(cap, f"of {declared} bytes (Content-Length)"))
                    return
        await _CappedRequest(self.app, cap).run(scope, receive, send)


class _CappedRequest:
    """One request whose body is counted as it arrives and cut at ``cap`` bytes."""

    def __init__(self, app: ASGIApp, cap: int) -> None:
        self.app = app
        self.cap = cap
        self.received = 0
        self.started = False  # the app began its answer
        self.refused = False  # this request was answered 413 here

    async def run(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def counted_receive() -> Message:
            if self.refused:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                self.received += len(message.get("body", b""))
                if self.received > self.cap:
                    if not self.started:
                        self.refused = True
                        await _refuse(send, _too_large(self.cap, "sent in chunks"))
                    # The route sees the client leave; its answer, if any, is dropped.
                    return {"type": "http.disconnect"}
            return message

        async def guarded_send(message: Message) -> None:
            if self.refused:
                return
            if message["type"] == "http.response.start":
                self.started = True
            await send(message)

        try:
            await self.app(scope, counted_receive, guarded_send)
        except Exception:
            if not self.refused:
                raise
            # A route that failed on the cut body has nothing to tell: the 413 was sent.


class RateLimiter:
    """At most ``limit`` calls per ``window_s`` seconds from one key (a client address).

    The window slides: a call is allowed when fewer than ``limit`` calls were allowed in the
    last ``window_s`` seconds. Refusals are not counted, so a client that waits the
    ``Retry-After`` it was given gets through. Keys whose calls all aged out are dropped, and
    a table past ``max_keys`` starts over rather than grow without bound.
    """

    def __init__(
        self,
        limit: int,
        window_s: float,
        *,
        clock: Callable[[], float] = time.monotonic,
        max_keys: int = 10_000,
    ) -> None:
        if limit < 1 or window_s <= 0:
            raise ValueError("a rate limit needs limit >= 1 and a positive window")
        self.limit = limit
        self.window_s = window_s
        self._clock = clock
        self._max_keys = max_keys
        self._calls: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def check(self, key: str, what: str) -> None:
        """Count a call from ``key``; :class:`RateLimitedError` when it is one too many."""
        now = self._clock()
        with self._lock:
            calls = self._calls.get(key)
            if calls is None:
                if len(self._calls) >= self._max_keys:
                    self._prune(now)
                calls = self._calls[key] = deque()
            while calls and calls[0] <= now - self.window_s:
                calls.popleft()
            if len(calls) >= self.limit:
                wait = max(1, math.ceil(calls[0] + self.window_s - now))
                raise RateLimitedError(
                    f"Too many {what} from {key}: at most {self.limit} in "
                    f"{self.window_s:g} s. Try again in {wait} s.",
                    retry_after=wait,
                )
            calls.append(now)

    def _prune(self, now: float) -> None:
        for key in [k for k, v in self._calls.items() if not v or v[-1] <= now - self.window_s]:
            del self._calls[key]
        if len(self._calls) >= self._max_keys:
            self._calls.clear()
