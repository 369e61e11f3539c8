"""GPU tier of ``osmosis train run --ray``: NCCL between the trainer workers, and a vLLM engine
placed on the cluster as a Ray actor (TRL's ``vllm-serve``) that worker 0's TRL syncs the
weights to after each update. Skipped, with the reason named, without a CUDA device or vLLM."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip(
    "torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\""
)
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

pytestmark = [
    pytest.mark.ray,
    pytest.mark.gpu,
    pytest.mark.timeout(1800),
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="GPU tier: no CUDA device is visible here"
    ),
]

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_train_ray import options, workspace  # noqa: E402

from osmosis_ai.train.runner import run_training  # noqa: E402
from osmosis_ai.train.tiny_model import build_tiny_model  # noqa: E402
from test_train_smoke import SMOKE_CONFIG  # noqa: E402


def test_a_vllm_engine_on_the_cluster_serves_the_rollouts_and_follows_the_updates(
    ray_cluster, tmp_path: Path
):
    pytest.importorskip("vllm", reason="GPU tier: vLLM is not installed (pip install vllm)")
    model = build_tiny_model(tmp_path / "model" / "tiny")
    root = workspace(tmp_path / "ws", model, "smoke", SMOKE_CONFIG)
    result = run_training(
        options(
            root,
            "gpu",
            config="smoke",
            ray_address=ray_cluster.address,
            trainer_workers=1,
            max_steps=3,
            device="cuda",
        )
    )
    assert result.status == "success" and result.steps_done == 3
    log = (result.run_dir / "logs.txt").read_text()
    assert "vLLM engine ready at" in log and "NCCL on GPUs" in log
    records = [json.loads(line) for line in (result.run_dir / "metrics.jsonl").open()]
    assert [r["rollouts"] for r in records] == [16] * 3
