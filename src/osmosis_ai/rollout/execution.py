"""What a backend is asked to run (``ExecutionRequest``) and what it reports back."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from osmosis_ai.rollout.ids import validate_rollout_id
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus


@dataclass
class ExecutionRequest:
    """One rollout for a backend to run.

    ``id`` must be a single path segment (it names the rollout's artifact folder). Timeouts
    are finite seconds or ``None`` (unbounded); zero or negative means already expired.
    ``grade=False`` runs the workflow only.
    """

    id: str
    prompt: list[dict[str, Any]]
    label: str | None = None
    metadata: dict[str, Any] | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    grade: bool = True

    def __post_init__(self) -> None:
        validate_rollout_id(self.id)
        for name in ("agent_timeout_sec", "grader_timeout_sec"):
            value = getattr(self, name)
            if value is not None and not math.isfinite(value):
                raise ValueError(f"{name} must be finite or None, got {value!r}")


@dataclass
class ExecutionResult:
    """The outcome of one phase (workflow or grader) of a rollout.

    ``extra_fields`` carries backend diagnostics: never sent on the wire, saved as
    ``diagnostics.json`` beside the trajectory.
    """

    status: RolloutStatus
    sample: RolloutSample | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None
    extra_fields: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def failure(
        cls,
        message: str | None,
        category: RolloutErrorCategory | None = None,
        sample: RolloutSample | None = None,
    ) -> ExecutionResult:
        return cls(RolloutStatus.FAILURE, sample, message, category)


@dataclass
class ExecutionOutcome:
    """Both phases of a rollout. ``grader`` is ``None`` when no grading phase ran."""

    workflow: ExecutionResult
    grader: ExecutionResult | None = None

    @property
    def result(self) -> ExecutionResult:
        """The result to report: the workflow's failure, else the grader's, else the workflow's.

        A failed workflow borrows the grader's sample when it has none of its own.
        """
        if self.workflow.status != RolloutStatus.SUCCESS:
            if self.workflow.sample is None and self.grader is not None and self.grader.sample:
                return ExecutionResult(
                    self.workflow.status,
                    self.grader.sample,
                    self.workflow.err_message,
                    self.workflow.err_category,
                    self.workflow.extra_fields,
                )
            return self.workflow
        return self.grader if self.grader is not None else self.workflow

    @property
    def result_to_save(self) -> ExecutionResult:
        """The result to archive: the grader's if it has a sample (the real reward), else the
        workflow's."""
        if self.grader is not None and self.grader.sample is not None:
            return self.grader
        return self.workflow
