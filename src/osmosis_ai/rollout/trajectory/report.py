"""The controller's optional trajectory report (carried in callback acks) and its overlay.

A controller knows what the chat endpoint saw (token ids, logprobs, cost); it may send that
back as ``{"trajectory": {...}}`` in a callback ack. This module parses the report and
attaches its per-call metrics to a trajectory's agent steps.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from osmosis_ai.rollout.trajectory.atif import Metrics, Step

logger = logging.getLogger(__name__)


class _Report(BaseModel):
    model_config = ConfigDict(extra="ignore")


class LlmCallMetrics(_Report):
    """What the controller recorded for one LLM call. Non-finite numbers are dropped
    (a ``logprobs`` list holding one is dropped whole, to keep it aligned with the token ids).
    """

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: float | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    model_name: str | None = None
    extra: dict[str, Any] | None = None

    @field_validator("cost_usd")
    @classmethod
    def _finite_cost(cls, value: float | None) -> float | None:
        return value if value is None or math.isfinite(value) else None

    @field_validator("logprobs")
    @classmethod
    def _finite_logprobs(cls, value: list[float] | None) -> list[float] | None:
        if value is not None and not all(math.isfinite(v) for v in value):
            logger.warning("dropped a logprobs list holding non-finite values")
            return None
        return value


class SampleReport(_Report):
    """The controller's view of one sample: its LLM calls in order and optional totals."""

    model_name: str | None = None
    llm_call_metrics: list[LlmCallMetrics] = Field(default_factory=list)
    final_metrics: dict[str, Any] | None = None


class TrajectoryReport(_Report):
    """The ``trajectory`` object of a callback ack. ``samples`` keys are not interpreted."""

    model_name: str | None = None
    samples: dict[str, SampleReport] = Field(default_factory=dict)


def report_from_response(body: object) -> TrajectoryReport | None:
    """Read the ``trajectory`` key of a callback ack body (a mapping or JSON text).

    Returns ``None`` when there is no report; a malformed one is logged and ignored.
    """
    if isinstance(body, (str, bytes, bytearray)):
        try:
            body = json.loads(body)
        except ValueError:
            logger.warning("ignored a callback ack that is not JSON")
            return None
    if not isinstance(body, Mapping):
        return None
    raw = body.get("trajectory")  # pyright: ignore[reportUnknownMemberType]
    if raw is None:
        return None
    try:
        return TrajectoryReport.model_validate(raw)
    except ValidationError as exc:
        logger.warning("ignored a malformed trajectory report: %s", exc)
        return None


def select_sample_report(
    report: TrajectoryReport | None,
) -> tuple[SampleReport | None, dict[str, Any] | None]:
    """The sample report to overlay, or (with several) none plus all of them to preserve.

    The SDK produces one sample per rollout, so a single entry applies whatever its key.
    """
    if report is None or not report.samples:
        return None, None
    if len(report.samples) == 1:
        return next(iter(report.samples.values())), None
    preserved = {key: value.model_dump() for key, value in report.samples.items()}
    return None, preserved


def attach_call_metrics(steps: list[Step], calls: list[LlmCallMetrics]) -> bool:
    """Attach ``calls`` to the agent steps in order if there is one call per agent step.

    Returns whether they were attached; on a count mismatch nothing is changed. Values the
    controller reports win over usage read from the messages.
    """
    agent_steps = [step for step in steps if step.source == "agent"]
    if len(agent_steps) != len(calls):
        return False
    for step, call in zip(agent_steps, calls, strict=True):
        reported = call.model_dump(exclude_none=True, exclude={"model_name"})
        current = step.metrics.model_dump(exclude_none=True) if step.metrics else {}
        step.metrics = Metrics.model_validate({**current, **reported})
        if call.model_name is not None:
            step.model_name = call.model_name
        step.llm_call_count = 1
    return True
