"""``RolloutSample``: the one sample a rollout produces, and its JSON-safe copy."""

from __future__ import annotations

import copy
import logging
import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

logger = logging.getLogger(__name__)

MessageDict = dict[str, Any]
Messages = list[MessageDict]


class RolloutSample(BaseModel):
    """One conversation produced by a workflow, plus its reward once graded.

    ``messages`` is the framework-native history graders see; ``trajectory_messages`` is an
    OpenAI-chat-shaped copy used only to write ``trajectory.json`` (a deep copy of
    ``messages`` unless set; an explicit ``None`` disables trajectory saving).
    """

    model_config = ConfigDict(
        validate_assignment=True, arbitrary_types_allowed=True, defer_build=True
    )

    messages: Sequence[Mapping[str, Any]] = Field(default_factory=list)
    trajectory_messages: Sequence[Mapping[str, Any]] | None = None
    label: str | None = None
    reward: float | None = Field(default=None, allow_inf_nan=False)
    remove_sample: bool = False
    metrics: dict[str, Any] = Field(default_factory=dict)
    extra_fields: dict[str, Any] = Field(default_factory=dict)

    @model_validator(mode="before")
    @classmethod
    def _default_trajectory(cls, data: Any) -> Any:
        if isinstance(data, dict) and "trajectory_messages" not in data:
            messages = data.get("messages", [])
            data = {**data, "trajectory_messages": copy.deepcopy(list(messages))}
        return data

    @field_validator("reward", mode="before")
    @classmethod
    def _coerce_reward(cls, value: Any) -> Any:
        if value is None:
            return value
        if isinstance(value, bool):
            raise ValueError("reward must be a finite number, not a bool")
        item = getattr(value, "item", None)  # numpy / torch scalars
        if callable(item) and not isinstance(value, (int, float)):
            value = item()
        if isinstance(value, (int, float)) and not math.isfinite(float(value)):
            raise ValueError(f"reward must be finite, got {value!r}")
        return value

    def wire_dict(self) -> dict[str, Any]:
        """The sample as sent over the wire: no ``trajectory_messages``, JSON-safe telemetry."""
        safe = self.json_safe_copy()
        return {
            "messages": [dict(m) for m in safe.messages],
            "label": safe.label,
            "reward": safe.reward,
            "remove_sample": safe.remove_sample,
            "metrics": safe.metrics,
            "extra_fields": safe.extra_fields,
        }

    def json_safe_copy(self) -> RolloutSample:
        """A copy whose ``metrics`` and ``extra_fields`` hold only JSON-encodable, finite values.

        numpy scalars and arrays become Python numbers and lists; NaN, infinities and values
        that cannot be encoded are dropped (logged once per call).
        """
        dropped: list[str] = []
        metrics = _json_safe_mapping(self.metrics, "metrics", dropped)
        extra = _json_safe_mapping(self.extra_fields, "extra_fields", dropped)
        if dropped:
            logger.warning("dropped non-JSON-safe sample telemetry: %s", ", ".join(dropped))
        return self.model_copy(update={"metrics": metrics, "extra_fields": extra})


_DROP: Any = object()


def _json_safe(value: Any, path: str, dropped: list[str]) -> Any:
    if value is None or isinstance(value, (str, bool)):
        return value
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if math.isfinite(value):
            return value
        dropped.append(path)
        return _DROP
    tolist = getattr(value, "tolist", None)  # numpy scalars and arrays
    if callable(tolist):
        try:
            return _json_safe(tolist(), path, dropped)
        except Exception:  # a foreign tolist() may fail in any way
            dropped.append(path)
            return _DROP
    if isinstance(value, Mapping):
        return _json_safe_mapping(value, path, dropped)
    if isinstance(value, (list, tuple)):
        out: list[Any] = []
        for i, item in enumerate(value):
            safe = _json_safe(item, f"{path}[{i}]", dropped)
            if safe is not _DROP:
                out.append(safe)
        return out
    dropped.append(path)
    return _DROP


def _json_safe_mapping(data: Mapping[Any, Any], path: str, dropped: list[str]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        if not isinstance(key, str):
            dropped.append(f"{path}.{key!r}")
            continue
        safe = _json_safe(value, f"{path}.{key}", dropped)
        if safe is not _DROP:
            out[key] = safe
    return out
