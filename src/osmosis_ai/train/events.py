"""What a training run reports while it runs (events) and when it ends (the result).

The runner never prints: it calls one event sink with these events, in order, on the
thread that runs the trainer, and returns a :class:`TrainRunResult`. The CLI renders both.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.events import LogEvent, StageEvent, WarningEvent


@dataclass(frozen=True)
class WarmupEvent:
    """A supervised warm-up step finished (``loss`` when the trainer logged one)."""

    step: int
    total: int
    loss: float | None


@dataclass(frozen=True)
class EvalSummary:
    """Validation: ``rollouts`` sampled over the validation rows at the training step
    ``step`` (0 = before RL); the mean reward and pass rate are over the scored ones.
    ``policy_version``: the policy version pinned to answer them, when validation ran beside
    asynchronous training (``None``: the served policy, training paused)."""

    step: int
    rollouts: int
    scored: int
    mean_reward: float | None
    pass_rate: float | None
    policy_version: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.step,
            "rollouts": self.rollouts,
            "scored": self.scored,
            "mean_reward": self.mean_reward,
            "pass_rate": self.pass_rate,
            "policy_version": self.policy_version,
        }


@dataclass(frozen=True)
class ValidationEvent:
    summary: EvalSummary

    @property
    def policy_version(self) -> int | None:
        return self.summary.policy_version


@dataclass(frozen=True)
class StepEvent:
    """An optimizer step finished; ``metrics`` is its ``metrics.jsonl`` record."""

    step: int
    total: int
    metrics: dict[str, Any]
    elapsed_s: float


TrainEvent = StageEvent | WarningEvent | LogEvent | WarmupEvent | ValidationEvent | StepEvent
EventSink = Callable[[TrainEvent], None]


def window_mean(
    values: Sequence[float | None], *, head: bool, fraction: float = 0.1
) -> float | None:
    """Mean of the first (``head``) or last ``fraction`` of the finite ``values`` (≥ 1 value)."""
    finite = [v for v in values if v is not None and math.isfinite(v)]
    if not finite:
        return None
    count = max(1, round(len(finite) * fraction))
    part = finite[:count] if head else finite[-count:]
    return sum(part) / len(part)


@dataclass(frozen=True)
class TrainRunResult:
    """How one invocation of ``osmosis train run`` ended.

    ``status``: ``success`` (every step done), ``interrupted`` (Ctrl-C: checkpoint saved),
    ``partial`` (stopped early for another reason), ``failed`` (stopped and saved, but the
    run did not do its job: ``error`` names why, e.g. ``no_learning_signal``, and
    ``error_message`` says what to try). Rewards are training-batch means per step;
    ``reward_start``/``reward_end`` average the first and last 10% of the steps.
    """

    run_name: str
    run_dir: Path
    status: str
    steps_done: int
    total_steps: int
    resumed: bool
    duration_ms: int
    rewards: tuple[float | None, ...]
    validations: tuple[EvalSummary, ...] = ()
    checkpoints: tuple[Path, ...] = ()
    warmup_steps: int = 0
    plot_path: Path | None = None
    warnings: tuple[str, ...] = field(default=())
    error: str | None = None
    error_message: str | None = None

    @property
    def reward_start(self) -> float | None:
        return window_mean(self.rewards, head=True)

    @property
    def reward_end(self) -> float | None:
        return window_mean(self.rewards, head=False)

    @property
    def final_checkpoint(self) -> Path | None:
        return self.checkpoints[-1] if self.checkpoints else None

    def to_resource(self) -> dict[str, Any]:
        """The ``resource`` of the ``train.run`` JSON result."""
        return {
            "run_name": self.run_name,
            "output_path": str(self.run_dir),
            "status": self.status,
            "steps_done": self.steps_done,
            "total_steps": self.total_steps,
            "resumed": self.resumed,
            "duration_ms": self.duration_ms,
            "warmup_steps": self.warmup_steps,
            "training_reward": {"start": self.reward_start, "end": self.reward_end},
            "validation": [v.to_json() for v in self.validations],
            "checkpoints": [str(p) for p in self.checkpoints],
            "final_checkpoint": None
            if self.final_checkpoint is None
            else str(self.final_checkpoint),
            "metrics_path": str(self.run_dir / "metrics.jsonl"),
            "plot_path": None if self.plot_path is None else str(self.plot_path),
            "error": self.error,
            "error_message": self.error_message,
        }
