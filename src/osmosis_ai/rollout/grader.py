"""``Grader``: turns the rollout's sample and label into one reward."""

from __future__ import annotations

from abc import ABC, abstractmethod

from osmosis_ai.rollout.config import GraderConfig
from osmosis_ai.rollout.context import GraderContext


class Grader(ABC):
    """Scores one sample. Call ``ctx.set_reward(x)`` with a finite number; the return value
    is ignored. Leaving the reward unset means the rollout was not graded (a failure)."""

    def __init__(self, config: GraderConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def grade(self, ctx: GraderContext) -> object:
        """Grade ``ctx.sample`` against ``ctx.label``."""
