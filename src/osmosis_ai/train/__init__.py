"""RL training: the loop from dataset rows to rollouts, rewards and policy updates, plus the
tiny local model (:mod:`osmosis_ai.train.tiny_model`) that tests and examples train offline.

Names resolve on first access, so importing the package needs neither torch nor TRL;
running a training needs the ``train`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from osmosis_ai.lazy import lazy_exports as _lazy_exports

_EXPORTS: dict[str, str] = {
    "DemoResult": "osmosis_ai.train.demo",
    "EvalSummary": "osmosis_ai.train.events",
    "NoRewardError": "osmosis_ai.train.errors",
    "OutOfMemoryError": "osmosis_ai.train.errors",
    "PlacementError": "osmosis_ai.train.errors",
    "RayTrainError": "osmosis_ai.train.errors",
    "TokenFidelityError": "osmosis_ai.train.errors",
    "TrainRunOptions": "osmosis_ai.train.plan",
    "TrainRunResult": "osmosis_ai.train.events",
    "TrainingError": "osmosis_ai.train.errors",
    "TrainingRow": "osmosis_ai.train.tokens",
    "build_row": "osmosis_ai.train.tokens",
    "build_tiny_model": "osmosis_ai.train.tiny_model",
    "run_demo": "osmosis_ai.train.demo",
    "run_training": "osmosis_ai.train.runner",
}

if TYPE_CHECKING:
    from osmosis_ai.train.demo import DemoResult as DemoResult
    from osmosis_ai.train.demo import run_demo as run_demo
    from osmosis_ai.train.errors import NoRewardError as NoRewardError
    from osmosis_ai.train.errors import OutOfMemoryError as OutOfMemoryError
    from osmosis_ai.train.errors import PlacementError as PlacementError
    from osmosis_ai.train.errors import RayTrainError as RayTrainError
    from osmosis_ai.train.errors import TokenFidelityError as TokenFidelityError
    from osmosis_ai.train.errors import TrainingError as TrainingError
    from osmosis_ai.train.events import EvalSummary as EvalSummary
    from osmosis_ai.train.events import TrainRunResult as TrainRunResult
    from osmosis_ai.train.plan import TrainRunOptions as TrainRunOptions
    from osmosis_ai.train.runner import run_training as run_training
    from osmosis_ai.train.tiny_model import build_tiny_model as build_tiny_model
    from osmosis_ai.train.tokens import TrainingRow as TrainingRow
    from osmosis_ai.train.tokens import build_row as build_row

__all__ = [
    "DemoResult",
    "EvalSummary",
    "NoRewardError",
    "OutOfMemoryError",
    "PlacementError",
    "RayTrainError",
    "TokenFidelityError",
    "TrainRunOptions",
    "TrainRunResult",
    "TrainingError",
    "TrainingRow",
    "build_row",
    "build_tiny_model",
    "run_demo",
    "run_training",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS)
