"""What a workflow may return, and the rules that turn it into one output."""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class AgentWorkflowOutput(BaseModel):
    """The result of :meth:`AgentWorkflow.run`: one message history plus finite metrics.

    ``info`` is reserved and never reaches the grader.
    """

    model_config = ConfigDict(
        extra="forbid",
        allow_inf_nan=False,
        revalidate_instances="always",
        validate_assignment=True,
        defer_build=True,
    )

    messages: list[dict[str, Any]] | None = None
    metrics: dict[str, float] = Field(default_factory=dict)
    info: dict[str, Any] = Field(default_factory=dict)


def coerce_output(value: object) -> AgentWorkflowOutput | None:
    """Apply the return contract of :meth:`AgentWorkflow.run`.

    ``None`` stays ``None`` (the backend falls back to the registered sample source); a list
    becomes ``AgentWorkflowOutput(messages=list)``; an ``AgentWorkflowOutput`` is validated
    again (catching mutation after construction); anything else is a ``TypeError``.
    """
    if value is None:
        return None
    if isinstance(value, AgentWorkflowOutput):
        return AgentWorkflowOutput.model_validate(value)
    if isinstance(value, list):
        return AgentWorkflowOutput(messages=value)
    raise TypeError(
        "AgentWorkflow.run must return an AgentWorkflowOutput, a list of messages or None, "
        f"got {type(value).__name__}"
    )
