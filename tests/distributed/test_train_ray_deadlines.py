"""The trainer step deadline on Ray: a trainer worker stopped with SIGSTOP leaves its peer
waiting in gloo's allreduce; the peer's step deadline ends its step, and the driver ends
the run with ``TrainerStepStalledError`` (with ``max_failures = 0``: no restart), within
twice the deadline (``pytest -s`` prints the time: 50 s for a 30 s deadline here)."""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_train_ray import options, workspace

from osmosis_ai.deadlines import TRAIN_STEP
from osmosis_ai.train.errors import TrainerStepStalledError
from osmosis_ai.train.events import StepEvent
from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import SMOKE_CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

NO_RESTART = (
    SMOKE_CONFIG.replace("eval_interval = 2", "eval_interval = 0")
    + "\n[advanced.ray]\nmax_failures = 0\n"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ray-deadline-model") / "tiny")


def test_a_stopped_trainer_worker_ends_the_run_with_trainer_step_stalled(
    ray_cluster: Any, tmp_path: Path, model_dir: Path, monkeypatch: pytest.MonkeyPatch
):
    deadline = 30.0
    monkeypatch.setenv(TRAIN_STEP.setting, str(deadline))  # the driver's, handed to workers
    root = workspace(tmp_path, model_dir, "stall", NO_RESTART)
    run_dir = root / ".osmosis" / "training" / "stall"
    stopped: list[tuple[int, float]] = []

    def stop_worker_one(event: object) -> None:
        if stopped or not isinstance(event, StepEvent) or event.step != 2:
            return
        found = re.findall(
            r'trainer worker 1 of 2 started .*"pid":(\d+)', (run_dir / "logs.txt").read_text()
        )
        os.kill(int(found[-1]), signal.SIGSTOP)
        stopped.append((int(found[-1]), time.monotonic()))

    try:
        with pytest.raises(TrainerStepStalledError) as caught:
            run_training(
                options(
                    root,
                    "stall",
                    ray_address=ray_cluster.address,
                    trainer_workers=2,
                    max_steps=6,
                ),
                stop_worker_one,
            )
        ended = time.monotonic()
    finally:
        for pid, _ in stopped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
    assert stopped, "the run never reached step 2"
    print(
        f"\n[deadline] trainer step on Ray (a worker SIGSTOPped): deadline {deadline:g}s, "
        f"named error on the driver {ended - stopped[0][1]:.2f}s after the stop"
    )
    error = caught.value
    assert (error.stage, error.deadline_s, error.setting) == (
        "trainer step",
        deadline,
        TRAIN_STEP.setting,
    )
    # worker 0 waits on worker 1 in step 2's end-of-step work (its save's barrier, the stop
    # vote's allreduce) or in step 3's gradient allreduce, as the stop lands
    assert re.search(r"training step [23] computed for", str(error)), str(error)
    log = (run_dir / "logs.txt").read_text()
    assert "training failed: TrainerStepStalledError" in log
