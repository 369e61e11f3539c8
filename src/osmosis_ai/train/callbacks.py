"""Trainer callbacks that connect TRL's loop to the run: the served policy's version moves
with each optimizer step, and every step end and log line reaches the runner's hooks.
Imported only once the ``train`` extra is known to be installed.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Protocol

from transformers import TrainerCallback

from osmosis_ai.train.events import WarmupEvent
from osmosis_ai.train.step_watch import StepWatch


class StepHooks(Protocol):
    """What the RL loop's callback calls on the runner."""

    def updating(self, version: int) -> contextlib.AbstractContextManager[None]:
        """Hold the served policy while the optimizer changes its weights."""
        ...

    def after_step(self, step: int) -> bool:
        """A step ended (validation, checkpoints); ``True`` stops training after it."""
        ...

    def record_step(self, step: int, logs: dict[str, Any]) -> bool:
        """The trainer logged the step's metrics; ``True`` stops training after it (saved)."""
        ...


class RunCallback(TrainerCallback):
    """The RL loop's callback. Generation never overlaps an optimizer step: the policy is
    held from just before ``optimizer.step()`` until just after, then its version is the
    new global step."""

    def __init__(self, hooks: StepHooks, watch: StepWatch | None = None) -> None:
        self.hooks = hooks
        self.watch = watch
        self._held = contextlib.ExitStack()
        self.stopped_early = False

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # a resumed trainer has loaded its checkpoint's weights by now: a policy copy served
        # with max_staleness takes them before the first rollouts
        with self.hooks.updating(int(state.global_step)):
            pass

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.watch is not None:
            self.watch.begin(int(state.global_step) + 1)

    def on_pre_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._held.enter_context(self.hooks.updating(int(state.global_step) + 1))

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._held.close()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._held.close()  # in case an error skipped on_optimizer_step
        if self.hooks.after_step(int(state.global_step)):
            self.stopped_early = True
            control.should_save = True
            control.should_training_stop = True

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        if logs and "reward" in logs and self.hooks.record_step(int(state.global_step), dict(logs)):
            control.should_save = True
            control.should_training_stop = True
        # metrics.jsonl keeps the history; the trainer's copy goes into the resumable state
        # saved every step, where the whole history made each save O(steps): 45 ms at step 200
        del state.log_history[:-1]


class WarmupCallback(TrainerCallback):
    """Reports supervised warm-up steps and stops the warm-up when asked to."""

    def __init__(
        self, emit: Callable[[WarmupEvent], None], should_stop: Callable[[], bool]
    ) -> None:
        self.emit = emit
        self.should_stop = should_stop
        self.stopped = False
        self.reported_step = -1

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kwargs: Any
    ) -> None:
        step = int(state.global_step)
        if step == self.reported_step:  # the trainer's end-of-training summary: step reported
            return
        self.reported_step = step
        loss = (logs or {}).get("loss")
        value = float(loss) if isinstance(loss, int | float) else None
        self.emit(WarmupEvent(step, int(state.max_steps), value))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.should_stop():
            self.stopped = True
            control.should_training_stop = True
