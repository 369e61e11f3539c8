"""``ProtocolController``: drive any rollout server by URL, in either protocol generation.

The polling generation goes through :class:`~osmosis_ai.rollout.client.RolloutClient`; the
callback generation runs a :class:`CallbackReceiver` (the controller side of reference §2.5)
on 127.0.0.1 and waits for the server's callbacks. Meant for tests and quick manual checks.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import json
import logging
import secrets
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal
from urllib.parse import quote

import httpx
from pydantic import ValidationError

from osmosis_ai.errors import MissingExtraError, RolloutProtocolError, UsageError
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.http import HttpClientOwner
from osmosis_ai.rollout.protocol import (
    Generation,
    GraderCompleteRequest,
    RolloutCompleteRequest,
    RolloutResultResponse,
    validate_rollout_id,
)
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import GraderStatus, RolloutErrorCategory, RolloutStatus
from osmosis_ai.testing.serving import serve_in_task

__all__ = ["CallbackReceiver", "ControllerOutcome", "ProtocolController", "ReceivedCallback"]

logger = logging.getLogger(__name__)

CallbackKind = Literal["completion", "grader"]
_CANCEL_BOUND_SEC = 5.0


@dataclass(frozen=True)
class ReceivedCallback:
    """One callback as the receiver saw it: the parsed body (``None`` if not JSON) and
    the HTTP status it answered."""

    kind: CallbackKind
    rollout_id: str
    body: object
    status_code: int


@dataclass
class _Expected:
    ack_trajectory: dict[str, Any] | None
    bodies: dict[CallbackKind, dict[str, Any]] = field(default_factory=dict)
    acks: dict[CallbackKind, dict[str, Any]] = field(default_factory=dict)
    arrived: dict[CallbackKind, asyncio.Event] = field(
        default_factory=lambda: {"completion": asyncio.Event(), "grader": asyncio.Event()}
    )


class CallbackReceiver:
    """Receives 0.3.0 completion and grader callbacks for the rollouts it was told to expect.

    Serves ``POST /v1/rollouts/{rollout_id}/completion`` and ``.../grader``: a wrong or
    missing bearer gets 401, an id not announced with :meth:`expect` 404, a malformed body,
    a body ``rollout_id`` differing from the path or a non-terminal status 422. Accepted
    callbacks get ``{"ok": true}`` (plus ``trajectory`` on the completion ack when one was
    given); a repeated callback gets the stored ack. Waiters must share the serving loop.
    """

    def __init__(self, api_key: str) -> None:
        if not api_key:
            raise UsageError("CallbackReceiver needs a non-empty api_key (the controller key)")
        self._key = api_key.encode()
        self.calls: list[ReceivedCallback] = []
        self._expected: dict[str, _Expected] = {}
        self._app: Any = None

    def expect(self, rollout_id: str, *, ack_trajectory: Mapping[str, Any] | None = None) -> None:
        """Accept callbacks for ``rollout_id``; ``ack_trajectory`` rides on the completion ack."""
        trajectory = None if ack_trajectory is None else dict(ack_trajectory)
        self._expected[rollout_id] = _Expected(trajectory)

    def forget(self, rollout_id: str) -> None:
        """Stop accepting callbacks for ``rollout_id`` (they answer 404 again)."""
        self._expected.pop(rollout_id, None)

    def body(self, rollout_id: str, kind: CallbackKind) -> dict[str, Any] | None:
        """The first accepted body of that callback, if it arrived."""
        entry = self._expected.get(rollout_id)
        return None if entry is None else entry.bodies.get(kind)

    async def wait_for(self, rollout_id: str, kind: CallbackKind) -> dict[str, Any]:
        """Wait until that callback has been accepted; returns its body."""
        entry = self._expected.get(rollout_id)
        if entry is None:
            raise UsageError(f"rollout {rollout_id!r} is not expected: call expect() first")
        await entry.arrived[kind].wait()
        return entry.bodies[kind]

    async def receive(
        self, kind: CallbackKind, rollout_id: str, authorization: str | None, raw: bytes
    ) -> tuple[int, dict[str, Any]]:
        """Apply the receiver rules to one callback; returns (HTTP status, JSON body)."""
        try:
            body: object = json.loads(raw) if raw else None
        except ValueError:
            body = None
        code, answer = self._judge(kind, rollout_id, authorization, body)
        self.calls.append(ReceivedCallback(kind, rollout_id, body, code))
        return code, answer

    def _judge(
        self, kind: CallbackKind, rollout_id: str, authorization: str | None, body: object
    ) -> tuple[int, dict[str, Any]]:
        scheme, _, token = (authorization or "").partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(token.encode(), self._key):
            return 401, {"detail": "unauthorized"}
        try:
            validate_rollout_id(rollout_id)
        except ValueError as exc:
            return 422, {"detail": str(exc)}
        entry = self._expected.get(rollout_id)
        if entry is None:
            return 404, {"detail": f"unknown rollout_id {rollout_id!r}"}
        if not isinstance(body, dict):
            return 422, {"detail": "the callback body must be a JSON object"}
        problem = _check_body(kind, rollout_id, body)
        if problem is not None:
            return 422, {"detail": problem}
        stored = entry.acks.get(kind)
        if stored is not None:
            if body != entry.bodies[kind]:
                logger.warning("conflicting duplicate %s callback for %s", kind, rollout_id)
            return 200, stored
        ack: dict[str, Any] = {"ok": True}
        if kind == "completion" and entry.ack_trajectory is not None:
            ack["trajectory"] = entry.ack_trajectory
        entry.bodies[kind] = body
        entry.acks[kind] = ack
        entry.arrived[kind].set()
        return 200, ack

    @property
    def app(self) -> Any:
        """The ASGI app (Starlette, from the ``server`` extra), built on first use."""
        if self._app is None:
            self._app = self._build_app()
        return self._app

    def _build_app(self) -> Any:
        try:
            from starlette.applications import Starlette
            from starlette.requests import Request
            from starlette.responses import JSONResponse
            from starlette.routing import Route
        except ModuleNotFoundError as exc:
            raise MissingExtraError("server", "CallbackReceiver", exc.name) from exc

        def endpoint(kind: CallbackKind) -> Any:
            async def handle(request: Request) -> JSONResponse:
                code, answer = await self.receive(
                    kind,
                    str(request.path_params["rollout_id"]),
                    request.headers.get("authorization"),
                    await request.body(),
                )
                return JSONResponse(answer, status_code=code)

            return handle

        routes = [
            Route(f"/v1/rollouts/{{rollout_id}}/{kind}", endpoint(kind), methods=["POST"])
            for kind in ("completion", "grader")
        ]
        return Starlette(routes=routes)


def _check_body(kind: CallbackKind, rollout_id: str, body: dict[str, Any]) -> str | None:
    try:
        if kind == "completion":
            status = RolloutCompleteRequest.model_validate(body).status
            terminal = status.is_terminal
        else:
            status = GraderCompleteRequest.model_validate(body).status
            terminal = status in (GraderStatus.SUCCESS, GraderStatus.FAILURE)
    except ValidationError as exc:
        return f"malformed {kind} callback: {exc.error_count()} validation errors: {exc}"
    echoed = body.get("rollout_id")
    if echoed is not None and echoed != rollout_id:
        return f"body rollout_id {echoed!r} differs from the URL's {rollout_id!r}"
    if not terminal:
        return f"{kind} callback status {status.value!r} is not terminal"
    return None


@dataclass(frozen=True)
class ControllerOutcome:
    """How one rollout ended, whichever generation ran it.

    ``completion`` and ``grader`` are the raw callback bodies (callback generation);
    ``result`` is the terminal polling result (polling generation).
    """

    rollout_id: str
    generation: Generation
    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None
    completion: dict[str, Any] | None = None
    grader: dict[str, Any] | None = None
    result: RolloutResultResponse | None = None

    @property
    def reward(self) -> float | None:
        """The wire reward: ``None`` unless the rollout succeeded and was kept."""
        return None if self.sample is None else self.sample.reward


class ProtocolController(HttpClientOwner):
    """Runs rollouts against the server at ``base_url``; use as an async context manager.

    Args:
        generation: ``"polling"``, ``"callback"``, or ``"auto"``: ask ``GET /health`` once;
            a body with ``process_id`` and ``lifecycle`` means polling, else callback.
        api_key: bearer for the rollout server, when it requires one.
        controller_api_key: bearer the server must send with callbacks (random by default).
    """

    def __init__(
        self,
        base_url: str,
        *,
        generation: Literal["polling", "callback", "auto"] = "auto",
        api_key: str | None = None,
        controller_api_key: str | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.controller_api_key = controller_api_key or secrets.token_urlsafe(32)
        self.receiver = CallbackReceiver(self.controller_api_key)
        self._generation: Generation | None = None if generation == "auto" else generation
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._init_http(None, lambda: httpx.AsyncClient(timeout=30.0))
        self._http = self.http_client
        self.client = RolloutClient(self.base_url, api_key=api_key, http_client=self._http)
        self._stack = contextlib.AsyncExitStack()
        self._receiver_url: str | None = None
        self._receiver_lock = asyncio.Lock()

    async def aclose(self) -> None:
        """Stop the callback receiver (if started) and close the HTTP client."""
        try:
            await self._stack.aclose()
        finally:
            self._receiver_url = None
            await super().aclose()

    async def resolve_generation(self) -> Generation:
        """The generation used for this server (asks ``/health`` once in auto mode)."""
        if self._generation is None:
            self._generation = await self.client.generation()
        return self._generation

    async def receiver_url(self) -> str:
        """Base URL of the callback receiver, started on 127.0.0.1 on first call."""
        async with self._receiver_lock:
            if self._receiver_url is None:
                serving = serve_in_task(self.receiver.app)
                self._receiver_url = await self._stack.enter_async_context(serving)
            return self._receiver_url

    async def run(
        self,
        initial_messages: Sequence[Mapping[str, Any]],
        chat_completions_url: str,
        *,
        label: str | None = None,
        metadata: Mapping[str, Any] | None = None,
        grade: bool = True,
        llm_api_key: str | None = None,
        agent_timeout_sec: float | None = None,
        grader_timeout_sec: float | None = None,
        extra_fields: Mapping[str, Any] | None = None,
        rollout_id: str | None = None,
        ack_trajectory: Mapping[str, Any] | None = None,
        timeout: float = 60.0,  # noqa: ASYNC109 - the whole run's budget, not one call's
    ) -> ControllerOutcome:
        """Run one rollout to its end; ``TimeoutError`` (after a best-effort cancel) when
        it takes longer than ``timeout`` seconds. ``ack_trajectory`` applies to the
        callback generation only."""
        rollout_id = rollout_id if rollout_id is not None else uuid.uuid4().hex
        request: dict[str, Any] = {
            "initial_messages": [dict(m) for m in initial_messages],
            "chat_completions_url": chat_completions_url,
            "rollout_id": rollout_id,
            "label": label,
            "metadata": None if metadata is None else dict(metadata),
            "llm_api_key": llm_api_key,
            "agent_timeout_sec": agent_timeout_sec,
            "grader_timeout_sec": grader_timeout_sec,
            "extra_fields": None if extra_fields is None else dict(extra_fields),
        }
        generation = await self.resolve_generation()
        scope = asyncio.timeout(timeout)
        try:
            async with scope:
                if generation == "polling":
                    result = await self.client.run_rollout_async(
                        **request, grade=grade, admission_timeout_sec=timeout
                    )
                    return _polling_outcome(result)
                return await self._run_callback(request, grade, ack_trajectory)
        except TimeoutError:
            if not scope.expired():
                raise
            with contextlib.suppress(httpx.HTTPError, RolloutProtocolError, TimeoutError):
                await self.client.cancel_rollout(rollout_id)
            raise TimeoutError(
                f"rollout {rollout_id!r} ({generation} generation) did not finish within "
                f"{timeout:g}s; it was cancelled"
            ) from None

    async def _run_callback(
        self, request: dict[str, Any], grade: bool, ack_trajectory: Mapping[str, Any] | None
    ) -> ControllerOutcome:
        rollout_id: str = request["rollout_id"]
        base = f"{await self.receiver_url()}/v1/rollouts/{quote(rollout_id, safe='')}"
        self.receiver.expect(rollout_id, ack_trajectory=ack_trajectory)
        body = {k: v for k, v in request.items() if v is not None}
        body["completion_callback_url"] = f"{base}/completion"
        body["controller_api_key"] = self.controller_api_key
        if grade:
            body["grader_callback_url"] = f"{base}/grader"
        response = await self._http.post(
            f"{self.base_url}/rollout", json=body, headers=self._headers
        )
        if response.status_code != 202:
            raise RolloutProtocolError(
                f"POST /rollout (callback generation) for rollout {rollout_id!r} answered "
                f"HTTP {response.status_code}: {response.text[:500]}",
                status_code=response.status_code,
            )
        await self.receiver.wait_for(rollout_id, "grader" if grade else "completion")
        return _callback_outcome(
            rollout_id,
            self.receiver.body(rollout_id, "completion"),
            self.receiver.body(rollout_id, "grader"),
        )


def _polling_outcome(result: RolloutResultResponse) -> ControllerOutcome:
    return ControllerOutcome(
        rollout_id=result.rollout_id,
        generation="polling",
        status=result.status,
        sample=result.sample,
        err_message=result.err_message,
        err_category=result.err_category,
        result=result,
    )


def _callback_outcome(
    rollout_id: str, completion: dict[str, Any] | None, grader: dict[str, Any] | None
) -> ControllerOutcome:
    done = None if completion is None else RolloutCompleteRequest.model_validate(completion)
    graded = None if grader is None else GraderCompleteRequest.model_validate(grader)
    status, err_message, err_category = RolloutStatus.SUCCESS, None, None
    if done is not None and done.status != RolloutStatus.SUCCESS:
        status, err_message, err_category = done.status, done.err_message, done.err_category
        if graded is not None:
            err_message = err_message or graded.err_message
            err_category = err_category or graded.err_category
    elif graded is not None and graded.status != GraderStatus.SUCCESS:
        status, err_message, err_category = (
            RolloutStatus.FAILURE,
            graded.err_message,
            graded.err_category,
        )
    return ControllerOutcome(
        rollout_id=rollout_id,
        generation="callback",
        status=status,
        sample=None if graded is None else graded.sample,
        err_message=err_message,
        err_category=err_category,
        completion=completion,
        grader=grader,
    )
