"""GPU tier: the same training path on CUDA, then with rollouts served by vLLM through TRL's
vLLM integration (``trl vllm-serve``; TRL syncs the weights over NCCL after each step), each
synchronous and asynchronous (``max_staleness = 1``: the next step's rollouts generate on
the weights there are, so a weight sync overlaps them).

Skipped, with the reason named, where no CUDA device is visible or vLLM is not installed.
"""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

torch = pytest.importorskip(
    "torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\""
)
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="GPU tier: no CUDA device is visible here"
    ),
]

from osmosis_ai.train.demo import setup_workspace  # noqa: E402
from osmosis_ai.train.plan import TrainRunOptions  # noqa: E402
from osmosis_ai.train.runner import run_training  # noqa: E402
from osmosis_ai.train.tiny_model import build_tiny_model  # noqa: E402
from test_train_smoke import SMOKE_CONFIG, metrics  # noqa: E402


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    setup_workspace(tmp_path)
    build_tiny_model(tmp_path / "models" / "tiny")
    (tmp_path / "configs" / "training" / "smoke.toml").write_text(SMOKE_CONFIG)
    return tmp_path


def options(workspace: Path, **extra: object) -> TrainRunOptions:
    return TrainRunOptions(
        config_path=workspace / "configs" / "training" / "smoke.toml",
        cwd=workspace,
        max_steps=3,
        eval_rows=4,
        device="cuda",
        handle_signals=False,
        **extra,  # type: ignore[arg-type]
    )


def asynchronous(workspace: Path, staleness: int) -> None:
    config = workspace / "configs" / "training" / "smoke.toml"
    text = config.read_text()
    config.write_text(text.replace("[training]\n", f"[training]\nmax_staleness = {staleness}\n"))


def check_staleness(records: list[dict[str, object]], staleness: int) -> None:
    for record in records:
        assert record["max_staleness"] == staleness
        assert isinstance(record["staleness_max"], int) and record["staleness_max"] <= staleness
    if staleness:
        assert all(isinstance(r["logprob_mismatch"], float) for r in records)
        assert any(float(r["staleness_mean"]) > 0 for r in records)  # type: ignore[arg-type]


@pytest.mark.parametrize("staleness", [0, 1])
def test_training_runs_on_cuda_with_the_local_policy(workspace: Path, staleness: int):
    asynchronous(workspace, staleness)
    result = run_training(options(workspace))
    assert result.status == "success" and result.steps_done == 3
    records = metrics(result.run_dir)
    assert all(isinstance(r["training_reward"], float) for r in records)
    check_staleness(records, staleness)


@pytest.mark.parametrize("staleness", [0, 1])
def test_rollouts_served_by_vllm_with_trl_weight_sync(workspace: Path, staleness: int):
    pytest.importorskip("vllm", reason="needs vLLM for the GPU serving tier")
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    model = str(workspace / "models" / "tiny")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "trl.cli",
            "vllm-serve",
            "--model",
            model,
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            "--gpu-memory-utilization",
            "0.2",
        ],
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(1)
        else:
            pytest.fail("trl vllm-serve did not become healthy within 300 s")
        asynchronous(workspace, staleness)
        result = run_training(options(workspace, vllm_server_url=f"http://127.0.0.1:{port}"))
        assert result.status == "success"
        records = metrics(result.run_dir)
        for record in records:
            assert record["failed_rollouts"] == 0
            assert record["policy_version_lag"] <= staleness
        check_staleness(records, staleness)
    finally:
        server.terminate()
        server.wait(timeout=60)
