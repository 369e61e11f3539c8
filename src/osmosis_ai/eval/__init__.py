"""Local evaluation: the durable store and the metrics of ``osmosis eval run``.

The journal is the source of truth; the run dir's other files are projections rebuilt from
it. Orchestration and the CLI build on these pieces.
"""

from __future__ import annotations

from osmosis_ai.eval.durable import atomic_write_bytes, atomic_write_json, canonical_json
from osmosis_ai.eval.inputs import (
    DatasetLock,
    Manifest,
    Provenance,
    RolloutLock,
    RunInputs,
    TimeoutsLock,
    VersionsLock,
    rollout_source_digest,
)
from osmosis_ai.eval.journal import (
    Journal,
    JournalCorruptError,
    JournalRecord,
    JournalState,
    JournalStatus,
    WorkKey,
    replay_journal,
)
from osmosis_ai.eval.logs import REDACTED, Redactor, RunLog
from osmosis_ai.eval.metrics import EvalMetrics, PassAtK, RewardStats, aggregate_metrics, pass_at_k
from osmosis_ai.eval.outcome import (
    LocalErrorType,
    classify_admission_rejection,
    classify_callback_result,
    classify_polling_result,
    supervisor_error_record,
)
from osmosis_ai.eval.projections import (
    EvalRunInfo,
    FailedRow,
    IndexEntry,
    Projections,
    Projector,
    RunProgress,
    load_trajectory,
    project_artifacts,
    rebuild_projections,
)
from osmosis_ai.eval.rundir import (
    ResumeMismatchError,
    RunDir,
    RunLock,
    RunLockedError,
    archive_run_dir,
    open_run,
)
from osmosis_ai.eval.workitems import (
    Attempt,
    WorkCounts,
    WorkItem,
    build_work_items,
    count_work,
    new_rollout_id,
    pending_items,
)

__all__ = [
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
