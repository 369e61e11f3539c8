"""What a local evaluation reports while it runs (events, projections) and when it ends.

The runner never prints: it calls one event sink with these events, in order, on the
thread that called it, and returns an :class:`EvalRunResult`; the CLI renders both.
:class:`LiveProjections` keeps the run dir's projections current meanwhile.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from pydantic import JsonValue

from osmosis_ai.eval.journal import JournalRecord, JournalState, WorkKey
from osmosis_ai.eval.plan import EvalPlan
from osmosis_ai.events import LogEvent, StageEvent, WarningEvent
from osmosis_ai.rundir.timestamps import iso_utc

if TYPE_CHECKING:
    from osmosis_ai.eval.metrics import EvalMetrics
    from osmosis_ai.eval.projections import FailedRow, Projections

REFRESH_INTERVAL_SEC = 0.5

# A stage line of the run; the shared event under the name eval has always used.
MilestoneEvent = StageEvent


@dataclass(frozen=True)
class PlanEvent:
    """The plan is resolved; nothing has started yet."""

    plan: EvalPlan


@dataclass(frozen=True, slots=True)
class Tally:
    """How the run's work items stand: terminal ones by outcome, out of ``total``."""

    total: int
    done: int = 0
    passed: int = 0
    scored: int = 0
    failed: int = 0
    skipped: int = 0

    @property
    def pass_rate(self) -> float | None:
        """Passed over finished, non-skipped items (``None`` before the first)."""
        counted = self.done - self.skipped
        return self.passed / counted if counted else None


@dataclass(frozen=True)
class DispatchStartedEvent:
    """Rollouts are about to run: ``pending`` of ``tally.total``, ``concurrency`` at once."""

    pending: int
    concurrency: int
    tally: Tally


@dataclass(frozen=True)
class ItemFinishedEvent:
    """A work item got its terminal record (already durable in the journal)."""

    record: JournalRecord
    rollout_dir: Path
    tally: Tally
    elapsed_s: float


EvalEvent = (
    PlanEvent | MilestoneEvent | WarningEvent | LogEvent | DispatchStartedEvent | ItemFinishedEvent
)
EventSink = Callable[[EvalEvent], None]


class TallyCounter:
    """Keeps a :class:`Tally` current as records replace one another."""

    def __init__(self, total: int, pass_threshold: float) -> None:
        self.total = total
        self.threshold = pass_threshold
        self.counts = [0, 0, 0, 0, 0]  # done, passed, scored, failed, skipped

    def _apply(self, record: JournalRecord, sign: int) -> None:
        scored = record.reward is not None and record.status != "skipped"
        passed = scored and record.reward is not None and record.reward >= self.threshold
        for index, hit in enumerate(
            (True, passed, scored, record.status == "failed", record.status == "skipped")
        ):
            self.counts[index] += sign * int(hit)

    def replace(self, old: JournalRecord | None, new: JournalRecord) -> None:
        if old is not None:
            self._apply(old, -1)
        self._apply(new, 1)

    def snapshot(self) -> Tally:
        done, passed, scored, failed, skipped = self.counts
        return Tally(self.total, done, passed, scored, failed, skipped)


class LiveProjections:
    """The projections of one run dir, refreshed in a thread while items finish.

    One refresh at a time, at most every :data:`REFRESH_INTERVAL_SEC` (or twice as long as
    the last one took), since each rewrites the whole index; :meth:`refresh` called after
    dispatch is the complete, final one.
    """

    def __init__(
        self,
        plan: EvalPlan,
        run_dir: Path,
        run_id: str,
        created_at: str,
        resumed_ids: set[str],
        *,
        began: float | None = None,
    ) -> None:
        """``began``: when the invocation began (``time.monotonic()``; default: now)."""
        # Here, not at the top: the runner imports this module before it starts the server.
        from osmosis_ai.eval.projections import Projector

        self.plan, self.run_id, self.created_at = plan, run_id, created_at
        self.resumed_ids: Collection[str] = resumed_ids
        self.began = time.monotonic() if began is None else began
        self._projector = Projector(run_dir)
        self._dirty = asyncio.Event()
        self._stopped = asyncio.Event()

    def mark_dirty(self) -> None:
        self._dirty.set()

    def refresh(self, state: JournalState, status: str) -> Projections:
        from osmosis_ai.eval.projections import EvalRunInfo, RunProgress

        plan = self.plan
        return self._projector.refresh(
            state,
            run=EvalRunInfo(
                id=self.run_id,
                status=status,
                name=plan.run_name,
                dataset_name=plan.dataset_name,
                model_name=plan.model_path,
                rollout_name=plan.rollout_name,
                duration_ms=round((time.monotonic() - self.began) * 1000),
                started_at=self.created_at,
                completed_at=iso_utc() if status == "finished" else None,
            ),
            progress=RunProgress(len(plan.items), len(plan.rows), plan.total_rows),
            pass_threshold=plan.config.evaluation.pass_threshold,
            n_runs=plan.n,
            resumed_ids=self.resumed_ids,
        )

    async def keep_current(self, latest: Mapping[WorkKey, JournalRecord]) -> None:
        """Refresh from ``latest`` whenever marked dirty, until :meth:`stop`."""
        while True:
            await self._dirty.wait()
            self._dirty.clear()
            if self._stopped.is_set():
                return
            began = time.monotonic()
            state = JournalState(latest=dict(latest))
            await asyncio.to_thread(self.refresh, state, "running")
            pause = max(REFRESH_INTERVAL_SEC, 2 * (time.monotonic() - began))
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stopped.wait(), pause)

    def stop(self) -> None:
        """End :meth:`keep_current` once a refresh in progress is done."""
        self._stopped.set()
        self._dirty.set()


@dataclass(frozen=True)
class EvalRunResult:
    """How one invocation of ``osmosis eval run`` ended.

    Counts are over every work item of the run (earlier invocations included);
    ``dispatched`` counts attempts started by this invocation, ``resumed`` items whose result
    an earlier one recorded. ``halted`` says why dispatch stopped early, if it did.
    """

    plan: EvalPlan
    local_run_id: str
    run_dir: Path
    total_work_items: int
    dispatched: int
    succeeded: int
    failed: int
    skipped: int
    resumed: int
    pending: int
    cancelled: bool
    duration_ms: int
    metrics: EvalMetrics
    failed_rows: tuple[FailedRow, ...]
    halted: str | None = None
    archived_to: Path | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def complete(self) -> bool:
        return self.pending == 0

    @property
    def status(self) -> str:
        """``success`` when every item has a terminal record, else ``partial``."""
        return "success" if self.complete else "partial"

    def to_resource(self) -> dict[str, JsonValue]:
        """The ``resource`` of the ``eval.run`` JSON result (reference §5.8)."""
        return {
            "run_name": self.plan.run_name,
            "local_run_id": self.local_run_id,
            "output_path": str(self.run_dir),
            "dataset_source": self.plan.dataset_source,
            "total_work_items": self.total_work_items,
            "dispatched": self.dispatched,
            "succeeded": self.succeeded,
            "failed": self.failed,
            "skipped": self.skipped,
            "resumed": self.resumed,
            "cancelled": self.cancelled,
            "duration_ms": self.duration_ms,
            "metrics": self.metrics.to_json(),
            "failed_rows": [
                {
                    "row_index": row.row_index,
                    "source_row_index": row.source_row_index,
                    "run_index": row.run_index,
                    "rollout_id": row.rollout_id,
                    "error_type": row.error_type,
                    "rollout_dir": row.rollout_dir,
                }
                for row in self.failed_rows
            ],
            "git": self.plan.git,  # pyright: ignore[reportReturnType]
            "workspace_directory": str(self.plan.workspace.root),
        }
