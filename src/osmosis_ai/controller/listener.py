"""The callback listener: receives 0.3.0 completion and grader callbacks (reference §2.5).

It owns the receiver rules (bearer, 401/404/422) and the ack contract: the terminal callback
is answered only after the caller's hook (its durable commit) has returned, one hook at a
time per rollout; a failed hook answers 500 so the server's retry can commit.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import unquote

from pydantic import ValidationError

from osmosis_ai.controller.asgi import dumps
from osmosis_ai.controller.errors import ControllerError
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.asgi import Receive, Scope, Send, lifespan, read_body, send_body
from osmosis_ai.rollout.ids import validate_rollout_id
from osmosis_ai.rollout.protocol import GraderCompleteRequest, RolloutCompleteRequest
from osmosis_ai.rollout.status import GraderStatus

__all__ = ["CallbackKind", "CallbackListener", "CallbackResult", "CompletionHook", "TerminalHook"]

logger = logging.getLogger(__name__)

CallbackKind = Literal["completion", "grader"]
DEFAULT_MAX_BODY_BYTES = 32 * 1024 * 1024
ROUTE_PREFIX = "/v1/rollouts/"
_DEFAULT_ACK = {"ok": True}


@dataclass(frozen=True, slots=True)
class CallbackResult:
    """The callbacks of one rollout when its terminal one arrived: the grader callback, or
    the completion callback when no grader callback was expected (``grader`` is ``None``)."""

    rollout_id: str
    completion: RolloutCompleteRequest | None
    grader: GraderCompleteRequest | None


CompletionHook = Callable[[RolloutCompleteRequest], Mapping[str, Any] | None]
"""Called on the first completion callback; a mapping it returns rides on that ack as
``trajectory`` (reference §2.8)."""
TerminalHook = Callable[[CallbackResult], Awaitable[Mapping[str, Any] | None]]
"""Commits the terminal result; its return value is the ack (``None``: ``{"ok": true}``)."""


@dataclass(slots=True)
class _Entry:
    on_terminal: TerminalHook
    on_completion: CompletionHook | None
    expect_grader: bool
    completion: RolloutCompleteRequest | None = None
    bodies: dict[CallbackKind, object] = field(default_factory=dict)
    acks: dict[CallbackKind, bytes] = field(default_factory=dict)
    result: CallbackResult | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    settled: asyncio.Event = field(default_factory=asyncio.Event)

    @property
    def terminal_kind(self) -> CallbackKind:
        return "grader" if self.expect_grader else "completion"


class CallbackListener:
    """Serves ``POST /v1/rollouts/{rollout_id}/completion`` and ``.../grader``.

    Answers, in order: 404 for other paths, 401 without ``Authorization: Bearer <token>``,
    405 for other methods, 422 when the id is not one path segment, 404 when it is not
    registered (or expects no grader callback), 413 for an oversized body, 422 for a
    malformed body, a body ``rollout_id`` differing from the path or a non-terminal status.
    Duplicates get the stored ack. Serve it on the loop the hooks run on.
    """

    def __init__(self, *, token: str, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if not token:
            raise UsageError("CallbackListener needs a non-empty token (the controller bearer)")
        self.token = token
        self.max_body_bytes = max_body_bytes
        self._auth = f"Bearer {token}".encode()
        self._entries: dict[str, _Entry] = {}

    @property
    def app(self) -> CallbackListener:
        """The ASGI app (this instance)."""
        return self

    def register(
        self,
        rollout_id: str,
        *,
        on_terminal: TerminalHook,
        on_completion: CompletionHook | None = None,
        expect_grader: bool = True,
    ) -> None:
        """Accept callbacks for ``rollout_id``. The grader callback is terminal, or the
        completion callback when ``expect_grader`` is false (a grader callback then 404s)."""
        try:
            validate_rollout_id(rollout_id)
        except ValueError as exc:
            raise UsageError(str(exc)) from None
        if rollout_id in self._entries:
            raise UsageError(f"rollout id {rollout_id!r} is already registered: discard it first")
        self._entries[rollout_id] = _Entry(on_terminal, on_completion, expect_grader)

    def discard(self, rollout_id: str) -> None:
        """Stop accepting callbacks for ``rollout_id`` (idempotent); wakes its waiters. A hook
        already running finishes and its callback still gets the ack."""
        entry = self._entries.pop(rollout_id, None)
        if entry is not None:
            entry.settled.set()

    def __contains__(self, rollout_id: object) -> bool:
        return rollout_id in self._entries

    async def wait_terminal(self, rollout_id: str) -> CallbackResult:
        """Wait until the terminal callback of ``rollout_id`` is committed (its hook returned).

        Raises :class:`ControllerError` when the id is discarded first.
        """
        entry = self._entries.get(rollout_id)
        if entry is None:
            raise UsageError(f"rollout id {rollout_id!r} is not registered with this listener")
        await entry.settled.wait()
        if entry.result is None:
            raise ControllerError(
                f"rollout {rollout_id!r} was discarded before its terminal callback was committed"
            )
        return entry.result

    # -- ASGI ------------------------------------------------------------------------------

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            status, body = await self._http(scope, receive)
            await send_body(send, status, body)
        elif scope["type"] == "lifespan":
            await lifespan(receive, send)

    async def _http(self, scope: Scope, receive: Receive) -> tuple[int, bytes]:
        path: str = scope["path"]
        method: str = scope["method"]
        raw: bytes | None = scope.get("raw_path")
        rest = raw.decode("latin-1").partition("?")[0] if raw else path
        rest = rest[len(ROUTE_PREFIX) :] if rest.startswith(ROUTE_PREFIX) else ""
        segment, slash, kind = rest.rpartition("/")
        if not slash or kind not in ("completion", "grader"):
            return _detail(404, f"no route for {method} {path}")
        if not self._authorized(scope["headers"]):
            return _detail(401, "unauthorized")
        if method != "POST":
            return _detail(405, f"method {method} not allowed here; use POST")
        rollout_id = unquote(segment)
        try:
            validate_rollout_id(rollout_id)
        except ValueError as exc:
            return _detail(422, str(exc))
        entry = self._entries.get(rollout_id)
        if entry is None:
            return _detail(404, f"unknown rollout_id {rollout_id!r}")
        callback: CallbackKind = "completion" if kind == "completion" else "grader"
        if callback == "grader" and not entry.expect_grader:
            return _detail(404, f"rollout {rollout_id!r} expects no grader callback")
        raw_body = await read_body(receive, self.max_body_bytes)
        if raw_body is None:
            return _detail(413, f"callback body is over {self.max_body_bytes} bytes")
        try:
            body: object = json.loads(raw_body)
        except ValueError:
            return _detail(422, f"the {callback} callback body is not valid JSON")
        parsed = _parse(callback, rollout_id, body)
        if isinstance(parsed, str):
            return _detail(422, parsed)
        stored = entry.acks.get(callback)
        if stored is not None:
            return 200, self._duplicate(entry, callback, rollout_id, body, stored)
        if callback == entry.terminal_kind:
            return await self._commit(entry, rollout_id, parsed, body)
        assert isinstance(parsed, RolloutCompleteRequest)
        entry.completion = parsed
        entry.bodies[callback] = body
        entry.acks[callback] = ack = dumps(self._completion_ack(entry, rollout_id, parsed))
        return 200, ack

    def _authorized(self, headers: list[tuple[bytes, bytes]]) -> bool:
        for name, value in headers:
            if name == b"authorization":
                return hmac.compare_digest(value, self._auth)
        return False

    def _duplicate(
        self, entry: _Entry, kind: CallbackKind, rollout_id: str, body: object, ack: bytes
    ) -> bytes:
        if body != entry.bodies.get(kind):
            logger.warning("conflicting duplicate %s callback for rollout %s", kind, rollout_id)
        return ack

    def _completion_ack(
        self, entry: _Entry, rollout_id: str, completion: RolloutCompleteRequest
    ) -> dict[str, Any]:
        ack: dict[str, Any] = dict(_DEFAULT_ACK)
        if entry.on_completion is None:
            return ack
        try:
            report = entry.on_completion(completion)
        except Exception:  # a report is optional: never refuse a callback for it
            logger.exception("building the trajectory report of rollout %s failed", rollout_id)
            return ack
        if report is not None:
            ack["trajectory"] = dict(report)
        return ack

    async def _commit(
        self,
        entry: _Entry,
        rollout_id: str,
        parsed: RolloutCompleteRequest | GraderCompleteRequest,
        body: object,
    ) -> tuple[int, bytes]:
        kind = entry.terminal_kind
        async with entry.lock:  # single flight: a concurrent duplicate waits, then gets the ack
            stored = entry.acks.get(kind)
            if stored is not None:
                return 200, self._duplicate(entry, kind, rollout_id, body, stored)
            if isinstance(parsed, RolloutCompleteRequest):
                result = CallbackResult(rollout_id, parsed, None)
                extra = self._completion_ack(entry, rollout_id, parsed)
            else:
                result = CallbackResult(rollout_id, entry.completion, parsed)
                extra = {}
            try:
                answer = await entry.on_terminal(result)
            except Exception as exc:  # the caller's commit failed: stay uncommitted for a retry
                logger.exception(
                    "committing the %s callback of rollout %s failed", kind, rollout_id
                )
                return _detail(
                    500,
                    f"could not record the {kind} callback of rollout {rollout_id!r}: "
                    f"{type(exc).__name__}: {exc}",
                )
            ack = {**extra, **(answer if answer is not None else _DEFAULT_ACK)}
            encoded = _encode_ack(ack, rollout_id)
            entry.bodies[kind] = body
            entry.acks[kind] = encoded
            entry.result = result
            entry.settled.set()
            return 200, encoded


def _parse(
    kind: CallbackKind, rollout_id: str, body: object
) -> RolloutCompleteRequest | GraderCompleteRequest | str:
    """The parsed body, or why it is refused."""
    if not isinstance(body, dict):
        return f"the {kind} callback body must be a JSON object"
    try:
        if kind == "completion":
            parsed: RolloutCompleteRequest | GraderCompleteRequest = (
                RolloutCompleteRequest.model_validate(body)
            )
        else:
            parsed = GraderCompleteRequest.model_validate(body)
    except ValidationError as exc:
        return f"malformed {kind} callback ({exc.error_count()} validation errors): {exc}"
    if parsed.rollout_id is not None and parsed.rollout_id != rollout_id:
        return f"body rollout_id {parsed.rollout_id!r} differs from the URL's {rollout_id!r}"
    if isinstance(parsed, RolloutCompleteRequest):
        terminal = parsed.status.is_terminal
    else:
        terminal = parsed.status in (GraderStatus.SUCCESS, GraderStatus.FAILURE)
    if not terminal:
        return f"{kind} callback status {parsed.status.value!r} is not terminal"
    return parsed


def _encode_ack(ack: Mapping[str, Any], rollout_id: str) -> bytes:
    # The result is committed by now: a bad ack must not turn into a 500 and a second commit.
    try:
        return dumps(ack)
    except (TypeError, ValueError):
        logger.exception("the ack for rollout %s is not JSON; answering the default", rollout_id)
        return dumps(_DEFAULT_ACK)


def _detail(status: int, message: str) -> tuple[int, bytes]:
    return status, dumps({"detail": message})
