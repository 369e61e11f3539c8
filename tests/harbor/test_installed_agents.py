"""Harbor's own installed agents (``mini-swe-agent``, ``claude-code``) run from a host
install prefix in the sandbox, against the scripted model behind the real policy endpoint.

Each agent solves the shipped example task ``create-file`` (a ``no-network`` task: the
agent reaches only the forwarded endpoint), the task's verifier scores 1, and the policy
endpoint's trace holds the token ids of every call the agent made. The prefixes are what
``scripts/setup_harbor.sh`` installs under ``.harbor-agents/`` (``OSMOSIS_HARBOR_AGENTS``
points elsewhere); a test skips, naming the missing install, when its prefix is absent.

Then ``osmosis train run``, unchanged, takes 2 GRPO steps of the tiny model whose every
rollout is a trial of such an agent (the trainer's Python and the rollout server's, as in
test_train_harbor.py): the agent's calls are sampled from the policy, and the verifier's
reward reaches the trainer.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import time
import warnings
from collections.abc import AsyncGenerator, Callable
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


def request_size(request: ChatRequest) -> int:
    """Characters of a request's messages and tool schemas (printed for the figures)."""
    size = len(json.dumps(request.messages)) + len(json.dumps(request.body.get("tools") or []))
    print(f"\nrequest {request.turn}: {size} characters, tools {sorted(tool_names(request))}")
    return size


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
        self.agent_requests: list[ChatRequest] = []

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        if "Bash" not in tool_names(request):
            self.side_calls += 1
            return ScriptedTurn(content="Greeting file")
        self.agent_turns += 1
        self.agent_requests.append(request)
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
    from harbor.trial.queue import TrialQueue  # pyright: ignore[reportMissingImports]

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
) -> AsyncGenerator[tuple[PolicyProxy, str]]:
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
    assert grader is not None and grader.status == RolloutStatus.SUCCESS, (
        grader and grader.err_message
    )
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
@pytest.mark.parametrize("named_by", ["its path", "a link under /tmp"])
async def test_mini_swe_agent_from_a_host_prefix_solves_a_shipped_task(
    tmp_path: Path, named_by: str
):
    prefix = agent_prefix("mini-swe-agent", "mini-swe-agent")
    if named_by == "a link under /tmp":  # the trial has a /tmp of its own: shown to it anyway
        (tmp_path / "mswea").symlink_to(prefix)
        prefix = tmp_path / "mswea"
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
    assert request_size(player.agent_requests[0]) > 50000  # Claude Code's own prompt and tools
    assert len(calls) == player.agent_turns + player.side_calls


COMPACT_CLAUDE_CODE = {
    "tools": "Bash,Write",
    "system_prompt": "You solve terminal tasks in /app. Use the Bash tool; reply briefly.",
}
"""Claude Code's own ``--tools`` and ``--system-prompt``: a prompt a small policy can take."""


@pytest.mark.slow
@pytest.mark.timeout(400)
async def test_claude_code_sends_only_the_tools_and_system_prompt_it_is_given(tmp_path: Path):
    prefix = agent_prefix("claude-code", "claude")
    backend = make_backend(tmp_path, "claude-code", prefix, native_agent_kwargs=COMPACT_CLAUDE_CODE)
    player = ClaudeCodePlayer()
    await solve(tmp_path, backend, player, "claude-compact-1")
    assert player.agent_turns == 2
    for request in player.agent_requests:
        assert tool_names(request) == {"Bash", "Write"}
        system = content_text(request.messages[0].get("content"))
        assert request.messages[0].get("role") == "system"
        assert system.endswith(COMPACT_CLAUDE_CODE["system_prompt"])
        # The whole request (messages and tool schemas) is a few kB, not Claude Code's ~75 kB.
        assert request_size(request) < 6000


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


# -- a training run whose rollouts are installed-agent trials ------------------------

ROLLOUT_MAIN = '''
"""Each rollout is a Harbor trial of the greeting task, run by one of Harbor's installed
agents from a host install prefix; the task's own tests/test.sh is the reward."""

from pathlib import Path

from harbor.trial.queue import TrialQueue

from osmosis_ai.rollout.backend.harbor import HarborBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

backend = HarborBackend(
    orchestrator=TrialQueue(n_concurrent=2),
    tasks_dir=Path(__file__).resolve().parent / "greeting_task",
    agent={agent!r},
    agent_prefix={prefix!r},
    native_agent_kwargs={kwargs!r},
)
run_rollout_server(create_rollout_server(backend=backend))
'''
TRAIN_CONFIG = """
[experiment]
rollout = "greeting"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "greeting"

[training]
lr = 3e-4
total_epochs = 1
n_samples_per_prompt = 2
rollout_batch_size = 2
max_prompt_length = {max_prompt}  # the agent's prompt, one token a byte
max_response_length = {max_response}
agent_workflow_timeout_s = 180
grader_timeout_s = 60
seed = 0
no_signal_patience = 0

[checkpoints]
eval_interval = 100
checkpoint_save_freq = 100
"""
ROW = {
    "system_prompt": "You solve terminal tasks.",
    "user_prompt": "Write the line 'hello from harbor' to /app/greeting.txt.",
    "ground_truth": "hello from harbor",
}


TRAINED_AGENTS = [
    # Two model calls a rollout: the untrained policy never finishes on its own.
    ("mini-swe-agent", "mini-swe-agent", {"config": {"agent": {"step_limit": 2}}}, 12000, 16),
    # With its default system prompt and tools claude-code sends ~76k tokens to the
    # byte-level tiny model (a prefill past the agent timeout on CPU): it is trained with
    # only Bash and Write offered and a one-line system prompt, its own options. A reply cut
    # at the response limit ends Claude Code with an error (it reads stop_reason max_tokens
    # as its own limit), so the untrained policy gets room to end its reply.
    ("claude-code", "claude", COMPACT_CLAUDE_CODE, 8000, 256),
]


@pytest.mark.slow
@pytest.mark.timeout(900)
@pytest.mark.parametrize(
    ("agent", "program", "kwargs", "max_prompt", "max_response"),
    TRAINED_AGENTS,
    ids=[a[0] for a in TRAINED_AGENTS],
)
def test_train_run_steps_through_installed_agent_trials(
    tmp_path: Path,
    agent: str,
    program: str,
    kwargs: dict[str, Any],
    max_prompt: int,
    max_response: int,
):
    import json
    import subprocess
    import sys

    from test_train_harbor import run, trainer_python

    trainer, why = trainer_python()
    if trainer is None:
        pytest.skip(why)
    prefix = agent_prefix(agent, program)
    workspace = tmp_path / "workspace"
    rollout = workspace / "rollouts" / "greeting"
    rollout.mkdir(parents=True)
    (workspace / ".osmosis").mkdir()
    shutil.copytree(EXAMPLE_TASKS / "create-file", rollout / "greeting_task")
    (rollout / "main.py").write_text(
        ROLLOUT_MAIN.format(agent=agent, prefix=str(prefix), kwargs=kwargs)
    )
    (workspace / "data").mkdir()
    (workspace / "data" / "greeting.jsonl").write_text(
        "".join(json.dumps(ROW) + "\n" for _ in range(4))
    )
    (workspace / "configs" / "training").mkdir(parents=True)
    (workspace / "configs" / "training" / "agent.toml").write_text(
        TRAIN_CONFIG.format(max_prompt=max_prompt, max_response=max_response)
    )
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_", "VIRTUAL_ENV"))
    }
    env |= {"NO_COLOR": "1", "HOME": str(tmp_path / "home")}
    built = subprocess.run(
        [trainer, "-c", "import sys; from osmosis_ai.train.tiny_model import build_tiny_model; "
         "build_tiny_model(sys.argv[1], max_position_embeddings=int(sys.argv[2]))",
         str(workspace / "models" / "tiny"), str(max_prompt + max_response + 64)],
        cwd=workspace, env=env, capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    env["OSMOSIS_ROLLOUT_PYTHON"] = sys.executable
    started = time.monotonic()
    done = run(
        trainer, "-m", "osmosis_ai.cli.main", "--json", "train", "run",
        "configs/training/agent.toml", "--max-steps", "2", "--eval-rows", "2",
        "--threads", "1", "--name", agent,
        cwd=workspace, env=env, timeout=840,
    )  # fmt: skip
    elapsed = time.monotonic() - started
    assert done.stdout.strip(), done.stderr[-3000:]
    envelope = json.loads(done.stdout)
    assert envelope["status"] == "success", envelope
    resource = envelope["resource"]
    assert resource["steps_done"] == 2
    run_dir = Path(resource["output_path"])
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        assert record["rollouts"] == 4 and record["failed_rollouts"] == 0
        assert record["training_reward"] == 0.0  # an untrained policy writes no greeting
        assert record["response_length"] > 0
    # Every rollout was a trial of the agent, whose verifier wrote the reward.
    rollouts = sorted(p for p in (run_dir / "rollouts").iterdir() if p.is_dir())
    assert len(rollouts) == 12
    for kept in rollouts:
        assert (kept / "harbor" / "verifier" / "reward.txt").read_text().strip() == "0"
        assert (kept / "harbor" / "agent" / f"{agent}.txt").is_file()  # the agent's output
    print(f"\n2 steps, 12 {agent} trials: {elapsed:.0f}s, {json.dumps(records)}")
