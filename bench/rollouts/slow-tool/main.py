"""A latency-bound agent on the copy-digit task: the model answers, a slow tool runs.

After each model answer the workflow runs a tool that waits ``BENCH_TOOL_MS`` (default 250)
in ``asyncio.sleep``, as a remote API or a sandbox would; with ``BENCH_TURNS`` (default 2)
above 1 the tool's result (the task again, ``Copy: <digit>``) goes back as a user turn for
another model call. The conversation only grows, so the trainer keeps every model token of
the rollout in one row. The grader wants the final answer to equal the label, as the
copy-digit template's does, so the tiny model warmed up on that template can learn it.
``bench/train_async.py`` copies this file into its workspace and sets both variables in the
training config's ``[env]``.
"""

from __future__ import annotations

import asyncio
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
TOOL_S = float(os.environ.get("BENCH_TOOL_MS", "250")) / 1000
TURNS = int(os.environ.get("BENCH_TURNS", "2"))


async def restate(task: str) -> str:
    """The slow tool: after ``TOOL_S`` seconds, the task again."""
    await asyncio.sleep(TOOL_S)
    return task


class SlowToolWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """``TURNS`` model calls, each followed by the slow tool."""

    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        if rollout is None:
            raise RuntimeError("SlowToolWorkflow runs inside a rollout server")
        url = f"{rollout.chat_completions_url}/chat/completions"
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        messages: list[dict[str, Any]] = list(ctx.prompt)
        task = str(messages[-1].get("content") or "")
        for turn in range(TURNS):
            completion = await post_json(
                url,
                {"model": "osmosis-rollout", "messages": messages, "max_tokens": MAX_TOKENS},
                headers=headers,
            )
            answer = completion["choices"][0]["message"].get("content") or ""
            messages.append({"role": "assistant", "content": answer})
            result = await restate(task)
            if turn < TURNS - 1:
                messages.append({"role": "user", "content": result})
        return AgentWorkflowOutput(messages=messages)


class FinalAnswerGrader(Grader):
    """1.0 when the last (assistant) message, stripped, equals the label; else 0.0."""

    async def grade(self, ctx: GraderContext) -> None:
        if ctx.sample is None:
            raise ValueError("nothing to grade: the rollout produced no sample")
        answer = str(ctx.sample.messages[-1].get("content") or "").strip()
        ctx.set_reward(1.0 if answer == (ctx.label or "").strip() else 0.0)


def main() -> None:
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    if TURNS < 1:
        raise SystemExit(f"BENCH_TURNS={TURNS}: a rollout needs at least 1 turn")
    backend = LocalBackend(workflow=SlowToolWorkflow, grader=FinalAnswerGrader, max_concurrent=256)
    save = os.environ.get("OSMOSIS_SAVE_TRAJECTORIES", "1") != "0"
    app = create_rollout_server(backend=backend, configure_logging=False, save_trajectories=save)
    run_rollout_server(app, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
