"""The append-only journal ``events.jsonl``: one canonical JSON record per terminal attempt.

:meth:`Journal.append` returns only after the line is written and fsynced, so a result is
acknowledged (or dispatch moves on) only once it survives a crash. Replay keeps the latest
record per ``(row_index, run_index)`` by append order; a torn last line is discarded.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, cast, get_args

from pydantic import JsonValue

from osmosis_ai.errors import OsmosisError, UsageError
from osmosis_ai.rollout.ids import validate_rollout_id
from osmosis_ai.rundir.durable import HeldFile, canonical_json, open_owner_only, write_all

JournalStatus = Literal["success", "failed", "skipped"]
WorkKey = tuple[int, int]
"""``(row_index, run_index)``: the identity of one work item."""

_STATUSES: frozenset[str] = frozenset(get_args(JournalStatus))


class JournalCorruptError(OsmosisError):
    """A journal line before the last one is not a valid record."""


def _check_count(name: str, value: object, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if not (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        raise UsageError(f"{name} must be a non-negative integer, got {value!r}")


def _check_reward(value: object) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        raise UsageError(f"reward must be a finite number or None, got {value!r}")


def _check_text(name: str, value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise UsageError(f"{name} must be a string or None, got {value!r}")


def _torn_warning(path: Path, size: int) -> str:
    return (
        f"{path}: discarded a torn last line ({size} bytes) left by an interrupted write; "
        "that attempt was never acknowledged and its work item stays pending"
    )


@dataclass(frozen=True, slots=True)
class AttemptRecord:
    """What every record of one finished attempt holds: its work item, its rollout id and
    how it ended (the journal's line, and the index entry of the attempt a run selected)."""

    row_index: int
    run_index: int
    rollout_id: str
    status: JournalStatus
    duration_ms: int
    reward: float | None = None
    tokens: int | None = None
    error_type: str | None = None

    @property
    def key(self) -> WorkKey:
        return (self.row_index, self.run_index)


@dataclass(frozen=True, slots=True)
class JournalRecord(AttemptRecord):
    """The terminal outcome of one attempt at one work item."""

    source_row_index: int | None = None

    def __post_init__(self) -> None:
        _check_count("row_index", self.row_index)
        _check_count("run_index", self.run_index)
        _check_count("duration_ms", self.duration_ms)
        _check_count("source_row_index", self.source_row_index, optional=True)
        _check_count("tokens", self.tokens, optional=True)
        _check_text("status", self.status)
        if self.status not in _STATUSES:
            raise UsageError(f"status must be one of {sorted(_STATUSES)}, got {self.status!r}")
        _check_text("rollout_id", self.rollout_id)
        try:
            validate_rollout_id(self.rollout_id)
        except (ValueError, TypeError) as exc:
            raise UsageError(str(exc)) from None
        _check_reward(self.reward)
        _check_text("error_type", self.error_type)

    def to_json(self) -> dict[str, JsonValue]:
        """The record as written to the journal: ``None`` fields are left out."""
        data: dict[str, JsonValue] = {
            "row_index": self.row_index,
            "run_index": self.run_index,
            "rollout_id": self.rollout_id,
            "status": self.status,
            "duration_ms": self.duration_ms,
            "source_row_index": self.source_row_index,
            "reward": None if self.reward is None else float(self.reward),
            "tokens": self.tokens,
            "error_type": self.error_type,
        }
        return {key: value for key, value in data.items() if value is not None}

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> JournalRecord:
        """Read a journal line's object; unknown keys are ignored, bad values raise UsageError."""
        missing = [k for k in ("row_index", "run_index", "rollout_id", "status") if k not in data]
        if missing:
            raise UsageError(f"missing keys {missing}")
        duration: object = data.get("duration_ms", 0)
        if isinstance(duration, float) and math.isfinite(duration) and duration >= 0:
            duration = round(duration)
        reward = data.get("reward")
        if isinstance(reward, int) and not isinstance(reward, bool):
            reward = float(reward)
        # Types are checked by __post_init__; the casts only tell the checker so.
        return cls(
            row_index=cast(int, data["row_index"]),
            run_index=cast(int, data["run_index"]),
            rollout_id=cast(str, data["rollout_id"]),
            status=cast(JournalStatus, data["status"]),
            duration_ms=cast(int, duration),
            source_row_index=cast("int | None", data.get("source_row_index")),
            reward=cast("float | None", reward),
            tokens=cast("int | None", data.get("tokens")),
            error_type=cast("str | None", data.get("error_type")),
        )


@dataclass(frozen=True)
class JournalState:
    """What a replay found: every record in append order, the latest per item, warnings."""

    records: tuple[JournalRecord, ...] = ()
    latest: Mapping[WorkKey, JournalRecord] = field(default_factory=dict[WorkKey, JournalRecord])
    warnings: tuple[str, ...] = ()


def replay_journal(path: Path) -> JournalState:
    """Read the journal at ``path`` (a missing file is an empty journal).

    A last line without its newline is a write the crash interrupted: it is discarded and
    reported in ``warnings``. A damaged line before it raises :class:`JournalCorruptError`.
    """
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        return JournalState()
    lines = data.split(b"\n")
    tail = lines.pop()
    warnings: list[str] = []
    if tail:
        warnings.append(_torn_warning(path, len(tail)))
    records: list[JournalRecord] = []
    latest: dict[WorkKey, JournalRecord] = {}
    for number, raw in enumerate(lines, start=1):
        if not raw.strip():
            continue
        try:
            obj = json.loads(raw)
            if not isinstance(obj, dict):
                raise UsageError("not a JSON object")
            record = JournalRecord.from_json(cast("dict[str, object]", obj))
        except (ValueError, TypeError, UsageError) as exc:
            raise JournalCorruptError(
                f"{path} line {number} is not a valid journal record ({exc}); the journal is "
                "damaged: rerun with --fresh to archive this run (nothing is deleted) and start "
                "over"
            ) from None
        records.append(record)
        latest[record.key] = record
    return JournalState(records=tuple(records), latest=latest, warnings=tuple(warnings))


class Journal(HeldFile):
    """An open journal file; appends are serialized, written whole and fsynced."""

    def __init__(self, path: Path, fd: int, warnings: tuple[str, ...]) -> None:
        super().__init__(path, fd)
        self._open_warnings = warnings

    @classmethod
    def open(cls, path: str | os.PathLike[str]) -> Journal:
        """Open (or create, owner-only) the journal at ``path`` for appending.

        A torn last line is cut off before the first append so that it cannot glue itself
        to the next record; :meth:`replay` reports it.
        """
        path = Path(path)
        fd = open_owner_only(path, os.O_RDWR | os.O_APPEND)
        try:
            warnings = _cut_torn_tail(fd, path)
        except BaseException:
            os.close(fd)
            raise
        return cls(path, fd, warnings)

    def append(self, record: JournalRecord) -> None:
        """Write ``record`` as one line and fsync it; returns only once it is durable."""
        line = (canonical_json(record.to_json()) + "\n").encode("utf-8")
        with self._lock:
            if self._fd < 0:
                raise UsageError(f"journal {self.path} is closed")
            start = os.fstat(self._fd).st_size
            try:
                write_all(self._fd, line)
                os.fsync(self._fd)
            except BaseException:
                # Never leave half a line behind: the next append would be glued to it.
                try:
                    os.ftruncate(self._fd, start)
                    os.fsync(self._fd)
                except OSError:
                    pass
                raise

    def replay(self) -> JournalState:
        """Replay the file, including the warning about a tail cut off at open."""
        state = replay_journal(self.path)
        if not self._open_warnings:
            return state
        return JournalState(state.records, state.latest, self._open_warnings + state.warnings)


def _cut_torn_tail(fd: int, path: Path) -> tuple[str, ...]:
    size = os.fstat(fd).st_size
    if size == 0 or os.pread(fd, 1, size - 1) == b"\n":
        return ()
    end = size
    keep = 0
    while end > 0:
        start = max(0, end - 65536)
        chunk = os.pread(fd, end - start, start)
        newline = chunk.rfind(b"\n")
        if newline >= 0:
            keep = start + newline + 1
            break
        end = start
    os.ftruncate(fd, keep)
    os.fsync(fd)
    return (_torn_warning(path, size - keep),)
