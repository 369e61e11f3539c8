"""multiply-harbor-openai: an OpenAI Agents SDK agent multiplies two numbers with a tool.

The agent gets the row's prompt ("val1 = …\\nval2 = …"), calls the ``multiply`` tool and
answers ``#### <product>``; the grader gives 1.0 when that answer is within 1e-2 of the
row's ``ground_truth``.

Each rollout is a Harbor trial of the task in ``multiply_harbor_task/`` (template mode: the
row's prompt becomes its instruction). HarborBackend copies this folder into the task
environment, runs the workflow there, and runs the grader as the task's verifier (the task
has no tests of its own). Model calls go to the rollout's own endpoint, forwarded into the
no-network sandbox, so one file serves ``osmosis eval run`` and ``osmosis train run``;
``python rollouts/<name>/main.py`` starts it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, cast

from agents import ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.interface import Model

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
)
from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisMemorySession,
    OsmosisRolloutModel,
)
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

# The Agents SDK would upload traces to OpenAI; the controller records every call instead.
# Off at import: the workflow runs in the task environment, where main() does not run.
set_tracing_disabled(True)

MAX_TURNS = 8
TOLERANCE = 1e-2
ANSWER = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")
TASK_DIR = Path(__file__).resolve().parent / "multiply_harbor_task"


@function_tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers and return the product."""
    return a * b


class MultiplyConfig(AgentWorkflowConfig):
    """What the workflow builds its agent from; deep-copied for every rollout."""

    name: str = "multiply-harbor-openai"
    model: Model
    model_settings: ModelSettings
    tools: list[Any]


WORKFLOW_CONFIG = MultiplyConfig(
    # A placeholder: OsmosisAgent binds it to the endpoint of the rollout being run.
    model=OsmosisRolloutModel(),
    model_settings=ModelSettings(temperature=1.0, top_p=1.0, max_tokens=4096),
    tools=[multiply],
)


class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
    async def run(self, ctx: AgentWorkflowContext[MultiplyConfig]) -> None:
        config = ctx.config
        if config is None:
            raise ValueError("MultiplyWorkflow needs its workflow config (WORKFLOW_CONFIG)")
        agent = OsmosisAgent(
            name="multiply",
            model=config.model,
            model_settings=config.model_settings,
            tools=config.tools,
        )
        # The session records the conversation and is the rollout's sample: returning None
        # hands it to the grader.
        await Runner.run(
            agent, cast(Any, ctx.prompt), session=OsmosisMemorySession(), max_turns=MAX_TURNS
        )


def final_answer(text: str) -> float | None:
    """The number of the last ``#### <n>`` in ``text``, if any."""
    found = ANSWER.findall(text)
    if not found:
        return None
    try:
        return float(found[-1].replace(",", ""))
    except ValueError:
        return None


def message_text(message: Mapping[str, Any]) -> str:
    """The text of a Responses-API message item (its ``output_text`` parts) or a chat one."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = cast(list[Any], content)
        return "\n".join(
            str(part.get("text", "")) for part in parts if isinstance(part, dict) and "text" in part
        )
    return ""


class MultiplyGrader(Grader):
    """1.0 when the agent's last message answers within ``TOLERANCE`` of the label."""

    async def grade(self, ctx: GraderContext) -> None:
        if ctx.sample is None or not ctx.sample.messages:
            raise ValueError("nothing to grade: the rollout recorded no conversation")
        answer = final_answer(message_text(ctx.sample.messages[-1]))
        try:
            expected = float(ctx.label or "")
        except ValueError:
            raise ValueError(f"the label {ctx.label!r} is not a number") from None
        correct = answer is not None and abs(answer - expected) < TOLERANCE
        ctx.set_reward(1.0 if correct else 0.0)


def main() -> None:
    from harbor.trial.queue import TrialQueue  # pyright: ignore[reportMissingImports]  # Python 3.12+

    backend = HarborBackend(
        # Trials running at once; keep its retries at 0 (a trial's end is final).
        orchestrator=TrialQueue(n_concurrent=8),
        tasks_dir=TASK_DIR,
        agent=MultiplyWorkflow,
        workflow_config=WORKFLOW_CONFIG,
        grader=MultiplyGrader,
    )
    # Serves on $_OSMOSIS_ROLLOUT_PORT (default 8000), loopback only by default.
    run_rollout_server(create_rollout_server(backend=backend))


if __name__ == "__main__":
    main()
