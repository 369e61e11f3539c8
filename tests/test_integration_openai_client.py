"""The framework-free rollout client over HTTP: a plain AsyncOpenAI tool loop as the workflow."""

from __future__ import annotations

import importlib
import json
import re
import sys
from typing import Any

import pytest

pytest.importorskip("openai", reason="openai not installed (extra openai-agents or strands)")

from openai import AsyncOpenAI

from osmosis_ai.errors import MissingExtraError, UsageError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    AgentWorkflowContext,
    Grader,
    GraderContext,
    LocalBackend,
    RolloutContext,
    RolloutStatus,
    SampleSource,
)
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.http import aclose_shared_transport, shared_transport
from osmosis_ai.rollout.integrations import RolloutBindingError, openai_client
from osmosis_ai.rollout.integrations.openai_client import (
    ChatTranscriptSource,
    rollout_http_client,
    rollout_openai_client,
)
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.testing.model_server import ScriptedModelServer, ScriptedTurn, ToolCall
from rollouts import rollout_server

LLM_KEY = "llm-key"
PROMPT = [
    {"role": "system", "content": "Multiply with the tool, then answer '#### <n>'."},
    {"role": "user", "content": "val1 = 6\nval2 = 7"},
]
SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7}, id="call_1")]),
    ScriptedTurn(content="The product is 42.\n#### 42", usage={"prompt_tokens": 3}),
]
TOOLS: list[Any] = [
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


class ToolLoopWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """What a LangGraph tool node loop boils down to: call, run tools, call again."""

    async def run(self, ctx: AgentWorkflowContext[AgentWorkflowConfig]) -> None:
        stream = bool((ctx.metadata or {}).get("stream"))
        async with rollout_openai_client(max_retries=0) as client:
            await self.loop(client, list(ctx.prompt), stream)
        # returning None: the sample comes from the client's transcript

    async def loop(self, client: AsyncOpenAI, messages: list[Any], stream: bool) -> None:
        for _ in range(8):
            if stream:
                async with client.chat.completions.stream(
                    model="osmosis-rollout", messages=messages, tools=TOOLS
                ) as events:
                    message = (await events.get_final_completion()).choices[0].message
            else:
                completion = await client.chat.completions.create(
                    model="osmosis-rollout", messages=messages, tools=TOOLS, temperature=0.5
                )
                message = completion.choices[0].message
            messages.append(message.model_dump(exclude_none=True))
            if not message.tool_calls:
                break
            for call in message.tool_calls:
                args = json.loads(call.function.arguments)  # type: ignore[union-attr]
                result = float(args["a"]) * float(args["b"])
                messages.append({"role": "tool", "tool_call_id": call.id, "content": str(result)})


class MultiplyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        match = ANSWER.search(str(ctx.sample.messages[-1].get("content") or ""))
        ok = match is not None and abs(float(match.group(1)) - float(ctx.label or "nan")) < 1e-2
        ctx.set_reward(1.0 if ok else 0.0)


async def run_loop(artifact_root, rollout_id: str, *, stream: bool):
    backend = LocalBackend(workflow=ToolLoopWorkflow, grader=MultiplyGrader)
    model = ScriptedModelServer(SCRIPT, api_key=LLM_KEY, record_requests=True)
    async with model, rollout_server(backend) as url, RolloutClient(url) as client:
        result = await client.run_rollout_async(
            PROMPT,
            f"{model.url}/v1/rollouts/{rollout_id}",
            rollout_id=rollout_id,
            llm_api_key=LLM_KEY,
            label="42",
            metadata={"stream": stream},
            agent_timeout_sec=30,
            grader_timeout_sec=30,
        )
    trajectory = json.loads((artifact_root / rollout_id / "trajectory.json").read_text())
    return result, model.requests, trajectory


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
async def test_tool_loop_rollout_records_the_conversation(artifact_root, stream):
    rollout_id = f"oc-{stream}"
    result, requests, trajectory = await run_loop(artifact_root, rollout_id, stream=stream)

    assert result.status == RolloutStatus.SUCCESS, result.err_message
    assert result.sample is not None and result.sample.reward == 1.0
    assert len(requests) == 2
    for request in requests:
        assert request.path == f"/v1/rollouts/{rollout_id}/chat/completions"
        assert request.headers["authorization"] == f"Bearer {LLM_KEY}"
        assert request.body["model"] == "osmosis-rollout"
        assert bool(request.body.get("stream")) is stream
        assert request.body["tools"] == TOOLS
    messages = [dict(m) for m in result.sample.messages]
    assert messages[:2] == PROMPT
    assert messages[2]["role"] == "assistant"
    # the workflow's own copy of the reply: openai's stream helper adds "index" to tool calls
    calls = [{k: v for k, v in c.items() if k != "index"} for c in messages[2]["tool_calls"]]
    assert calls == [
        {
            "id": "call_1",
            "type": "function",
            "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'},
        }
    ]
    assert messages[3] == {"role": "tool", "tool_call_id": "call_1", "content": "42.0"}
    assert messages[4] == {"role": "assistant", "content": "The product is 42.\n#### 42"}
    assert len(messages) == 5

    steps = trajectory["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
    assert steps[2]["tool_calls"][0]["arguments"] == {"a": 6, "b": 7}
    assert steps[2]["observation"]["results"] == [{"source_call_id": "call_1", "content": "42.0"}]
    assert steps[3]["message"].endswith("#### 42")


async def test_clients_of_one_rollout_share_one_transcript():
    async with ScriptedModelServer(["first", "second"], api_key=LLM_KEY) as model:
        rollout = RolloutContext(
            chat_completions_url=f"{model.url}/v1/rollouts/r", api_key=LLM_KEY, rollout_id="r"
        )
        with rollout:
            plain = rollout_openai_client()
            copied = plain.with_options(timeout=5)
            # what a framework that builds its own client from URL, key and httpx client does
            own = AsyncOpenAI(
                base_url=rollout.chat_completions_url,
                api_key=LLM_KEY,
                http_client=rollout_http_client(),  # type: ignore[arg-type]
            )
            await copied.chat.completions.create(
                model="m", messages=[{"role": "user", "content": "a"}]
            )
            history: Any = [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "first"},
                {"role": "user", "content": "b"},
            ]
            await own.chat.completions.create(model="m", messages=history)
            await plain.close()
            await own.close()
            sample = await rollout.get_sample()
            source = rollout.sample_source
    assert isinstance(source, ChatTranscriptSource) and len(source.calls) == 2
    assert sample is not None
    assert [m["content"] for m in sample.messages] == ["a", "first", "b", "second"]
    assert sample.trajectory_messages == sample.messages
    preview = await source.get_preview(1)
    assert preview is not None and [m["content"] for m in preview.messages] == ["second"]


async def test_rollouts_share_the_loops_pool_and_closing_a_client_keeps_it():
    async with ScriptedModelServer(["hello"], api_key=LLM_KEY) as model:
        replies: list[str | None] = []
        pools: list[object] = []
        for rollout_id in ("r1", "r2"):
            rollout = RolloutContext(
                chat_completions_url=f"{model.url}/v1/rollouts/{rollout_id}",
                api_key=LLM_KEY,
                rollout_id=rollout_id,
            )
            with rollout:
                async with rollout_openai_client(max_retries=0) as client:
                    reply = await client.chat.completions.create(
                        model="m", messages=[{"role": "user", "content": rollout_id}]
                    )
                replies.append(reply.choices[0].message.content)
                pools.append(shared_transport())  # after the rollout's client was closed
        assert replies == ["hello", "hello"]
        assert pools[0] is pools[1]
        await aclose_shared_transport()
        assert shared_transport() is not pools[0]
        await aclose_shared_transport()


async def test_failed_calls_are_not_recorded():
    script = [ScriptedTurn(status_code=500, error="boom")]
    async with ScriptedModelServer(script, api_key=LLM_KEY) as model:
        rollout = RolloutContext(
            chat_completions_url=f"{model.url}/v1/rollouts/r", api_key=LLM_KEY, rollout_id="r"
        )
        with rollout:
            client = rollout_openai_client(max_retries=0)
            with pytest.raises(Exception, match="boom"):
                await client.chat.completions.create(
                    model="m", messages=[{"role": "user", "content": "a"}]
                )
            await client.close()
            assert await rollout.get_sample() is None


def test_exported_names():
    assert sorted(openai_client.__all__) == [
        "ChatTranscriptSource",
        "RecordedCall",
        "bound_http_client",
        "rollout_http_client",
        "rollout_openai_client",
    ]


# -- wrong use ----------------------------------------------------------------------------------


def test_outside_a_rollout_says_what_to_do():
    with pytest.raises(RolloutBindingError, match=r"AgentWorkflow\.run"):
        rollout_openai_client()


def test_refuses_endpoint_options():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="r"):
        with pytest.raises(UsageError, match="base_url"):
            rollout_openai_client(base_url="http://elsewhere/v1")
        with pytest.raises(UsageError, match="http_client"):
            rollout_openai_client(http_client=None)


class OtherSource(SampleSource):
    async def get_sample(self) -> RolloutSample | None:
        return None


def test_another_sample_source_in_the_rollout_fails():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="r-two") as ctx:
        ctx.set_sample_source(OtherSource())
        with pytest.raises(ValueError, match="already has a sample source"):
            rollout_openai_client()


async def test_client_reused_in_another_rollout_names_both_ids():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="one"):
        client = rollout_openai_client(max_retries=0)
    with (
        RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="two"),
        pytest.raises(RolloutBindingError, match=r"'one'.*'two'"),
    ):
        await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "a"}])


def test_missing_openai_names_an_extra(monkeypatch):
    name = "osmosis_ai.rollout.integrations.openai_client"
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "openai", None)
    with pytest.raises(MissingExtraError, match="openai"):
        importlib.import_module(name)
