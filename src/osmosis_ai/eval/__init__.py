"""Local evaluation: the durable store and the metrics of ``osmosis eval run``.

The journal is the source of truth; the run dir's other files are projections rebuilt from
it. Orchestration and the CLI build on these pieces.

Names resolve on first access (PEP 562): ``osmosis eval run`` imports only what it needs
before it starts the rollout server, and the rest while the server boots.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_ai.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    "atomic_write_bytes": "osmosis_ai.rundir.durable",
    "atomic_write_json": "osmosis_ai.rundir.durable",
    "canonical_json": "osmosis_ai.rundir.durable",
    "DatasetLock": "osmosis_ai.eval.inputs",
    "Manifest": "osmosis_ai.eval.inputs",
    "Provenance": "osmosis_ai.eval.inputs",
    "RolloutLock": "osmosis_ai.eval.inputs",
    "RunInputs": "osmosis_ai.eval.inputs",
    "TimeoutsLock": "osmosis_ai.eval.inputs",
    "VersionsLock": "osmosis_ai.eval.inputs",
    "rollout_source_digest": "osmosis_ai.eval.inputs",
    "Journal": "osmosis_ai.eval.journal",
    "JournalCorruptError": "osmosis_ai.eval.journal",
    "JournalRecord": "osmosis_ai.eval.journal",
    "JournalState": "osmosis_ai.eval.journal",
    "JournalStatus": "osmosis_ai.eval.journal",
    "WorkKey": "osmosis_ai.eval.journal",
    "replay_journal": "osmosis_ai.eval.journal",
    "REDACTED": "osmosis_ai.rundir.logs",
    "Redactor": "osmosis_ai.rundir.logs",
    "RunLog": "osmosis_ai.rundir.logs",
    "EvalMetrics": "osmosis_ai.eval.metrics",
    "PassAtK": "osmosis_ai.eval.metrics",
    "RewardStats": "osmosis_ai.eval.metrics",
    "aggregate_metrics": "osmosis_ai.eval.metrics",
    "pass_at_k": "osmosis_ai.eval.metrics",
    "LocalErrorType": "osmosis_ai.eval.outcome",
    "classify_admission_rejection": "osmosis_ai.eval.outcome",
    "classify_callback_result": "osmosis_ai.eval.outcome",
    "classify_polling_result": "osmosis_ai.eval.outcome",
    "supervisor_error_record": "osmosis_ai.eval.outcome",
    "EvalRunInfo": "osmosis_ai.eval.projections",
    "FailedRow": "osmosis_ai.eval.projections",
    "IndexEntry": "osmosis_ai.eval.projections",
    "Projections": "osmosis_ai.eval.projections",
    "Projector": "osmosis_ai.eval.projections",
    "RunProgress": "osmosis_ai.eval.projections",
    "load_trajectory": "osmosis_ai.eval.projections",
    "project_artifacts": "osmosis_ai.eval.projections",
    "rebuild_projections": "osmosis_ai.eval.projections",
    "ResumeMismatchError": "osmosis_ai.eval.rundir",
    "RunDir": "osmosis_ai.eval.rundir",
    "RunLock": "osmosis_ai.eval.rundir",
    "RunLockedError": "osmosis_ai.eval.rundir",
    "archive_run_dir": "osmosis_ai.eval.rundir",
    "open_run": "osmosis_ai.eval.rundir",
    "Attempt": "osmosis_ai.eval.workitems",
    "WorkCounts": "osmosis_ai.eval.workitems",
    "WorkItem": "osmosis_ai.eval.workitems",
    "build_work_items": "osmosis_ai.eval.workitems",
    "count_work": "osmosis_ai.eval.workitems",
    "new_rollout_id": "osmosis_ai.eval.workitems",
    "pending_items": "osmosis_ai.eval.workitems",
}

if TYPE_CHECKING:
    from osmosis_ai.eval.inputs import DatasetLock as DatasetLock
    from osmosis_ai.eval.inputs import Manifest as Manifest
    from osmosis_ai.eval.inputs import Provenance as Provenance
    from osmosis_ai.eval.inputs import RolloutLock as RolloutLock
    from osmosis_ai.eval.inputs import RunInputs as RunInputs
    from osmosis_ai.eval.inputs import TimeoutsLock as TimeoutsLock
    from osmosis_ai.eval.inputs import VersionsLock as VersionsLock
    from osmosis_ai.eval.inputs import rollout_source_digest as rollout_source_digest
    from osmosis_ai.eval.journal import Journal as Journal
    from osmosis_ai.eval.journal import JournalCorruptError as JournalCorruptError
    from osmosis_ai.eval.journal import JournalRecord as JournalRecord
    from osmosis_ai.eval.journal import JournalState as JournalState
    from osmosis_ai.eval.journal import JournalStatus as JournalStatus
    from osmosis_ai.eval.journal import WorkKey as WorkKey
    from osmosis_ai.eval.journal import replay_journal as replay_journal
    from osmosis_ai.eval.metrics import EvalMetrics as EvalMetrics
    from osmosis_ai.eval.metrics import PassAtK as PassAtK
    from osmosis_ai.eval.metrics import RewardStats as RewardStats
    from osmosis_ai.eval.metrics import aggregate_metrics as aggregate_metrics
    from osmosis_ai.eval.metrics import pass_at_k as pass_at_k
    from osmosis_ai.eval.outcome import LocalErrorType as LocalErrorType
    from osmosis_ai.eval.outcome import classify_admission_rejection as classify_admission_rejection
    from osmosis_ai.eval.outcome import classify_callback_result as classify_callback_result
    from osmosis_ai.eval.outcome import classify_polling_result as classify_polling_result
    from osmosis_ai.eval.outcome import supervisor_error_record as supervisor_error_record
    from osmosis_ai.eval.projections import EvalRunInfo as EvalRunInfo
    from osmosis_ai.eval.projections import FailedRow as FailedRow
    from osmosis_ai.eval.projections import IndexEntry as IndexEntry
    from osmosis_ai.eval.projections import Projections as Projections
    from osmosis_ai.eval.projections import Projector as Projector
    from osmosis_ai.eval.projections import RunProgress as RunProgress
    from osmosis_ai.eval.projections import load_trajectory as load_trajectory
    from osmosis_ai.eval.projections import project_artifacts as project_artifacts
    from osmosis_ai.eval.projections import rebuild_projections as rebuild_projections
    from osmosis_ai.eval.rundir import ResumeMismatchError as ResumeMismatchError
    from osmosis_ai.eval.rundir import RunDir as RunDir
    from osmosis_ai.eval.rundir import RunLock as RunLock
    from osmosis_ai.eval.rundir import RunLockedError as RunLockedError
    from osmosis_ai.eval.rundir import archive_run_dir as archive_run_dir
    from osmosis_ai.eval.rundir import open_run as open_run
    from osmosis_ai.eval.workitems import Attempt as Attempt
    from osmosis_ai.eval.workitems import WorkCounts as WorkCounts
    from osmosis_ai.eval.workitems import WorkItem as WorkItem
    from osmosis_ai.eval.workitems import build_work_items as build_work_items
    from osmosis_ai.eval.workitems import count_work as count_work
    from osmosis_ai.eval.workitems import new_rollout_id as new_rollout_id
    from osmosis_ai.eval.workitems import pending_items as pending_items
    from osmosis_ai.rundir.durable import atomic_write_bytes as atomic_write_bytes
    from osmosis_ai.rundir.durable import atomic_write_json as atomic_write_json
    from osmosis_ai.rundir.durable import canonical_json as canonical_json
    from osmosis_ai.rundir.logs import REDACTED as REDACTED
    from osmosis_ai.rundir.logs import Redactor as Redactor
    from osmosis_ai.rundir.logs import RunLog as RunLog

__all__ = [  # the names of _EXPORTS
    "REDACTED",
    "Attempt",
    "DatasetLock",
    "EvalMetrics",
    "EvalRunInfo",
    "FailedRow",
    "IndexEntry",
    "Journal",
    "JournalCorruptError",
    "JournalRecord",
    "JournalState",
    "JournalStatus",
    "LocalErrorType",
    "Manifest",
    "PassAtK",
    "Projections",
    "Projector",
    "Provenance",
    "Redactor",
    "ResumeMismatchError",
    "RewardStats",
    "RolloutLock",
    "RunDir",
    "RunInputs",
    "RunLock",
    "RunLockedError",
    "RunLog",
    "RunProgress",
    "TimeoutsLock",
    "VersionsLock",
    "WorkCounts",
    "WorkItem",
    "WorkKey",
    "aggregate_metrics",
    "archive_run_dir",
    "atomic_write_bytes",
    "atomic_write_json",
    "build_work_items",
    "canonical_json",
    "classify_admission_rejection",
    "classify_callback_result",
    "classify_polling_result",
    "count_work",
    "load_trajectory",
    "new_rollout_id",
    "open_run",
    "pass_at_k",
    "pending_items",
    "project_artifacts",
    "rebuild_projections",
    "replay_journal",
    "rollout_source_digest",
    "supervisor_error_record",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
