"""Pydantic models of the ATIF trajectory document (schema ``ATIF-v1.7``); internal.

Only what the SDK writes is modelled. ``Trajectory.to_document`` renders the JSON-ready dict
(unset optional fields left out); ``json_safe`` keeps any value strict JSON (no NaN, no objects).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any, Final, Literal

from pydantic import BaseModel, ConfigDict, Field, FiniteFloat

SCHEMA_VERSION: Final = "ATIF-v1.7"
AGENT_NAME = "osmosis-rollout-sdk"

StepSource = Literal["system", "user", "agent"]
_DROP: Any = object()


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class ToolCall(_Model):
    """One tool call an agent step made; ``arguments`` is always an object."""

    tool_call_id: str
    function_name: str
    arguments: dict[str, Any] = Field(default_factory=dict)


class ObservationResult(_Model):
    """The result of one tool call, matched to the call by ``source_call_id``."""

    source_call_id: str | None = None
    content: str | None = None


class Observation(_Model):
    results: list[ObservationResult] = Field(default_factory=list)


class Metrics(_Model):
    """Usage and training data of the LLM call behind one agent step."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    cached_tokens: int | None = None
    cost_usd: FiniteFloat | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[FiniteFloat] | None = None
    extra: dict[str, Any] | None = None

    def is_empty(self) -> bool:
        return all(value is None for value in self.__dict__.values())


class Step(_Model):
    """One message of the conversation; ``step_id`` counts from 1 in document order."""

    step_id: int = Field(ge=1)
    timestamp: str | None = None
    source: StepSource
    model_name: str | None = None
    message: str = ""
    reasoning_content: str | None = None
    tool_calls: list[ToolCall] | None = None
    observation: Observation | None = None
    metrics: Metrics | None = None
    llm_call_count: int | None = Field(default=None, ge=0)
    extra: dict[str, Any] | None = None


class Agent(_Model):
    name: str = AGENT_NAME
    version: str
    model_name: str | None = None


class FinalMetrics(BaseModel):
    """Totals over the trajectory. Extra keys a controller supplies are written as given."""

    model_config = ConfigDict(extra="allow", validate_assignment=True)

    total_prompt_tokens: int | None = None
    total_completion_tokens: int | None = None
    total_cached_tokens: int | None = None
    total_cost_usd: FiniteFloat | None = None
    total_steps: int = Field(ge=0)


class Trajectory(_Model):
    """The whole ATIF document for one rollout."""

    schema_version: Literal["ATIF-v1.7"] = SCHEMA_VERSION
    session_id: str
    trajectory_id: str
    agent: Agent
    steps: list[Step] = Field(default_factory=list)
    final_metrics: FinalMetrics
    extra: dict[str, Any] | None = None

    def to_document(self) -> dict[str, Any]:
        return self.model_dump(exclude_none=True)


def json_safe(data: Mapping[Any, Any], dropped: list[str], path: str = "") -> dict[str, Any]:
    """A copy of ``data`` holding only strict-JSON values; the paths left out go to ``dropped``.

    numpy scalars and arrays become numbers and lists (via ``tolist``).
    """
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            dropped.append(f"{path}.{key!r}")
            continue
        safe = _json_value(value, f"{path}.{key}", dropped)
        if safe is not _DROP:
            out[key] = safe
    return out


def _json_value(value: Any, path: str, dropped: list[str]) -> Any:
    if value is None or isinstance(value, (str, bool, int)):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
    elif isinstance(value, Mapping):
        return json_safe(value, dropped, path)
    elif isinstance(value, (list, tuple)):
        items = (_json_value(v, f"{path}[{i}]", dropped) for i, v in enumerate(value))
        return [item for item in items if item is not _DROP]
    elif callable(tolist := getattr(value, "tolist", None)):
        try:
            return _json_value(tolist(), path, dropped)
        except Exception:  # a foreign object's tolist() may fail in any way
            pass
    dropped.append(path)
    return _DROP
