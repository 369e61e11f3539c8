"""The workspace: layout and scaffold, eval/training TOML configs, dataset files, run names.

A leaf library behind ``osmosis eval run``, ``train run``, ``dataset validate`` and ``doctor``:
functions return result objects or raise errors from :mod:`osmosis_ai.errors`; none print.
"""

from __future__ import annotations

from osmosis_ai.workspace.config import (
    EvalConfig,
    Experiment,
    TrainingConfig,
    load_eval_config,
    load_training_config,
)
from osmosis_ai.workspace.dataset import (
    PARQUET_VALIDATION_SKIPPED,
    DatasetValidation,
    DatasetWarning,
    dataset_sha256,
    read_rows,
    validate_dataset,
)
from osmosis_ai.workspace.issues import ConfigIssue, ConfigValidationError
from osmosis_ai.workspace.layout import (
    ScaffoldConflictError,
    ScaffoldEntry,
    ScaffoldReport,
    Workspace,
    WorkspaceNotFoundError,
    check_scaffold,
    find_workspace,
    fix_scaffold,
    validate_rollout_name,
)
from osmosis_ai.workspace.names import InvalidNameError, generate_run_name, validate_run_name
from osmosis_ai.workspace.rows import (
    DatasetError,
    DatasetRow,
    RowSelectionError,
    normalize_row,
    select_rows,
)
from osmosis_ai.workspace.sections import (
    CheckpointsSection,
    EvaluationSection,
    LoraSection,
    SamplingSection,
    TrainingSection,
    WarmupSection,
)

__all__ = [
    "PARQUET_VALIDATION_SKIPPED",
    "CheckpointsSection",
    "ConfigIssue",
    "ConfigValidationError",
    "DatasetError",
    "DatasetRow",
    "DatasetValidation",
    "DatasetWarning",
    "EvalConfig",
    "EvaluationSection",
    "Experiment",
    "InvalidNameError",
    "LoraSection",
    "RowSelectionError",
    "SamplingSection",
    "ScaffoldConflictError",
    "ScaffoldEntry",
    "ScaffoldReport",
    "TrainingConfig",
    "TrainingSection",
    "WarmupSection",
    "Workspace",
    "WorkspaceNotFoundError",
    "check_scaffold",
    "dataset_sha256",
    "find_workspace",
    "fix_scaffold",
    "generate_run_name",
    "load_eval_config",
    "load_training_config",
    "normalize_row",
    "read_rows",
    "select_rows",
    "validate_dataset",
    "validate_rollout_name",
    "validate_run_name",
]
