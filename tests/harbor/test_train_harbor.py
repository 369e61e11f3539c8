"""``osmosis train run``, unchanged, on a multiply Harbor template: a few GRPO steps
of the tiny model whose every rollout is a Harbor trial, the workflow running in the
no-network sandbox and reaching the training policy through the forwarded endpoint, the
grader as the task's verifier.

Training needs PyTorch, which this tier's Python 3.12 environment leaves out, and Harbor
needs 3.12: the trainer is the project's ``.venv`` (or ``$OSMOSIS_TRAIN_PYTHON``) and the
rollout server runs on this interpreter through ``OSMOSIS_ROLLOUT_PYTHON``.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

REPO = Path(__file__).resolve().parents[2]
# The Strands template where strands-agents installs beside this Harbor; Harbor 0.26 needs an
# mcp release (>= 2.3) that every strands-agents release refuses (< 2.2), so there it is the
# OpenAI Agents one.
TEMPLATE = (
    "multiply-harbor-strands"
    if importlib.util.find_spec("strands") is not None
    else "multiply-harbor-openai"
)
CONFIG = """
[experiment]
rollout = "{template}"
entrypoint = "main.py"
model_path = "local:models/tiny"
dataset = "multiply"

[training]
lr = 3e-4
total_epochs = 1
n_samples_per_prompt = 2
rollout_batch_size = 2
max_prompt_length = 1024
max_response_length = 16
agent_workflow_timeout_s = 120
grader_timeout_s = 60
seed = 0
no_signal_patience = 0  # the untrained tiny model never multiplies: the sandbox path is tested

[checkpoints]
eval_interval = 100
checkpoint_save_freq = 100
"""


@functools.cache
def trainer_python() -> tuple[str | None, str]:
    """A Python with the ``train`` extra, or None and why there is none."""
    candidate = os.environ.get("OSMOSIS_TRAIN_PYTHON") or str(REPO / ".venv" / "bin" / "python")
    if not Path(candidate).is_file():
        return None, (
            f"no Python with the train extra: {candidate} is missing (run `make setup`, or "
            "set OSMOSIS_TRAIN_PYTHON to one with osmosis-ai[train])"
        )
    probe = subprocess.run(
        [candidate, "-c", "import torch, trl, osmosis_ai.train"],
        capture_output=True,
        text=True,
        check=False,
    )
    if probe.returncode != 0:
        last = (probe.stderr.strip().splitlines() or ["(no output)"])[-1]
        return None, f"{candidate} cannot train: {last}"
    return candidate, ""


def run(python: str, *args: str, cwd: Path, env: dict[str, str], timeout: float = 120):
    return subprocess.run(
        [python, *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


@pytest.mark.timeout(600)
def test_train_run_steps_through_harbor_trials(tmp_path: Path):
    trainer, why = trainer_python()
    if trainer is None:
        pytest.skip(why)
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_", "VIRTUAL_ENV"))
    }
    env |= {"NO_COLOR": "1", "HOME": str(tmp_path / "home")}
    applied = run(
        sys.executable, "-m", "osmosis_ai.cli.main", "template", "apply", TEMPLATE, "--json",
        cwd=workspace, env=env,
    )  # fmt: skip
    assert applied.returncode == 0, applied.stderr
    built = run(
        trainer, "-m", "osmosis_ai.train.tiny_model", str(workspace / "models" / "tiny"),
        cwd=workspace, env=env,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (workspace / "configs" / "training" / "smoke.toml").write_text(CONFIG.format(template=TEMPLATE))

    env["OSMOSIS_ROLLOUT_PYTHON"] = sys.executable
    done = run(
        trainer, "-m", "osmosis_ai.cli.main", "--json", "train", "run",
        "configs/training/smoke.toml", "--max-steps", "2", "--eval-rows", "2",
        "--threads", "1", "--name", "harbor",
        cwd=workspace, env=env, timeout=540,
    )  # fmt: skip
    assert done.stdout.strip(), done.stderr[-3000:]
    envelope = json.loads(done.stdout)
    assert envelope["status"] == "success", envelope
    resource = envelope["resource"]
    assert resource["steps_done"] == 2
    run_dir = Path(resource["output_path"])
    assert run_dir == workspace / ".osmosis" / "training" / "harbor"
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == [1, 2]
    for record in records:
        # Every rollout of the step came back graded; the policy's tokens reached the trainer.
        assert record["rollouts"] == 4 and record["failed_rollouts"] == 0
        assert record["training_reward"] == 0.0  # 16 bytes of a random model hold no answer
        assert record["response_length"] > 0
    assert [v["scored"] for v in resource["validation"]] == [2, 2]
    assert (run_dir / "checkpoints" / "step-000002").is_dir()

    # 8 training and 4 validation rollouts, each a Harbor trial kept in the run folder: the
    # workflow ran in the sandbox and the grader wrote the verifier's reward.
    rollouts = sorted(p for p in (run_dir / "rollouts").iterdir() if p.is_dir())
    assert len(rollouts) == 12
    for rollout in rollouts:
        harbor = rollout / "harbor"
        result = json.loads((harbor / "agent" / "container_result.json").read_text())
        assert result["status"] == "success", result
        assert json.loads((harbor / "verifier" / "reward.json").read_text()) == {"reward": 0.0}
        given = json.loads((harbor / "agent" / "container_input.json").read_text())
        assert given["chat_completions_url"].startswith("http://127.0.0.1:")
        assert given["api_key"] == "<redacted>"  # the run's proxy token stays out of the files
    # The rollout server's backend, stopped with the run, left no scratch copies behind.
    task = (workspace / "rollouts" / TEMPLATE / "multiply_harbor_task").resolve()
    scratch = Path(tempfile.gettempdir()) / (
        "osmosis-harbor-" + hashlib.sha256(str(task).encode()).hexdigest()[:12]
    )
    assert not scratch.exists(), sorted(str(p) for p in scratch.rglob("*"))[:10]
