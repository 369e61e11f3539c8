"""Harbor's own installed agents (``mini-swe-agent``, ``claude-code``) run from a host
install prefix in the sandbox, against the scripted model behind the real policy endpoint.

Each agent solves the shipped example task ``create-file`` (a ``no-network`` task: the
agent reaches only the forwarded endpoint), the task's verifier scores 1, and the policy
endpoint's trace holds the token ids of every call the agent made. The prefixes are what
``scripts/setup_harbor.sh`` installs under ``.harbor-agents/`` (``OSMOSIS_HARBOR_AGENTS``
points elsewhere); a test skips, naming the missing install, when its prefix is absent.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import time
import warnings
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.controller import OpenAICompatibleUpstream, PolicyProxy
from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.execution import ExecutionRequest
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.testing import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text
from osmosis_ai.testing.serving import serve_in_task

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE_TASKS = REPO / "examples" / "harbor-dataset" / "tasks"
AGENTS = Path(os.environ.get("OSMOSIS_HARBOR_AGENTS") or REPO / ".harbor-agents")
SOLUTION = "printf 'hello from harbor\\n' > /app/greeting.txt && cat /app/greeting.txt"
MSWEA_DONE = "echo COMPLETE_TASK_AND_SUBMIT_FINAL_OUTPUT"


def agent_prefix(agent: str, program: str) -> Path:
    """The agent's install prefix, or a skip naming how to make it."""
    prefix = AGENTS / agent
    for bin_dir in ("bin", "node_modules/.bin"):
        if (prefix / bin_dir / program).exists():
            return prefix
    if agent == "claude-code" and shutil.which("npm") is None:
        pytest.skip("claude-code is installed with npm, which is not installed here")
    pytest.skip(f"{agent} is not installed under {prefix} (run scripts/setup_harbor.sh)")


def tool_names(request: ChatRequest) -> set[str]:
    return {
        (tool.get("function") or tool).get("name", "") for tool in request.body.get("tools") or []
    }


class MiniSwePlayer:
    """Plays the model for mini-swe-agent: the solution as a shell command, then its
    completion marker (as a ``bash`` tool call when it offers tools, else a fenced block)."""

    def __init__(self) -> None:
        self.outputs: list[str] = []

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        if request.turn > 0:
            self.outputs.append(content_text(request.messages[-1].get("content")))
        command = SOLUTION if request.turn == 0 else MSWEA_DONE
        if "bash" in tool_names(request):
            return ScriptedTurn(
                content="THOUGHT: run it.",
                tool_calls=[ToolCall("bash", {"command": command}, id=f"call_{request.turn}")],
            )
        return ScriptedTurn(content=f"THOUGHT: run it.\n\n```mswea_bash_command\n{command}\n```")


class ClaudeCodePlayer:
    """Plays the model for claude-code: a ``Bash`` tool call with the solution, then a
    final answer; any side call (no ``Bash`` tool offered) gets a short text."""

    def __init__(self) -> None:
        self.agent_turns = 0
        self.side_calls = 0

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        if "Bash" not in tool_names(request):
            self.side_calls += 1
            return ScriptedTurn(content="Greeting file")
        self.agent_turns += 1
        last = request.messages[-1]
        if last.get("role") == "tool":
            return ScriptedTurn(content="I wrote the greeting to /app/greeting.txt.")
        return ScriptedTurn(
            tool_calls=[
                ToolCall(
                    "Bash",
                    {"command": SOLUTION, "description": "Write the greeting"},
                    id=f"toolu_{request.turn}",
                )
            ]
        )


def make_backend(tmp_path: Path, agent: str, prefix: Path, **kwargs: Any) -> Any:
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=EXAMPLE_TASKS,
            task_mode="dataset",
            agent=agent,
            agent_prefix=prefix,
            trials_dir=tmp_path / "trials",
            artifact_root=tmp_path / "artifacts",
            cleanup_successful_trials=False,
            **kwargs,
        )


@contextlib.asynccontextmanager
async def policy_endpoint(
    responder: Callable[[ChatRequest], ScriptedTurn], rollout_id: str
) -> AsyncIterator[tuple[PolicyProxy, str]]:
    """The real policy endpoint for one rollout, the scripted model as its upstream."""
    async with contextlib.AsyncExitStack() as stack:
        model = await stack.enter_async_context(ScriptedModelServer(responder=responder))
        upstream = OpenAICompatibleUpstream(model.base_url, None, "policy", timeout=60)
        stack.push_async_callback(upstream.aclose)
        proxy = PolicyProxy(upstream, request_token_data=True)
        proxy.register(rollout_id)
        origin = await stack.enter_async_context(serve_in_task(proxy, access_log=False))
        yield proxy, proxy.chat_base_url(rollout_id, origin)


async def solve(tmp_path: Path, backend: Any, responder: Any, rollout_id: str) -> list[Any]:
    request = ExecutionRequest(
        id=rollout_id,
        prompt=[{"role": "user", "content": "(the task's own instruction is used)"}],
        metadata={"harbor_task_id": "create-file"},
        agent_timeout_sec=240,
    )
    async with policy_endpoint(responder, rollout_id) as (proxy, url):
        started = time.monotonic()
        with RolloutContext(chat_completions_url=url, api_key=proxy.token, rollout_id=rollout_id):
            outcome = await backend.execute(request)
        elapsed = time.monotonic() - started
        calls = proxy.calls(rollout_id)
    assert outcome.workflow.status == RolloutStatus.SUCCESS, outcome.workflow.err_message
    grader = outcome.grader
    assert grader is not None and grader.status == RolloutStatus.SUCCESS, grader.err_message
    assert grader.sample is not None and grader.sample.reward == 1.0
    kept = tmp_path / "artifacts" / rollout_id
    assert (kept / "harbor" / "verifier" / "reward.txt").read_text().strip() == "1"
    # Every call went through the policy endpoint, which recorded its token ids.
    assert calls, "the agent made no call through the policy endpoint"
    for call in calls:
        assert call.ok, call.error
        assert call.prompt_token_ids and call.completion_token_ids
        assert call.logprobs is not None and len(call.logprobs) == len(call.completion_token_ids)
    prompt = sum(len(c.prompt_token_ids or []) for c in calls)
    completion = sum(len(c.completion_token_ids or []) for c in calls)
    print(
        f"\n{rollout_id}: {elapsed:.1f}s, {len(calls)} calls, "
        f"{prompt} prompt / {completion} completion tokens"
    )
    # The rollout's key is scrubbed from everything kept.
    leaked = [
        p
        for root in (tmp_path / "trials", kept)
        for p in root.rglob("*")
        if p.is_file() and proxy.token.encode() in p.read_bytes()
    ]
    assert leaked == []
    return calls


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_mini_swe_agent_from_a_host_prefix_solves_a_shipped_task(tmp_path: Path):
    prefix = agent_prefix("mini-swe-agent", "mini-swe-agent")
    backend = make_backend(tmp_path, "mini-swe-agent", prefix)
    player = MiniSwePlayer()
    calls = await solve(tmp_path, backend, player, "mswea-1")
    assert len(calls) == 2
    # The command ran in the task's sandbox: mini-swe-agent showed its output.
    assert "hello from harbor" in player.outputs[0]


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_claude_code_from_a_host_prefix_solves_a_shipped_task(tmp_path: Path):
    prefix = agent_prefix("claude-code", "claude")
    backend = make_backend(tmp_path, "claude-code", prefix)
    player = ClaudeCodePlayer()
    calls = await solve(tmp_path, backend, player, "claude-1")
    assert player.agent_turns == 2
    assert len(calls) == player.agent_turns + player.side_calls


async def test_an_agent_prefix_without_the_program_fails_the_trial_naming_it(tmp_path: Path):
    empty = tmp_path / "empty-prefix"
    empty.mkdir()
    backend = make_backend(tmp_path, "mini-swe-agent", empty)
    request = ExecutionRequest(
        id="no-prefix",
        prompt=[{"role": "user", "content": "x"}],
        metadata={"harbor_task_id": "create-file"},
        agent_timeout_sec=60,
    )
    async with policy_endpoint(MiniSwePlayer(), request.id) as (proxy, url):
        with RolloutContext(chat_completions_url=url, api_key=proxy.token, rollout_id=request.id):
            outcome = await backend.execute(request)
        assert proxy.calls(request.id) == []
    assert outcome.workflow.status != RolloutStatus.SUCCESS
    assert f"no mini-swe-agent under {empty}" in (outcome.workflow.err_message or "")
