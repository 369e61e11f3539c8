"""The local policy as its own OpenAI-compatible HTTP app (raw ASGI, like the proxy):
``/v1/chat/completions``, ``/v1/completions``, ``/v1/models``, ``POST /weights`` (a raw
safetensors body; ``?version=N`` or the ``x-policy-version`` header sets the new version,
else it goes up by one) and ``GET /health``. Serve it on 127.0.0.1 only.

Chat requests wait on the event loop, not a thread each, so those that come together are
generated in one batch.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any, TypeVar
from urllib.parse import parse_qs

from osmosis_ai.controller.asgi import dumps, error_body
from osmosis_ai.errors import OsmosisError, UsageError
from osmosis_ai.rollout.asgi import (
    SSE_HEADERS,
    Receive,
    Scope,
    Send,
    lifespan,
    read_body,
    send_body,
)

if TYPE_CHECKING:
    from osmosis_ai.controller.policy.engine import LocalPolicy

DEFAULT_MAX_REQUEST_BYTES = 64 * 1024 * 1024
DEFAULT_MAX_WEIGHTS_BYTES = 16 * 1024**3
_T = TypeVar("_T")
_ROUTES = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/models": "GET",
    "/weights": "POST",
    "/health": "GET",
}


class _HTTPError(OsmosisError):
    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status = status
        self.kind = kind


class PolicyApp:
    """The ASGI app of :func:`create_policy_app`. Generation and weight loads run in
    worker threads; the policy batches the requests that wait together."""

    def __init__(
        self,
        policy: LocalPolicy,
        *,
        max_request_bytes: int = DEFAULT_MAX_REQUEST_BYTES,
        max_weights_bytes: int = DEFAULT_MAX_WEIGHTS_BYTES,
    ) -> None:
        self.policy = policy
        self.max_request_bytes = max_request_bytes
        self.max_weights_bytes = max_weights_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        path: str = scope["path"].rstrip("/")
        method: str = scope["method"]
        try:
            allowed = _ROUTES.get(path)
            if allowed is None:
                raise _HTTPError(404, f"no route for {method} {path}", "not_found_error")
            if method != allowed:
                raise _HTTPError(405, f"method {method} not allowed on {path}; use {allowed}")
            if path == "/v1/models":
                await send_body(send, 200, dumps(self._models()))
            elif path == "/health":
                await send_body(send, 200, dumps(self.policy.health()))
            elif path == "/weights":
                await self._weights(scope, receive, send)
            else:
                await self._generate(path, receive, send)
        except _HTTPError as exc:
            await send_body(send, exc.status, error_body(str(exc), exc.kind, None))

    def _models(self) -> dict[str, Any]:
        card = {"id": self.policy.name, "object": "model", "created": 0, "owned_by": "osmosis"}
        return {"object": "list", "data": [card]}

    async def _generate(self, path: str, receive: Receive, send: Send) -> None:
        raw = await read_body(receive, self.max_request_bytes)
        if raw is None:
            raise _HTTPError(413, f"request body is over {self.max_request_bytes} bytes")
        try:
            body: object = json.loads(raw)
        except ValueError as exc:
            raise _HTTPError(400, f"request body is not valid JSON: {exc}") from exc
        if not isinstance(body, dict):
            raise _HTTPError(400, "request body must be a JSON object")
        request: dict[str, Any] = body
        stream = bool(request.get("stream"))
        if path == "/v1/completions":
            answer = await _run(self.policy.complete, request)
            chunks = [{**answer, "object": "text_completion"}] if stream else None
        elif stream:
            answer, chunks = None, await _mapped(self.policy.achat_chunks(request))
        else:
            answer, chunks = await _mapped(self.policy.achat(request)), None
        if chunks is None:
            await send_body(send, 200, dumps(answer))
            return
        payload = b"".join(b"data: " + dumps(c) + b"\n\n" for c in chunks)
        await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
        await send({"type": "http.response.body", "body": payload + b"data: [DONE]\n\n"})

    async def _weights(self, scope: Scope, receive: Receive, send: Send) -> None:
        version = _requested_version(scope)
        data = await read_body(receive, self.max_weights_bytes)
        if data is None:
            raise _HTTPError(413, f"weights are over {self.max_weights_bytes} bytes")
        if not data:
            raise _HTTPError(400, "POST /weights needs a safetensors file as the body")
        loaded = await _run(self.policy.load_safetensors, data, version)
        await send_body(send, 200, dumps({"policy_version": loaded}))


def create_policy_app(policy: LocalPolicy, **options: Any) -> PolicyApp:
    """The OpenAI-compatible ASGI app of ``policy`` (options: ``max_request_bytes``,
    ``max_weights_bytes``)."""
    return PolicyApp(policy, **options)


async def _run(method: Callable[..., _T], *args: Any) -> _T:
    return await _mapped(asyncio.to_thread(method, *args))


async def _mapped(work: Awaitable[_T]) -> _T:
    try:
        return await work
    except UsageError as exc:  # PolicyRequestError, bad weights: the caller's fault
        raise _HTTPError(400, str(exc)) from exc
    except RuntimeError as exc:  # torch failures (out of memory, device errors)
        raise _HTTPError(500, f"{type(exc).__name__}: {exc}", "server_error") from exc


def _requested_version(scope: Scope) -> int | None:
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"))
    value: str | None = query["version"][-1] if "version" in query else None
    for name, header in scope["headers"]:
        if name == b"x-policy-version":
            value = header.decode("latin-1")
    if value is None:
        return None
    try:
        return int(value)
    except ValueError as exc:
        raise _HTTPError(400, f"policy version {value!r} is not an integer") from exc
