"""Copy the digit: the embedded default rollout, small enough to train on a CPU.

The workflow asks the model once, through the rollout-scoped chat endpoint the controller
hands it (plain HTTP, no agent framework), and returns the conversation; the grader gives
1.0 when the answer is exactly the label. The same file serves ``osmosis eval run`` and
``osmosis train run``: run it as ``python rollouts/copy-digit/main.py``.
"""

from __future__ import annotations

import os
from typing import Any

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    AgentWorkflowOutput,
    Grader,
    GraderContext,
    LocalBackend,
    get_rollout_context,
)
from osmosis_ai.rollout.http import post_json

MAX_TOKENS = 4  # a digit and the end-of-turn token, with room to spare


class CopyDigitWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """One model call: the prompt in, the assistant's answer out."""

    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        if rollout is None:
            raise RuntimeError("CopyDigitWorkflow runs inside a rollout server")
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        messages: list[dict[str, Any]] = list(ctx.prompt)
        # One JSON call on pooled connections (any HTTP client works here; this is the
        # cheapest, which matters when thousands of rollouts run per minute).
        completion = await post_json(
            f"{rollout.chat_completions_url}/chat/completions",
            {"model": "osmosis-rollout", "messages": messages, "max_tokens": MAX_TOKENS},
            headers=headers,
        )
        answer = completion["choices"][0]["message"].get("content") or ""
        return AgentWorkflowOutput(messages=[*messages, {"role": "assistant", "content": answer}])


class ExactMatchGrader(Grader):
    """1.0 when the last message, stripped, equals the label; else 0.0."""

    async def grade(self, ctx: GraderContext) -> None:
        if ctx.sample is None:
            raise ValueError("nothing to grade: the rollout produced no sample")
        answer = str(ctx.sample.messages[-1].get("content") or "").strip()
        ctx.set_reward(1.0 if answer == (ctx.label or "").strip() else 0.0)


def main() -> None:
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    backend = LocalBackend(workflow=CopyDigitWorkflow, grader=ExactMatchGrader, max_concurrent=256)
    # A training run sets OSMOSIS_SAVE_TRAJECTORIES=0: thousands of rollouts, no files each.
    save = os.environ.get("OSMOSIS_SAVE_TRAJECTORIES", "1") != "0"
    app = create_rollout_server(backend=backend, configure_logging=False, save_trajectories=save)
    run_rollout_server(app, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
