"""Strands integration over HTTP: rollout server, polling client, scripted model server."""

from __future__ import annotations

import importlib
import json
import re
import sys
from typing import Any

import pytest

pytest.importorskip("strands", reason="strands-agents not installed (extra strands)")

from strands import tool
from strands.agent.agent_result import AgentResult
from strands.models.model import Model
from strands.models.openai import OpenAIModel

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
)
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.integrations import RolloutBindingError
from osmosis_ai.rollout.integrations.agents import strands as strands_integration
from osmosis_ai.rollout.integrations.agents.strands import (
    OsmosisRolloutModel,
    StrandsAgentSampleSource,
    to_strands_messages,
)
from osmosis_ai.rollout.integrations.agents.strands import OsmosisStrandsAgent as StrandsAgent
from osmosis_ai.testing.model_server import ScriptedModelServer, ScriptedTurn, ToolCall
from rollouts import rollout_server

LLM_KEY = "llm-key"
PROMPT = [
    {"role": "system", "content": "Multiply with the tool, then answer '#### <n>'."},
    {"role": "user", "content": "val1 = 6\nval2 = 7"},
]
SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7}, id="call_1")]),
    ScriptedTurn(content="The product is 42.\n#### 42"),
]
ANSWER = re.compile(r"####\s*(-?[0-9.,]+)")


# -- the multiply-local-strands template, as a rollout author writes it --------------------------


@tool
def multiply(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


def extract_solution(text: str) -> str | None:
    match = ANSWER.search(text)
    return match.group(1).replace(",", "") if match else None


class MultiplyAgentWorkflowConfig(AgentWorkflowConfig):
    name: str = "MultiplyAgentWorkflow"
    model: Model
    tools: Any


class MultiplyWorkflow(AgentWorkflow[MultiplyAgentWorkflowConfig]):
    async def check_done(self, result: AgentResult) -> bool:
        content = result.message.get("content", [])
        if not any("toolUse" in block for block in content):
            return True
        text = next((block for block in content if block.get("text")), None)
        return text is not None and extract_solution(text.get("text", "")) is not None

    async def run(self, ctx: AgentWorkflowContext[MultiplyAgentWorkflowConfig]) -> None:
        config = ctx.config
        assert config is not None
        agent = StrandsAgent(
            name="multiply",
            model=config.model,
            tools=config.tools,
            messages=ctx.prompt,
            callback_handler=None,
        )
        for _ in range(8):
            result = await agent.invoke_async()
            if await self.check_done(result):
                break


class MultiplyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        content: Any = ctx.sample.messages[-1].get("content", "")
        if isinstance(content, list):
            content = next((block["text"] for block in content if "text" in block), "")
        solution = extract_solution(content)
        ok = solution is not None and abs(float(solution) - float(ctx.label or "nan")) < 1e-2
        ctx.set_reward(1.0 if ok else 0.0)


def make_config(**model_config: Any) -> MultiplyAgentWorkflowConfig:
    params = {"temperature": 1.0, "top_p": 1.0, "max_tokens": 16384}
    return MultiplyAgentWorkflowConfig(
        model=OsmosisRolloutModel(params=params, **model_config), tools=[multiply]
    )


# -- helpers ------------------------------------------------------------------------------------


async def run_multiply(artifact_root, rollout_id: str, **model_config: Any):
    backend = LocalBackend(
        workflow=MultiplyWorkflow,
        workflow_config=make_config(**model_config),
        grader=MultiplyGrader,
    )
    model = ScriptedModelServer(SCRIPT, api_key=LLM_KEY, record_requests=True)
    async with model, rollout_server(backend) as url, RolloutClient(url) as client:
        result = await client.run_rollout_async(
            PROMPT,
            f"{model.url}/v1/rollouts/{rollout_id}",
            rollout_id=rollout_id,
            llm_api_key=LLM_KEY,
            label="42",
            agent_timeout_sec=30,
            grader_timeout_sec=30,
        )
    trajectory = json.loads((artifact_root / rollout_id / "trajectory.json").read_text())
    return result, model.requests, trajectory


def assert_requests(requests, rollout_id: str, *, stream: bool) -> None:
    assert len(requests) == 2
    for request in requests:
        assert request.path == f"/v1/rollouts/{rollout_id}/chat/completions"
        assert request.headers["authorization"] == f"Bearer {LLM_KEY}"
        body = request.body
        assert body["model"] == "osmosis-rollout"
        assert body["stream"] is stream
        assert ("stream_options" in body) is stream
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (1.0, 1.0, 16384)
        assert [t["function"]["name"] for t in body["tools"]] == ["multiply"]
        assert body["messages"][0] == {
            "role": "system",
            "content": [{"text": PROMPT[0]["content"], "type": "text"}],
        }
    second = requests[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "user", "assistant", "tool"]
    assert second[2]["tool_calls"][0]["id"] == "call_1"
    assert second[3]["tool_call_id"] == "call_1"


def assert_sample(result, trajectory) -> None:
    assert result.status == RolloutStatus.SUCCESS, result.err_message
    sample = result.sample
    assert sample is not None and sample.reward == 1.0 and sample.label == "42"
    messages = [dict(m) for m in sample.messages]
    assert messages[1]["role"] == "user"
    assert messages[1]["content"] == [{"text": PROMPT[1]["content"]}]
    tool_use = messages[2]["content"][0]["toolUse"]
    assert (tool_use["name"], tool_use["input"], tool_use["toolUseId"]) == (
        "multiply",
        {"a": 6, "b": 7},
        "call_1",
    )
    tool_result = messages[3]["content"][0]["toolResult"]
    assert tool_result["toolUseId"] == "call_1" and tool_result["status"] == "success"
    assert messages[-1]["role"] == "assistant"
    assert messages[-1]["content"][0]["text"].endswith("#### 42")

    steps = trajectory["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
    assert steps[2]["tool_calls"][0]["function_name"] == "multiply"
    assert steps[2]["tool_calls"][0]["arguments"] == {"a": 6, "b": 7}
    assert steps[2]["observation"]["results"] == [{"source_call_id": "call_1", "content": "42.0"}]
    assert steps[3]["message"].endswith("#### 42")


# -- end to end ---------------------------------------------------------------------------------


async def test_multiply_rollout_streams_by_default(artifact_root):
    result, requests, trajectory = await run_multiply(artifact_root, "st-stream")
    assert_sample(result, trajectory)
    assert_requests(requests, "st-stream", stream=True)


async def test_multiply_rollout_without_streaming(artifact_root):
    result, requests, trajectory = await run_multiply(artifact_root, "st-plain", stream=False)
    assert_sample(result, trajectory)
    assert_requests(requests, "st-plain", stream=False)


async def test_agent_is_the_sample_source_with_chat_shaped_trajectory():
    async with ScriptedModelServer(SCRIPT, api_key=LLM_KEY) as model:
        rollout = RolloutContext(
            chat_completions_url=f"{model.url}/v1/rollouts/r", api_key=LLM_KEY, rollout_id="r"
        )
        with rollout:
            agent = StrandsAgent(
                model=OsmosisRolloutModel(),
                tools=[multiply],
                system_prompt="Multiply.",
                callback_handler=None,
            )
            assert isinstance(agent.model, OpenAIModel)
            client = agent.model._custom_client  # pyright: ignore[reportPrivateUsage]
            assert str(client.base_url).rstrip("/") == rollout.chat_completions_url
            await agent.invoke_async("val1 = 6\nval2 = 7")
            sample = await rollout.get_sample()
    assert isinstance(rollout.sample_source, StrandsAgentSampleSource)
    assert sample is not None and sample.trajectory_messages is not None
    chat = [dict(m) for m in sample.trajectory_messages]
    assert [m["role"] for m in chat] == ["system", "user", "assistant", "tool", "assistant"]
    assert chat[0] == {"role": "system", "content": "Multiply."}
    assert chat[2]["tool_calls"][0]["function"]["name"] == "multiply"
    assert chat[3]["tool_call_id"] == "call_1"
    assert len(sample.messages) == 4  # the system prompt is not part of agent.messages
    preview = await rollout.sample_source.get_preview(2)
    assert preview is not None and len(preview.messages) == 2


def test_string_and_text_part_content_become_content_blocks():
    converted = to_strands_messages(
        [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": [{"type": "text", "text": "a"}, {"text": "b"}]},
            {"role": "assistant", "content": None},
        ]
    )
    assert converted == [
        {"role": "user", "content": [{"text": "hi"}]},
        {"role": "user", "content": [{"text": "a"}, {"text": "b"}]},
        {"role": "assistant", "content": []},
    ]


def test_exported_names():
    assert sorted(strands_integration.__all__) == [
        "OsmosisRolloutModel",
        "OsmosisStrandsAgent",
        "StrandsAgentSampleSource",
    ]


# -- wrong use ----------------------------------------------------------------------------------


def test_placeholder_outside_a_rollout_says_what_to_do():
    with pytest.raises(RolloutBindingError, match=r"AgentWorkflow\.run") as caught:
        StrandsAgent(model=OsmosisRolloutModel(), callback_handler=None)
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, UsageError)


def test_calling_the_placeholder_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="OsmosisStrandsAgent"):
        OsmosisRolloutModel().stream([])


def test_placeholder_refuses_endpoint_client_args():
    with pytest.raises(UsageError, match="api_key"):
        OsmosisRolloutModel(client_args={"api_key": "sk-elsewhere"})


def test_two_agents_in_one_rollout_fail():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="r-two"):
        StrandsAgent(model=OsmosisRolloutModel(), callback_handler=None)
        with pytest.raises(ValueError, match="already has a sample source"):
            StrandsAgent(model=OsmosisRolloutModel(), callback_handler=None)


async def test_agent_reused_in_another_rollout_names_both_ids():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="one"):
        agent = StrandsAgent(model=OsmosisRolloutModel(), callback_handler=None)
    with (
        RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="two"),
        pytest.raises(RolloutBindingError, match=r"'one'.*'two'"),
    ):
        await agent.invoke_async("hi")


def test_missing_framework_names_the_extra(monkeypatch):
    name = "osmosis_ai.rollout.integrations.agents.strands"
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "strands", None)
    with pytest.raises(MissingExtraError, match=re.escape('pip install "osmosis-ai[strands]"')):
        importlib.import_module(name)
