"""``osmosis train run --ray`` without a learning signal: two trainer workers whose grader
gives every answer the same reward both stop after the same step (they watch the summed step
stats alike), the lead saves, and the driver ends the run failed with
``no_learning_signal``, naming the steps, as one process does."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_train_ray import options, workspace

from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import SMOKE_CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

GRADED = 'ctx.set_reward(1.0 if answer == (ctx.label or "").strip() else 0.0)'
FLAT_CONFIG = (
    SMOKE_CONFIG.replace("no_signal_patience = 0", "no_signal_patience = 2")
    .replace("sft_steps = 5", "sft_steps = 0")
    .replace("eval_interval = 2", "eval_interval = 0")
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ray-flat-model") / "tiny")


def test_two_workers_without_a_signal_stop_together_and_the_run_fails(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    assert "no_signal_patience = 2" in FLAT_CONFIG and "sft_steps = 0" in FLAT_CONFIG
    root = workspace(tmp_path, model_dir, "flat", FLAT_CONFIG)
    main = root / "rollouts" / "copy-digit" / "main.py"
    assert GRADED in main.read_text()
    main.write_text(main.read_text().replace(GRADED, "ctx.set_reward(0.25)"))
    result = run_training(
        options(root, "flat", ray_address=ray_cluster.address, trainer_workers=2, max_steps=6)
    )
    assert (result.status, result.error, result.steps_done) == ("failed", "no_learning_signal", 2)
    assert result.error_message is not None
    assert "no learning signal for 2 consecutive steps (steps 1-2)" in result.error_message
    assert "mean reward 0.250" in result.error_message
    run_dir = root / ".osmosis" / "training" / "flat"
    manifest = json.loads((run_dir / "run.json").read_text())
    assert (manifest["status"], manifest["error"]) == ("failed", "no_learning_signal")
    records = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [(r["step"], r["steps_without_signal"]) for r in records] == [(1, 1), (2, 2)]
    assert (run_dir / "checkpoints" / "step-000002" / "config.json").is_file()
