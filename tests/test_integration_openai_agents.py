"""OpenAI Agents integration over HTTP: rollout server, polling client, scripted model server."""

from __future__ import annotations

import importlib
import json
import re
import sys
from typing import Any, cast

import pytest

pytest.importorskip("agents", reason="openai-agents not installed (extra openai-agents)")

from agents import ModelSettings, Runner, function_tool, set_tracing_disabled
from agents.models.interface import Model
from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel

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
from osmosis_ai.rollout.integrations.agents import openai_agents
from osmosis_ai.rollout.integrations.agents.openai_agents import (
    OsmosisAgent,
    OsmosisLitellmModel,
    OsmosisMemorySession,
    OsmosisRolloutModel,
    SessionSampleSource,
)
from osmosis_ai.testing.model_server import ScriptedModelServer, ScriptedTurn, ToolCall
from rollouts import rollout_server

LLM_KEY = "llm-key"
PROMPT = [
    {"role": "system", "content": "Multiply with the tool, then answer '#### <n>'."},
    {"role": "user", "content": "val1 = 6\nval2 = 7"},
]
SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("multiply_tool", {"a": 6, "b": 7}, id="call_1")]),
    ScriptedTurn(content="The product is 42.\n#### 42"),
]


# -- the multiply-local-openai template, as a rollout author writes it ---------------------------


@function_tool
async def multiply_tool(a: float, b: float) -> float:
    """Multiply two numbers."""
    return a * b


class MultiplyAgentWorkflowConfig(AgentWorkflowConfig):
    name: str = "MultiplyAgentWorkflow"
    model: Model
    model_settings: ModelSettings
    tools: Any


class MultiplyWorkflow(AgentWorkflow[MultiplyAgentWorkflowConfig]):
    async def run(self, ctx: AgentWorkflowContext[MultiplyAgentWorkflowConfig]) -> None:
        config = ctx.config
        assert config is not None
        agent = OsmosisAgent(
            name="multiply",
            instructions="You multiply numbers.",
            model=config.model,
            model_settings=config.model_settings,
            tools=config.tools,
        )
        await Runner.run(agent, cast(Any, ctx.prompt), session=OsmosisMemorySession(), max_turns=8)


ANSWER = re.compile(r"####\s*(-?[0-9.,]+)")


class MultiplyGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        assert ctx.sample is not None
        content: Any = ctx.sample.messages[-1].get("content", "")
        if isinstance(content, list):
            content = "\n".join(
                p.get("text", "") for p in content if p.get("type") == "output_text"
            )
        match = ANSWER.search(str(content))
        value = float(match.group(1).replace(",", "")) if match else None
        ok = value is not None and abs(value - float(ctx.label or "nan")) < 1e-2
        ctx.set_reward(1.0 if ok else 0.0)


def make_config(**model_options: Any) -> MultiplyAgentWorkflowConfig:
    return MultiplyAgentWorkflowConfig(
        model=OsmosisRolloutModel(**model_options),
        model_settings=ModelSettings(temperature=1.0, top_p=1.0, max_tokens=4096),
        tools=[multiply_tool],
    )


# -- fixtures and helpers ---------------------------------------------------------------------


@pytest.fixture(autouse=True)
def _no_tracing(artifact_root):
    set_tracing_disabled(True)
    yield
    set_tracing_disabled(False)


async def run_multiply(artifact_root, rollout_id: str, **model_options: Any):
    backend = LocalBackend(
        workflow=MultiplyWorkflow,
        workflow_config=make_config(**model_options),
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
        assert bool(body.get("stream")) is stream
        assert (body["temperature"], body["top_p"], body["max_tokens"]) == (1.0, 1.0, 4096)
        assert [t["function"]["name"] for t in body["tools"]] == ["multiply_tool"]
        assert body["messages"][0] == {"role": "system", "content": "You multiply numbers."}
    second = requests[1].body["messages"]
    assert [m["role"] for m in second] == ["system", "system", "user", "assistant", "tool"]
    assert second[-1] == {"role": "tool", "tool_call_id": "call_1", "content": "42.0"}


def assert_sample(result, trajectory) -> None:
    assert result.status == RolloutStatus.SUCCESS, result.err_message
    sample = result.sample
    assert sample is not None and sample.reward == 1.0 and sample.label == "42"
    items = [dict(m) for m in sample.messages]
    assert items[0] == {"role": "system", "content": PROMPT[0]["content"]}
    assert items[1] == {"role": "user", "content": PROMPT[1]["content"]}
    call = next(i for i in items if i.get("type") == "function_call")
    assert (call["name"], json.loads(call["arguments"])) == ("multiply_tool", {"a": 6, "b": 7})
    output = next(i for i in items if i.get("type") == "function_call_output")
    assert (output["call_id"], output["output"]) == ("call_1", "42.0")
    last = items[-1]
    assert last["role"] == "assistant" and last["type"] == "message"
    assert last["content"][0]["text"].endswith("#### 42")

    steps = trajectory["steps"]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent"]
    assert steps[2]["tool_calls"][0]["function_name"] == "multiply_tool"
    assert steps[2]["observation"]["results"] == [{"source_call_id": "call_1", "content": "42.0"}]
    assert steps[3]["message"].endswith("#### 42")
    assert trajectory["extra"]["osmosis"]["reward"] == 1.0


# -- end to end ---------------------------------------------------------------------------------


async def test_multiply_rollout_sends_plain_requests_by_default(artifact_root):
    result, requests, trajectory = await run_multiply(artifact_root, "oa-plain")
    assert_sample(result, trajectory)
    assert_requests(requests, "oa-plain", stream=False)


async def test_multiply_rollout_streaming(artifact_root):
    result, requests, trajectory = await run_multiply(artifact_root, "oa-stream", stream=True)
    assert_sample(result, trajectory)
    assert_requests(requests, "oa-stream", stream=True)


async def test_runner_run_streamed_and_chat_shaped_trajectory_messages():
    async with ScriptedModelServer(SCRIPT, api_key=LLM_KEY, record_requests=True) as model:
        rollout = RolloutContext(
            chat_completions_url=f"{model.url}/v1/rollouts/r-s", api_key=LLM_KEY, rollout_id="r-s"
        )
        with rollout:
            agent = OsmosisAgent(name="m", model=OsmosisRolloutModel(), tools=[multiply_tool])
            assert isinstance(agent.model, OsmosisLitellmModel)
            session = OsmosisMemorySession()
            run = Runner.run_streamed(agent, "val1 = 6\nval2 = 7", session=session, max_turns=8)
            async for _ in run.stream_events():
                pass
            assert str(run.final_output).endswith("#### 42")
            sample = await rollout.get_sample()
    assert sample is not None and isinstance(rollout.sample_source, SessionSampleSource)
    assert all(r.body["stream"] is True for r in model.requests)
    assert sample.trajectory_messages is not None
    chat = [dict(m) for m in sample.trajectory_messages]
    assert [m["role"] for m in chat] == ["user", "assistant", "tool", "assistant"]
    assert chat[1]["tool_calls"][0]["function"]["name"] == "multiply_tool"
    assert chat[2] == {"role": "tool", "tool_call_id": "call_1", "content": "42.0"}
    assert chat[3]["content"].endswith("#### 42")
    preview = await rollout.sample_source.get_preview(1)
    assert preview is not None and len(preview.messages) == 1


def test_exported_names():
    assert sorted(openai_agents.__all__) == [
        "OsmosisAgent",
        "OsmosisLitellmModel",
        "OsmosisMemorySession",
        "OsmosisRolloutModel",
        "SessionSampleSource",
    ]


def test_documented_model_name_binds_to_the_sdk_chat_completions_model():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1/rollouts/r", api_key="k"):
        model = OsmosisLitellmModel(timeout=5)
    assert isinstance(model, OpenAIChatCompletionsModel)
    assert model.model == "osmosis-rollout"
    assert str(model._client.base_url) == "http://127.0.0.1:9/v1/rollouts/r/"
    assert model._client.api_key == "k"
    with pytest.raises(RolloutBindingError):
        OsmosisLitellmModel()


# -- wrong use ----------------------------------------------------------------------------------


def test_placeholder_outside_a_rollout_says_what_to_do():
    with pytest.raises(RolloutBindingError, match=r"AgentWorkflow\.run") as caught:
        OsmosisAgent(name="m", model=OsmosisRolloutModel())
    assert isinstance(caught.value, RuntimeError) and isinstance(caught.value, UsageError)


async def test_calling_the_placeholder_raises_not_implemented():
    with pytest.raises(NotImplementedError, match="OsmosisAgent"):
        await OsmosisRolloutModel().get_response()
    with pytest.raises(NotImplementedError, match="placeholder"):
        OsmosisRolloutModel().stream_response()


def test_placeholder_refuses_endpoint_options():
    with pytest.raises(UsageError, match="base_url"):
        OsmosisRolloutModel(base_url="http://elsewhere")


async def test_runner_without_an_osmosis_session_is_refused():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", api_key="k", rollout_id="r"):
        agent = OsmosisAgent(name="m", model=OsmosisRolloutModel())
        with pytest.raises(UsageError, match=r"session=OsmosisMemorySession\(\)"):
            await Runner.run(agent, "hi")


def test_two_sample_sources_in_one_rollout_fail():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="r-two"):
        OsmosisMemorySession()
        with pytest.raises(ValueError, match="already has a sample source"):
            OsmosisMemorySession()


async def test_session_reused_in_another_rollout_names_both_ids():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="first"):
        session = OsmosisMemorySession()
        await session.add_items([{"role": "user", "content": "hi"}])
    with (
        RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="second"),
        pytest.raises(RolloutBindingError, match=r"'first'.*'second'"),
    ):
        await session.get_items()
    assert await session.get_items() == [{"role": "user", "content": "hi"}]  # no rollout: fine


async def test_model_reused_in_another_rollout_names_both_ids():
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="one"):
        agent = OsmosisAgent(name="m", model=OsmosisRolloutModel())
    with RolloutContext(chat_completions_url="http://127.0.0.1:9/v1", rollout_id="two"):
        OsmosisMemorySession()
        with pytest.raises(RolloutBindingError, match=r"'one'.*'two'"):
            await Runner.run(agent, "hi")


def test_session_outside_a_rollout_is_a_plain_session():
    session = OsmosisMemorySession()
    assert session.rollout is None and session.session_id


def test_missing_framework_names_the_extra(monkeypatch):
    name = "osmosis_ai.rollout.integrations.agents.openai_agents"
    monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "agents", None)
    with pytest.raises(
        MissingExtraError, match=re.escape('pip install "osmosis-ai[openai-agents]"')
    ):
        importlib.import_module(name)
