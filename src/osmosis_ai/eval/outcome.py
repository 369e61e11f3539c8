"""Outcome classification: the terminal bodies of one attempt become its journal record.

Polling generation per protocol-0.3.8 §4.3, callback generation per reference §5.3. A result
of ``None`` means "no record": the item stays pending, either because it was cancelled or
because the fault is process-wide and dispatch halts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from enum import StrEnum
from typing import Any

from pydantic import BaseModel

from osmosis_ai.errors import ProtocolError
from osmosis_ai.eval.journal import JournalRecord, JournalStatus
from osmosis_ai.eval.workitems import Attempt
from osmosis_ai.rollout.status import RolloutStatus

Body = Mapping[str, Any] | BaseModel
"""A terminal body as parsed JSON, or the wire model it validates into."""


class LocalErrorType(StrEnum):
    """``error_type`` values the local evaluator itself assigns (others come from the server)."""

    CALLBACK_TIMEOUT = "callback_timeout"
    MISSING_GRADER_CALLBACK = "missing_grader_callback"
    GRADER_FAILED = "grader_failed"
    WORKFLOW_FAILED = "workflow_failed"
    ROLLOUT_FAILED = "rollout_failed"
    ROLLOUT_PROTOCOL_ERROR = "rollout_protocol_error"
    SUPERVISOR_ERROR = "supervisor_error"


def classify_polling_result(
    attempt: Attempt, result: Body, *, duration_ms: float, tokens: int | None = None
) -> JournalRecord | None:
    """Classify a terminal ``RolloutResultResponse`` (polling generation).

    ``success`` is a success with the sample's reward (possibly none), or ``skipped`` when the
    sample asks to be removed; ``failure`` is failed with ``err_category``, else
    ``err_message``, else ``rollout_failed`` (a reward present is kept); ``cancelled`` writes
    no record.
    """
    body = _as_dict(result)
    _check_id(attempt, body, "result")
    status = _status(body, "result")
    sample = _sample(body)
    if status is RolloutStatus.CANCELLED:
        return None
    if status is RolloutStatus.SUCCESS:
        if sample.get("remove_sample") is True:
            return _record(attempt, "skipped", duration_ms, tokens)
        return _record(attempt, "success", duration_ms, tokens, reward=_reward(sample))
    if status is RolloutStatus.FAILURE:
        error = _text(body.get("err_category")) or _text(body.get("err_message"))
        return _record(
            attempt,
            "failed",
            duration_ms,
            tokens,
            reward=_reward(sample),
            error_type=error or LocalErrorType.ROLLOUT_FAILED,
        )
    raise ProtocolError(
        f"rollout {attempt.rollout_id!r} result has status {status.value!r}, which is not "
        "terminal; only a terminal result can be classified"
    )


def classify_callback_result(
    attempt: Attempt,
    completion: Body | None,
    grader: Body | None,
    *,
    duration_ms: float,
    tokens: int | None = None,
    deadline_exceeded: bool = False,
) -> JournalRecord | None:
    """Classify the completion and grader callbacks of one attempt (callback generation).

    In order: deadline exceeded → ``callback_timeout``; no grader callback →
    ``missing_grader_callback``; grader failure → its ``err_category`` or ``grader_failed``;
    removed sample → skipped; completion not ``success`` → its ``err_category`` or
    ``workflow_failed``; otherwise success with the sample's reward. A ``cancelled``
    completion (and no deadline) writes no record, as a cancel does in the polling generation.
    """
    if deadline_exceeded:
        return _record(
            attempt, "failed", duration_ms, tokens, error_type=LocalErrorType.CALLBACK_TIMEOUT
        )
    done = None if completion is None else _as_dict(completion)
    if done is not None:
        _check_id(attempt, done, "completion callback")
        if _status(done, "completion callback") is RolloutStatus.CANCELLED:
            return None
    if grader is None:
        return _record(
            attempt,
            "failed",
            duration_ms,
            tokens,
            error_type=LocalErrorType.MISSING_GRADER_CALLBACK,
        )
    graded = _as_dict(grader)
    _check_id(attempt, graded, "grader callback")
    sample = _sample(graded)
    reward = _reward(sample)
    if _text(graded.get("status")) != "success":
        error = _text(graded.get("err_category")) or LocalErrorType.GRADER_FAILED
        return _record(attempt, "failed", duration_ms, tokens, reward=reward, error_type=error)
    if sample.get("remove_sample") is True:
        return _record(attempt, "skipped", duration_ms, tokens)
    if done is None or _status(done, "completion callback") is not RolloutStatus.SUCCESS:
        category = None if done is None else _text(done.get("err_category"))
        error = category or LocalErrorType.WORKFLOW_FAILED
        return _record(attempt, "failed", duration_ms, tokens, reward=reward, error_type=error)
    return _record(attempt, "success", duration_ms, tokens, reward=reward)


def classify_admission_rejection(
    attempt: Attempt, status_code: int, *, duration_ms: float
) -> JournalRecord | None:
    """``POST /rollout`` refused before a rollout existed.

    A 4xx (other than 429, which is retried until the admission budget runs out) is failed
    with ``rollout_protocol_error``. Anything else (429 out of budget, 5xx) is a process-wide
    fault: no record, dispatch halts and the item stays pending.
    """
    if 400 <= status_code < 500 and status_code != 429:
        return _record(
            attempt, "failed", duration_ms, None, error_type=LocalErrorType.ROLLOUT_PROTOCOL_ERROR
        )
    return None


def supervisor_error_record(attempt: Attempt, *, duration_ms: float) -> JournalRecord:
    """A supervisor-side exception confined to one item (callback generation)."""
    return _record(attempt, "failed", duration_ms, None, error_type=LocalErrorType.SUPERVISOR_ERROR)


def _as_dict(body: Body) -> Mapping[str, Any]:
    return body.model_dump(mode="json") if isinstance(body, BaseModel) else body


def _text(value: object) -> str | None:
    # StrEnum members are str, so categories from parsed models and raw JSON read the same.
    return str(value) if isinstance(value, str) and value else None


def _status(body: Mapping[str, Any], what: str) -> RolloutStatus:
    raw = body.get("status")
    try:
        return RolloutStatus(raw)
    except ValueError:
        raise ProtocolError(f"the {what} has an unknown status {raw!r}") from None


def _check_id(attempt: Attempt, body: Mapping[str, Any], what: str) -> None:
    found = body.get("rollout_id")
    if found is not None and found != attempt.rollout_id:
        raise ProtocolError(
            f"the {what} names rollout {found!r}, but it answers rollout {attempt.rollout_id!r}"
        )


def _sample(body: Mapping[str, Any]) -> Mapping[str, Any]:
    sample = body.get("sample")
    return sample if isinstance(sample, Mapping) else {}


def _reward(sample: Mapping[str, Any]) -> float | None:
    value = sample.get("reward")
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _record(
    attempt: Attempt,
    status: JournalStatus,
    duration_ms: float,
    tokens: int | None,
    *,
    reward: float | None = None,
    error_type: str | None = None,
) -> JournalRecord:
    millis = round(duration_ms) if math.isfinite(duration_ms) else 0
    return JournalRecord(
        row_index=attempt.row_index,
        run_index=attempt.run_index,
        rollout_id=attempt.rollout_id,
        status=status,
        duration_ms=max(0, millis),
        source_row_index=attempt.source_row_index,
        reward=reward,
        tokens=tokens,
        error_type=None if error_type is None else str(error_type),
    )
