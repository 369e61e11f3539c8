"""``Dispatcher``: run one work item on a rollout server, in either protocol generation.

Each attempt gets a fresh rollout id registered with the proxy (and, for callbacks, the
listener); ``429`` is retried; a deadline or a cancelled task cancels the remote rollout.
A polling submit whose answer is lost is sent again: this package's server answers it with
the lease and the attempt carries on; a server that answers ``409`` (0.3.8's) leaves the
attempt admitted but unpollable, so it is cancelled and ends as a ``transport_error``.
The attempt's data types live in :mod:`osmosis_ai.controller.attempt`, re-exported here.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import httpx
from pydantic import ValidationError

from osmosis_ai.controller.attempt import (
    DEADLINE_GRACE_SEC,
    UNBOUNDED_DEADLINE_SEC,
    CommitHook,
    DispatchOutcome,
    DispatchRequest,
    OutcomeKind,
)
from osmosis_ai.controller.listener import CallbackResult
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.errors import RolloutProtocolError, UsageError
from osmosis_ai.rollout.client import (
    RolloutAdmissionTimeoutError,
    RolloutClient,
    RolloutHandle,
    RolloutLeaseLostError,
    retry_after_sec,
)
from osmosis_ai.rollout.http import HttpClientOwner, async_client
from osmosis_ai.rollout.protocol import (
    CancelDisposition,
    Generation,
    RolloutCompleteRequest,
    RolloutInitResponse,
)
from osmosis_ai.rollout.status import RolloutStatus

__all__ = [  # the attempt types are re-exported: callers import them from here
    "DEADLINE_GRACE_SEC",
    "UNBOUNDED_DEADLINE_SEC",
    "CommitHook",
    "DispatchOutcome",
    "DispatchRequest",
    "Dispatcher",
    "OutcomeKind",
]

DEFAULT_ADMISSION_WAIT_SEC = 3600.0
HTTP_TIMEOUT_SEC = 30.0
_COMMIT_SETTLE_SEC = 60.0


@dataclass
class _Attempt:
    request: DispatchRequest
    rollout_id: str
    commit: CommitHook | None
    started: float = field(default_factory=time.monotonic)
    generation: Generation | None = None
    posted: bool = False
    admitted: bool = False
    finished: DispatchOutcome | None = None  # the terminal outcome, once committed
    hook_idle: asyncio.Event = field(default_factory=lambda: _set(asyncio.Event()))


class Dispatcher(HttpClientOwner):
    """Runs work items on the rollout server at ``server_url`` through ``service``.

    Args:
        service: the started controller service (proxy and listener) the rollouts use.
        generation: ``"auto"`` asks ``/health`` once (see :meth:`detect_generation`).
        api_key: the rollout server's bearer, when it requires one.
        max_admission_wait_sec: how long one item may keep getting ``429``.
    """

    def __init__(
        self,
        server_url: str,
        service: ControllerService,
        *,
        generation: Literal["auto", "polling", "callback"] = "auto",
        api_key: str | None = None,
        max_admission_wait_sec: float = DEFAULT_ADMISSION_WAIT_SEC,
        http_client: httpx.AsyncClient | None = None,
    ) -> None:
        self.server_url = server_url.rstrip("/")
        self.service = service
        self.generation: Generation | None = None if generation == "auto" else generation
        self.max_admission_wait_sec = max_admission_wait_sec
        self._auto = generation == "auto"
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        # A large pool (each in-flight rollout holds a long-poll connection) on the fast
        # transport: httpx's own pool costs O(connections^2) per request.
        self._init_http(
            http_client, lambda: async_client(max_connections=4096, timeout=HTTP_TIMEOUT_SEC)
        )
        self._http = self.http_client
        self.client = RolloutClient(self.server_url, api_key=api_key, http_client=self._http)
        self._detecting = asyncio.Lock()

    # -- server ----------------------------------------------------------------------------

    async def health(self) -> dict[str, Any]:
        """The server's ``GET /health`` body."""
        return await self.client.health()

    async def detect_generation(self) -> Generation:
        """The generation to use (asked once): a health body with ``process_id`` and
        ``lifecycle`` means polling, else callback. A 202 carrying a polling lease later
        switches an auto-detected callback server to polling."""
        async with self._detecting:
            if self.generation is None:
                self.generation = await self.client.generation()
            return self.generation

    async def cancel_all(self, ids: Iterable[str]) -> dict[str, CancelDisposition]:
        """Cancel these rollouts on the server; returns each id's disposition."""
        chosen = list(ids)
        if not chosen:
            return {}
        return dict((await self.client.cancel(ids=chosen)).dispositions)

    # -- one work item ---------------------------------------------------------------------

    async def run(
        self, request: DispatchRequest, *, commit: CommitHook | None = None
    ) -> DispatchOutcome:
        """Run one attempt of ``request`` to its outcome; server faults become outcomes.

        ``commit`` is awaited once with a terminal outcome (``result`` or ``cancelled``):
        before the callback ack (a failure answers 500, so the server retries) or right
        after the terminal poll (a failure propagates). A cancelled task cancels the remote
        rollout (best effort, unless its result was committed) and re-raises.
        """
        attempt = _Attempt(request, request.rollout_id or uuid.uuid4().hex, commit)
        try:
            attempt.generation = await self.detect_generation()
        except (httpx.HTTPError, RolloutProtocolError) as exc:
            return self._outcome(attempt, "transport_error", detail=_describe(exc))
        proxy, listener = self.service.proxy, self.service.listener
        proxy.register(attempt.rollout_id, upstream_fields=request.upstream_fields)
        try:
            if attempt.generation == "polling":
                return await self._run_polling(attempt)
            return await self._run_callback(attempt)
        except asyncio.CancelledError:
            listener.discard(attempt.rollout_id)
            await _settle(attempt)
            if attempt.posted and attempt.finished is None:
                await self._cancel_remote(attempt.rollout_id)
            raise
        finally:
            listener.discard(attempt.rollout_id)
            proxy.discard(attempt.rollout_id)

    def _outcome(self, attempt: _Attempt, kind: OutcomeKind, **fields: Any) -> DispatchOutcome:
        rollout_id = attempt.rollout_id
        proxy = self.service.proxy
        try:
            calls, tokens = tuple(proxy.calls(rollout_id)), proxy.total_tokens(rollout_id)
        except UsageError:  # not registered (yet, or any more)
            calls, tokens = (), 0
        fields.setdefault("admitted", attempt.admitted)
        return DispatchOutcome(
            rollout_id=rollout_id,
            generation=attempt.generation,
            kind=kind,
            calls=calls,
            total_tokens=tokens,
            duration_ms=(time.monotonic() - attempt.started) * 1000.0,
            **fields,
        )

    def _refused(self, attempt: _Attempt, status_code: int | None, detail: str) -> DispatchOutcome:
        rejected = status_code is not None and 400 <= status_code < 500
        kind: OutcomeKind = "admission_rejected" if rejected else "transport_error"
        return self._outcome(attempt, kind, status_code=status_code, detail=detail)

    async def _cancel_remote(self, rollout_id: str) -> CancelDisposition | None:
        with contextlib.suppress(httpx.HTTPError, RolloutProtocolError, TimeoutError):
            return await self.client.cancel_rollout(rollout_id)
        return None

    async def _timed_out(self, attempt: _Attempt) -> DispatchOutcome:
        disposition = None
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(attempt.request.cancel_bound):
                disposition = await self._cancel_remote(attempt.rollout_id)
        return self._outcome(
            attempt,
            "timeout",
            cancel_disposition=disposition,
            detail=f"rollout {attempt.rollout_id!r} did not finish within its "
            f"{attempt.request.deadline:g}s deadline (the agent and grader timeouts plus a "
            f"grace; the run's agent_workflow_timeout_s and grader_timeout_s set it); cancel: "
            f"{disposition or 'not confirmed'}",
        )

    # -- polling generation ----------------------------------------------------------------

    async def _run_polling(self, attempt: _Attempt) -> DispatchOutcome:
        request = attempt.request
        attempt.posted = True
        try:
            handle = await self.client.submit(
                request.initial_messages,
                self.service.chat_completions_url(attempt.rollout_id),
                rollout_id=attempt.rollout_id,
                llm_api_key=self.service.proxy_token,
                label=request.label,
                metadata=request.metadata,
                grade=request.grade,
                agent_timeout_sec=request.agent_timeout_sec,
                grader_timeout_sec=request.grader_timeout_sec,
                extra_fields=request.extra_fields,
                admission_timeout_sec=self.max_admission_wait_sec,
            )
        except RolloutAdmissionTimeoutError as exc:
            return self._outcome(attempt, "timeout", detail=str(exc))
        except RolloutLeaseLostError as exc:
            # Admitted (a resend got 409 for this attempt's own id from a server that does
            # not replay submits), but unpollable without the lease that went with the lost
            # answer: stop it, and end as a lost answer, not as a rejected admission.
            attempt.admitted = True
            disposition = await self._cancel_remote(attempt.rollout_id)
            return self._outcome(
                attempt,
                "transport_error",
                cancel_disposition=disposition,
                detail=str(exc),
                lost_in_transit=True,
            )
        except RolloutProtocolError as exc:
            if exc.status_code == 202:  # admitted, but the answer is unusable: stop it
                await self._cancel_remote(attempt.rollout_id)
            return self._refused(attempt, exc.status_code, str(exc))
        except httpx.HTTPError as exc:
            await self._cancel_remote(attempt.rollout_id)
            return self._refused(attempt, None, _describe(exc))
        return await self._await_polling(attempt, handle)

    async def _await_polling(self, attempt: _Attempt, handle: RolloutHandle) -> DispatchOutcome:
        attempt.admitted = True
        scope = asyncio.timeout(attempt.request.deadline)
        try:
            async with scope:
                result = await handle.wait_for_completion()
        except TimeoutError:
            if not scope.expired():
                raise
            return await self._timed_out(attempt)
        except (httpx.HTTPError, RolloutProtocolError) as exc:
            await self._cancel_remote(attempt.rollout_id)
            code = exc.status_code if isinstance(exc, RolloutProtocolError) else None
            return self._outcome(
                attempt, "transport_error", status_code=code, detail=_describe(exc)
            )
        kind: OutcomeKind = "cancelled" if result.status == RolloutStatus.CANCELLED else "result"
        outcome = self._outcome(attempt, kind, result=result)
        attempt.finished = outcome
        if attempt.commit is not None:
            await attempt.commit(outcome)
        return outcome

    # -- callback generation ---------------------------------------------------------------

    async def _run_callback(self, attempt: _Attempt) -> DispatchOutcome:
        service, request, rollout_id = self.service, attempt.request, attempt.rollout_id

        async def on_terminal(callbacks: CallbackResult) -> None:
            attempt.hook_idle.clear()
            try:
                done = callbacks.completion
                cancelled = done is not None and done.status == RolloutStatus.CANCELLED
                outcome = self._outcome(
                    attempt,
                    "cancelled" if cancelled else "result",
                    admitted=True,  # a callback proves admission even before the 202 is read
                    completion=done,
                    grader=callbacks.grader,
                )
                if attempt.commit is not None:
                    await attempt.commit(outcome)
                attempt.finished = outcome
            finally:
                attempt.hook_idle.set()

        def report(_completion: RolloutCompleteRequest) -> dict[str, Any]:
            return service.proxy.trajectory_report(rollout_id).model_dump(
                mode="json", exclude_none=True
            )

        service.listener.register(
            rollout_id, on_terminal=on_terminal, on_completion=report, expect_grader=request.grade
        )
        body = self._callback_body(attempt)
        attempt.posted = True
        try:
            response = await self._admit(rollout_id, body)
        except RolloutAdmissionTimeoutError as exc:
            return attempt.finished or self._outcome(attempt, "timeout", detail=str(exc))
        except httpx.HTTPError as exc:
            await _settle(attempt)
            if attempt.finished is not None:
                return attempt.finished
            await self._cancel_remote(rollout_id)
            return self._refused(attempt, None, _describe(exc))
        if response.status_code != 202:
            return self._refused(
                attempt,
                response.status_code,
                f"POST /rollout (callback generation) for rollout {rollout_id!r} answered "
                f"HTTP {response.status_code}: {_detail(response)}",
            )
        lease = _lease(response, rollout_id)
        if lease is not None:  # a polling server ignored the callback fields: poll instead
            service.listener.discard(rollout_id)
            if self._auto:
                self.generation = "polling"
            attempt.generation = "polling"
            handle = RolloutHandle(self.client, self._send, lease, attempt.started)
            return await self._await_polling(attempt, handle)
        attempt.admitted = True
        scope = asyncio.timeout(request.deadline)
        try:
            async with scope:
                await service.listener.wait_terminal(rollout_id)
        except TimeoutError:
            if not scope.expired():
                raise
            service.listener.discard(rollout_id)  # no new commit may start; one running ends
            await _settle(attempt)
            return attempt.finished or await self._timed_out(attempt)
        assert attempt.finished is not None
        return attempt.finished

    def _callback_body(self, attempt: _Attempt) -> dict[str, Any]:
        request, rollout_id, service = attempt.request, attempt.rollout_id, self.service
        body: dict[str, Any] = {
            "initial_messages": [dict(m) for m in request.initial_messages],
            "chat_completions_url": service.chat_completions_url(rollout_id),
            "rollout_id": rollout_id,
            "llm_api_key": service.proxy_token,
            "controller_api_key": service.controller_token,
            "completion_callback_url": service.completion_url(rollout_id),
        }
        for key in ("label", "metadata", "agent_timeout_sec", "grader_timeout_sec", "extra_fields"):
            value = getattr(request, key)
            if value is not None:
                body[key] = dict(value) if isinstance(value, Mapping) else value
        if request.grade:
            body["grader_callback_url"] = service.grader_url(rollout_id)
        else:
            body["grade"] = False  # ignored by 0.3.0; keeps a polling server from grading
        return body

    async def _admit(self, rollout_id: str, body: dict[str, Any]) -> httpx.Response:
        """POST /rollout, retrying 429 after ``Retry-After`` within the admission budget.

        Never sent twice on a closed connection (the transport does not repeat a POST): a
        callback-generation server does not refuse a repeated rollout id, so a second send
        could run the rollout twice."""
        deadline = time.monotonic() + self.max_admission_wait_sec
        while True:
            response = await self._http.post(
                f"{self.server_url}/rollout", json=body, headers=self._headers
            )
            if response.status_code != 429:
                return response
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise RolloutAdmissionTimeoutError(
                    f"rollout {rollout_id!r} was not admitted within "
                    f"{self.max_admission_wait_sec:g}s: the server kept answering 429 "
                    f"({_detail(response)}); lower the concurrency or raise the budget"
                )
            await asyncio.sleep(
                min(retry_after_sec(response.headers.get("retry-after")), remaining)
            )

    async def _send(
        self,
        method: str,
        path: str,
        *,
        json: object = None,
        headers: Mapping[str, str] | None = None,
        request_timeout: httpx.Timeout | float | None = None,
    ) -> httpx.Response:
        """The request function a :class:`RolloutHandle` polls through."""
        return await self._http.request(
            method,
            self.server_url + path,
            json=json,
            headers={**self._headers, **(headers or {})},
            timeout=HTTP_TIMEOUT_SEC if request_timeout is None else request_timeout,
        )


def _lease(response: httpx.Response, rollout_id: str) -> RolloutInitResponse | None:
    """The polling lease in a 202 body, when there is a valid one for this rollout."""
    try:
        lease = RolloutInitResponse.model_validate_json(response.content or b"{}")
    except ValidationError:
        return None
    return lease if lease.rollout_id == rollout_id else None


def _set(event: asyncio.Event) -> asyncio.Event:
    event.set()
    return event


async def _settle(attempt: _Attempt) -> None:
    """Let a commit hook that is already running finish (bounded)."""
    if not attempt.hook_idle.is_set():
        waiter = asyncio.ensure_future(attempt.hook_idle.wait())
        _done, pending = await asyncio.wait({waiter}, timeout=_COMMIT_SETTLE_SEC)
        for task in pending:
            task.cancel()


def _detail(response: httpx.Response) -> str:
    try:
        body = response.json()
    except ValueError:
        return response.text[:500] or "<empty body>"
    detail = body.get("detail", body) if isinstance(body, dict) else body
    return str(detail)[:500]


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
