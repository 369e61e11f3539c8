"""Errors of a training run, below :class:`~osmosis_ai.errors.OsmosisError`::

TrainingError            the run failed while it ran (rollouts, rewards, the update)
├── TokenFidelityError   recorded token data cannot make a faithful training row
├── NoRewardError        a whole step came back without one usable reward
├── OutOfMemoryError     a training batch did not fit: the message names the sizes
├── TrainerStepStalledError  a step's own computation ran past OSMOSIS_TRAIN_STEP_TIMEOUT_S
│                        (also a DeadlineError)
├── PlacementError       the Ray cluster can never hold the trainer workers and rollout
│                        servers asked for: the message names both sides
└── RayTrainError        Ray Train's controller ended the run (the worker group did not
                         start, the workers failed past max_failures, …)
"""

from __future__ import annotations

from osmosis_ai.errors import DeadlineError, OsmosisError


class TrainingError(OsmosisError):
    """A training run failed at run time; the message says what failed and what to do."""


class TokenFidelityError(TrainingError):
    """A model call's recorded token ids are missing, or (strict mode) a later call's
    prompt is not an append-only extension of the earlier prompt plus completion."""


class NoRewardError(TrainingError):
    """Every rollout of a training step failed or came back without a reward."""


class OutOfMemoryError(TrainingError):
    """The device ran out of memory on a training batch."""


class TrainerStepStalledError(TrainingError, DeadlineError):
    """A training step computed for longer than its deadline without ending (the wait for
    its rollouts not counted): the trainer is hung, in a deadlock or in a collective
    operation waiting on a trainer worker that stopped."""


class PlacementError(TrainingError):
    """A run on Ray asked for more than the cluster has, on any node arrangement: the
    message names what was asked (trainer workers and rollout servers, each's resources)
    and what the cluster has (nodes, CPUs, GPUs)."""


class RayTrainError(TrainingError):
    """Ray Train's controller ended the run with an error; ``ray_error`` names Ray's
    (``WorkerGroupStartupTimeoutError``, ``WorkerGroupError``, …)."""

    def __init__(self, message: str, *, ray_error: str) -> None:
        super().__init__(message)
        self.ray_error = ray_error
