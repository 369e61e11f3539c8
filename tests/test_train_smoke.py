"""Training through the full path on the tiny model: the bundled copy-digit template's
rollout server, the protocol, the policy proxy, the grader and TRL's GRPO.

The default smoke runs a few steps through ``osmosis --json train run`` and checks the
run directory; a 40-step run checks that GRPO raises the reward; resume, Ctrl-C, kill -9
and a grader without rewards are ``slow``.
"""

from __future__ import annotations

import gc
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

from cli_support import invoke
from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.errors import NoRewardError, TokenFidelityError
from osmosis_ai.train.plan import TrainRunOptions
from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model

SMOKE_CONFIG = """
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "copy-digit"

[training]
lr = 3e-4
total_epochs = 4
n_samples_per_prompt = 4
rollout_batch_size = 4
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
seed = 0
# A few steps of a barely warmed-up policy: some have equal rewards in every group by chance,
# and these runs test the training path (tests/test_train_no_signal.py tests that check).
no_signal_patience = 0

[checkpoints]
eval_interval = 2
checkpoint_save_freq = 2

[warmup]
sft_steps = 5
batch_size = 8
"""


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("smoke-model") / "tiny")


@pytest.fixture
def workspace(tmp_path: Path, model_dir: Path) -> Path:
    setup_workspace(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(model_dir)
    (tmp_path / "configs" / "training" / "smoke.toml").write_text(SMOKE_CONFIG)
    return tmp_path


def options(workspace: Path, **overrides: object) -> TrainRunOptions:
    values: dict[str, object] = {
        "config_path": workspace / "configs" / "training" / "smoke.toml",
        "cwd": workspace,
        "eval_rows": 4,
        "torch_threads": 1,
        "handle_signals": False,
    }
    values.update(overrides)
    return TrainRunOptions(**values)  # type: ignore[arg-type]


def metrics(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_cli_smoke_trains_and_writes_a_loadable_checkpoint(workspace: Path, capsys, monkeypatch):
    monkeypatch.chdir(workspace)
    outcome = invoke(
        capsys,
        "--json",
        "train",
        "run",
        "configs/training/smoke.toml",
        "--max-steps",
        "3",
        "--eval-rows",
        "4",
        "--threads",
        "1",
        "--name",
        "smoke",
    )
    assert outcome.code == 0, outcome.err
    envelope = outcome.json()
    assert envelope["operation"] == "train.run" and envelope["status"] == "success"
    resource = envelope["resource"]
    assert resource["steps_done"] == 3 and resource["warmup_steps"] == 5
    run_dir = Path(resource["output_path"])
    assert run_dir == workspace / ".osmosis" / "training" / "smoke"

    records = metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3]
    for record in records:
        for key in ("training_reward", "entropy", "response_length", "rollouts_per_s"):
            assert isinstance(record[key], float) and math.isfinite(record[key]), key
        assert record["rollouts"] == 16 and record["policy_version_lag"] == 0
        # one model call a rollout: one unbroken token segment each, one row each
        assert record["token_segments"] == 16 and record["chain_breaks"] == 0
        assert 0.0 <= record["frac_reward_zero_std"] <= 1.0
    assert records[1]["validation_reward"] is not None  # eval_interval = 2
    assert [v["step"] for v in resource["validation"]] == [0, 2, 3]

    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names == ["step-000002", "step-000003"]
    for name in ("run.json", "config.toml", "inputs.json", "logs.txt", "warmup/config.json"):
        assert (run_dir / name).is_file(), name
    assert json.loads((run_dir / "run.json").read_text())["status"] == "success"

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    final = run_dir / "checkpoints" / "step-000003"
    tokenizer = AutoTokenizer.from_pretrained(final, local_files_only=True)
    model = AutoModelForCausalLM.from_pretrained(final, local_files_only=True)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "Copy: 7"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = prompt["input_ids"] if hasattr(prompt, "keys") else prompt
    with torch.no_grad():
        out = model.generate(ids, max_new_tokens=2, do_sample=False)
    assert out.shape[1] > ids.shape[1]


REWRITING_WORKFLOW = '''
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, LocalBackend
from osmosis_ai.rollout import get_rollout_context
from osmosis_ai.rollout.http import post_json

from copy_digit_grader import ExactMatchGrader

ONLY_ODD = False  # rewrite only when the digit to copy is odd



class SummarizingWorkflow(AgentWorkflow):
    """Asks twice; before the second call it replaces the history with a summary, so the
    second prompt does not extend the first call's tokens."""

    async def run(self, ctx):
        rollout = get_rollout_context()
        headers = {"Authorization": f"Bearer {rollout.api_key}"}
        url = f"{rollout.chat_completions_url}/chat/completions"
        messages = list(ctx.prompt)
        first = await post_json(
            url, {"model": "m", "messages": messages, "max_tokens": 4}, headers=headers
        )
        draft = first["choices"][0]["message"].get("content") or ""
        question = messages[-1]["content"]
        if ONLY_ODD and int(question[-1]) % 2 == 0:
            return AgentWorkflowOutput(messages=[*messages, {"role": "assistant", "content": draft}])
        summary = [{"role": "user", "content": f"Draft was {draft!r}. {question}"}]
        second = await post_json(
            url, {"model": "m", "messages": summary, "max_tokens": 4}, headers=headers
        )
        answer = second["choices"][0]["message"].get("content") or ""
        return AgentWorkflowOutput(messages=[*summary, {"role": "assistant", "content": answer}])


if __name__ == "__main__":
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    backend = LocalBackend(workflow=SummarizingWorkflow, grader=ExactMatchGrader)
    app = create_rollout_server(backend=backend, configure_logging=False, save_trajectories=False)
    run_rollout_server(app, log_level="warning", access_log=False)
'''
"""A copy-digit rollout whose agent rewrites its conversation between its two model calls."""


def rewriting_workspace(workspace: Path, *, only_odd: bool = False) -> Path:
    folder = workspace / "rollouts" / "copy-digit"
    (folder / "main.py").rename(folder / "copy_digit_grader.py")
    (folder / "main.py").write_text(
        REWRITING_WORKFLOW.replace("ONLY_ODD = False", f"ONLY_ODD = {only_odd}")
    )
    return workspace


def test_each_unbroken_token_segment_trains_as_its_own_row(workspace: Path):
    rewriting_workspace(workspace)
    result = run_training(options(workspace, name="segments", max_steps=2))
    assert result.status == "success" and result.steps_done == 2
    records = metrics(result.run_dir)
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        # each rollout: two segments, both trained (the trainer took the second ones)
        assert record["rollouts"] == 16 and record["failed_rollouts"] == 0
        assert record["token_segments"] == 32 and record["chain_breaks"] == 16
        assert record["dropped_calls"] == 0
        assert math.isfinite(record["training_reward"])  # type: ignore[arg-type]


def test_segments_join_micro_batched_steps_beside_unbroken_rollouts(workspace: Path):
    """Only rollouts of odd digits rewrite: their second segments join a step split into 8
    micro-batches (rows that carry no loss fill the last), the others stay one row each."""
    rewriting_workspace(workspace, only_odd=True)
    result = run_training(options(workspace, name="mixed", max_steps=2, micro_batch_size=2))
    assert result.status == "success" and result.steps_done == 2
    records = metrics(result.run_dir)
    assert any(record["chain_breaks"] for record in records)
    for record in records:
        breaks = record["chain_breaks"]
        assert isinstance(breaks, int) and breaks % 4 == 0  # a prompt's 4 samples alike
        assert record["token_segments"] == 16 + breaks and record["failed_rollouts"] == 0


def test_strict_token_chain_fails_a_run_whose_agent_rewrites(workspace: Path):
    rewriting_workspace(workspace)
    with pytest.raises(TokenFidelityError, match="not an append-only extension"):
        run_training(options(workspace, name="strict", max_steps=1, strict_token_chain=True))


COUNTING_WORKFLOW = '''
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, LocalBackend
from osmosis_ai.rollout import get_rollout_context
from osmosis_ai.rollout.http import post_json

from copy_digit_grader import ExactMatchGrader


class CountingWorkflow(AgentWorkflow):
    """Counts its prompt's tokens the Messages way, then asks: the two must agree."""

    async def run(self, ctx):
        rollout = get_rollout_context()
        headers = {"x-api-key": rollout.api_key}
        messages = list(ctx.prompt)
        counted = await post_json(
            f"{rollout.chat_completions_url}/v1/messages/count_tokens",
            {"model": "m", "messages": messages},
            headers=headers,
        )
        answer = await post_json(
            f"{rollout.chat_completions_url}/chat/completions",
            {"model": "m", "messages": messages, "max_tokens": 4},
            headers=headers,
        )
        if counted["input_tokens"] != len(answer["prompt_token_ids"]):
            raise RuntimeError(f"counted {counted}, sampled from {answer['prompt_token_ids']}")
        text = answer["choices"][0]["message"].get("content") or ""
        return AgentWorkflowOutput(messages=[*messages, {"role": "assistant", "content": text}])


if __name__ == "__main__":
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    backend = LocalBackend(workflow=CountingWorkflow, grader=ExactMatchGrader)
    app = create_rollout_server(backend=backend, configure_logging=False, save_trajectories=False)
    run_rollout_server(app, log_level="warning", access_log=False)
'''


def test_messages_token_counting_in_a_run_uses_the_trainers_chat_template(workspace: Path):
    """The rollout I/O process asks the trainer's policy to count: each rollout checks that
    its count equals the prompt ids its model call was sampled from (else it fails)."""
    folder = workspace / "rollouts" / "copy-digit"
    (folder / "main.py").rename(folder / "copy_digit_grader.py")
    (folder / "main.py").write_text(COUNTING_WORKFLOW)
    result = run_training(options(workspace, name="count", max_steps=1))
    assert result.status == "success"
    (record,) = metrics(result.run_dir)
    assert record["rollouts"] == 16 and record["failed_rollouts"] == 0


LEARNING_CONFIG = """
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "copy-digit"

[training]
lr = 1e-3
total_epochs = 32
n_samples_per_prompt = 8
rollout_batch_size = 8
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
loss_type = "dapo"
kl_coef = 0.0
seed = 0

[sampling]
rollout_temperature = 1.0
rollout_top_p = 1.0

[checkpoints]
eval_interval = 40
checkpoint_save_freq = 40

[warmup]
sft_steps = 100
lr = 1e-3
batch_size = 8
"""
"""The demo's shape (64 completions a step) with a GRPO learning rate that shows learning within
40 steps (10 rows x 32 epochs / 8 prompts) rather than 200. The warm-up is longer than the
demo's 60 steps: after 60 the policy scores about 0.05, so a step whose 64 samples all miss is
common, and about one seed in four ended with no learning signal for 8 steps or collapsed;
after 100 it scores about 0.5 and every one of 20 seeds learned."""

LEARNING_WINDOW = 10  # steps averaged at each end of the run
LEARNING_MARGIN = 0.15  # 20 seeds measured 0.29-0.44; one 10-step window's noise is about 0.02


@pytest.mark.parametrize("staleness", [0, pytest.param(1, marks=pytest.mark.slow)])
def test_grpo_raises_the_reward_of_the_tiny_model(
    workspace: Path, capsys, monkeypatch, staleness: int
):
    """Synchronous, and asynchronous (max_staleness = 1: each step's rollouts generated while
    the previous step updates, their loss corrected by the importance ratio): both learn."""
    config = LEARNING_CONFIG.replace("[training]\n", f"[training]\nmax_staleness = {staleness}\n")
    (workspace / "configs" / "training" / "learn.toml").write_text(config)
    monkeypatch.chdir(workspace)
    outcome = invoke(
        capsys,
        "--json",
        "train",
        "run",
        "configs/training/learn.toml",
        "--eval-rows",
        "4",
        "--threads",
        "1",
        "--resume-every",
        "40",
        "--name",
        "learn",
    )
    assert outcome.code == 0, outcome.err
    resource = outcome.json()["resource"]
    assert resource["steps_done"] == 40
    records = metrics(Path(resource["output_path"]))
    rewards = [r["training_reward"] for r in records]
    assert len(rewards) == 40 and all(isinstance(r, float) and math.isfinite(r) for r in rewards)
    assert all(r["staleness_max"] <= staleness for r in records)  # type: ignore[operator]
    if staleness:  # the overlap happened, and the correction saw the old policy's logprobs
        assert sum(float(r["staleness_mean"]) > 0 for r in records) >= 30  # type: ignore[arg-type]
        assert all(isinstance(r["logprob_mismatch"], float) for r in records)
    first = sum(rewards[:LEARNING_WINDOW]) / LEARNING_WINDOW  # type: ignore[arg-type]
    last = sum(rewards[-LEARNING_WINDOW:]) / LEARNING_WINDOW  # type: ignore[arg-type]
    print(f"training reward: first {LEARNING_WINDOW} steps {first:.3f}, last {last:.3f}")
    assert last >= first + LEARNING_MARGIN, f"no learning: {first:.3f} -> {last:.3f} {rewards}"


@pytest.mark.slow
def test_resume_continues_with_the_same_data_order(workspace: Path):
    frozen: list[int] = []

    def on_event(event: object) -> None:
        if type(event).__name__ == "StepEvent":
            frozen.append(gc.get_freeze_count())

    first = run_training(options(workspace, name="r", max_steps=2), on_event)
    assert first.status == "success" and first.steps_done == 2
    # the run's long-lived objects sit out full collections while it trains, and only then
    assert len(frozen) == 2 and min(frozen) > 0 and gc.get_freeze_count() == 0
    again = run_training(options(workspace, name="r", max_steps=4, resume=True))
    assert again.resumed and again.steps_done == 4 and again.warmup_steps == 0
    assert [r["step"] for r in metrics(again.run_dir)] == [1, 2, 3, 4]
    # the resumable state saved every step stays small: metrics.jsonl holds the history
    state = json.loads(
        (again.run_dir / "resume" / "checkpoint-4" / "trainer_state.json").read_text()
    )
    assert len(state["log_history"]) <= 1
    inputs = json.loads((again.run_dir / "run.json").read_text())
    assert inputs["invocations"] == 2


@pytest.mark.slow
def test_ctrl_c_saves_a_checkpoint_and_stops(workspace: Path):
    def interrupt(event: object) -> None:
        if type(event).__name__ == "StepEvent" and getattr(event, "step", 0) == 1:
            os.kill(os.getpid(), signal.SIGINT)

    result = run_training(options(workspace, name="c", handle_signals=True), interrupt)
    assert result.status == "interrupted"
    assert result.steps_done == 2  # the step in flight finishes, then the run stops
    assert (result.run_dir / "checkpoints" / "step-000002").is_dir()
    assert (result.run_dir / "resume" / "checkpoint-2" / "trainer_state.json").is_file()
    assert json.loads((result.run_dir / "run.json").read_text())["status"] == "interrupted"
    done = run_training(options(workspace, name="c", resume=True, max_steps=3))
    assert done.steps_done == 3 and [r["step"] for r in metrics(done.run_dir)] == [1, 2, 3]


@pytest.mark.slow
def test_kill_9_loses_at_most_the_current_step(workspace: Path):
    script = (
        "import sys\n"
        "from pathlib import Path\n"
        "from osmosis_ai.train.plan import TrainRunOptions\n"
        "from osmosis_ai.train.runner import run_training\n"
        "ws = Path(sys.argv[1])\n"
        "run_training(TrainRunOptions(config_path=ws / 'configs/training/smoke.toml', cwd=ws,"
        " name='k', eval_rows=4, torch_threads=1))\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script, str(workspace)], start_new_session=True)
    run_dir = workspace / ".osmosis" / "training" / "k"
    deadline = time.monotonic() + 180
    try:
        while time.monotonic() < deadline:
            path = run_dir / "metrics.jsonl"
            if path.is_file() and len(path.read_text().splitlines()) >= 3:
                break
            time.sleep(0.1)
        else:
            pytest.fail("the child never reached step 3")
    finally:
        os.kill(child.pid, signal.SIGKILL)  # its rollout server (own session) is orphaned
        child.wait()
    orphan = json.loads((run_dir / "rollout-server.json").read_text())["pid"]
    logged = len(metrics(run_dir))
    saved = [
        int(p.name.rpartition("-")[2])
        for p in (run_dir / "resume").iterdir()
        if (p / "trainer_state.json").is_file()
    ]
    assert max(saved) >= logged - 1  # at most the step in flight is lost
    resumed = run_training(options(workspace, name="k", resume=True, max_steps=logged + 1))
    assert [r["step"] for r in metrics(resumed.run_dir)] == list(range(1, logged + 2))
    assert resumed.steps_done == logged + 1
    # the resume stopped the orphaned server (a zombie only awaits reaping by its adopter)
    assert not psutil.pid_exists(orphan) or psutil.Process(orphan).status() == psutil.STATUS_ZOMBIE
    assert not (run_dir / "rollout-server.json").exists()


@pytest.mark.slow
def test_a_grader_that_never_sets_a_reward_stops_the_run(workspace: Path):
    main = workspace / "rollouts" / "copy-digit" / "main.py"
    main.write_text(main.read_text().replace("ctx.set_reward(1.0 if", "(1.0 if"))
    with pytest.raises(NoRewardError, match="set_reward"):
        run_training(options(workspace, name="g", max_steps=1))
    run = json.loads((workspace / ".osmosis/training/g/run.json").read_text())
    assert run["status"] == "failed"


@pytest.mark.slow
def test_cli_demo_sets_up_the_workspace_and_trains(tmp_path: Path, capsys):
    demo = tmp_path / "demo"
    # 10 steps, not fewer: the default no-signal patience is a fifth of the steps, and one of
    # the warmed-up policy's early steps now and then has equal rewards in all its groups
    outcome = invoke(
        capsys, "--json", "train", "run", "--demo", "--demo-dir", str(demo), "--max-steps", "10"
    )
    assert outcome.code == 0, outcome.err
    resource = outcome.json()["resource"]
    assert resource["steps_done"] == 10 and resource["warmup_steps"] == 60
    assert [v["step"] for v in resource["validation"]] == [0, 10]
    assert all(v["rollouts"] == 40 for v in resource["validation"])  # 10 rows x 4 samples
    for name in (
        "rollouts/copy-digit/main.py",
        "configs/training/copy-digit.toml",
        "configs/eval/copy-digit.toml",
        "data/copy-digit.jsonl",
        "models/tiny/config.json",
    ):
        assert (demo / name).is_file(), name
    assert Path(resource["plot_path"]).is_file()


def test_training_sends_no_hub_telemetry_unless_asked(monkeypatch: pytest.MonkeyPatch):
    from huggingface_hub import constants

    from osmosis_ai.train import engine

    monkeypatch.setattr(constants, "HF_HUB_DISABLE_TELEMETRY", False)
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "0")  # the user asked for it: kept
    engine.quiet()
    assert constants.HF_HUB_DISABLE_TELEMETRY is False
    monkeypatch.delenv("HF_HUB_DISABLE_TELEMETRY")
    engine.quiet()  # TRL would report each trainer it builds to the Hub
    assert constants.HF_HUB_DISABLE_TELEMETRY is True
