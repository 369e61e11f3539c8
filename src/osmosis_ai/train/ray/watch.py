"""What the driver of ``osmosis train run --ray`` sees of Ray Train's controller while
``fit()`` runs in a thread of its own.

:class:`ControllerLookout` is a controller callback: it runs inside Ray Train's controller
actor and tells a :class:`FitWatch` actor the controller's handle and each state the
controller moves to, with the error of a failed one. The driver reads the watch as it waits,
so a controller that errored ends the run at once (even while ``fit()`` is still shutting
down), and a Ctrl-C before the first step can abort the controller without Ray Train's own
SIGINT handler. Imported by the driver only once Ray is known to be installed (Ray 2.60's
controller callback API, pinned by the ``distributed`` extra).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ray.train.v2._internal.execution.callback import ControllerCallback

from osmosis_ai.train.errors import TrainingError

__all__ = ["ControllerLookout", "FitWatch", "RunAbortedError", "Sighting"]


@dataclass(frozen=True)
class Sighting:
    """The controller as last seen: its actor handle (``None`` until it started), its
    state (``"Scheduling"``, ``"Running"``, ``"Restarting"``, ``"Errored"``, …), and the
    error that ended it (``failed``: Ray's error class, ``detail``: its message)."""

    controller: Any = None
    state: str = ""
    failed: str | None = None
    detail: str = ""
    running_since: int = 0  # how many times it entered "Running" (a worker group started)
    stalled: Any = None  # the TrainerStepStalledError a worker failed with, if one did


class RunAbortedError(TrainingError):
    """The driver ended the run before the controller started (a Ctrl-C before the first
    step): the controller ends as it starts, before it places any worker."""


class FitWatch:
    """The actor body (``num_cpus=0``) the lookout reports to and the driver reads."""

    def __init__(self) -> None:
        self.seen = Sighting()
        self.aborted = False

    def started(self, controller: Any) -> bool:
        """The controller started; whether the driver has already ended the run."""
        self.seen = Sighting(controller, "Initializing")
        return self.aborted

    def abort(self) -> Any:
        """The driver ends the run: the controller's handle when it started (for the driver
        to end it), else ``None`` (it ends itself as it starts)."""
        self.aborted = True
        return self.seen.controller

    def moved(self, state: str, failed: str | None, detail: str, stalled: Any = None) -> None:
        seen = self.seen
        running = seen.running_since + (state == "Running" != seen.state)
        if failed is None:
            failed, detail, stalled = seen.failed, seen.detail, seen.stalled
        self.seen = Sighting(seen.controller, state, failed, detail, running, stalled)

    def read(self) -> Sighting:
        return self.seen


def _final_error(state: Any) -> Any:
    """The error a state ends the run with (a shutdown carries the state it ends in)."""
    if type(state).__name__ == "ShuttingDownState":
        state = getattr(state, "next_state", None)
    if type(state).__name__ != "ErroredState":
        return None
    return getattr(state, "training_failed_error", None)


def stalled_step(error: BaseException) -> Any:
    """The ``TrainerStepStalledError`` a trainer worker failed with (a peer that stopped
    left its collective operation waiting), under Ray Train's worker group error."""
    from osmosis_ai.train.errors import TrainerStepStalledError

    failures = getattr(ray_error_of(error), "worker_failures", None)
    if not isinstance(failures, dict):
        return None
    for _rank, failure in sorted(failures.items()):  # pyright: ignore[reportUnknownVariableType, reportUnknownArgumentType]
        seen: Any = failure
        while isinstance(seen, BaseException):
            if isinstance(seen, TrainerStepStalledError):
                return seen
            seen = getattr(seen, "_base_exc", None) or seen.__cause__
    return None


def ray_error_of(error: BaseException) -> BaseException:
    """The error under Ray Train's wrapper (a ``ControllerError`` carries its cause)."""
    cause = getattr(error, "controller_failure", None)
    return cause if isinstance(cause, BaseException) else error


class ControllerLookout(ControllerCallback):
    """Reports the controller's handle and states to ``watch``. The states go fire and
    forget (the hooks run on the controller's event loop, which must not block); the start
    waits for the watch's answer, so a run the driver already ended never places a worker."""

    def __init__(self, watch: Any) -> None:
        self.watch = watch

    def after_controller_start(self, train_run_context: Any) -> None:
        import ray

        me = ray.get_runtime_context().current_actor
        if ray.get(self.watch.started.remote(me), timeout=60):  # (once, before any placement)
            raise RunAbortedError("the run was stopped before Ray Train's controller started")

    def after_controller_state_update(self, previous_state: Any, current_state: Any) -> None:
        name = type(current_state).__name__.removesuffix("State")
        error = _final_error(current_state)
        if error is None:
            self.watch.moved.remote(name, None, "")
            return
        cause = ray_error_of(error)
        self.watch.moved.remote(name, type(cause).__name__, str(cause), stalled_step(error))
