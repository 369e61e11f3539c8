"""The policy proxy: a rollout-scoped model endpoint in front of the upstream.

Agents call ``POST /v1/rollouts/<rollout_id>/chat/completions``; the proxy checks the run's
key, forwards the whole body with ``model`` replaced, passes the answer through (JSON or
SSE, chunk by chunk) and records each call. The same rollout path also serves the OpenAI
Responses API (``…/responses``) and the Anthropic Messages API (``…/messages``, or
``…/v1/messages`` as Anthropic clients append it): each :class:`Dialect` maps the request
onto chat completions and the answer back, so every call is sampled and recorded the same
way. ``…/v1/messages/count_tokens`` counts a Messages request's prompt tokens without a model
call (nothing is recorded). A raw ASGI app: it sits on every model call.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import secrets
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, NamedTuple
from urllib.parse import quote, unquote

from osmosis_ai.controller.asgi import dumps, error_reply, upstream_error_reply
from osmosis_ai.controller.calls import CallRecord, CallRecorder, build_report
from osmosis_ai.controller.dialect import Dialect, DialectError
from osmosis_ai.controller.dialects import DIALECTS, MessagesDialect
from osmosis_ai.controller.dialects.messages import COUNT_TOKENS, count_answer, estimate_tokens
from osmosis_ai.controller.errors import UpstreamError
from osmosis_ai.controller.relay import ask_usage, relay_stream
from osmosis_ai.controller.upstream import Upstream
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.asgi import Receive, Scope, Send, lifespan, read_body, send_body

if TYPE_CHECKING:
    from osmosis_ai.rollout.trajectory.report import TrajectoryReport

DEFAULT_MAX_BODY_BYTES = 64 * 1024 * 1024
_PREFIX = "/v1/rollouts/"
_CHAT = "/chat/completions"
_MODELS = "/models"
_DIALECT_ROUTES = (  # the longer suffix first
    ("/v1/messages", DIALECTS["messages"]),
    ("/messages", DIALECTS["messages"]),
    ("/responses", DIALECTS["responses"]),
)


@dataclass(slots=True)
class _Rollout:
    rollout_id: str
    records: list[CallRecord] = field(default_factory=list)
    next_index: int = 0
    total_tokens: int = 0
    upstream_fields: dict[str, Any] | None = None  # merged into each body sent upstream


class _Route(NamedTuple):
    rollout: _Rollout
    dialect: Dialect | None  # None: chat completions
    counting: bool = False  # Messages token counting, not a model call


_COUNTING = MessagesDialect()


class PolicyProxy:
    """Serves each registered rollout ``<base>/v1/rollouts/<id>`` in front of ``upstream``.

    ``token`` is the bearer agents must send (random when ``None``; read it back from
    :attr:`token`; Anthropic clients may send it as ``x-api-key``). ``request_token_data``
    asks the upstream for ``logprobs`` and ``return_token_ids`` unless the caller set them.
    Streams get ``: keep-alive`` comments after ``keepalive_interval`` seconds without
    upstream data. With ``stream_usage`` a stream asks for its usage chunk; if the caller
    did not, that chunk is recorded, not sent.
    Token counting asks ``upstream.count_tokens(chat_body)`` (an ``int``, or ``None`` when
    it cannot count) where the upstream has that method, as the local policy does (its chat
    template and tokenizer); otherwise, or on ``None``, it answers an estimate
    (:func:`~osmosis_ai.controller.dialects.messages.estimate_tokens`).
    Serve the app on the event loop the upstream is used on.
    """

    def __init__(
        self,
        upstream: Upstream,
        *,
        token: str | None = None,
        request_token_data: bool = False,
        keepalive_interval: float = 15.0,
        stream_usage: bool = True,
        max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
    ) -> None:
        if not keepalive_interval > 0:
            raise UsageError(f"keepalive_interval={keepalive_interval!r}: give seconds > 0")
        self.upstream = upstream
        self.token = token if token is not None else secrets.token_urlsafe(32)
        if not self.token:
            raise UsageError("token='' would accept no caller: pass None for a random token")
        self.request_token_data = request_token_data
        self.keepalive_interval = keepalive_interval
        self.stream_usage = stream_usage
        self.max_body_bytes = max_body_bytes
        self._auth = f"Bearer {self.token}".encode()
        self._also: bytes | None = None
        self._rollouts: dict[str, _Rollout] = {}
        models = {
            "object": "list",
            "data": [
                {"id": name, "object": "model", "created": 0, "owned_by": "osmosis"}
                for name in dict.fromkeys((upstream.model, "osmosis-rollout"))
            ],
        }
        self._models: tuple[int, bytes] = (200, dumps(models))

    # -- rollouts and records --------------------------------------------------------------

    @property
    def app(self) -> PolicyProxy:
        """The ASGI app (this instance)."""
        return self

    def register(
        self, rollout_id: str, *, upstream_fields: Mapping[str, Any] | None = None
    ) -> None:
        """Open the endpoint of ``rollout_id`` (a fresh, single path segment).
        ``upstream_fields`` are merged into every request body of the rollout the upstream
        gets (model calls and token counts), over the agent's own fields."""
        if not rollout_id or "/" in rollout_id:
            raise UsageError(f"rollout id {rollout_id!r} must be one non-empty path segment")
        if rollout_id in self._rollouts:
            raise UsageError(f"rollout id {rollout_id!r} is already registered: discard it first")
        fields = dict(upstream_fields) if upstream_fields else None
        self._rollouts[rollout_id] = _Rollout(rollout_id, upstream_fields=fields)

    def discard(self, rollout_id: str) -> list[CallRecord]:
        """Close the endpoint of ``rollout_id``; returns its remaining records (idempotent)."""
        rollout = self._rollouts.pop(rollout_id, None)
        return sorted(rollout.records, key=_by_index) if rollout else []

    def chat_base_url(self, rollout_id: str, base: str) -> str:
        """The ``chat_completions_url`` to hand a rollout server: ``<base>/v1/rollouts/<id>``."""
        return f"{base.rstrip('/')}{_PREFIX}{quote(rollout_id, safe='')}"

    def calls(self, rollout_id: str) -> list[CallRecord]:
        """The finished calls of ``rollout_id`` so far, in call order."""
        return sorted(self._rollout(rollout_id).records, key=_by_index)

    def pop_calls(self, rollout_id: str) -> list[CallRecord]:
        """:meth:`calls`, then forget them (the token total is kept)."""
        rollout = self._rollout(rollout_id)
        records, rollout.records = rollout.records, []
        return sorted(records, key=_by_index)

    def total_tokens(self, rollout_id: str) -> int:
        """Tokens the upstream reported for every call of ``rollout_id``."""
        return self._rollout(rollout_id).total_tokens

    def trajectory_report(self, rollout_id: str) -> TrajectoryReport:
        """The ``trajectory`` of a completion-callback ack (reference §2.8)."""
        return build_report(rollout_id, self.upstream.model, self.calls(rollout_id))

    def _rollout(self, rollout_id: str) -> _Rollout:
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            raise UsageError(f"rollout id {rollout_id!r} is not registered with this proxy")
        return rollout

    def _keep(self, rollout: _Rollout, record: CallRecord) -> None:
        rollout.records.append(record)
        if record.usage is not None:
            rollout.total_tokens += record.usage.total

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            await self._http(scope, receive, send)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive, send: Send) -> None:
        # The helpers return a (status, body) answer or what to go on with: no extra awaits.
        route = self._route(scope)
        if not isinstance(route, _Route):
            await send_body(send, *route)
            return
        rollout, dialect, counting = route
        body = self._request(await read_body(receive, self.max_body_bytes), dialect)
        if isinstance(body, tuple):
            await send_body(send, *body)
            return
        if counting:
            await send_body(send, *await self._count(body, rollout.upstream_fields))
            return
        asked, body = body, self._translate(body, dialect)
        if isinstance(body, tuple):
            await send_body(send, *body)
            return
        if rollout.upstream_fields:
            body.update(rollout.upstream_fields)
        index, rollout.next_index = rollout.next_index, rollout.next_index + 1
        recorder = CallRecorder(rollout.rollout_id, index, stream=bool(body.get("stream")))
        try:
            if recorder.stream:
                hide_usage = dialect is None and self.stream_usage and ask_usage(body)
                await relay_stream(
                    self.upstream.stream(body),
                    recorder,
                    receive,
                    send,
                    keepalive_interval=self.keepalive_interval,
                    hide_usage=hide_usage,
                    writer=None if dialect is None else dialect.writer(asked),
                )
            else:
                await self._complete(body, recorder, send, dialect, asked)
        except asyncio.CancelledError:
            recorder.fail(499, "the call was cancelled (client gone or server shutting down)")
            raise
        finally:
            self._keep(rollout, recorder.finish())

    def _route(self, scope: Scope) -> _Route | tuple[int, bytes]:
        """The rollout a model call is for and the API it speaks (``None``: chat
        completions), or the whole answer: the model list, or a refusal (unknown route,
        wrong key, bad or unknown rollout id, wrong method) in that API's error shape."""
        path: str = scope["path"]
        method: str = scope["method"]
        if not path.startswith(_PREFIX):
            return error_reply(404, f"no route for {method} {path}", "not_found")
        raw: bytes | None = scope.get("raw_path")
        rest = raw.decode("latin-1").partition("?")[0] if raw else path
        rest = rest[len(_PREFIX) :]
        dialect: Dialect | None = None
        segment: str | None = None
        allowed = "POST"
        counting = False
        if rest.endswith(_CHAT):
            segment = rest[: -len(_CHAT)]
        elif rest.endswith(_MODELS):
            segment, allowed = rest[: -len(_MODELS)].removesuffix("/v1"), "GET"
        elif rest.endswith(COUNT_TOKENS):
            segment, dialect = rest[: -len(COUNT_TOKENS)].removesuffix("/v1"), _COUNTING
            counting = True
        else:
            for suffix, candidate in _DIALECT_ROUTES:
                if rest.endswith(suffix):
                    segment, dialect = rest[: -len(suffix)], candidate
                    break
        if not self._authorized(scope["headers"]):
            return _refusal(dialect, 401, "missing or wrong API key for the policy proxy")
        if segment is None:
            return error_reply(404, f"no route for {method} {path}", "not_found")
        if not segment or "/" in segment:
            return _refusal(dialect, 422, f"rollout id in {path!r} must be one path segment")
        rollout_id = unquote(segment)
        rollout = self._rollouts.get(rollout_id)
        if rollout is None:
            return _refusal(dialect, 404, f"unknown rollout {rollout_id!r}", "unknown_rollout")
        if method != allowed:
            return _refusal(dialect, 405, f"method {method} not allowed here; use {allowed}")
        return self._models if allowed == "GET" else _Route(rollout, dialect, counting)

    def _request(
        self, raw_body: bytes | None, dialect: Dialect | None
    ) -> dict[str, Any] | tuple[int, bytes]:
        """The request body, or the answer refusing it."""
        if raw_body is None:
            return _refusal(dialect, 413, f"request body is over {self.max_body_bytes} bytes")
        try:
            body: object = json.loads(raw_body)
        except ValueError as exc:
            return _refusal(dialect, 400, f"request body is not valid JSON: {exc}")
        if not isinstance(body, dict):
            return _refusal(
                dialect, 400, f"request body must be a JSON object, not {type(body).__name__}"
            )
        return body

    def _translate(
        self, body: dict[str, Any], dialect: Dialect | None
    ) -> dict[str, Any] | tuple[int, bytes]:
        """The chat request to forward for ``body``, or the answer refusing it."""
        if dialect is not None:
            try:
                body = dialect.to_chat(body)
            except DialectError as exc:
                return exc.status, dialect.error_body(exc.status, exc.message)
        if self.request_token_data:
            body.setdefault("logprobs", True)
            body.setdefault("return_token_ids", True)
        return body

    async def _count(
        self, body: dict[str, Any], upstream_fields: dict[str, Any] | None
    ) -> tuple[int, bytes]:
        """The answer to a Messages ``count_tokens`` request."""
        try:
            chat = _COUNTING.counting_chat(body)
        except DialectError as exc:
            return exc.status, _COUNTING.error_body(exc.status, exc.message)
        if upstream_fields:
            chat.update(upstream_fields)
        counter = getattr(self.upstream, "count_tokens", None)
        tokens: int | None = None
        if counter is not None:
            try:
                tokens = await counter(chat)
            except UpstreamError as exc:
                status, payload = upstream_error_reply(exc)
                return status, _COUNTING.upstream_error(status, payload)
        return 200, count_answer(estimate_tokens(chat) if tokens is None else tokens)

    def also_accept(self, token: str) -> None:
        """Accept ``token`` as well: the run's callback bearer, which servers of the first
        0.3.0 releases (no ``llm_api_key`` field) hand their agents for model calls."""
        self._also = f"Bearer {token}".encode()

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization":
                return self._accepts(value)
            if name == b"x-api-key":  # how Anthropic clients send their key
                return self._accepts(b"Bearer " + value)
        return False

    def _accepts(self, value: bytes) -> bool:
        main = hmac.compare_digest(value, self._auth)
        also = self._also is not None and hmac.compare_digest(value, self._also)
        return main or also

    async def _complete(
        self,
        body: dict[str, Any],
        recorder: CallRecorder,
        send: Send,
        dialect: Dialect | None = None,
        asked: dict[str, Any] | None = None,
    ) -> None:
        try:
            content = await self.upstream.complete(body)
        except Exception as exc:  # a broken upstream must still answer the agent
            error = exc if isinstance(exc, UpstreamError) else _broken(self.upstream, exc)
            status, payload = upstream_error_reply(error)
            recorder.fail(status, str(error))
            if dialect is not None:
                payload = dialect.upstream_error(status, payload)
            await send_body(send, status, payload)
            return
        if dialect is None:
            await send_body(send, 200, content)
            recorder.body(content)  # after sending: recording never delays the agent
            return
        try:
            completion: Any = json.loads(content)
            answer = dialect.from_chat(asked or {}, completion)
        except (ValueError, TypeError, AttributeError, DialectError) as exc:
            message = f"model upstream {self.upstream.target} answered no chat completion: {exc}"
            recorder.fail(502, message)
            await send_body(send, 502, dialect.error_body(502, message))
            return
        await send_body(send, 200, dumps(answer))
        recorder.completion(completion, content)


def _broken(upstream: Upstream, exc: Exception) -> UpstreamError:
    message = f"model upstream {upstream.target} failed: {type(exc).__name__}: {exc}"
    return UpstreamError(message, url=upstream.target)


def _refusal(
    dialect: Dialect | None, status: int, message: str, code: str | None = None
) -> tuple[int, bytes]:
    """An answer the proxy gives on its own, in the error shape of the caller's API."""
    if dialect is None:
        return error_reply(status, message, code)
    return status, dialect.error_body(status, message, code)


def _by_index(record: CallRecord) -> int:
    return record.index
