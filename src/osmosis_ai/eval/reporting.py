"""An eval's final metrics, as the trackers ``[advanced] report_to`` names record them
(:mod:`osmosis_ai.tracking`; the targets are checked with the plan, in
:mod:`osmosis_ai.eval.report_targets`).

They are recorded once the run's projections are final, while the run lock is held. A
tracker that fails then is a warning: the run's own files already hold its results.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai import tracking
from osmosis_ai.eval.report_targets import EvalReporting
from osmosis_ai.rundir.logs import LOGS_FILE

if TYPE_CHECKING:
    from osmosis_ai.eval.metrics import EvalMetrics
    from osmosis_ai.eval.progress import EvalEvent, EvalRunResult


def final_metrics(metrics: EvalMetrics) -> dict[str, float]:
    """The ``metrics.json`` summary as flat scalars: the counts and rates, ``reward_<stat>``,
    and ``pass_at_<k>``."""
    values: dict[str, Any] = {
        "total_samples": metrics.total_samples,
        "completed_samples": metrics.completed_samples,
        "graded": metrics.graded,
        "passed": metrics.passed,
        "failed": metrics.failed,
        "skipped": metrics.skipped,
        "pass_rate": metrics.pass_rate,
        "pass_threshold": metrics.pass_threshold,
        "tokens_used": metrics.tokens_used,
    }
    stats = metrics.reward_stats
    if stats is not None:
        values |= {f"reward_{name}": value for name, value in stats.to_json().items()}
    if metrics.n_runs is not None:
        values["n_runs"] = metrics.n_runs
    for point in metrics.pass_at_k or ():
        values[f"pass_at_{point.k}"] = point.value
    return tracking.scalars(values)


def report_final(
    result: EvalRunResult,
    reporting: EvalReporting,
    environ: Mapping[str, str],
    *,
    on_warning: Callable[[str], None],
    on_output: Callable[[str], None],
) -> list[str]:
    """Record ``result``'s metrics in every target; the warnings, one per tracker that
    could not."""
    if not reporting.targets:
        return []
    plan = result.plan
    warnings: list[str] = []

    def warn(message: str) -> None:
        warnings.append(message)
        on_warning(message)

    run = tracking.TrackedRun(
        kind="eval",
        name=plan.run_name,
        run_dir=result.run_dir,
        project=plan.workspace.root.name,
        config=run_config(result),
        resumed=(result.run_dir / tracking.STATE_FILE).is_file(),
        environ=environ,
        mlflow_tracking_uri=reporting.mlflow_tracking_uri,
    )
    status = "interrupted" if result.cancelled else "success" if result.complete else "partial"
    metrics = final_metrics(result.metrics)
    for target in reporting.targets:  # one at a time: one that cannot open spares the rest
        try:
            trackers = tracking.open_trackers([target], run, on_warning=warn, on_output=on_output)
        except Exception as exc:
            warn(f"{target} could not record this run: {type(exc).__name__}: {exc}")
            continue
        trackers.summary(metrics)
        trackers.close(status)
    return warnings


def record_in_trackers(
    result: EvalRunResult,
    environ: Mapping[str, str],
    secret_values: Iterable[str],
    emit: Callable[[EvalEvent], None],
) -> EvalRunResult:
    """:func:`report_final` for ``run_eval``: library output goes to the run's
    ``logs.txt``, each warning to ``emit`` and into the returned result."""
    if not result.plan.reporting.targets:
        return result
    from osmosis_ai.events import WarningEvent
    from osmosis_ai.rundir.logs import Redactor, RunLog

    redactor = Redactor(secret_values)
    with RunLog(result.run_dir / LOGS_FILE, redactor) as runlog:
        warnings = report_final(
            result,
            result.plan.reporting,
            environ,
            on_warning=lambda message: emit(
                WarningEvent("TRACKER_FAILED", redactor.redact(message))
            ),
            on_output=lambda line: runlog.output("trackers", line),
        )
        for line in warnings:
            runlog.warning("trackers", line)
    if not warnings:
        return result
    shown = tuple(redactor.redact(line) for line in warnings)
    return dataclasses.replace(result, warnings=(*result.warnings, *shown))


def run_config(result: EvalRunResult) -> dict[str, Any]:
    """The eval's config as written (less its ``[env]`` values) and what the plan resolved."""
    plan = result.plan
    written: Mapping[str, object] = plan.config.raw
    return {
        "run_name": plan.run_name,
        "model": plan.config.experiment.model_path,
        "dataset": plan.dataset_name,
        "rows": len(plan.rows),
        "work_items": len(plan.items),
        "run_dir": str(Path(result.run_dir)),
        **{key: value for key, value in written.items() if key != "env"},
    }
