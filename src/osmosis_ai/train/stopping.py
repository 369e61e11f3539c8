"""Stopping a run cleanly: the first Ctrl-C (or SIGTERM) asks the run to finish its step
and save; a second one raises ``KeyboardInterrupt`` at once. :class:`SignalWatch` stops a
run that has had no learning signal for too long (it then fails, saved). Plus
:class:`Background`, a thread whose error is re-raised where it is waited for.
"""

from __future__ import annotations

import math
import signal
import threading
from collections.abc import Callable, Mapping, Sequence
from types import FrameType, TracebackType
from typing import Any


class StopRequest:
    """A flag set by the first SIGINT/SIGTERM while installed (main thread only), or by
    setting ``external`` (a caller that handles signals itself, e.g. a platform worker)."""

    def __init__(
        self,
        on_request: Callable[[int], None] | None = None,
        external: threading.Event | None = None,
    ) -> None:
        self._requested = False
        self.on_request = on_request
        self.external = external
        self._previous: dict[int, Any] = {}

    @property
    def requested(self) -> bool:
        return self._requested or (self.external is not None and self.external.is_set())

    def request(self) -> None:
        """Ask for the stop from code (as the first signal would, without its callback)."""
        self._requested = True

    def __enter__(self) -> StopRequest:
        if threading.current_thread() is threading.main_thread():
            for sig in (signal.SIGINT, signal.SIGTERM):
                self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)
        self._previous.clear()

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self._requested:
            raise KeyboardInterrupt
        self._requested = True
        if self.on_request is not None:
            self.on_request(signum)


class Background:
    """Runs ``call`` in a daemon thread; :meth:`wait` re-raises its error in the caller."""

    def __init__(self, call: Callable[[], object], name: str | None = None) -> None:
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, args=(call,), name=name, daemon=True)
        self._thread.start()

    def _run(self, call: Callable[[], object]) -> None:
        try:
            call()
        except BaseException as exc:
            self._error = exc

    def join(self, timeout: float) -> bool:
        """Wait at most ``timeout`` seconds; whether ``call`` has returned (or raised)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    def wait(self, *, raise_error: bool = True) -> None:
        self._thread.join()
        if raise_error and self._error is not None:
            raise self._error


NO_LEARNING_SIGNAL = "no_learning_signal"  # the error of a run the watch stopped


class SignalWatch:
    """Counts consecutive optimizer steps without a learning signal: every group's rewards
    equal (GRPO's advantages, hence its update, are zero) or a gradient norm of exactly 0.
    After ``patience`` of them in a row (0: never) the run stops, saves and fails with
    :data:`NO_LEARNING_SIGNAL`; a step with a signal starts the count again."""

    def __init__(self, patience: int) -> None:
        self.patience = patience
        self.streak = 0
        self.first_step = 0
        self.last_step = 0
        self.equal_rewards = True  # every step of the streak had equal rewards in every group
        self._rewards: list[float] = []

    @property
    def tripped(self) -> bool:
        return self.patience > 0 and self.streak >= self.patience

    def observe(
        self,
        step: int,
        *,
        groups: int,
        groups_without_signal: int,
        grad_norm: object,
        reward: object,
    ) -> bool:
        """Record ``step``; whether it had no learning signal."""
        equal = groups > 0 and groups_without_signal == groups
        zero_grad = isinstance(grad_norm, int | float) and grad_norm == 0
        if not (equal or zero_grad):
            self.streak = 0
            return False
        if self.streak == 0:
            self.first_step, self.equal_rewards, self._rewards = step, True, []
        self.streak += 1
        self.last_step = step
        self.equal_rewards = self.equal_rewards and equal
        if isinstance(reward, int | float) and math.isfinite(reward):
            self._rewards.append(float(reward))
        return True

    def recount(self, records: Sequence[Mapping[str, object]]) -> None:
        """Take the streak from the run's ``metrics.jsonl`` records (``steps_without_signal``):
        a Ray driver, whose trainer workers did the watching."""
        last = records[-1] if records else {}
        streak, step = last.get("steps_without_signal"), last.get("step")
        if not (isinstance(streak, int) and isinstance(step, int) and streak > 0):
            return
        self.streak, self.last_step, self.first_step = streak, step, step - streak + 1
        rewards = (r.get("training_reward") for r in records[-streak:])
        self._rewards = [
            float(r) for r in rewards if isinstance(r, int | float) and math.isfinite(r)
        ]

    def message(self) -> str:
        """Why the run failed and what to try."""
        count = max(self.streak, self.patience)
        steps = (
            f" (steps {self.first_step}-{self.last_step})"
            if self.streak > 1
            else f" (step {self.last_step})"
            if self.streak
            else ""
        )
        if self.equal_rewards:
            mean = sum(self._rewards) / len(self._rewards) if self._rewards else None
            shown = "" if mean is None else f", mean reward {mean:.3f}"
            cause = (
                f"every group's samples got the same reward{shown}, so GRPO's advantages and "
                "updates were zero"
            )
        else:
            cause = "the gradients were zero, so the updates changed nothing"
        return (
            f"no learning signal for {count} consecutive steps{steps}: {cause}. Check the "
            "grader (does it score different answers differently?), the reward spread (give "
            "partial credit), the warm-up ([warmup] sft_steps, so the policy sometimes "
            "succeeds), and the learning rate ([training] lr). The last checkpoint is saved; "
            "[training] no_signal_patience sets how many such steps a run tolerates (0: no "
            "limit)."
        )
