"""``AgentWorkflow``: the user's agent, run once per rollout."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any, Generic

from osmosis_ai.rollout.context import AgentWorkflowContext, TConfig
from osmosis_ai.rollout.output import AgentWorkflowOutput


class AgentWorkflow(ABC, Generic[TConfig]):
    """An agent run once per rollout against the rollout-scoped model endpoint.

    ``run`` returns an :class:`AgentWorkflowOutput`, a list of messages (wrapped as one), or
    ``None`` to let the registered :class:`SampleSource` provide the sample.
    """

    def __init__(self, config: TConfig | None = None) -> None:
        self.config = config

    @abstractmethod
    async def run(
        self, ctx: AgentWorkflowContext[TConfig]
    ) -> AgentWorkflowOutput | list[dict[str, Any]] | None:
        """Run the agent for one rollout."""
