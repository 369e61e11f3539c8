"""``run_training``: one invocation of ``osmosis train run``, from the plan to the result.

Plan → run dir → reporter (metric trackers) → the session that trains: in this process
(:class:`~osmosis_ai.train.session.Session`), or as the driver of a run on a Ray cluster
(``plan.ray``: :class:`~osmosis_ai.train.ray.driver.DriverSession`).
"""

from __future__ import annotations

from osmosis_ai.train import engine
from osmosis_ai.train.events import EventSink, TrainRunResult
from osmosis_ai.train.plan import TrainRunOptions, build_plan
from osmosis_ai.train.ray.driver import DriverSession
from osmosis_ai.train.reporting import TrainReporter, require_trackers
from osmosis_ai.train.rundir import RunDir
from osmosis_ai.train.session import Session


def run_training(options: TrainRunOptions, on_event: EventSink | None = None) -> TrainRunResult:
    """Run (or resume) the training ``options`` describe; ``on_event`` sees its progress."""
    emit: EventSink = on_event or (lambda _event: None)
    plan = build_plan(options)
    engine.require_train_extra(lora=plan.config.lora.enabled)
    require_trackers(plan)
    rundir = RunDir(plan)
    try:
        try:
            reporter = TrainReporter(plan, rundir, emit)
        except BaseException as exc:
            rundir.set_status("failed", error=rundir.journal.redact(str(exc)))
            raise
        status = "failed"
        session = Session if plan.ray is None else DriverSession
        try:
            result = session(plan, rundir, reporter.emit).execute()
            status = result.status
            return result
        except KeyboardInterrupt:
            status = "interrupted"
            raise
        finally:
            reporter.close(status)
    finally:
        rundir.close()
