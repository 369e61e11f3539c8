"""Workflows, graders and server fixtures shared by the HTTP tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx

from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowOutput,
    Grader,
    get_rollout_context,
)
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing.model_server import ScriptedTurn, ToolCall
from osmosis_ai.testing.serving import serve_in_task

TOOL_SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})]),
    ScriptedTurn(content="#### 42"),
]


async def chat(
    client: httpx.AsyncClient, messages: list[dict[str, Any]], **extra: Any
) -> dict[str, Any]:
    """One chat-completions call to the active rollout's endpoint."""
    ctx = get_rollout_context()
    assert ctx is not None, "no active rollout"
    headers = {"Authorization": f"Bearer {ctx.api_key}"} if ctx.api_key else {}
    response = await client.post(
        f"{ctx.chat_completions_url}/chat/completions",
        json={"model": "osmosis-rollout", "messages": messages, **extra},
        headers=headers,
    )
    response.raise_for_status()
    return response.json()["choices"][0]["message"]


class ToolWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """Calls the model, runs the multiply tool it asks for, calls the model again."""

    async def run(self, ctx):
        messages = list(ctx.prompt)
        async with httpx.AsyncClient() as client:
            for _ in range(4):
                message = await chat(client, messages)
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
                            "content": str(args["a"] * args["b"]),
                        }
                    )
        if ctx.artifacts_dir:
            (ctx.artifacts_dir / "notes.txt").write_text("multiplied")
        return AgentWorkflowOutput(messages=messages, metrics={"turns": float(len(messages))})


class AnswerGrader(Grader):
    """Reward 1.0 when the last message ends with ``#### <label>``."""

    async def grade(self, ctx):
        assert ctx.sample is not None
        text = str(ctx.sample.messages[-1].get("content") or "")
        ctx.set_reward(1.0 if text.strip().endswith(f"#### {ctx.label}") else 0.0)


class ScriptedBehaviour(AgentWorkflow[AgentWorkflowConfig]):
    """Does what the row's metadata says: sleep, raise, or answer."""

    async def run(self, ctx):
        meta = ctx.metadata or {}
        if "sleep" in meta:
            await asyncio.sleep(meta["sleep"])
        if "raise" in meta:
            raise ValueError(meta["raise"])
        return [*ctx.prompt, {"role": "assistant", "content": meta.get("answer", "#### 42")}]


class MetadataGrader(Grader):
    async def grade(self, ctx):
        meta = ctx.metadata or {}
        if meta.get("remove"):
            ctx.sample.remove_sample = True
        if meta.get("grader_sleep"):
            await asyncio.sleep(meta["grader_sleep"])
        ctx.set_reward(float(meta.get("reward", 1.0)))


@contextlib.asynccontextmanager
async def rollout_server(backend: Any, **options: Any) -> AsyncIterator[str]:
    options.setdefault("configure_logging", False)
    app = create_rollout_server(backend=backend, **options)
    async with serve_in_task(app) as url:
        yield url


def init_body(rollout_id: str | None, chat_url: str, **fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "initial_messages": [{"role": "user", "content": "What is 6 * 7?"}],
        "label": "42",
        "chat_completions_url": chat_url,
        "llm_api_key": "llm-key",
    }
    if rollout_id is not None:
        body["rollout_id"] = rollout_id
    body.update(fields)
    return body


async def poll_until_done(
    client: httpx.AsyncClient, rollout_id: str, lease: str, limit: float = 20.0
) -> dict[str, Any]:
    seen: list[str] = []
    async with asyncio.timeout(limit):
        while True:
            response = await client.get(
                f"/rollout/{rollout_id}/result", headers={"X-Osmosis-Rollout-Lease": lease}
            )
            assert response.status_code == 200, response.text
            body = response.json()
            seen.append(body["status"])
            if body["status"] in ("success", "failure", "cancelled"):
                body["_seen"] = seen
                return body
