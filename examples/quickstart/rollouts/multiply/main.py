"""A rollout written against the documented osmosis API: multiply two numbers with a tool.

The workflow talks to whatever model serves the rollout-scoped endpoint (plain HTTP, no
agent framework): it offers a ``multiply`` tool, runs the calls the model makes, and stops
when the model answers. The grader accepts ``#### <n>`` within 1e-2 of the label.

Run it the way a controller does: ``python rollouts/multiply/main.py`` serves on
``$_OSMOSIS_ROLLOUT_PORT`` (default 8000).
"""

from __future__ import annotations

import json
import re
from typing import Any

import httpx

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
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "description": "Multiply two numbers.",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
                "required": ["a", "b"],
            },
        },
    }
]
ANSWER = re.compile(r"####\s*(-?[0-9.,]+)")


def multiply(a: float, b: float) -> float:
    return a * b


class MultiplyWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        assert rollout is not None, "run inside a rollout"
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        messages: list[dict[str, Any]] = list(ctx.prompt)
        async with httpx.AsyncClient(timeout=60) as client:
            for _turn in range(8):
                response = await client.post(
                    f"{rollout.chat_completions_url}/chat/completions",
                    json={"model": "osmosis-rollout", "messages": messages, "tools": TOOLS},
                    headers=headers,
                )
                response.raise_for_status()
                message = response.json()["choices"][0]["message"]
                messages.append(message)
                calls = message.get("tool_calls") or []
                if not calls:
                    break
                for call in calls:
                    args = json.loads(call["function"]["arguments"])
                    messages.append(
                        {
                            "role": "tool",
                            "tool_call_id": call["id"],
                            "content": str(multiply(float(args["a"]), float(args["b"]))),
                        }
                    )
        return AgentWorkflowOutput(messages=messages, metrics={"messages": float(len(messages))})


class MultiplyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        assert ctx.label is not None
        text = str(ctx.sample.messages[-1].get("content") or "")
        match = ANSWER.search(text)
        if match is None:
            ctx.set_reward(0.0)
            return
        answer = float(match.group(1).replace(",", ""))
        ctx.set_reward(1.0 if abs(answer - float(ctx.label)) <= 1e-2 else 0.0)


backend = LocalBackend(workflow=MultiplyWorkflow, grader=MultiplyGrader)
app = create_rollout_server(backend=backend)

if __name__ == "__main__":
    run_rollout_server(app, log_level="warning")
