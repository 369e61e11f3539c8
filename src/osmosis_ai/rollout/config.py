"""Configuration models handed to workflows and graders."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class ConcurrencyConfig(BaseModel):
    """How many rollouts may run at once. ``None`` means unlimited."""

    model_config = ConfigDict(validate_assignment=True, defer_build=True)

    max_concurrent: int | None = Field(default=None, ge=1)


class BaseConfig(BaseModel):
    """Base for user configs: a name, an optional description, and any extra fields.

    Extra fields are allowed and assignments are validated, so a config can carry model
    placeholders, tool lists or any other object the workflow needs.
    """

    model_config = ConfigDict(
        extra="allow", validate_assignment=True, arbitrary_types_allowed=True, defer_build=True
    )

    name: str
    description: str | None = None


class AgentWorkflowConfig(BaseConfig):
    """Config of an :class:`~osmosis_ai.rollout.AgentWorkflow`."""

    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)


class GraderConfig(BaseConfig):
    """Config of a :class:`~osmosis_ai.rollout.Grader`."""

    concurrency: ConcurrencyConfig = Field(default_factory=ConcurrencyConfig)
