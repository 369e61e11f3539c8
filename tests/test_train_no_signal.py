"""A run without a learning signal fails instead of ending green: real tiny trainings through
``osmosis train run`` whose grader gives every sample the same reward stop after the
patience (``[training] no_signal_patience``, by default the smaller of 25 and 20 % of the
steps), save their last checkpoint, and fail with ``no_learning_signal`` in the exit code,
the summary, ``run.json``, ``metrics.jsonl`` and ``logs.txt``; with patience 0 they finish.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

from cli_support import invoke
from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.plan import TrainRunOptions, build_plan
from osmosis_ai.train.stopping import SignalWatch
from osmosis_ai.train.tiny_model import build_tiny_model
from osmosis_ai.workspace import ConfigValidationError

# 10 rows x 4 epochs / 4 prompts = 10 steps; no warm-up: the grader decides the signal
CONFIG = """
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "copy-digit"

[training]
lr = 3e-4
total_epochs = 4
n_samples_per_prompt = 2
rollout_batch_size = 4
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
seed = 0

[checkpoints]
eval_interval = 0
checkpoint_save_freq = 0
"""
GRADED = 'ctx.set_reward(1.0 if answer == (ctx.label or "").strip() else 0.0)'
CONSTANT = "ctx.set_reward(0.5)  # the same reward for every answer"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("no-signal-model") / "tiny")


@pytest.fixture
def workspace(tmp_path: Path, model_dir: Path) -> Path:
    setup_workspace(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(model_dir)
    main = tmp_path / "rollouts" / "copy-digit" / "main.py"
    source = main.read_text()
    assert GRADED in source
    main.write_text(source.replace(GRADED, CONSTANT))
    (tmp_path / "configs" / "training" / "flat.toml").write_text(CONFIG)
    return tmp_path


def configure(workspace: Path, extra: str) -> None:
    path = workspace / "configs" / "training" / "flat.toml"
    path.write_text(path.read_text().replace("seed = 0\n", f"seed = 0\n{extra}\n"))


def train(capsys: pytest.CaptureFixture[str], workspace: Path, name: str, *flags: str):
    return invoke(
        capsys,
        "--json",
        "train",
        "run",
        str(workspace / "configs" / "training" / "flat.toml"),
        "--name",
        name,
        "--threads",
        "1",
        "--eval-rows",
        "2",
        *flags,
    )


def test_the_default_patience_is_the_smaller_of_25_and_a_fifth_of_the_steps(workspace: Path):
    def patience(max_steps: int | None, extra: str = "") -> int:
        if extra:
            configure(workspace, extra)
        options = TrainRunOptions(
            config_path=workspace / "configs" / "training" / "flat.toml",
            cwd=workspace,
            max_steps=max_steps,
        )
        return build_plan(options).no_signal_patience

    assert patience(10) == 2
    assert patience(3) == 1  # at least one step
    path = workspace / "configs" / "training" / "flat.toml"
    path.write_text(path.read_text().replace("total_epochs = 4", "total_epochs = 400"))
    assert patience(None) == 25  # 1000 steps
    assert patience(200) == 25
    assert patience(60) == 12
    assert patience(60, "no_signal_patience = 0") == 0
    text = path.read_text().replace("no_signal_patience = 0\n", "")
    path.write_text(text + "\n[advanced]\nno_signal_patience = 7\n")
    assert patience(60) == 7  # also read from [advanced], like the trainer's other settings
    path.write_text(text.replace("seed = 0\n", "seed = 0\nno_signal_patience = -1\n"))
    with pytest.raises(ConfigValidationError, match="no_signal_patience"):
        patience(60)


def test_constant_rewards_fail_the_run_after_the_patience_and_keep_the_checkpoint(
    workspace: Path, capsys: pytest.CaptureFixture[str]
):
    outcome = train(capsys, workspace, "flat", "--max-steps", "10")  # patience 2
    assert outcome.code == 1, outcome.err
    envelope = outcome.json()
    assert envelope["status"] == "failed"
    resource = envelope["resource"]
    assert resource["error"] == "no_learning_signal"
    assert resource["steps_done"] == 2 and resource["total_steps"] == 10
    message = envelope["message"]
    assert "failed (no_learning_signal) after 2/10 steps" in message
    assert "same reward, mean reward 0.500" in message
    for hint in ("grader", "partial credit", "sft_steps", "[training] lr", "no_signal_patience"):
        assert hint in message, hint
    run_dir = Path(resource["output_path"])
    # what it had is saved: the last step's checkpoint and the resumable state
    assert [Path(p).name for p in resource["checkpoints"]] == ["step-000002"]
    assert (run_dir / "checkpoints" / "step-000002" / "config.json").is_file()
    assert (run_dir / "resume" / "checkpoint-2").is_dir()
    manifest = json.loads((run_dir / "run.json").read_text())
    assert manifest["status"] == "failed" and manifest["steps_done"] == 2
    assert manifest["error"] == "no_learning_signal"
    assert manifest["message"] == resource["error_message"]
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    assert [r["steps_without_signal"] for r in records] == [1, 2]
    assert all(r["groups_without_signal"] == 4 and r["training_reward"] == 0.5 for r in records)
    logs = (run_dir / "logs.txt").read_text()
    assert "no learning signal for 2 steps in a row: stopping after step 2" in logs
    assert "ERROR" in logs and "training failed: no learning signal for 2 consecutive" in logs


def test_patience_zero_turns_the_check_off(workspace: Path, capsys: pytest.CaptureFixture[str]):
    configure(workspace, "no_signal_patience = 0")
    outcome = train(capsys, workspace, "flat-off", "--max-steps", "3")
    assert outcome.code == 0, outcome.err
    envelope = outcome.json()
    assert envelope["status"] == "success"
    resource = envelope["resource"]
    assert resource["steps_done"] == 3 and resource["error"] is None
    records = (Path(resource["output_path"]) / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(r)["steps_without_signal"] for r in records] == [1, 2, 3]


def test_a_step_with_a_signal_starts_the_count_again():
    def flat(watch: SignalWatch, step: int) -> bool:
        return watch.observe(step, groups=4, groups_without_signal=4, grad_norm=0.0, reward=0.0)

    watch = SignalWatch(3)
    assert flat(watch, 1) and flat(watch, 2)
    assert not watch.observe(3, groups=4, groups_without_signal=3, grad_norm=0.2, reward=0.1)
    assert watch.streak == 0 and not watch.tripped
    for step in (4, 5):
        flat(watch, step)
    assert not watch.tripped
    watch.observe(6, groups=4, groups_without_signal=1, grad_norm=0, reward=0.3)  # zero grad
    assert watch.tripped and (watch.first_step, watch.last_step) == (4, 6)
    assert "steps 4-6" in watch.message() and "gradients were zero" in watch.message()
    driver = SignalWatch(3)  # a Ray driver reads what its workers recorded
    driver.recount(
        [
            {"step": 1, "steps_without_signal": 0, "training_reward": 0.4},
            {"step": 2, "steps_without_signal": 1, "training_reward": 0.0},
            {"step": 3, "steps_without_signal": 2, "training_reward": 0.0},
            {"step": 4, "steps_without_signal": 3, "training_reward": 0.0},
        ]
    )
    assert driver.tripped and (driver.first_step, driver.last_step) == (2, 4)
    assert "3 consecutive steps (steps 2-4)" in driver.message()
    assert "mean reward 0.000" in driver.message()
    off = SignalWatch(0)
    for step in range(1, 50):
        flat(off, step)
    assert off.streak == 49 and not off.tripped
