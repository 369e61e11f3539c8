"""multiply-harbor-strands: a Strands agent multiplies two numbers with a tool.

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

from strands import tool
from strands.models.model import Model
from strands.types.exceptions import MaxTokensReachedException

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
)
from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    OsmosisStrandsAgent,
)
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

MAX_INVOCATIONS = 8
TOLERANCE = 1e-2
ANSWER = re.compile(r"####\s*([-+]?[\d,]*\.?\d+)")
TASK_DIR = Path(__file__).resolve().parent / "multiply_harbor_task"


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers and return the product."""
    return a * b


class MultiplyConfig(AgentWorkflowConfig):
    """What the workflow builds its agent from; deep-copied for every rollout."""

    name: str = "multiply-harbor-strands"
    model: Model
    tools: list[Any]


WORKFLOW_CONFIG = MultiplyConfig(
    # A placeholder: OsmosisStrandsAgent binds it to the endpoint of the rollout being run.
    model=OsmosisRolloutModel(params={"temperature": 1.0, "top_p": 1.0, "max_tokens": 16384}),
    tools=[multiply],
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
    """The text of a Strands message (its ``{"text": ...}`` blocks) or a chat message."""
    content = message.get("content")
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        blocks = cast(list[Any], content)
        return "\n".join(
            str(block["text"]) for block in blocks if isinstance(block, dict) and "text" in block
        )
    return ""


def finished(message: Mapping[str, Any]) -> bool:
    """The agent stopped calling tools, or it already gave an answer."""
    blocks = cast(list[Any], message.get("content") or [])
    calls_tools = any(isinstance(block, dict) and "toolUse" in block for block in blocks)
    return not calls_tools or final_answer(message_text(message)) is not None


class MultiplyWorkflow(AgentWorkflow[MultiplyConfig]):
    async def run(self, ctx: AgentWorkflowContext[MultiplyConfig]) -> None:
        config = ctx.config
        if config is None:
            raise ValueError("MultiplyWorkflow needs its workflow config (WORKFLOW_CONFIG)")
        # Strands keeps the system prompt apart from the conversation.
        system = [message_text(m) for m in ctx.prompt if m.get("role") == "system"]
        conversation = [m for m in ctx.prompt if m.get("role") != "system"]
        # The agent is the rollout's sample source: returning None hands its messages to
        # the grader.
        agent = OsmosisStrandsAgent(
            name="multiply",
            model=config.model,
            tools=config.tools,
            system_prompt="\n\n".join(system) or None,
            messages=conversation,
            callback_handler=None,
        )
        for _ in range(MAX_INVOCATIONS):
            try:
                result = await agent.invoke_async()
            except MaxTokensReachedException:
                # A reply cut at the token limit stays in the conversation: the grader
                # scores it (no answer: 0.0) instead of the rollout failing, so training
                # keeps the sample and learns to answer within the limit.
                break
            if finished(cast(Mapping[str, Any], result.message)):
                break


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
