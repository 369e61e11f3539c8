"""The deadlines this package adds to waits that had none, each with its stage, the setting
(an environment variable) that changes it and its default.

The rule every stage keeps (the Deadlines table of ``docs/architecture.md`` lists them all,
these and the ones that live beside their own options): whatever stalls, the wait ends with
a named error within twice its deadline.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TypeVar

from osmosis_ai.errors import ConfigError, DeadlineError

__all__ = [
    "DATASET_PROCESSING",
    "ENVIRONMENT_BUILD",
    "MODEL_CALL",
    "ROLLOUT_IO",
    "RUN_HEARTBEAT",
    "SANDBOX_READY",
    "SANDBOX_TEARDOWN",
    "SANDBOX_TRANSFER",
    "TRAIN_STEP",
    "WEIGHT_SYNC",
    "Deadline",
]

E = TypeVar("E", bound=DeadlineError)


@dataclass(frozen=True)
class Deadline:
    """One stage's deadline: ``seconds()`` reads ``setting`` from the environment (the
    default when unset) and refuses a value that is not a finite number above ``floor_s``."""

    stage: str
    setting: str
    default_s: float
    floor_s: float = 0.0

    def seconds(self, environ: Mapping[str, str] | None = None) -> float:
        raw = (os.environ if environ is None else environ).get(self.setting, "").strip()
        if not raw:
            return self.default_s
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value > self.floor_s):
            raise ConfigError(
                f"{self.setting}={raw!r} is not a number of seconds above {self.floor_s:g}: "
                f"set it to one (the default is {self.default_s:g}), or unset it"
            )
        return value

    def error(self, kind: type[E], what: str, seconds: float, *args: object, **kw: object) -> E:
        """``kind(message, *args, **kw)`` for a wait of ``seconds`` that ended with ``what``
        not done; the message names the stage, the deadline and the setting."""
        message = (
            f"{what}: the {self.stage} deadline is {seconds:g}s (set {self.setting} to change it)"
        )
        return kind(message, *args, **kw).with_deadline(self.stage, seconds, self.setting)


MODEL_CALL = Deadline("model call", "OSMOSIS_MODEL_TIMEOUT_S", 600.0)
"""Each wait of the policy proxy on the model upstream: to connect, to send, for answer bytes."""

ENVIRONMENT_BUILD = Deadline("environment build", "OSMOSIS_ENV_BUILD_TIMEOUT_S", 1800.0)
"""A rollout's isolated environment (``uv sync``), including the wait for another build of it."""

ROLLOUT_IO = Deadline("rollout I/O", "OSMOSIS_ROLLOUT_IO_STALL_S", 120.0, floor_s=0.5)
"""How long a trainer waits without a word from its rollout I/O process, which sends one at
least every quarter of it while it lives."""

RUN_HEARTBEAT = Deadline("run heartbeat", "OSMOSIS_RUN_STALL_S", 60.0, floor_s=2.0)
"""How long a platform worker lets a run's process go without a heartbeat (it beats each
second) before it kills the run's processes and fails the run."""

DATASET_PROCESSING = Deadline("dataset processing", "OSMOSIS_DATASET_PROCESSING_TIMEOUT_S", 600.0)
"""Reading and validating an uploaded dataset file on the platform server."""

TRAIN_STEP = Deadline("trainer step", "OSMOSIS_TRAIN_STEP_TIMEOUT_S", 1800.0)
"""One training step's own computation, from its start to its end, the wait for its
rollouts excluded (the rollout I/O deadline covers that): a hung trainer (a deadlock, a
collective operation waiting on a worker that stopped) ends the run."""

WEIGHT_SYNC = Deadline("weight sync", "OSMOSIS_WEIGHT_SYNC_TIMEOUT_S", 1800.0)
"""The served policy's weight update: the local policy's hold of the next step's model calls
until the trainer asks for that step, and the optimizer's wait for the model while a
generation batch runs; with a vLLM server, TRL's communicator timeout."""

SANDBOX_READY = Deadline("sandbox start", "OSMOSIS_SANDBOX_READY_TIMEOUT_S", 30.0)
"""A Harbor bubblewrap sandbox's holder process signalling that it is ready."""

SANDBOX_TRANSFER = Deadline("sandbox transfer", "OSMOSIS_SANDBOX_TRANSFER_TIMEOUT_S", 600.0)
"""Each file or folder copied into or out of a Harbor bubblewrap sandbox."""

SANDBOX_TEARDOWN = Deadline("sandbox teardown", "OSMOSIS_SANDBOX_TEARDOWN_TIMEOUT_S", 5.0)
"""Each wait of a Harbor sandbox's teardown on a killed process (the holder, then the helper)."""
