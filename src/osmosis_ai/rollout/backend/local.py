"""``LocalBackend``: runs the workflow and grader in this process, with a concurrency limit.

Per rollout: wait for a slot (queue time counts against the agent deadline), run the
workflow inside the ambient :class:`RolloutContext`, report it, then (when grading was
asked for and the workflow succeeded) run the grader under its own deadline. When grading
was asked for and the workflow failed, timed out or returned something invalid, the grader
callback still comes, once: a FAILURE without a sample that repeats the workflow's error.
The backend tracks every rollout's status and can cancel queued and running rollouts.
"""

from __future__ import annotations

import asyncio
import copy
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.backend.base import ExecutionBackend, ResultCallback
from osmosis_ai.rollout.backend.registry import RolloutRegistry, TrackedRollout
from osmosis_ai.rollout.backend.status import Concurrency, LocalHealth, RolloutReport
from osmosis_ai.rollout.config import AgentWorkflowConfig, GraderConfig
from osmosis_ai.rollout.context import (
    AgentWorkflowContext,
    ArtifactsFolder,
    GraderContext,
    RolloutContext,
    get_rollout_context,
)
from osmosis_ai.rollout.execution import ExecutionOutcome, ExecutionRequest, ExecutionResult
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.imports import resolve_object
from osmosis_ai.rollout.output import coerce_output
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus, categorize_exception

logger = logging.getLogger(__name__)

ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
_PROBE_NAME = ".osmosis-health-check"
_RETRY_DELAY_SEC = 0.05


def default_artifact_root() -> Path:
    """``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, else ``~/.osmosis``."""
    configured = os.environ.get(ARTIFACT_ROOT_ENV)
    return Path(configured) if configured else Path.home() / ".osmosis"


@dataclass
class _Tracked(TrackedRollout):
    artifacts: ArtifactsFolder | None = None


class LocalBackend(ExecutionBackend):
    """Runs rollouts in-process.

    Args:
        workflow: an :class:`AgentWorkflow` subclass, or its ``"module:Class"`` path.
        workflow_config: the workflow's config (deep-copied for every rollout), or a path.
        grader: a :class:`Grader` subclass, or its path. ``None`` means rollouts asking to be
            graded fail with a message saying no grader is configured.
        grader_config: the grader's config, or a path.
        max_concurrent: rollouts running at once. Defaults to
            ``workflow_config.concurrency.max_concurrent`` when that is set, else
            :attr:`DEFAULT_MAX_CONCURRENT`. ``None`` passed explicitly means unlimited.
        artifact_root: where per-rollout folders go; defaults to
            ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` or ``~/.osmosis``, read once here.
        project_path: passed to graders as ``ctx.project_path`` (default: the working dir).
        status_retention_sec: how long finished rollouts stay visible to :meth:`rollout_status`.
        max_queue_depth: when set, the server answers 429 while this many rollouts wait for
            a slot (default: queue without bound).
    """

    DEFAULT_MAX_CONCURRENT = 64
    """Concurrency when neither ``max_concurrent`` nor the workflow config sets one."""

    reports_progress = True
    """This backend reports ``running`` and ``grading`` through the rollout context."""

    def __init__(
        self,
        *,
        workflow: type[AgentWorkflow[Any]] | str,
        workflow_config: AgentWorkflowConfig | str | None = None,
        grader: type[Grader] | str | None = None,
        grader_config: GraderConfig | str | None = None,
        max_concurrent: int | object | None = ...,
        artifact_root: str | os.PathLike[str] | None = None,
        project_path: str | None = None,
        status_retention_sec: float = 900.0,
        max_queue_depth: int | None = None,
    ) -> None:
        self.workflow_cls: type[AgentWorkflow[Any]] = _resolve_class(
            workflow, AgentWorkflow, "workflow"
        )
        self.workflow_config: AgentWorkflowConfig | None = _resolve_config(
            workflow_config, AgentWorkflowConfig, "workflow_config"
        )
        self.grader_cls: type[Grader] | None = (
            None if grader is None else _resolve_class(grader, Grader, "grader")
        )
        self.grader_config: GraderConfig | None = _resolve_config(
            grader_config, GraderConfig, "grader_config"
        )
        self.max_concurrent = self._pick_limit(max_concurrent)
        self.artifact_root = Path(artifact_root) if artifact_root else default_artifact_root()
        self.project_path = project_path if project_path is not None else os.getcwd()
        self.status_retention_sec = status_retention_sec
        if max_queue_depth is not None and max_queue_depth < 1:
            raise ValueError(f"max_queue_depth must be >= 1 or None, got {max_queue_depth!r}")
        self.max_queue_depth = max_queue_depth

        self._slots = asyncio.Semaphore(self.max_concurrent) if self.max_concurrent else None
        grader_limit = self.grader_config.concurrency.max_concurrent if self.grader_config else None
        self._grader_slots = asyncio.Semaphore(grader_limit) if grader_limit else None
        self._queued = 0
        self._running = 0
        self._rollouts = RolloutRegistry[_Tracked](lambda: self.status_retention_sec)

    def _pick_limit(self, explicit: int | object | None) -> int | None:
        if explicit is not ...:
            if explicit is not None and (not isinstance(explicit, int) or explicit < 1):
                raise ValueError(f"max_concurrent must be a positive int or None, got {explicit!r}")
            return explicit  # type: ignore[return-value]
        configured = (
            self.workflow_config.concurrency.max_concurrent if self.workflow_config else None
        )
        return configured if configured is not None else self.DEFAULT_MAX_CONCURRENT

    # -- backend interface -------------------------------------------------------------

    def has_capacity(self) -> bool:
        return self.max_queue_depth is None or self._queued < self.max_queue_depth

    def health(self) -> dict[str, Any]:
        limits = Concurrency(self.max_concurrent, self._queued, self._running)
        return LocalHealth(limits).body()

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        tracked = self._rollouts.get(rollout_id)
        return None if tracked is None else RolloutReport.of(tracked).body()

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        return self._rollouts.cancel(ids, prefix, all, _disposition)

    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback | None = None,
        on_grader_complete: ResultCallback | None = None,
    ) -> ExecutionOutcome:
        if on_grader_complete is not None and not request.grade:
            raise ValueError(
                f"rollout {request.id!r}: on_grader_complete was given but the request has "
                "grade=False; pass grade=True to have it graded, or no grader callback"
            )
        tracked = self._rollouts.add(
            request.id, _Tracked(RolloutStatus.QUEUED, asyncio.current_task())
        )
        rctx = get_rollout_context()
        try:
            async with _maybe_context(rctx, request.id) as ctx:
                workflow = await self._workflow_phase(request, ctx, tracked)
                await _notify(on_workflow_complete, workflow, "workflow")
                grader: ExecutionResult | None = None
                if request.grade and workflow.status == RolloutStatus.SUCCESS:
                    self._set_status(tracked, RolloutStatus.GRADING)
                    await ctx.set_status(RolloutStatus.GRADING)
                    grader = await self._grader_phase(request, workflow.sample, tracked)
                    await _notify(on_grader_complete, grader, "grader")
                elif request.grade:
                    # No grading phase, but whoever asked for the grader callback is waiting
                    # on it: a failure without a sample, naming why the workflow failed.
                    await _notify(on_grader_complete, _ungraded(workflow), "grader")
            outcome = ExecutionOutcome(workflow, grader)
            final = outcome.result
            self._rollouts.finish(
                request.id, tracked, final.status, final.sample, final.err_message
            )
            return outcome
        except asyncio.CancelledError:
            self._rollouts.finish(request.id, tracked, RolloutStatus.CANCELLED, None, "cancelled")
            raise
        except BaseException as exc:
            self._rollouts.finish(
                request.id, tracked, RolloutStatus.FAILURE, None, str(exc) or type(exc).__name__
            )
            raise

    # -- phases --------------------------------------------------------------------------

    async def _workflow_phase(
        self, request: ExecutionRequest, rctx: RolloutContext, tracked: _Tracked
    ) -> ExecutionResult:
        admitted = time.monotonic()
        budget = request.agent_timeout_sec
        deadline = None if budget is None else admitted + budget
        self._queued += 1
        try:
            if self._slots is not None:
                await self._slots.acquire()
        finally:
            self._queued -= 1
        self._running += 1
        try:
            self._set_status(tracked, RolloutStatus.RUNNING)
            await rctx.set_status(RolloutStatus.RUNNING)
            queued_for = time.monotonic() - admitted
            if deadline is not None and time.monotonic() >= deadline:
                return _timeout_result("workflow", budget, queued_for)
            try:
                remaining = None if deadline is None else deadline - time.monotonic()
                async with asyncio.timeout(remaining):
                    sample = await self._run_workflow(request, rctx, tracked)
            except TimeoutError:
                if deadline is not None and time.monotonic() >= deadline:
                    return _timeout_result("workflow", budget, queued_for)
                raise  # a TimeoutError raised by user code, not our deadline
            if deadline is not None and time.monotonic() > deadline:
                # The workflow blocked the loop or swallowed cancellation past its budget.
                return _timeout_result("workflow", budget, queued_for)
            return ExecutionResult(RolloutStatus.SUCCESS, sample)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("rollout %s: workflow failed: %r", request.id, exc)
            return ExecutionResult.failure(_describe(exc), categorize_exception(exc))
        finally:
            self._running -= 1
            if self._slots is not None:
                self._slots.release()

    async def _run_workflow(
        self, request: ExecutionRequest, rctx: RolloutContext, tracked: _Tracked
    ) -> RolloutSample | None:
        config = copy.deepcopy(self.workflow_config)
        workflow = self.workflow_cls(config)
        ctx: AgentWorkflowContext[Any] = AgentWorkflowContext(
            prompt=copy.deepcopy(request.prompt),
            config=config,
            metadata=copy.deepcopy(request.metadata),
            artifacts_dir=self._artifacts_dir(request.id, tracked),
        )
        output = coerce_output(await workflow.run(ctx))
        if output is None:
            sample = await rctx.get_sample()
            if sample is not None and sample.label is None:
                sample.label = request.label
            return sample
        if output.messages is None:
            return None
        return RolloutSample(messages=output.messages, label=request.label, metrics=output.metrics)

    async def _grader_phase(
        self, request: ExecutionRequest, sample: RolloutSample | None, tracked: _Tracked
    ) -> ExecutionResult:
        if self.grader_cls is None:
            return ExecutionResult.failure(
                "no grader is configured: pass grader= to LocalBackend, or send grade=false",
                RolloutErrorCategory.VALIDATION_ERROR,
            )
        if request.label is None and request.metadata is None:
            return ExecutionResult.failure(
                "nothing to grade against: the request has neither a label nor metadata",
                RolloutErrorCategory.VALIDATION_ERROR,
            )
        if sample is None:
            return ExecutionResult.failure(
                "the workflow produced no sample: return messages from run() or register "
                "a sample source",
                RolloutErrorCategory.VALIDATION_ERROR,
            )
        return await self._grade(self.grader_cls, request, sample.model_copy(deep=True), tracked)

    async def _grade(
        self,
        grader_cls: type[Grader],
        request: ExecutionRequest,
        graded: RolloutSample,
        tracked: _Tracked,
    ) -> ExecutionResult:
        """Grade ``graded`` (the grader's own copy of the sample) within the request's
        grader budget; a grader that leaves no reward fails the rollout."""
        budget = request.grader_timeout_sec
        started = time.monotonic()
        try:
            if budget is not None and budget <= 0:
                return _timeout_result("grader", budget, 0.0, graded)
            if self._grader_slots is not None:
                await self._grader_slots.acquire()
            try:
                grader = grader_cls(copy.deepcopy(self.grader_config))
                ctx = GraderContext(
                    label=request.label,
                    sample=graded,
                    project_path=self.project_path,
                    metadata=copy.deepcopy(request.metadata),
                    artifacts_dir=self._artifacts_dir(request.id, tracked),
                )
                async with asyncio.timeout(budget):
                    await grader.grade(ctx)
            finally:
                if self._grader_slots is not None:
                    self._grader_slots.release()
        except TimeoutError:
            if budget is not None and time.monotonic() - started >= budget:
                return _timeout_result("grader", budget, 0.0, graded)
            return ExecutionResult.failure(
                "grader raised TimeoutError", RolloutErrorCategory.TIMEOUT, graded
            )
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            logger.info("rollout %s: grader failed: %r", request.id, exc)
            return ExecutionResult.failure(_describe(exc), categorize_exception(exc), graded)
        if budget is not None and time.monotonic() - started > budget:
            return _timeout_result("grader", budget, 0.0, graded)
        if graded.reward is None and not graded.remove_sample:
            return ExecutionResult.failure(
                "Sample has no reward after grading: call ctx.set_reward(x) in grade()",
                RolloutErrorCategory.VALIDATION_ERROR,
                graded,
            )
        return ExecutionResult(RolloutStatus.SUCCESS, graded)

    # -- bookkeeping ---------------------------------------------------------------------

    def _artifacts_dir(self, rollout_id: str, tracked: _Tracked) -> ArtifactsFolder:
        # One folder per rollout, shared by its workflow and grader, made on first read.
        if tracked.artifacts is None:
            root = self.artifact_root
            tracked.artifacts = ArtifactsFolder(lambda: _prepare_artifacts_dir(root, rollout_id))
        return tracked.artifacts

    def _set_status(self, tracked: _Tracked, status: RolloutStatus) -> None:
        if not tracked.status.is_terminal:
            tracked.status = status


def _prepare_artifacts_dir(root: Path, rollout_id: str) -> Path | None:
    """``<root>/<id>/artifacts/``, created and write-probed (3 attempts), or ``None``.

    Runs when user code first reads ``ctx.artifacts_dir``, on its thread: the retries wait
    50 and 100 ms, so a failing filesystem holds an event loop for at most 0.15 s."""
    target = root / rollout_id / "artifacts"
    delay = _RETRY_DELAY_SEC
    for attempt in range(3):
        try:
            target.mkdir(parents=True, exist_ok=True)
            probe = target / _PROBE_NAME
            probe.write_bytes(b"ok")
            probe.unlink()
            return target
        except OSError as exc:
            if attempt == 2:
                logger.warning("rollout %s: no artifacts dir at %s: %s", rollout_id, target, exc)
                return None
            time.sleep(delay)
            delay *= 2
    return None


def _disposition(tracked: _Tracked) -> str:
    queued = tracked.status == RolloutStatus.QUEUED
    return "cancelled_queued" if queued else "cancelled_running"


class _maybe_context:
    """Use the ambient rollout context, or enter a fresh one when called outside a server."""

    def __init__(self, existing: RolloutContext | None, rollout_id: str) -> None:
        self._existing = existing
        self._fresh: RolloutContext | None = None
        self._rollout_id = rollout_id

    async def __aenter__(self) -> RolloutContext:
        if self._existing is not None:
            return self._existing
        self._fresh = RolloutContext(rollout_id=self._rollout_id)
        return self._fresh.__enter__()

    async def __aexit__(self, *exc: object) -> None:
        if self._fresh is not None:
            self._fresh.__exit__(None, None, None)


async def _notify(callback: ResultCallback | None, result: ExecutionResult, phase: str) -> None:
    if callback is None:
        return
    try:
        await callback(result)
    except asyncio.CancelledError:
        raise
    except Exception:
        logger.exception("on_%s_complete callback failed", phase)


def _ungraded(workflow: ExecutionResult) -> ExecutionResult:
    """The grader callback's result when the workflow failed: FAILURE, no sample."""
    return ExecutionResult.failure(workflow.err_message, workflow.err_category)


def _timeout_result(
    phase: str, budget: float | None, queued_for: float, sample: RolloutSample | None = None
) -> ExecutionResult:
    message = f"{phase} exceeded its {budget:g}s deadline"
    if queued_for >= 0.001:
        message += f" ({queued_for:.3f}s of it spent queued)"
    return ExecutionResult.failure(message, RolloutErrorCategory.TIMEOUT, sample)


def _describe(exc: BaseException) -> str:
    text = str(exc)
    return text if text else type(exc).__name__


def _resolve_class(value: Any, base: type[Any], what: str) -> Any:
    obj = resolve_object(value) if isinstance(value, str) else value
    if not (isinstance(obj, type) and issubclass(obj, base)):
        raise TypeError(
            f"{what} must be a {base.__name__} subclass or its 'module:Class' path, got {obj!r}"
        )
    return obj


def _resolve_config(value: Any, base: type[Any], what: str) -> Any:
    if value is None:
        return None
    obj = resolve_object(value) if isinstance(value, str) else value
    if not isinstance(obj, base):
        raise TypeError(
            f"{what} must be a {base.__name__} instance or its 'module:attr' path, got {obj!r}"
        )
    try:
        copy.deepcopy(obj)
    except Exception as exc:
        raise TypeError(
            f"{what} must be deep-copyable (each rollout gets its own copy): {exc}"
        ) from exc
    return obj
