"""``RunReporter``: everything a run's execution writes back to the platform, fenced.

The process executing a run (see :mod:`osmosis_ai.platform.worker`) reports through one
reporter bound to ``(run_id, worker_id, attempt)``. Every write checks in its transaction that
this attempt still holds the run; once another attempt claimed it, the write raises
:class:`~osmosis_ai.platform.services.work.LeaseLostError` and nothing is written, so a worker
that was given up on never overwrites the one that took over.

Files go to the object store under ``runs/<run_id>/``:

* ``trajectories/row_<r>_run_<n>.json`` and ``artifacts/row_<r>_run_<n>/…`` (eval samples),
* ``checkpoints/step-<N>/…`` (training checkpoints),
* ``files/…`` (anything else a run keeps, e.g. its rendered config).

Samples are keyed by ``(row_index, run_index)``: recording one again replaces it, so a work
item ends with exactly one stored result however often it was attempted.
"""

from __future__ import annotations

import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from sqlalchemy import delete, insert, select, tuple_
from sqlalchemy.orm import Session

from osmosis_ai.platform.objects import ObjectStore
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.runs import add_log
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Run, RunCheckpoint, RunMetric, RunSample, utcnow

RUNS_PREFIX = "runs"


def run_prefix(run_id: str) -> str:
    return f"{RUNS_PREFIX}/{run_id}"


def trajectory_key(run_id: str, row_index: int, run_index: int) -> str:
    return f"{run_prefix(run_id)}/trajectories/row_{row_index}_run_{run_index}.json"


def artifacts_prefix(run_id: str, row_index: int, run_index: int) -> str:
    return f"{run_prefix(run_id)}/artifacts/row_{row_index}_run_{run_index}"


def checkpoint_prefix(run_id: str, step: int) -> str:
    return f"{run_prefix(run_id)}/checkpoints/step-{step}"


@dataclass(frozen=True)
class LogEntry:
    message: str
    step: str = "run"
    level: str = "info"
    details: dict[str, object] | None = None
    timestamp: datetime | None = None


@dataclass(frozen=True)
class SampleRecord:
    """One finished eval work item, as the eval journal records it."""

    row_index: int
    run_index: int
    rollout_id: str
    status: str  # success | failed | skipped
    reward: float | None = None
    tokens: int | None = None
    duration_ms: int | None = None
    error_type: str | None = None
    source_row_index: int | None = None
    trajectory: Path | None = None  # the ATIF file to keep
    artifacts: Path | None = None  # a folder to keep as the sample's artifacts


class RunReporter:
    """Fenced writes of one attempt of one run (see the module docstring)."""

    def __init__(
        self,
        database: Database,
        objects: ObjectStore,
        *,
        run_id: str,
        worker_id: str,
        attempt: int,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        self.database = database
        self.objects = objects
        self.run_id = run_id
        self.worker_id = worker_id
        self.attempt = attempt
        self.clock = clock

    # --- reading ---------------------------------------------------------------------------

    def run(self) -> Run:
        """The run as stored now (detached; read its fields freely)."""
        with self.database.read() as session:
            return self._held(session)

    def samples(self) -> list[RunSample]:
        """The samples stored so far (by earlier attempts too), ordered by (row, run)."""
        with self.database.read() as session:
            query = (
                select(RunSample)
                .where(RunSample.run_id == self.run_id)
                .order_by(RunSample.row_index, RunSample.run_index)
            )
            return list(session.scalars(query))

    def checkpoints(self) -> list[RunCheckpoint]:
        with self.database.read() as session:
            query = (
                select(RunCheckpoint)
                .where(RunCheckpoint.run_id == self.run_id)
                .order_by(RunCheckpoint.step)
            )
            return list(session.scalars(query))

    # --- writing ---------------------------------------------------------------------------

    def log(
        self,
        message: str,
        *,
        step: str = "run",
        level: str = "info",
        details: dict[str, object] | None = None,
    ) -> None:
        self.logs([LogEntry(message, step=step, level=level, details=details)])

    def logs(self, entries: Sequence[LogEntry]) -> None:
        if not entries:
            return
        with self.database.transaction() as session:
            run = self._held(session)
            for entry in entries:
                add_log(
                    session,
                    run,
                    entry.timestamp or self.clock(),
                    entry.step,
                    entry.message,
                    level=entry.level,
                    details=entry.details,
                )

    def record_samples(self, samples: Sequence[SampleRecord]) -> None:
        """Keep each sample's files, then store (or replace) its row in one transaction."""
        if not samples:
            return
        keys: dict[tuple[int, int], str | None] = {}
        files: list[tuple[str, Path]] = []
        for sample in samples:
            key = None
            if sample.trajectory is not None and sample.trajectory.is_file():
                key = trajectory_key(self.run_id, sample.row_index, sample.run_index)
                files.append((key, sample.trajectory))
            if sample.artifacts is not None and sample.artifacts.is_dir():
                prefix = artifacts_prefix(self.run_id, sample.row_index, sample.run_index)
                self.objects.delete_prefix(prefix + "/")
                files.extend(_tree(prefix, sample.artifacts))
            keys[(sample.row_index, sample.run_index)] = key
        self.objects.put_files(files)
        now = self.clock()
        rows = {
            (sample.row_index, sample.run_index): {
                "run_id": self.run_id,
                "row_index": sample.row_index,
                "run_index": sample.run_index,
                "source_row_index": sample.source_row_index,
                "rollout_id": sample.rollout_id,
                "status": sample.status,
                "reward": _finite(sample.reward),
                "tokens": sample.tokens,
                "duration_ms": sample.duration_ms,
                "error_type": sample.error_type,
                "trajectory_key": keys[(sample.row_index, sample.run_index)],
                "attempt": self.attempt,
                "created_at": now,
            }
            for sample in samples
        }  # the last record of a key in the batch wins
        with self.database.transaction() as session:
            self._held(session)
            # Replace: two statements per batch, not a SELECT per sample.
            session.execute(
                delete(RunSample).where(
                    RunSample.run_id == self.run_id,
                    tuple_(RunSample.row_index, RunSample.run_index).in_(list(rows)),
                )
            )
            session.execute(insert(RunSample), list(rows.values()))

    def forget_samples(self, keys: Iterable[tuple[int, int]]) -> None:
        """Drop stored samples (a retry of failed items runs them again)."""
        with self.database.transaction() as session:
            self._held(session)
            for row_index, run_index in keys:
                session.execute(
                    delete(RunSample).where(
                        RunSample.run_id == self.run_id,
                        RunSample.row_index == row_index,
                        RunSample.run_index == run_index,
                    )
                )

    def record_metrics(self, step: int, values: Mapping[str, float | None]) -> None:
        """Metric points of one step; a non-finite value is stored as ``None``."""
        if not values:
            return
        now = self.clock()
        with self.database.transaction() as session:
            self._held(session)
            for key, value in values.items():
                session.merge(
                    RunMetric(
                        run_id=self.run_id, key=key, step=step, value=_finite(value), timestamp=now
                    )
                )

    def record_checkpoint(
        self, step: int, source: Path, *, reward: float | None = None, name: str | None = None
    ) -> RunCheckpoint:
        """Keep the checkpoint folder ``source`` as step ``step`` (a step saved again is
        replaced)."""
        prefix = checkpoint_prefix(self.run_id, step)
        self.objects.delete_prefix(prefix + "/")
        self.put_tree(prefix, source)
        with self.database.transaction() as session:
            run = self._held(session)
            found = session.scalar(
                select(RunCheckpoint).where(
                    RunCheckpoint.run_id == self.run_id, RunCheckpoint.step == step
                )
            )
            checkpoint = found or RunCheckpoint(run_id=self.run_id, step=step)
            checkpoint.name = name or f"{run.name}-step-{step}"
            checkpoint.status = "saved"
            checkpoint.reward = _finite(reward)
            checkpoint.object_prefix = prefix
            checkpoint.created_at = self.clock()
            if found is None:
                session.add(checkpoint)
            session.flush()
            return checkpoint

    def progress(
        self,
        *,
        current_step: int | None = None,
        total_steps: int | None = None,
        examples_processed: int | None = None,
        reward: float | None = None,
        results: dict[str, object] | None = None,
    ) -> None:
        """Update the run's progress fields (``None`` leaves a field as it is)."""
        with self.database.transaction() as session:
            run = self._held(session)
            if current_step is not None:
                run.current_step = current_step
            if total_steps is not None:
                run.total_steps = total_steps
            if examples_processed is not None:
                run.examples_processed_count = examples_processed
            if reward is not None and math.isfinite(reward):
                run.reward = reward
            if results is not None:
                run.results = results
            run.updated_at = self.clock()

    def end(self, status: str, *, error: str | None = None, message: str | None = None) -> None:
        """End the run (a run already stopped stays stopped) and release the lease."""
        with self.database.transaction() as session:
            work.end_attempt(
                session,
                self.run_id,
                self.worker_id,
                self.attempt,
                status=status,
                now=self.clock(),
                error=error,
                message=message,
            )

    # --- files -----------------------------------------------------------------------------

    def put_file(self, key: str, source: Path) -> str:
        with source.open("rb") as handle:
            self.objects.put(key, iter(lambda: handle.read(1 << 20), b""))
        return key

    def put_tree(self, prefix: str, root: Path) -> int:
        """Copy every regular file under ``root`` (symlinks skipped) to ``prefix/<rel>``."""
        files = _tree(prefix, root)
        self.objects.put_files(files)
        return len(files)

    def _held(self, session: Session) -> Run:
        return work.held_run(session, self.run_id, self.worker_id, self.attempt)


def _tree(prefix: str, root: Path) -> list[tuple[str, Path]]:
    """``(prefix/<relative path>, file)`` for every regular file under ``root``; symlinks are
    skipped, so a link out of the folder never reaches the store."""
    found: list[tuple[str, Path]] = []
    for folder, dirs, names in os.walk(root, followlinks=False):
        dirs.sort()
        for name in sorted(names):
            path = Path(folder) / name
            if path.is_symlink() or not path.is_file():
                continue
            found.append((f"{prefix}/{path.relative_to(root).as_posix()}", path))
    return found


def _finite(value: float | None) -> float | None:
    if value is None:
        return None
    value = float(value)
    return value if math.isfinite(value) else None
