"""Wire models of the rollout protocol, both generations.

* **Callback generation** (protocol 0.3, SDK 0.3.0): the controller's ``POST /rollout`` carries
  ``completion_callback_url``; the server answers ``202 {}`` and later POSTs a
  :class:`RolloutCompleteRequest` and (optionally) a :class:`GraderCompleteRequest`.
* **Polling generation** (protocol 0.4, SDK 0.3.8): the request carries ``rollout_id`` and no
  callback URL; the server answers 202 with a :class:`RolloutInitResponse` holding a polling
  lease, and the controller long-polls ``GET /rollout/{id}/result`` for a
  :class:`RolloutResultResponse`.

A request is in the callback generation exactly when it names ``completion_callback_url``.
Unknown keys are ignored, as both original generations do.
"""

from __future__ import annotations

import math
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    field_serializer,
    field_validator,
    model_validator,
)

from osmosis_ai.rollout.ids import validate_rollout_id
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import GraderStatus, RolloutErrorCategory, RolloutStatus

ROLLOUT_PROTOCOL_VERSION = "0.3"
"""Version string of the callback generation."""
POLLING_PROTOCOL_VERSION = "0.4"
"""Version string of the polling-lease generation."""
POLLING_LEASE_HEADER = "X-Osmosis-Rollout-Lease"

Generation = Literal["callback", "polling"]


def _finite_or_none(value: float | None, field: str) -> float | None:
    if value is not None and not math.isfinite(value):
        raise ValueError(f"{field} must be a finite number of seconds or null, got {value!r}")
    return value


class _Wire(BaseModel):
    model_config = ConfigDict(extra="ignore")


class RolloutInitRequest(_Wire):
    """Body of ``POST /rollout`` (both generations)."""

    initial_messages: list[dict[str, Any]]
    label: str | None = None
    metadata: dict[str, Any] | None = None
    rollout_id: str | None = None
    chat_completions_url: str
    llm_api_key: str | None = None
    agent_timeout_sec: float | None = None
    grader_timeout_sec: float | None = None
    extra_fields: dict[str, Any] | None = None
    # Polling generation only.
    grade: bool = True
    # Callback generation only.
    controller_api_key: str | None = None
    completion_callback_url: str | None = None
    grader_callback_url: str | None = None

    @field_validator("rollout_id")
    @classmethod
    def _check_id(cls, value: str | None) -> str | None:
        return None if value is None else validate_rollout_id(value)

    @field_validator("llm_api_key")
    @classmethod
    def _check_key(cls, value: str | None) -> str | None:
        if value is not None and value == "":
            raise ValueError("llm_api_key must be a non-empty string or omitted")
        return value

    @field_validator("agent_timeout_sec", "grader_timeout_sec")
    @classmethod
    def _check_timeout(cls, value: float | None, info: Any) -> float | None:
        return _finite_or_none(value, info.field_name)

    @field_validator("chat_completions_url")
    @classmethod
    def _check_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"chat_completions_url must be an http(s) URL, got {value!r}")
        return value

    @model_validator(mode="after")
    def _check_generation(self) -> RolloutInitRequest:
        if self.completion_callback_url is None and self.rollout_id is None:
            raise ValueError(
                "rollout_id is required (polling protocol); to use the callback protocol, "
                "pass completion_callback_url instead"
            )
        return self

    @property
    def generation(self) -> Generation:
        return "callback" if self.completion_callback_url is not None else "polling"


class RolloutInitResponse(_Wire):
    """202 body of a polling-generation ``POST /rollout``."""

    rollout_id: str
    status: RolloutStatus = RolloutStatus.QUEUED
    polling_lease_token: str = Field(min_length=1)
    result_wait_timeout_sec: float = Field(gt=0, allow_inf_nan=False)
    polling_lease_timeout_sec: float = Field(gt=0, allow_inf_nan=False)

    @model_validator(mode="after")
    def _lease_outlives_wait(self) -> RolloutInitResponse:
        if self.polling_lease_timeout_sec <= self.result_wait_timeout_sec:
            raise ValueError(
                "polling_lease_timeout_sec must be greater than result_wait_timeout_sec"
            )
        return self


class _SampleCarrier(_Wire):
    sample: RolloutSample | None = None

    @field_serializer("sample")
    def _wire_sample(self, sample: RolloutSample | None) -> dict[str, Any] | None:
        return None if sample is None else sample.wire_dict()


class RolloutResultResponse(_SampleCarrier):
    """Body of ``GET /rollout/{id}/result``: the current or terminal state of a rollout."""

    rollout_id: str
    status: RolloutStatus
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None


class RolloutCompleteRequest(_Wire):
    """Completion callback body (callback generation): the workflow phase ended."""

    status: RolloutStatus
    rollout_id: str | None = None
    extra_fields: dict[str, Any] | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None


class GraderCompleteRequest(_SampleCarrier):
    """Grader callback body (callback generation): the graded sample, reward included."""

    status: GraderStatus
    rollout_id: str | None = None
    err_message: str | None = None
    err_category: RolloutErrorCategory | None = None


class GraderInitRequest(_SampleCarrier):
    """Request of a remote-grader endpoint (defined by the protocol, not served)."""

    rollout_id: str | None = None
    completion_callback_url: str
    extra_fields: dict[str, Any] | None = None
    controller_api_key: str | None = None


class GraderInitResponse(_Wire):
    """Empty answer of a remote-grader endpoint."""


class RolloutStatusResponse(_Wire):
    """Body of ``GET /rollout/{id}/status``."""

    rollout_id: str
    status: RolloutStatus
    reward: float | None = None
    err_message: str | None = None


CancelDisposition = Literal["cancelled_queued", "cancelled_running", "not_found"]


class CancelRolloutsRequest(_Wire):
    """Body of ``POST /rollout/cancel``: exactly one of ``ids``, ``prefix`` or ``all``."""

    ids: list[str] | None = None
    prefix: str | None = None
    all: bool = False

    @model_validator(mode="after")
    def _one_selector(self) -> CancelRolloutsRequest:
        chosen = [self.ids is not None, self.prefix is not None, self.all]
        if sum(chosen) != 1:
            raise ValueError("pass exactly one selector: ids, prefix, or all")
        return self


class CancelRolloutsResponse(_Wire):
    """Per-id outcome of a cancel request."""

    dispositions: dict[str, CancelDisposition] = Field(default_factory=dict)


class RolloutLifecycle(_Wire):
    """Admission state reported by ``GET /health``."""

    accepting_rollouts: bool
    active_rollouts: int = Field(ge=0)
