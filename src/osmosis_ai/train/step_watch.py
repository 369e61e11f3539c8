"""The trainer step deadline (``OSMOSIS_TRAIN_STEP_TIMEOUT_S``): each step is timed on the
trainer's thread, from its start to the next step's start (its own end-of-step work, such as
the checkpoint save and its barrier, included), the waits for rollouts excluded (the rollout
I/O deadline covers those), and watched from another thread.

A hung step does not return, so nothing on its thread can notice it: :func:`run_watched`
runs the training on a thread of its own and waits for it on the caller's, which raises
:class:`~osmosis_ai.train.errors.TrainerStepStalledError` once a step is past its deadline.
The error then takes the run's ordinary way out (``run.json``, ``logs.txt``, the CLI's
error, a platform run's error); the hung thread is a daemon and ends with the process.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Callable, Generator

from osmosis_ai.deadlines import TRAIN_STEP
from osmosis_ai.train.errors import TrainerStepStalledError
from osmosis_ai.train.stopping import Background

_POLL_MAX_S = 1.0


class StepWatch:
    """How long the step in progress has computed. ``begin``/``end`` and ``paused`` are
    called on the trainer's thread; :meth:`overdue` from any other."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline_s = deadline_s
        self._lock = threading.Lock()
        self._step: int | None = None
        self._since: float | None = None  # when the clock last (re)started; None: paused
        self._spent = 0.0

    def begin(self, step: int) -> None:
        """Step ``step`` starts (again: TRL announces each micro-batch; the clock runs on)."""
        with self._lock:
            if self._step == step:
                return
            self._step, self._spent, self._since = step, 0.0, time.monotonic()

    def end(self) -> None:
        """No step is in progress (the next :meth:`begin` starts the clock again)."""
        with self._lock:
            self._step, self._since, self._spent = None, None, 0.0

    @contextlib.contextmanager
    def paused(self) -> Generator[None]:
        """A wait the step deadline does not count (the step's rollouts)."""
        with self._lock:
            if self._since is not None:
                self._spent += time.monotonic() - self._since
                self._since = None
        try:
            yield
        finally:
            with self._lock:
                if self._step is not None and self._since is None:
                    self._since = time.monotonic()

    def computed(self) -> tuple[int | None, float]:
        """The step in progress (``None`` between steps) and the seconds it has computed."""
        with self._lock:
            running = 0.0 if self._since is None else time.monotonic() - self._since
            return self._step, self._spent + running

    def overdue(self) -> TrainerStepStalledError | None:
        """The named error when the step in progress has computed past the deadline."""
        step, spent = self.computed()
        if step is None or spent <= self.deadline_s:
            return None
        return TRAIN_STEP.error(
            TrainerStepStalledError,
            f"training step {step} computed for {spent:.1f}s without ending (the trainer "
            "is hung in the step or its checkpoint save: a deadlock, or a collective "
            "operation waiting on a trainer worker that stopped)",
            self.deadline_s,
        )


def run_watched(call: Callable[[], object], watch: StepWatch) -> None:
    """``call()`` (the training) on a daemon thread, waited for here: its error is raised
    here, and so is the watch's error when a step stalls (the hung thread is left behind)."""
    poll = min(_POLL_MAX_S, watch.deadline_s / 10)
    training = Background(call, name="osmosis-trainer")
    while not training.join(poll):
        error = watch.overdue()
        if error is not None:
            raise error
    training.wait()
