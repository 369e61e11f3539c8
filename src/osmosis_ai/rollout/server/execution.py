"""Running one admitted rollout on the backend and delivering its result.

Polling generation: publish the terminal result in the registry (after the trajectory is
saved). Callback generation: POST the completion callback when the workflow ends and the
grader callback when grading ends, each exactly once, also when the rollout fails, is
cancelled or crashes, so no controller waits forever.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass, field
from typing import Any

import httpx

from osmosis_ai.rollout.backend.base import ExecutionBackend
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.execution import ExecutionOutcome, ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.protocol import RolloutInitRequest
from osmosis_ai.rollout.server.callbacks import CallbackPoster
from osmosis_ai.rollout.server.registry import Entry, Registry, wire_sample
from osmosis_ai.rollout.status import (
    GraderStatus,
    RolloutErrorCategory,
    RolloutStatus,
    categorize_exception,
)

logger = logging.getLogger("osmosis_ai.rollout.server")


@dataclass
class Admitted:
    rollout_id: str
    lease: str | None


@dataclass
class _Delivery:
    """What one callback-generation rollout has reported so far."""

    completion_sent: bool = False
    grader_sent: bool = False
    report: Any = None
    workflow: ExecutionResult | None = None
    grader: ExecutionResult | None = None
    extra: dict[str, Any] = field(default_factory=dict)


class RolloutRunner:
    """Owns the rollout tasks of one server."""

    def __init__(
        self,
        backend: ExecutionBackend,
        registry: Registry,
        client: httpx.AsyncClient | None = None,
        *,
        save_trajectories: bool = True,
    ) -> None:
        self.backend = backend
        self.registry = registry
        self.poster = CallbackPoster(client)  # no client: the poster makes one when first needed
        self.save_trajectories = save_trajectories

    # -- admission -----------------------------------------------------------------------

    def start(self, init: RolloutInitRequest, *, body: bytes | None = None) -> Admitted:
        """Admit and start ``init``; ``body``: its raw request, when a replay of it may
        recover the lease (see :meth:`Registry.replay`)."""
        rollout_id = init.rollout_id or uuid.uuid4().hex
        entry, lease = self.registry.admit(rollout_id, init.generation, body=body)
        task = asyncio.create_task(self._run(entry, init), name=f"rollout:{rollout_id}")
        self.registry.attach(entry, task)
        return Admitted(rollout_id, lease)

    # -- one rollout -----------------------------------------------------------------------

    async def _run(self, entry: Entry, init: RolloutInitRequest) -> None:
        delivery = _Delivery()
        callback = init.generation == "callback"
        grade = (
            (init.grader_callback_url is not None or self.backend.capture_final_result)
            if callback
            else init.grade
        )

        async def on_workflow(result: ExecutionResult) -> None:
            delivery.workflow = result
            if callback:
                await self._send_completion(init, result, delivery)

        async def on_grader(result: ExecutionResult) -> None:
            delivery.grader = result
            if callback:
                workflow = delivery.workflow
                if workflow is None or workflow.status == RolloutStatus.SUCCESS:
                    # The grader's result is final: make /status agree before the callback.
                    self._finish(entry, result)
                await self._send_grader(init, result, delivery)

        async def on_status(status: RolloutStatus) -> None:
            self.registry.set_status(entry, status)

        api_key = init.llm_api_key
        if api_key is None and callback:
            api_key = init.controller_api_key
        rctx = RolloutContext(
            chat_completions_url=init.chat_completions_url,
            api_key=api_key,
            rollout_id=entry.rollout_id,
            status_hook=on_status,
        )
        outcome: ExecutionOutcome | None = None
        try:
            request = ExecutionRequest(
                id=entry.rollout_id,
                prompt=init.initial_messages,
                label=init.label,
                metadata=init.metadata,
                agent_timeout_sec=init.agent_timeout_sec,
                grader_timeout_sec=init.grader_timeout_sec,
                grade=grade,
            )
            if not getattr(self.backend, "reports_progress", False):
                self.registry.set_status(entry, RolloutStatus.RUNNING)
            with rctx:
                outcome = await self.backend.execute(
                    request, on_workflow, on_grader if grade else None
                )
            if outcome is None:  # a callback-only backend
                workflow = delivery.workflow or ExecutionResult.failure(
                    "backend reported no workflow result", RolloutErrorCategory.INTERNAL_ERROR
                )
                outcome = ExecutionOutcome(workflow, delivery.grader)
        except asyncio.CancelledError:
            entry.concluding = True
            _clear_cancellation()
            await self._conclude(
                entry,
                init,
                delivery,
                ExecutionResult(RolloutStatus.CANCELLED, err_message="cancelled"),
            )
            return
        except Exception as exc:
            entry.concluding = True
            logger.exception("rollout %s crashed", entry.rollout_id)
            failure = ExecutionResult.failure(
                str(exc) or "Internal server error", categorize_exception(exc)
            )
            await self._conclude(entry, init, delivery, failure)
            return
        entry.concluding = True
        await self._conclude(entry, init, delivery, outcome.result, outcome)

    async def _conclude(
        self,
        entry: Entry,
        init: RolloutInitRequest,
        delivery: _Delivery,
        result: ExecutionResult,
        outcome: ExecutionOutcome | None = None,
    ) -> None:
        """Polling: save the trajectory, then publish the result. Callback: record the result,
        send the callbacks not sent yet, then save the trajectory (with the acks' report)."""
        to_save = outcome.result_to_save if outcome is not None else result
        if init.generation == "polling":
            if self.save_trajectories:
                await self._save(entry.rollout_id, init, to_save, delivery.report)
            self._finish(entry, result)
            return
        self._finish(entry, result)
        if not delivery.completion_sent:
            await self._send_completion(init, result, delivery)
        if init.grader_callback_url is not None and not delivery.grader_sent:
            await self._send_grader(init, result, delivery)
        if self.save_trajectories:
            await self._save(entry.rollout_id, init, to_save, delivery.report)

    def _finish(self, entry: Entry, result: ExecutionResult) -> None:
        self.registry.finish(
            entry, result.status, result.sample, result.err_message, result.err_category
        )

    async def _send_completion(
        self,
        init: RolloutInitRequest,
        result: ExecutionResult,
        delivery: _Delivery,
    ) -> None:
        assert init.completion_callback_url is not None
        delivery.completion_sent = True
        # Shielded: a cancel arriving mid-post must not swallow the callback.
        ack = await asyncio.shield(
            self.poster.post(
                init.completion_callback_url,
                {
                    "status": result.status.value,
                    "rollout_id": init.rollout_id,  # echo; null when the server minted the id
                    "extra_fields": None,
                    "err_message": result.err_message,
                    "err_category": _value(result.err_category),
                },
                init.controller_api_key,
            )
        )
        self._take_report(ack, delivery)

    async def _send_grader(
        self,
        init: RolloutInitRequest,
        result: ExecutionResult,
        delivery: _Delivery,
    ) -> None:
        if init.grader_callback_url is None:
            return
        delivery.grader_sent = True
        ok = result.status == RolloutStatus.SUCCESS
        ack = await asyncio.shield(
            self.poster.post(
                init.grader_callback_url,
                {
                    "status": (GraderStatus.SUCCESS if ok else GraderStatus.FAILURE).value,
                    "rollout_id": init.rollout_id,  # echo; null when the server minted the id
                    "sample": wire_sample(result.sample, result.status),
                    "err_message": result.err_message,
                    "err_category": _value(result.err_category),
                },
                init.controller_api_key,
            )
        )
        self._take_report(ack, delivery)

    def _take_report(self, ack: dict[str, Any] | None, delivery: _Delivery) -> None:
        if not ack or "trajectory" not in ack:
            return
        from osmosis_ai.rollout.trajectory import report_from_response

        report = report_from_response(ack)
        if report is not None:
            delivery.report = report

    async def _save(
        self, rollout_id: str, init: RolloutInitRequest, result: ExecutionResult, report: Any
    ) -> None:
        from osmosis_ai.rollout.trajectory import save_trajectory

        try:
            await save_trajectory(
                rollout_id=rollout_id,
                result=result,
                request_label=init.label,
                request_metadata=init.metadata,
                request_extra_fields=init.extra_fields,
                report=report,
                artifact_root=getattr(self.backend, "artifact_root", None),
            )
        except Exception:  # save_trajectory never raises; this guards a broken install
            logger.exception("rollout %s: saving the trajectory failed", rollout_id)

    # -- status, cancel, shutdown ------------------------------------------------------------

    def status(self, rollout_id: str) -> dict[str, Any]:
        entry = self.registry.entries.get(rollout_id)
        if entry is not None:
            return {
                "rollout_id": rollout_id,
                "status": entry.status.value,
                "reward": entry.reward,
                "err_message": entry.err_message,
            }
        known = self.backend.rollout_status(rollout_id)
        if known:
            return {
                "rollout_id": rollout_id,
                "status": known.get("status", RolloutStatus.UNKNOWN.value),
                "reward": known.get("reward"),
                "err_message": known.get("err_message"),
            }
        return {"rollout_id": rollout_id, "status": "unknown", "reward": None, "err_message": None}

    def cancel(self, ids: list[str] | None, prefix: str | None, all: bool) -> dict[str, str]:
        dispositions: dict[str, str] = {}
        for rollout_id, entry in self.registry.select(ids, prefix, all):
            if entry is None or entry.terminal or entry.concluding:
                # Finished, or finished executing and about to publish its result.
                dispositions[rollout_id] = "not_found"
                continue
            if entry.cancel_disposition is None:
                entry.cancel_disposition = (
                    "cancelled_queued"
                    if entry.status == RolloutStatus.QUEUED
                    else "cancelled_running"
                )
                self.stop_execution(entry)
            dispositions[rollout_id] = entry.cancel_disposition
        return dispositions

    def stop_execution(self, entry: Entry) -> None:
        """Cancel a rollout's execution: through the backend if it knows the id, else the task."""
        if entry.concluding:
            return
        try:
            handled = self.backend.cancel_rollouts(ids=[entry.rollout_id])
        except Exception:
            logger.exception("backend cancel of %s failed", entry.rollout_id)
            handled = {}
        if handled.get(entry.rollout_id, "not_found") == "not_found" and entry.task is not None:
            entry.task.cancel()

    async def drain(self, grace_sec: float) -> None:
        """Let running rollouts finish for ``grace_sec`` seconds, then cancel the rest."""
        pending = set(self.registry.tasks)
        if pending:
            logger.info("draining %d rollout(s) for up to %.0fs", len(pending), grace_sec)
            _done, pending = await asyncio.wait(pending, timeout=grace_sec)
        if pending:
            logger.warning("cancelling %d rollout(s) still running at shutdown", len(pending))
            for entry in list(self.registry.entries.values()):
                if entry.task in pending:
                    self.stop_execution(entry)
            _done, pending = await asyncio.wait(pending, timeout=grace_sec)
            for task in pending:
                task.cancel()
            if pending:
                await asyncio.wait(pending, timeout=grace_sec)

    async def aclose(self) -> None:
        """Close what the runner made for callbacks (after :meth:`drain`)."""
        await self.poster.aclose()


def _clear_cancellation() -> None:
    """Forget the cancel request so the clean-up awaits (callbacks, saving) can run."""
    task = asyncio.current_task()
    if task is not None:
        while task.cancelling():
            task.uncancel()


def _value(category: RolloutErrorCategory | None) -> str | None:
    return None if category is None else category.value
