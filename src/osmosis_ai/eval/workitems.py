"""Work items (selected rows × runs) and which of them still need an attempt.

``row_index`` is the position in the row selection, ``source_row_index`` the row's offset in
the dataset file, ``run_index`` counts 0..n-1. Every attempt gets a fresh rollout id, so a
retried item never reuses the id of the attempt it supersedes.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from osmosis_ai.errors import UsageError
from osmosis_ai.eval.journal import JournalState, WorkKey


def new_rollout_id() -> str:
    """A fresh rollout id: 32 hex digits (uuid4), one URL path segment."""
    return uuid.uuid4().hex


@dataclass(frozen=True, slots=True, order=True)
class WorkItem:
    """One row of the selection, evaluated for the ``run_index``-th time."""

    row_index: int
    run_index: int
    source_row_index: int

    @property
    def key(self) -> WorkKey:
        return (self.row_index, self.run_index)

    def new_attempt(self) -> Attempt:
        """A new attempt at this item under a fresh rollout id."""
        return Attempt(self, new_rollout_id())


@dataclass(frozen=True, slots=True)
class Attempt:
    """One dispatch of a work item: the item and the rollout id it runs under."""

    item: WorkItem
    rollout_id: str

    @property
    def key(self) -> WorkKey:
        return self.item.key

    @property
    def row_index(self) -> int:
        return self.item.row_index

    @property
    def run_index(self) -> int:
        return self.item.run_index

    @property
    def source_row_index(self) -> int:
        return self.item.source_row_index


def build_work_items(selected_source_rows: Sequence[int], n: int) -> list[WorkItem]:
    """Every work item of a run, ordered by ``(row_index, run_index)``.

    ``selected_source_rows`` are the dataset offsets in selection order; ``n`` is the number
    of runs per row.
    """
    if n < 1:
        raise UsageError(f"n (runs per row) must be at least 1, got {n}")
    if len(set(selected_source_rows)) != len(selected_source_rows):
        raise UsageError("selected_source_rows must not repeat a row")
    if any(row < 0 for row in selected_source_rows):
        raise UsageError("selected_source_rows must be non-negative offsets")
    return [
        WorkItem(row_index=row_index, run_index=run_index, source_row_index=source)
        for row_index, source in enumerate(selected_source_rows)
        for run_index in range(n)
    ]


def pending_items(
    all_items: Iterable[WorkItem], state: JournalState, *, retry_failed: bool
) -> list[WorkItem]:
    """The items that still need an attempt, in the order of ``all_items``.

    An item without a terminal record is pending. With ``retry_failed``, an item whose latest
    record is ``failed`` or ``skipped`` is pending again; its new attempt supersedes the old
    one (which stays on disk, unindexed).
    """
    pending: list[WorkItem] = []
    for item in all_items:
        record = state.latest.get(item.key)
        if record is None or (retry_failed and record.status != "success"):
            pending.append(item)
    return pending


@dataclass(frozen=True, slots=True)
class WorkCounts:
    """How the work items of a run stand after a replay."""

    total: int
    succeeded: int
    failed: int
    skipped: int

    @property
    def terminal(self) -> int:
        return self.succeeded + self.failed + self.skipped

    @property
    def pending(self) -> int:
        return self.total - self.terminal


def count_work(all_items: Iterable[WorkItem], state: JournalState) -> WorkCounts:
    """Count items by the status of their latest record; records of unknown items are ignored."""
    total = succeeded = failed = skipped = 0
    for item in all_items:
        total += 1
        record = state.latest.get(item.key)
        if record is None:
            continue
        if record.status == "success":
            succeeded += 1
        elif record.status == "failed":
            failed += 1
        else:
            skipped += 1
    return WorkCounts(total=total, succeeded=succeeded, failed=failed, skipped=skipped)
