"""The rollouts an execution backend is running or has finished, as status queries and
cancels see them: shared by :class:`LocalBackend` and :class:`HarborBackend`.

A finished rollout stays visible for ``retention_sec()`` seconds (the protocol's status and
cancel paths may ask after the result went out), then is forgotten; a rollout id that was
reused meanwhile keeps its newer entry.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutStatus

__all__ = ["RolloutRegistry", "TrackedRollout"]


@dataclass
class TrackedRollout:
    """One rollout: its status, the task running it (until it ends), how it ended, and how
    a cancel request found it (``cancelled_queued`` / ``cancelled_running``, said again to a
    repeated cancel)."""

    status: RolloutStatus
    task: asyncio.Task[Any] | None
    reward: float | None = None
    err_message: str | None = None
    cancel_disposition: str | None = None
    finished_at: float | None = None

    @property
    def live(self) -> bool:
        return not self.status.is_terminal


T = TypeVar("T", bound=TrackedRollout)


class RolloutRegistry(Generic[T]):
    """The backend's rollouts by id (``T``: its own :class:`TrackedRollout` subclass)."""

    def __init__(self, retention_sec: Callable[[], float]) -> None:
        self.retention_sec = retention_sec
        self._tracked: dict[str, T] = {}
        self._finished: deque[tuple[float, str, T]] = deque()

    def add(self, rollout_id: str, tracked: T) -> T:
        self._tracked[rollout_id] = tracked
        return tracked

    def get(self, rollout_id: str) -> T | None:
        """The rollout, if it runs or finished within the retention time."""
        self.expire()
        return self._tracked.get(rollout_id)

    def __iter__(self) -> Iterator[T]:
        return iter(list(self._tracked.values()))

    def finish(
        self,
        rollout_id: str,
        tracked: T,
        status: RolloutStatus,
        sample: RolloutSample | None,
        err_message: str | None,
    ) -> None:
        """Record how the rollout ended (its first ending counts; later ones are ignored)."""
        if tracked.status.is_terminal:
            return
        tracked.status = status
        tracked.reward = sample.reward if sample is not None else None
        tracked.err_message = err_message
        tracked.task = None
        tracked.finished_at = time.monotonic()
        self._finished.append((tracked.finished_at, rollout_id, tracked))
        self.expire()

    def expire(self) -> None:
        """Forget rollouts that finished longer ago than the retention time."""
        horizon = time.monotonic() - self.retention_sec()
        finished = self._finished
        while finished and finished[0][0] <= horizon:
            _, rollout_id, tracked = finished.popleft()
            if self._tracked.get(rollout_id) is tracked:
                del self._tracked[rollout_id]

    def cancel(
        self,
        ids: list[str] | None,
        prefix: str | None,
        everything: bool,
        disposition: Callable[[T], str],
    ) -> dict[str, str]:
        """Cancel the rollouts ``ids`` names, or the live ones whose id starts with
        ``prefix``, or (``everything``) every live one: each id maps to how the cancel found
        it (``disposition(tracked)`` the first time), or ``not_found``."""
        if ids is not None:
            selected = list(dict.fromkeys(ids))
        elif prefix is not None:
            selected = [i for i, t in self._tracked.items() if i.startswith(prefix) and t.live]
        elif everything:
            selected = [i for i, t in self._tracked.items() if t.live]
        else:
            selected = []
        out: dict[str, str] = {}
        for rollout_id in selected:
            tracked = self._tracked.get(rollout_id)
            if tracked is None or (not tracked.live and tracked.cancel_disposition is None):
                out[rollout_id] = "not_found"
                continue
            if tracked.cancel_disposition is None:
                tracked.cancel_disposition = disposition(tracked)
                if tracked.task is not None:
                    tracked.task.cancel()
            out[rollout_id] = tracked.cancel_disposition
        return out
