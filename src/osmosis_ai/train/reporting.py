"""``[training] report_to``: a run's progress events, as the trackers of
:mod:`osmosis_ai.tracking` record them.

It sits between the runner and the caller's event sink, so every way a step's metrics are
made (this process, or a Ray driver relaying its lead worker) reaches the trackers the same
way: a :class:`StepEvent` is the step's ``metrics.jsonl`` record, a :class:`ValidationEvent`
the validation figures at its step (each validation is recorded once, step 0 and the final
one included). Trackers stay off the trainer: TRL's own ``report_to`` is not used.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from osmosis_ai import tracking
from osmosis_ai.train.events import EventSink, StepEvent, TrainEvent, ValidationEvent, WarningEvent
from osmosis_ai.train.plan import TrainPlan
from osmosis_ai.train.rundir import RunDir

FEATURE = "osmosis train run"
# metrics.jsonl keys that are not metrics, and the validation keys a ValidationEvent brings
_NOT_LOGGED = frozenset(
    {"step", "time", "validation_reward", "validation_pass_rate", "validation_policy_version"}
)


def require_trackers(plan: TrainPlan) -> None:
    """Fail before the run dir exists when ``report_to`` names a tracker not installed, or
    ``[advanced] mlflow_tracking_uri`` is not a string."""
    targets = plan.config.training.report_to
    if targets:
        tracking.require_installed(targets, FEATURE, _environ(plan), mlflow_uri=_mlflow_uri(plan))


class TrainReporter:
    """Forwards every event to ``emit`` and records the metric ones; :meth:`close` ends the
    tracker runs with the run's status."""

    def __init__(self, plan: TrainPlan, rundir: RunDir, emit: EventSink) -> None:
        self._emit = emit
        self._rundir = rundir
        self._trackers: tracking.Trackers | None = None
        targets = plan.config.training.report_to
        if not targets:
            return
        resume_point = rundir.last_resume_point() if plan.resumed else None
        run = tracking.TrackedRun(
            kind="train",
            name=plan.run_name,
            run_dir=rundir.path,
            project=plan.workspace.root.name,
            config=run_config(plan),
            resumed=plan.resumed,
            resume_step=int(resume_point.name.rpartition("-")[2]) if resume_point else 0,
            environ=_environ(plan),
            mlflow_tracking_uri=_mlflow_uri(plan),
        )
        self._trackers = tracking.open_trackers(
            targets, run, on_warning=self._tracker_failed, on_output=self._library_output
        )
        for line in self._trackers.locations:
            rundir.journal.info("trackers", f"reporting to {line}")

    def emit(self, event: TrainEvent) -> None:
        trackers = self._trackers
        if trackers is not None:
            if isinstance(event, StepEvent):
                metrics = {k: v for k, v in event.metrics.items() if k not in _NOT_LOGGED}
                trackers.log(event.step, metrics)
            elif isinstance(event, ValidationEvent):
                summary = event.summary
                values = {
                    "validation_reward": summary.mean_reward,
                    "validation_pass_rate": summary.pass_rate,
                }
                if summary.policy_version is not None:
                    values["validation_policy_version"] = summary.policy_version
                trackers.log(summary.step, values)
        self._emit(event)

    def close(self, status: str) -> None:
        trackers, self._trackers = self._trackers, None
        if trackers is not None:
            trackers.close(status)

    def _tracker_failed(self, message: str) -> None:
        self._rundir.journal.warning("trackers", message, code="TRACKER_FAILED")
        self._emit(WarningEvent("TRACKER_FAILED", self._rundir.journal.redact(message)))

    def _library_output(self, line: str) -> None:
        self._rundir.journal.output("trackers", line)


def run_config(plan: TrainPlan) -> dict[str, Any]:
    """What the trackers record as the run's config: the config file as written (less its
    ``[env]`` values) and what the plan resolved."""
    written: Mapping[str, object] = plan.config.raw
    return {
        "run_name": plan.run_name,
        "model": plan.model_ref,
        "dataset": str(plan.dataset_path),
        "steps": plan.steps,
        "prompts_per_step": plan.batch,
        "samples_per_prompt": plan.group,
        **{key: value for key, value in written.items() if key != "env"},
    }


def _environ(plan: TrainPlan) -> Mapping[str, str]:
    return plan.options.environ if plan.options.environ is not None else os.environ


def _mlflow_uri(plan: TrainPlan) -> str | None:
    return tracking.mlflow_tracking_uri(plan.config.advanced)
