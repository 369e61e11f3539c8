"""{{rollout}}: a new rollout. Write ``MyAgentWorkflow.run`` and ``MyGrader.grade``.

``osmosis eval run configs/eval/{{rollout}}.toml`` starts this file and sends it the rows of
the dataset; ``python rollouts/{{rollout}}/main.py`` serves it by hand on
``$_OSMOSIS_ROLLOUT_PORT`` (default 8000).
"""

from __future__ import annotations

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
)
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


class MyAgentWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        """Run the agent on one row and return its conversation.

        ``ctx.prompt`` holds the row's messages (``system_prompt``, then ``user_prompt``).
        Send every model call to this rollout's endpoint: ``get_rollout_context()`` (from
        ``osmosis_ai.rollout``) gives ``chat_completions_url`` and ``api_key`` for any
        OpenAI-compatible client, or use an integration (``OsmosisAgent``,
        ``OsmosisStrandsAgent``). Return ``AgentWorkflowOutput(messages=[...])``.
        """
        raise NotImplementedError(
            "MyAgentWorkflow.run is not written yet: edit rollouts/{{rollout}}/main.py to call "
            "the model at get_rollout_context().chat_completions_url and return "
            "AgentWorkflowOutput(messages=[...])"
        )


class MyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        """Score the conversation: ``ctx.sample.messages`` is what ``run`` returned and
        ``ctx.label`` the row's ``ground_truth``. Set a finite reward, e.g. 1.0 or 0.0."""
        ctx.set_reward(0.0)


def main() -> None:
    backend = LocalBackend(workflow=MyAgentWorkflow, grader=MyGrader)
    # Serves on $_OSMOSIS_ROLLOUT_PORT (default 8000), loopback only by default.
    run_rollout_server(create_rollout_server(backend=backend))


if __name__ == "__main__":
    main()
