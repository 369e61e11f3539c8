"""``ExecutionBackend``: where and how rollouts run, behind the rollout server."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from typing import Any

from osmosis_ai.rollout.execution import ExecutionOutcome, ExecutionRequest, ExecutionResult

ResultCallback = Callable[[ExecutionResult], Awaitable[None]]
"""Called with a phase's result as soon as that phase ends."""


class ExecutionBackend(ABC):
    """Runs rollouts. The server calls :meth:`execute` once per admitted rollout.

    ``execute`` returns the :class:`ExecutionOutcome` of both phases. It also calls
    ``on_workflow_complete`` as soon as the workflow ends and ``on_grader_complete`` when
    grading ends, so the callback protocol can report each phase when it happens. A backend
    written for the callback-only interface may return ``None`` after calling the callbacks;
    the server then builds the outcome from them.

    Passing ``on_grader_complete`` asks for grading, and a backend calls it exactly once:
    with the grader's result, or, when no grading could run (the workflow failed, timed out
    or returned something invalid), with a FAILURE result that has no sample. Whoever drives
    a backend can therefore wait for that callback without a deadline of its own.
    """

    @abstractmethod
    async def execute(
        self,
        request: ExecutionRequest,
        on_workflow_complete: ResultCallback | None = None,
        on_grader_complete: ResultCallback | None = None,
    ) -> ExecutionOutcome | None:
        """Run one rollout to its end."""

    @property
    def capture_final_result(self) -> bool:
        """``True`` when the backend grades by itself even without a grader callback URL."""
        return False

    def has_capacity(self) -> bool:
        """``False`` makes the server answer ``429`` with ``Retry-After``."""
        return True

    def rollout_status(self, rollout_id: str) -> dict[str, Any] | None:
        """``{"status", "reward"?, "err_message"?}`` for a rollout this backend knows."""
        del rollout_id
        return None

    def cancel_rollouts(
        self, ids: list[str] | None = None, prefix: str | None = None, all: bool = False
    ) -> dict[str, str]:
        """Cancel rollouts; returns a disposition per id the backend knows."""
        del ids, prefix, all
        return {}

    def health(self) -> dict[str, Any]:
        """Body of ``GET /health`` (the server adds its own keys)."""
        return {"status": "ok"}

    async def shutdown(self) -> None:
        """Release resources when the server stops."""
        return
