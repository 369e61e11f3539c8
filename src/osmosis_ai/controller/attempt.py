"""The data of one dispatch attempt: the work item in, how it ended out, and the commit hook.

:class:`DispatchRequest`, :class:`DispatchOutcome`, :data:`OutcomeKind` and :data:`CommitHook`
are plain values; :class:`~osmosis_ai.controller.dispatch.Dispatcher` produces them.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from osmosis_ai.controller.calls import CallRecord
from osmosis_ai.rollout.protocol import (
    CancelDisposition,
    Generation,
    GraderCompleteRequest,
    RolloutCompleteRequest,
    RolloutResultResponse,
)
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import GraderStatus, RolloutStatus

__all__ = [
    "DEADLINE_GRACE_SEC",
    "UNBOUNDED_DEADLINE_SEC",
    "CommitHook",
    "DispatchOutcome",
    "DispatchRequest",
    "OutcomeKind",
]

OutcomeKind = Literal["result", "admission_rejected", "timeout", "cancelled", "transport_error"]
DEADLINE_GRACE_SEC = 60.0
MIN_GRACE_SEC = 0.5
CANCEL_AFTER_DEADLINE_SEC = 5.0
UNBOUNDED_DEADLINE_SEC = 3600.0


@dataclass(frozen=True)
class DispatchRequest:
    """One work item. ``rollout_id`` ``None`` mints a fresh uuid4 hex per attempt;
    ``deadline_sec`` ``None`` derives the deadline from the timeouts (:attr:`deadline`).
    ``upstream_fields``: JSON fields the policy proxy merges into every model request body
    the rollout sends upstream (the agent never sees them), such as the policy version that
    must answer it."""

    initial_messages: Sequence[Mapping[str, Any]]
    label: str | None = None
    metadata: Mapping[str, Any] | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    extra_fields: Mapping[str, Any] | None = None
    grade: bool = True
    rollout_id: str | None = None
    deadline_sec: float | None = None
    upstream_fields: Mapping[str, Any] | None = None

    @property
    def deadline(self) -> float:
        """Seconds to wait after admission: the agent and grader timeouts plus a grace of
        half their sum (at most 60 s, at least 0.5 s); 3600 when one is unset. With
        :attr:`cancel_bound`, a server that ignores its own deadlines is given up on within
        twice them."""
        if self.deadline_sec is not None:
            return self.deadline_sec
        budget = self._budget()
        if budget is None:
            return UNBOUNDED_DEADLINE_SEC
        return budget + min(DEADLINE_GRACE_SEC, max(budget / 2, MIN_GRACE_SEC))

    @property
    def cancel_bound(self) -> float:
        """Seconds the remote cancel after a missed deadline may take: a quarter of the
        agent and grader timeouts' sum, at most 5 s (at least 0.5 s)."""
        budget = self._budget()
        if budget is None or self.deadline_sec is not None:
            return CANCEL_AFTER_DEADLINE_SEC
        return min(CANCEL_AFTER_DEADLINE_SEC, max(budget / 4, MIN_GRACE_SEC))

    def _budget(self) -> float | None:
        grader = self.grader_timeout_sec if self.grade else 0.0
        if self.agent_timeout_sec is None or grader is None:
            return None
        return max(self.agent_timeout_sec, 0.0) + max(grader, 0.0)


@dataclass(frozen=True)
class DispatchOutcome:
    """How one attempt ended.

    ``kind``: ``result`` (a terminal body came back), ``cancelled`` (the terminal status is
    ``cancelled``), ``admission_rejected`` (``POST /rollout`` answered a 4xx: see
    ``status_code``/``detail``), ``timeout`` (admission budget or item deadline spent; the
    rollout was cancelled, see ``cancel_disposition``) or ``transport_error`` (the server
    was unreachable, answered 5xx, or broke the protocol). ``result`` is the polling body;
    ``completion``/``grader`` the callback bodies. ``calls`` are the proxy's records.
    ``lost_in_transit``: admitted, but the answer carrying its lease was lost and the server
    does not replay submits; the rollout was cancelled, and the item may run again under a
    fresh id without being counted twice.
    """

    rollout_id: str
    generation: Generation | None
    kind: OutcomeKind
    admitted: bool
    result: RolloutResultResponse | None = None
    completion: RolloutCompleteRequest | None = None
    grader: GraderCompleteRequest | None = None
    status_code: int | None = None
    detail: str | None = None
    cancel_disposition: CancelDisposition | None = None
    calls: tuple[CallRecord, ...] = ()
    total_tokens: int = 0
    duration_ms: float = 0.0
    lost_in_transit: bool = False

    @property
    def status(self) -> RolloutStatus | None:
        """The terminal status, whichever generation ran (``None`` without a terminal body)."""
        if self.result is not None:
            return self.result.status
        done = self.completion
        if done is not None and done.status != RolloutStatus.SUCCESS:
            return done.status
        if self.grader is not None:
            ok = self.grader.status == GraderStatus.SUCCESS
            return RolloutStatus.SUCCESS if ok else RolloutStatus.FAILURE
        return None if done is None else done.status

    @property
    def sample(self) -> RolloutSample | None:
        """The returned sample (polling result, or grader callback)."""
        if self.result is not None:
            return self.result.sample
        return None if self.grader is None else self.grader.sample


CommitHook = Callable[[DispatchOutcome], Awaitable[None]]
"""Records a terminal outcome durably; called once per attempt that got a terminal body
(a failing call is retried only by a retried callback)."""
