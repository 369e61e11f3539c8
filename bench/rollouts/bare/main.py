"""A bare rollout: two plain HTTP chat-completions calls and one multiply tool call.

The bench's workload. No agent framework: one shared client from
``osmosis_ai.rollout.http.async_client`` (made on first use, inside the server's loop)
talks to the rollout-scoped chat endpoint, runs the tool the model asks for, asks again
and returns the messages; the grader wants ``#### <label>``.
Run as ``python bench/rollouts/bare/main.py``: serves on 127.0.0.1:$_OSMOSIS_ROLLOUT_PORT.
"""

from __future__ import annotations

import itertools
import json
import os
import time
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
from osmosis_ai.rollout.http import async_client

MAX_TURNS = 4
# One shared client by default. BENCH_MODEL_CLIENTS=N spreads model calls round-robin over
# N clients: a diagnostic for plain httpx, whose pool costs O(connections²) per request.
MODEL_CLIENTS = max(1, int(os.environ.get("BENCH_MODEL_CLIENTS", "1")))
# BENCH_WORKFLOW_CPU_MS=N: each rollout also computes for N ms of CPU time in the workflow
# itself (holding the GIL, as parsing or a local tool would): a CPU-bound agent, which one
# server process runs on one core at most.
WORKFLOW_CPU_S = float(os.environ.get("BENCH_WORKFLOW_CPU_MS", "0")) / 1000
_clients: list[httpx.AsyncClient] = []
_turn = itertools.count()


def client() -> httpx.AsyncClient:
    """The process's HTTP client for model calls, made on first use."""
    if not _clients:
        _clients.extend(async_client(timeout=60.0) for _ in range(MODEL_CLIENTS))
    return _clients[next(_turn) % MODEL_CLIENTS]


def multiply(a: float, b: float) -> float:
    return a * b


def compute(seconds: float) -> int:
    """Busy CPU work for ``seconds`` of this thread's CPU time."""
    end, total = time.thread_time() + seconds, 0
    while time.thread_time() < end:
        total += sum(range(200))
    return total


class BareWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """Model call, the multiply tool call it asks for, model call again."""

    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> AgentWorkflowOutput:
        rollout = get_rollout_context()
        if rollout is None:
            raise RuntimeError("BareWorkflow runs inside a rollout server (no rollout context)")
        url = rollout.chat_completions_url + "/chat/completions"
        headers = {"Authorization": f"Bearer {rollout.api_key}"} if rollout.api_key else {}
        messages: list[dict[str, Any]] = list(ctx.prompt)
        if WORKFLOW_CPU_S:
            compute(WORKFLOW_CPU_S)
        for _ in range(MAX_TURNS):
            response = await client().post(
                url, json={"model": "osmosis-rollout", "messages": messages}, headers=headers
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
                        "content": str(multiply(args["a"], args["b"])),
                    }
                )
        return AgentWorkflowOutput(messages=messages)


class ExactMatchGrader(Grader):
    """1.0 when the last message's answer after ``####`` equals the label, else 0.0."""

    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        text = str(ctx.sample.messages[-1].get("content") or "")
        _, marker, answer = text.rpartition("####")
        ctx.set_reward(1.0 if marker and answer.strip() == (ctx.label or "").strip() else 0.0)


def main() -> None:
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    if MODEL_CLIENTS > 1:
        client()  # the diagnostic's clients up front, so their set-up is not measured
    backend = LocalBackend(workflow=BareWorkflow, grader=ExactMatchGrader, max_concurrent=512)
    app = create_rollout_server(backend=backend, configure_logging=False)
    run_rollout_server(app, log_level="warning", access_log=False)


if __name__ == "__main__":
    main()
