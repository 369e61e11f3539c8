"""What our backends report: the body of ``GET /health`` and a rollout's status, typed once.

:meth:`ExecutionBackend.health` and :meth:`ExecutionBackend.rollout_status` return plain
dicts (the API a custom backend implements); :class:`LocalBackend` and :class:`HarborBackend`
build theirs from these types. ``body()`` writes the keys in the order they go on the wire
and the values as they are (a reward stays the number the grader set).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from osmosis_ai.rollout.backend.registry import TrackedRollout
from osmosis_ai.rollout.status import RolloutStatus

__all__ = ["Concurrency", "HarborHealth", "LocalHealth", "RolloutReport"]


@dataclass(frozen=True, slots=True)
class RolloutReport:
    """A rollout the backend knows: where it stands and, once ended, how."""

    status: RolloutStatus
    reward: float | None = None
    err_message: str | None = None

    @classmethod
    def of(cls, tracked: TrackedRollout, *, reward_on_success_only: bool = False) -> RolloutReport:
        """The report of ``tracked``; ``reward_on_success_only`` leaves out the reward of a
        rollout that did not succeed."""
        keep = not reward_on_success_only or tracked.status == RolloutStatus.SUCCESS
        return cls(tracked.status, tracked.reward if keep else None, tracked.err_message)

    def body(self) -> dict[str, Any]:
        return {"status": self.status.value, "reward": self.reward, "err_message": self.err_message}


@dataclass(frozen=True, slots=True)
class Concurrency:
    max_concurrent: int | None  # None: unlimited
    queued: int
    running: int


@dataclass(frozen=True, slots=True)
class LocalHealth:
    """:class:`LocalBackend`'s health: its concurrency limit and what waits and runs."""

    concurrency: Concurrency

    def body(self) -> dict[str, Any]:
        limits = self.concurrency
        return {
            "status": "ok",
            "concurrency": {
                "max_concurrent": limits.max_concurrent,
                "queued": limits.queued,
                "running": limits.running,
            },
        }


@dataclass(frozen=True, slots=True)
class HarborHealth:
    """:class:`HarborBackend`'s health: the agent it runs and its queue."""

    agent: str
    running: int
    queued: int
    max_queue_depth: int | None  # None: no limit

    def body(self) -> dict[str, Any]:
        return {
            "status": "ok",
            "backend": "harbor",
            "agent": self.agent,
            "in_flight": self.queued + self.running,
            "running": self.running,
            "queued": self.queued,
            "max_queue_depth": self.max_queue_depth,
        }
