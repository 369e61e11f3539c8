"""ASGI middleware in front of every route: optional bearer auth and a request-size cap.

Auth compares ``Authorization: Bearer <key>`` in constant time on every path (``/health``
and ``/docs`` included) and answers ``401 {"detail": "unauthorized"}``. Bodies larger than
the cap are refused with 413 before they are read in full.
"""

from __future__ import annotations

import hmac
from collections.abc import Sequence

from osmosis_ai.errors import OsmosisError
from osmosis_ai.rollout.asgi import JSON_ENCODER, ASGIApp, Message, Receive, Scope, Send, send_body


async def _send_detail(
    send: Send, status: int, detail: str, headers: Sequence[tuple[bytes, bytes]] = ()
) -> None:
    await send_body(send, status, JSON_ENCODER.encode({"detail": detail}).encode(), headers)


class _TooLargeError(OsmosisError):
    pass


class GuardMiddleware:
    """Bearer auth (when ``api_key`` is set) and a ``max_body_bytes`` cap."""

    def __init__(self, app: ASGIApp, *, api_key: str | None, max_body_bytes: int) -> None:
        self.app = app
        self.expected = None if api_key is None else f"Bearer {api_key}".encode()
        self.max_body_bytes = max_body_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length: int | None = None
        authorization = b""
        chunked = False
        for name, value in scope["headers"]:
            if name == b"authorization":
                authorization = value
            elif name == b"content-length":
                try:
                    length = int(value)
                except ValueError:
                    length = None
            elif name == b"transfer-encoding":
                chunked = True
        if self.expected is not None and not hmac.compare_digest(authorization, self.expected):
            await _send_detail(send, 401, "unauthorized", [(b"www-authenticate", b"Bearer")])
            return
        if length is not None and length > self.max_body_bytes:
            await _send_detail(send, 413, self._too_large_message(length))
            return
        if length is not None or not chunked:  # a known length, or no body at all
            await self.app(scope, receive, send)
            return
        await self._guard_stream(scope, receive, send)

    async def _guard_stream(self, scope: Scope, receive: Receive, send: Send) -> None:
        received = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > self.max_body_bytes:
                    raise _TooLargeError
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except _TooLargeError:
            if not started:
                await _send_detail(send, 413, self._too_large_message(received))

    def _too_large_message(self, size: int) -> str:
        return (
            f"request body of {size} bytes exceeds the {self.max_body_bytes}-byte limit; "
            "send a smaller body or raise create_rollout_server(max_body_bytes=...)"
        )
