"""Projections of a run directory, rebuilt from the journal and ``rollout_trials/``.

``index.jsonl`` (and its byte-identical copy ``summary.jsonl``), ``progress.json``,
``metrics.json``, and the selected attempt's trajectory and artifacts per work item. Nothing
here decides what reruns; every file is written atomically and can be rebuilt at any time.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import stat
import tempfile
import uuid
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from pydantic import JsonValue

from osmosis_ai.eval.journal import AttemptRecord, JournalRecord, JournalState, WorkKey
from osmosis_ai.eval.metrics import EvalMetrics, aggregate_metrics
from osmosis_ai.eval.rundir import TRIALS_DIR
from osmosis_ai.rundir.durable import (
    OWNER_ONLY,
    atomic_write_bytes,
    atomic_write_json,
    canonical_json,
    ensure_dir,
    fsync_dir,
    read_regular_file,
)

INDEX_FILE = "index.jsonl"
SUMMARY_FILE = "summary.jsonl"
PROGRESS_FILE = "progress.json"
METRICS_FILE = "metrics.json"
TRAJECTORIES_DIR = "trajectories"
ARTIFACTS_DIR = "artifacts"
TRAJECTORY_FILE = "trajectory.json"
"""Name of the ATIF document in a trial folder, and ``trajectory_filename`` in the index."""

_STEM = re.compile(r"^row_\d+_run_\d+$")


def projection_stem(row_index: int, run_index: int) -> str:
    return f"row_{row_index}_run_{run_index}"


@dataclass(frozen=True, slots=True)
class IndexEntry(AttemptRecord):
    """One line of ``index.jsonl``: the selected attempt of one work item."""

    trajectory_filename: str | None = None
    resumed: bool = False
    """The attempt was recorded by an earlier invocation of this run."""

    def to_json(self) -> dict[str, JsonValue]:
        data: dict[str, JsonValue] = {
            "row_index": self.row_index,
            "run_index": self.run_index,
            "rollout_id": self.rollout_id,
            "trajectory_filename": self.trajectory_filename,
            "status": self.status,
            "reward": self.reward,
            "tokens": self.tokens,
            "duration_ms": self.duration_ms,
            "error_type": self.error_type,
            "resumed": True if self.resumed else None,
        }
        return {key: value for key, value in data.items() if value is not None}


@dataclass(frozen=True, slots=True)
class RunProgress:
    """``progress.json``: work items in total, rows sampled, rows in the dataset file."""

    total_runs: int
    sampled_rows: int
    total_dataset_rows: int


@dataclass(frozen=True, slots=True)
class EvalRunInfo:
    """The ``eval_run`` block of ``metrics.json`` (display only)."""

    id: str
    status: str
    name: str
    dataset_name: str
    model_name: str
    rollout_name: str
    duration_ms: int
    started_at: str
    completed_at: str | None = None


@dataclass(frozen=True, slots=True)
class FailedRow:
    """A failed work item as the ``eval.run`` result lists it."""

    row_index: int
    source_row_index: int | None
    run_index: int
    rollout_id: str
    error_type: str | None
    rollout_dir: str


@dataclass(frozen=True)
class Projections:
    """What one refresh wrote, for the caller's result and rendering."""

    entries: tuple[IndexEntry, ...]
    metrics: EvalMetrics
    failed_rows: tuple[FailedRow, ...]


@dataclass(frozen=True, slots=True)
class _Trajectory:
    tokens: int | None
    data: bytes | None  # present only when read during this refresh


class Projector:
    """Refreshes the projections of one run dir, copying only what changed since last time.

    The first refresh projects every item and prunes stale projections; later ones re-copy
    an item's trajectory and artifacts only when its selected attempt changed or its
    trajectory became valid, so refreshing after every result stays linear.
    """

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self._valid: dict[str, int | None] = {}  # rollout id -> tokens of a valid trajectory
        self._projected: dict[WorkKey, tuple[str, bool]] | None = None

    def refresh(
        self,
        state: JournalState,
        *,
        run: EvalRunInfo,
        progress: RunProgress,
        pass_threshold: float,
        n_runs: int,
        resumed_ids: Collection[str] = (),
    ) -> Projections:
        full = self._projected is None
        projected = self._projected if self._projected is not None else {}
        entries: list[IndexEntry] = []
        for key in sorted(state.latest):
            record = state.latest[key]
            trajectory = self._trajectory(record.rollout_id)
            tokens = record.tokens
            if tokens is None and trajectory is not None:
                tokens = trajectory.tokens
            entries.append(_entry(record, trajectory is not None, tokens, resumed_ids))
            wanted = (record.rollout_id, trajectory is not None)
            if full or projected.get(key) != wanted:
                self._project(record, trajectory)
                projected[key] = wanted
        if full:
            self._prune({projection_stem(*key) for key in state.latest})
        self._projected = projected

        index = "".join(canonical_json(e.to_json()) + "\n" for e in entries).encode("utf-8")
        atomic_write_bytes(self.run_dir / INDEX_FILE, index)
        atomic_write_bytes(self.run_dir / SUMMARY_FILE, index)
        atomic_write_json(
            self.run_dir / PROGRESS_FILE,
            {
                "total_runs": progress.total_runs,
                "sampled_rows": progress.sampled_rows,
                "total_dataset_rows": progress.total_dataset_rows,
            },
        )
        metrics = aggregate_metrics(entries, pass_threshold, n_runs)
        run_block = {k: v for k, v in _fields(run).items() if v is not None}
        atomic_write_json(
            self.run_dir / METRICS_FILE, {"eval_run": run_block, "summary": metrics.to_json()}
        )
        failed = tuple(
            FailedRow(
                row_index=r.row_index,
                source_row_index=r.source_row_index,
                run_index=r.run_index,
                rollout_id=r.rollout_id,
                error_type=r.error_type,
                rollout_dir=str(self.run_dir / TRIALS_DIR / r.rollout_id),
            )
            for r in (state.latest[key] for key in sorted(state.latest))
            if r.status == "failed"
        )
        return Projections(entries=tuple(entries), metrics=metrics, failed_rows=failed)

    def _trajectory(self, rollout_id: str) -> _Trajectory | None:
        if rollout_id in self._valid:
            return _Trajectory(self._valid[rollout_id], None)
        path = self.run_dir / TRIALS_DIR / rollout_id / TRAJECTORY_FILE
        loaded = load_trajectory(path, rollout_id)
        if loaded is None:
            return None  # not cached: it may still be written
        data, document = loaded
        tokens = trajectory_tokens(document)
        self._valid[rollout_id] = tokens
        return _Trajectory(tokens, data)

    def _project(self, record: JournalRecord, trajectory: _Trajectory | None) -> None:
        stem = projection_stem(record.row_index, record.run_index)
        trial = self.run_dir / TRIALS_DIR / record.rollout_id
        target = self.run_dir / TRAJECTORIES_DIR / f"{stem}.json"
        data = None
        if trajectory is not None:
            data = trajectory.data
            if data is None:
                loaded = load_trajectory(trial / TRAJECTORY_FILE, record.rollout_id)
                data = None if loaded is None else loaded[0]
        if data is not None:
            atomic_write_bytes(target, data)
        elif os.path.lexists(target):
            os.unlink(target)
            fsync_dir(target.parent)
        project_artifacts(trial / ARTIFACTS_DIR, self.run_dir / ARTIFACTS_DIR / stem)

    def _prune(self, stems: set[str]) -> None:
        for folder, suffix in ((TRAJECTORIES_DIR, ".json"), (ARTIFACTS_DIR, "")):
            base = self.run_dir / folder
            if not base.is_dir():
                continue
            for entry in os.scandir(base):
                name = entry.name.removesuffix(suffix) if suffix else entry.name
                leftover = entry.name.startswith(".") and ".tmp" in entry.name
                if leftover or (_STEM.match(name) and name not in stems):
                    _remove(Path(entry.path))
            fsync_dir(base)


def rebuild_projections(
    run_dir: Path,
    state: JournalState,
    *,
    run: EvalRunInfo,
    progress: RunProgress,
    pass_threshold: float,
    n_runs: int,
    resumed_ids: Collection[str] = (),
) -> Projections:
    """Rebuild every projection of ``run_dir`` from ``state`` (a full, one-off refresh)."""
    return Projector(run_dir).refresh(
        state,
        run=run,
        progress=progress,
        pass_threshold=pass_threshold,
        n_runs=n_runs,
        resumed_ids=resumed_ids,
    )


def load_trajectory(path: Path, rollout_id: str) -> tuple[bytes, Mapping[str, object]] | None:
    """The bytes and document of an ATIF file whose ``session_id`` is ``rollout_id``.

    ``None`` when the file is missing, a symlink, unparseable, not an object, or names
    another rollout.
    """
    data = read_regular_file(path)
    if data is None:
        return None
    try:
        document = json.loads(data)
    except ValueError:
        return None
    if not isinstance(document, dict) or document.get("session_id") != rollout_id:
        return None
    return data, document


def trajectory_tokens(document: Mapping[str, object]) -> int | None:
    """Prompt plus completion tokens from an ATIF document's ``final_metrics``, if any."""
    metrics = document.get("final_metrics")
    if not isinstance(metrics, Mapping):
        return None
    values = [metrics.get(k) for k in ("total_prompt_tokens", "total_completion_tokens")]
    counts = [v for v in values if isinstance(v, int) and not isinstance(v, bool) and v >= 0]
    return sum(counts) if counts else None


def project_artifacts(source: Path, target: Path) -> int:
    """Replace ``target`` with a copy of the regular files and folders under ``source``.

    Symlinks and special files are skipped and no link is ever followed (a symlinked
    ``source`` copies nothing). The copy is built beside ``target`` and swapped in; with no
    file to copy, ``target`` is removed. Returns the number of files copied.
    """
    if not os.path.lexists(target) and (not _is_real_dir(source) or _is_empty_dir(source)):
        return 0  # nothing to copy and nothing to replace (servers make empty folders)
    ensure_dir(target.parent)
    staging = Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp"))
    try:
        copied = _copy_tree(source, staging) if _is_real_dir(source) else 0
        if os.path.lexists(target):
            old = target.with_name(f".{target.name}.{uuid.uuid4().hex}.tmp")
            os.rename(target, old)
            _remove(old)
        if copied:
            os.rename(staging, target)
        else:
            _remove(staging)
    except BaseException:
        _remove(staging)
        raise
    fsync_dir(target.parent)
    return copied


def _copy_tree(source: Path, target: Path) -> int:
    copied = 0
    with os.scandir(source) as scan:
        entries = sorted(scan, key=lambda e: e.name)
    for entry in entries:
        if entry.is_symlink():
            continue
        if entry.is_dir(follow_symlinks=False):
            child = target / entry.name
            child.mkdir(mode=0o700)
            copied += _copy_tree(Path(entry.path), child)
        elif entry.is_file(follow_symlinks=False):
            data = read_regular_file(Path(entry.path))
            if data is None:  # swapped for a link or special file since the scan
                continue
            fd = os.open(target / entry.name, os.O_WRONLY | os.O_CREAT | os.O_EXCL, OWNER_ONLY)
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
                handle.flush()
                os.fsync(handle.fileno())
            copied += 1
    fsync_dir(target)
    return copied


def _is_empty_dir(path: Path) -> bool:
    try:
        with os.scandir(path) as entries:
            return next(entries, None) is None
    except OSError:
        return False


def _is_real_dir(path: Path) -> bool:
    try:
        return stat.S_ISDIR(os.lstat(path).st_mode)
    except OSError:
        return False


def _remove(path: Path) -> None:
    with contextlib.suppress(FileNotFoundError):
        if _is_real_dir(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def _entry(
    record: JournalRecord, has_trajectory: bool, tokens: int | None, resumed_ids: Collection[str]
) -> IndexEntry:
    return IndexEntry(
        row_index=record.row_index,
        run_index=record.run_index,
        rollout_id=record.rollout_id,
        status=record.status,
        duration_ms=record.duration_ms,
        trajectory_filename=TRAJECTORY_FILE if has_trajectory else None,
        reward=record.reward,
        tokens=tokens,
        error_type=record.error_type,
        resumed=record.rollout_id in resumed_ids,
    )


def _fields(run: EvalRunInfo) -> dict[str, JsonValue]:
    return {
        "id": run.id,
        "status": run.status,
        "name": run.name,
        "dataset_name": run.dataset_name,
        "model_name": run.model_name,
        "rollout_name": run.rollout_name,
        "duration_ms": run.duration_ms,
        "started_at": run.started_at,
        "completed_at": run.completed_at,
    }
