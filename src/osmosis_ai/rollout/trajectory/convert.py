"""Conversion of a ``RolloutSample``'s OpenAI-chat-shaped messages into an ATIF document.

Owns the mapping rules (roles, tool calls and results, content, per-message usage, model,
timestamps), the totals, the ``extra.osmosis`` block and the strict-JSON guarantee: values
that JSON cannot hold (NaN, infinities, foreign objects) are dropped, never written.
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, TypeGuard

from pydantic import ValidationError

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.rollout.trajectory.atif import (
    Agent,
    FinalMetrics,
    Metrics,
    Observation,
    ObservationResult,
    Step,
    StepSource,
    ToolCall,
    Trajectory,
    json_safe,
)
from osmosis_ai.rollout.trajectory.report import (
    LlmCallMetrics,
    TrajectoryReport,
    attach_call_metrics,
    select_sample_report,
)

if TYPE_CHECKING:
    from osmosis_ai.rollout.sample import RolloutSample

logger = logging.getLogger(__name__)

_ROLES: dict[str, StepSource] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "agent",
}
_TOOL_ROLES = frozenset({"tool", "function"})
_TEXT_PART_TYPES = frozenset({"text", "input_text", "output_text"})


def convert_sample_to_trajectory(
    *,
    rollout_id: str,
    sample: RolloutSample,
    label: str | None = None,
    reward: float | None = None,
    status: str | None = None,
    err_message: str | None = None,
    err_category: str | None = None,
    request_metadata: Mapping[str, Any] | None = None,
    request_extra_fields: Mapping[str, Any] | None = None,
    report: TrajectoryReport | None = None,
    model_name: str | None = None,
) -> dict[str, Any]:
    """Build the JSON-ready ATIF document for ``sample`` (which is not modified) from its
    ``trajectory_messages``, or its ``messages`` when those are ``None``.

    ``label`` and ``reward`` default to the sample's own. ``report`` is the controller's
    trajectory report (see ``report.py``); ``model_name`` wins over any model it names.
    """
    messages = sample.trajectory_messages
    steps = _steps(list(messages if messages is not None else sample.messages))
    sample_report, unmatched_reports = select_sample_report(report)
    dropped: list[str] = []
    osmosis: dict[str, Any] = {
        "rollout_id": rollout_id,
        "label": label if label is not None else sample.label,
        "reward": reward if reward is not None else sample.reward,
        "status": status,
        "err_message": err_message,
        "err_category": err_category,
        "sample_metrics": sample.metrics,
        "sample_extra_fields": sample.extra_fields,
        "request_metadata": dict(request_metadata or {}),
        "request_extra_fields": dict(request_extra_fields or {}),
    }
    calls = sample_report.llm_call_metrics if sample_report else []
    matched = attach_call_metrics(steps, calls) if calls else False
    if calls and not matched:
        osmosis["unmatched_llm_call_metrics"] = [c.model_dump() for c in calls]
    if unmatched_reports is not None:
        osmosis["unmatched_sample_reports"] = unmatched_reports
    final = _final_metrics(steps, calls if calls and not matched else None)
    if sample_report is not None and sample_report.final_metrics:
        final = _overlay_final_metrics(final, sample_report.final_metrics)
    agent_model = model_name or (sample_report.model_name if sample_report else None)
    agent_model = agent_model or (report.model_name if report else None)
    agent_model = agent_model or next((s.model_name for s in steps if s.model_name), None)
    trajectory = Trajectory(
        session_id=rollout_id,
        trajectory_id=rollout_id,
        agent=Agent(version=PACKAGE_VERSION, model_name=agent_model),
        steps=steps,
        final_metrics=final,
        extra={"osmosis": json_safe(osmosis, dropped, "extra.osmosis")},
    )
    document = json_safe(trajectory.to_document(), dropped, "trajectory")
    if dropped:
        logger.warning("dropped non-JSON values from the trajectory: %s", ", ".join(dropped))
    return document


def _steps(messages: list[Any]) -> list[Step]:
    steps: list[Step] = []
    for raw in messages:
        message = _mapping(raw)
        role = message.get("role")
        if isinstance(role, str) and role in _TOOL_ROLES and steps and steps[-1].source == "agent":
            _fold_tool_result(steps[-1], message)
            continue
        source = _ROLES.get(role) if isinstance(role, str) else None
        step = Step(
            step_id=len(steps) + 1,
            source=source or "user",
            message=_text(message.get("content")) or "",
            extra={"original_role": role} if source is None else None,
        )
        response = _mapping(_mapping(message.get("extra")).get("response"))
        step.timestamp = _timestamp(message, response)
        if source == "agent":
            _fill_agent_step(step, message, response)
        steps.append(step)
    return steps


def _fill_agent_step(step: Step, message: Mapping[str, Any], response: Mapping[str, Any]) -> None:
    reasoning = message.get("reasoning_content", message.get("reasoning"))
    step.reasoning_content = _text(reasoning)
    raw_calls = message.get("tool_calls")
    calls = list(raw_calls) if isinstance(raw_calls, (list, tuple)) else []
    if isinstance(message.get("function_call"), Mapping):  # legacy single function call
        calls.append(message["function_call"])
    if calls:
        step.tool_calls = [_tool_call(c, step.step_id, i) for i, c in enumerate(calls)]
    step.model_name = _first_str(message, response, keys=("model", "model_name"))
    metrics = _usage_metrics(message.get("usage") or response.get("usage"))
    if metrics is not None:
        step.metrics = metrics
        step.llm_call_count = 1


def _tool_call(raw: Any, step_id: int, index: int) -> ToolCall:
    call = _mapping(raw)
    function = _mapping(call.get("function")) or call
    call_id = call.get("id") or call.get("tool_call_id") or call.get("call_id")
    name = function.get("name")
    return ToolCall(
        tool_call_id=call_id if isinstance(call_id, str) else f"call_{step_id}_{index}",
        function_name=name if isinstance(name, str) else "",
        arguments=_arguments(function.get("arguments")),
    )


def _arguments(raw: Any) -> dict[str, Any]:
    if raw is None or raw == "":
        return {}
    if isinstance(raw, Mapping):
        return json_safe(raw, [])
    text = raw if isinstance(raw, str) else _text(raw) or ""
    try:
        parsed = json.loads(text)
    except ValueError:
        return {"_raw": text}
    return json_safe(parsed, []) if isinstance(parsed, dict) else {"_raw": text}


def _fold_tool_result(step: Step, message: Mapping[str, Any]) -> None:
    call_id = message.get("tool_call_id") or message.get("call_id")
    calls = step.tool_calls or []
    observation = step.observation or Observation()
    answered = {r.source_call_id for r in observation.results}
    match = next((c for c in calls if c.tool_call_id == call_id), None)
    if match is None and call_id is None and isinstance(name := message.get("name"), str):
        unanswered = (c for c in calls if c.tool_call_id not in answered)
        match = next((c for c in unanswered if c.function_name == name), None)
    content = _text(message.get("content"))
    if match is None:
        extra = dict(step.extra or {})
        unmatched = {"role": message.get("role"), "tool_call_id": call_id, "content": content}
        extra["unmatched_tool_results"] = [*extra.get("unmatched_tool_results", []), unmatched]
        step.extra = extra
        return
    result = ObservationResult(source_call_id=match.tool_call_id, content=content)
    step.observation = Observation(results=[*observation.results, result])


def _text(content: Any) -> str | None:
    """Message content as text: a list of text parts joins; other structures become JSON."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list) and content and all(map(_is_text_part, content)):
        return "\n".join(p if isinstance(p, str) else p["text"] for p in content)
    return json.dumps(json_safe({"c": content}, []).get("c"), ensure_ascii=False)


def _is_text_part(part: Any) -> bool:
    if isinstance(part, str):
        return True
    return (
        isinstance(part, Mapping)
        and isinstance(part.get("text"), str)
        and part.get("type", "text") in _TEXT_PART_TYPES
        and set(part) <= {"type", "text"}
    )


def _usage_metrics(raw: Any) -> Metrics | None:
    """Usage in chat-completions or Responses field names, as step metrics."""
    usage = _mapping(raw)
    if not usage:
        return None
    prompt_details = _mapping(usage.get("prompt_tokens_details"))
    input_details = _mapping(usage.get("input_tokens_details"))
    cached = prompt_details.get("cached_tokens", input_details.get("cached_tokens"))
    cost = usage.get("cost_usd", usage.get("cost"))
    metrics = Metrics(
        prompt_tokens=_count(usage.get("prompt_tokens", usage.get("input_tokens"))),
        completion_tokens=_count(usage.get("completion_tokens", usage.get("output_tokens"))),
        cached_tokens=_count(cached),
        cost_usd=float(cost) if _is_finite_number(cost) else None,
    )
    return None if metrics.is_empty() else metrics


def _final_metrics(steps: list[Step], calls: list[LlmCallMetrics] | None) -> FinalMetrics:
    """Totals over the step metrics, or over the report's calls when they were not attached."""
    sources: Sequence[Metrics | LlmCallMetrics] = (
        calls if calls is not None else [s.metrics for s in steps if s.metrics]
    )

    def total(field: str) -> Any:
        values = [v for s in sources if (v := getattr(s, field)) is not None]
        return sum(values) if values else None

    return FinalMetrics(
        total_prompt_tokens=total("prompt_tokens"),
        total_completion_tokens=total("completion_tokens"),
        total_cached_tokens=total("cached_tokens"),
        total_cost_usd=total("cost_usd"),
        total_steps=len(steps),
    )


def _overlay_final_metrics(computed: FinalMetrics, reported: Mapping[str, Any]) -> FinalMetrics:
    """The controller's totals win, except ``total_steps`` (always counted here)."""
    values = {**computed.model_dump(exclude_none=True), **json_safe(reported, [])}
    values["total_steps"] = computed.total_steps
    try:
        return FinalMetrics.model_validate(values)
    except ValidationError as exc:
        logger.warning("ignored the controller's final_metrics: %s", exc)
        return computed


def _timestamp(message: Mapping[str, Any], response: Mapping[str, Any]) -> str | None:
    for source in (message, response):
        for key in ("created_at", "timestamp", "completed_at"):
            value = source.get(key)
            if isinstance(value, str) and value:
                return value
            if _is_finite_number(value):
                try:
                    return datetime.fromtimestamp(value, tz=UTC).isoformat()
                except (OverflowError, OSError, ValueError):
                    continue
    return None


def _first_str(*sources: Mapping[str, Any], keys: tuple[str, ...]) -> str | None:
    for source in sources:
        for key in keys:
            if isinstance(value := source.get(key), str) and value:
                return value
    return None


def _count(value: Any) -> int | None:
    return int(value) if _is_finite_number(value) and value >= 0 else None


def _is_finite_number(value: Any) -> TypeGuard[int | float]:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _mapping(value: Any) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}
