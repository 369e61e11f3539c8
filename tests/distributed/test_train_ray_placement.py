"""``osmosis train run --ray`` never waits on placement for ever, on the local two-node
cluster: on a cluster given by address, a request it can never hold fails at once, naming
both sides; an error of Ray Train's controller (a worker group that did not get its
resources in time) ends the run with that error; a Ctrl-C before the first step ends the
command at once; the demo's 2 x 2 topology runs on a cluster the command starts itself."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

sys.path.insert(0, str(Path(__file__).resolve().parent))

from test_train_ray import options, workspace

from osmosis_ai.train.errors import RayTrainError
from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import SMOKE_CONFIG

OSMOSIS = [sys.executable, "-m", "osmosis_ai.cli.main"]

# no warm-up and no validations: the run reaches placement in seconds
QUICK_CONFIG = SMOKE_CONFIG.replace("sft_steps = 5", "sft_steps = 0").replace(
    "eval_interval = 2", "eval_interval = 0"
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("placement-model") / "tiny")


@pytest.fixture
def quick(tmp_path: Path, model_dir: Path) -> Path:
    root = workspace(tmp_path, model_dir, "quick", QUICK_CONFIG)
    assert "sft_steps = 0" in QUICK_CONFIG and "eval_interval = 0" in QUICK_CONFIG
    return root


@pytest.fixture
def cpus_held(ray_cluster) -> Iterator[None]:
    """Other work holds 1.5 of each node's 2 CPUs: a rollout server (0.25 CPU) still fits,
    a trainer worker (1 CPU) waits for one."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    @ray.remote(num_cpus=1.5)
    class Holder:
        def ready(self) -> bool:
            return True

    holders = [
        Holder.options(
            scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False)
        ).remote()
        for n in ray_cluster.connection.nodes()
    ]
    assert ray.get([h.ready.remote() for h in holders], timeout=60) == [True] * len(holders)
    try:
        yield
    finally:
        for holder in holders:
            ray.kill(holder)


def cli_env(ray_cluster, **extra: str) -> dict[str, str]:
    env = {**os.environ, "RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": ray_cluster.cluster.auth_token}
    env.pop("RAY_ADDRESS", None)
    return env | extra


def train_command(root: Path, name: str, *ray: str) -> list[str]:
    config = root / "configs" / "training" / "quick.toml"
    return [*OSMOSIS, "train", "run", str(config), "--name", name, "--threads", "1", *ray]


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_an_infeasible_request_on_a_cluster_by_address_fails_at_once_in_the_cli(
    ray_cluster, quick: Path
):
    nodes = ray_cluster.connection.nodes()
    cpus = sum(float(n["Resources"].get("CPU", 0)) for n in nodes)
    assert cpus < 16  # 16 trainer workers (one per completion of a step) cannot fit
    command = train_command(
        quick, "too-big", "--ray", ray_cluster.address, "--trainer-workers", "16"
    )
    command += ["--rollout-servers", "2", "--json"]
    began = time.monotonic()
    done = subprocess.run(
        command,
        check=False,
        cwd=quick,
        env=cli_env(ray_cluster),
        capture_output=True,
        text=True,
        timeout=240,
    )
    elapsed = time.monotonic() - began
    print(f"the infeasible request failed after {elapsed:.1f}s (command start to exit)")
    assert done.returncode == 1, done.stderr[-3000:]
    envelope = json.loads(done.stderr.strip().splitlines()[-1])
    error = envelope["error"]
    assert error["details"]["error_type"] == "PlacementError", error
    message = error["message"]
    assert "16 trainer worker(s) × 1 CPU and 2 rollout server(s) × 0.25 CPU" in message
    assert f"{len(nodes)} node(s) with {cpus:g} CPU, 0 GPU in all" in message
    status = json.loads((quick / ".osmosis" / "training" / "too-big" / "run.json").read_text())
    assert status["status"] == "failed"
    log = (quick / ".osmosis" / "training" / "too-big" / "logs.txt").read_text()
    assert "starting 2 rollout server(s)" not in log  # it failed before placing anything


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_a_worker_group_that_cannot_be_placed_ends_the_run_with_ray_trains_error(
    ray_cluster, quick: Path, cpus_held: None, monkeypatch: pytest.MonkeyPatch
):
    monkeypatch.setenv("RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S", "5")
    began = time.monotonic()
    with pytest.raises(RayTrainError) as caught:
        run_training(
            options(
                quick,
                "unplaced",
                config="quick",
                ray_address=ray_cluster.address,
                trainer_workers=2,
                rollout_servers=1,
            )
        )
    elapsed = time.monotonic() - began
    print(f"the run ended {elapsed:.1f}s after it began (worker group start deadline 5s)")
    assert caught.value.ray_error == "WorkerGroupStartupTimeoutError"
    message = str(caught.value)
    assert "Ray Train ended the run with WorkerGroupStartupTimeoutError" in message
    assert "2 trainer worker(s) × 1 CPU did not get their resources within 5s" in message
    run_dir = quick / ".osmosis" / "training" / "unplaced"
    assert json.loads((run_dir / "run.json").read_text())["status"] == "failed"
    log = (run_dir / "logs.txt").read_text()
    assert "rollout server 0 started" in log  # the servers fit beside the held CPUs


@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ctrl_c_while_the_worker_group_waits_ends_the_command_at_once(
    ray_cluster, quick: Path, cpus_held: None
):
    command = train_command(quick, "waiting", "--ray", ray_cluster.address)
    command += ["--trainer-workers", "2", "--rollout-servers", "1", "--plain"]
    env = cli_env(ray_cluster, RAY_TRAIN_WORKER_GROUP_START_TIMEOUT_S="120")
    proc = subprocess.Popen(
        command, cwd=quick, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    lines: list[tuple[float, str]] = []
    placing = threading.Event()

    def read_stderr() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            lines.append((time.monotonic(), line))
            if "placing 2 trainer worker(s)" in line:
                placing.set()

    reader = threading.Thread(target=read_stderr, daemon=True)
    reader.start()
    try:
        assert placing.wait(180), "".join(line for _, line in lines)[-3000:]
        time.sleep(2.0)  # Ray Train's controller is waiting for the workers' CPUs
        began = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=120)
        elapsed = time.monotonic() - began
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    reader.join(10)
    assert proc.stdout is not None
    out = proc.stdout.read()
    ended = [at for at, line in lines if "interrupted before the first step" in line]
    assert ended, "".join(line for _, line in lines)[-3000:]
    print(f"Ctrl-C to the run's end {ended[0] - began:.1f}s, to the command's exit {elapsed:.1f}s")
    assert proc.returncode == 130, "".join(line for _, line in lines)[-3000:]
    assert "Interrupted waiting after 0/" in out, out
    assert not any("finish the step, then save" in line for _, line in lines)
    status = json.loads((quick / ".osmosis" / "training" / "waiting" / "run.json").read_text())
    assert status["status"] == "interrupted"


@pytest.mark.ray
@pytest.mark.timeout(600)
def test_the_demo_topology_starts_on_a_cluster_the_command_starts(ray_cluster, tmp_path: Path):
    """``osmosis train run --demo --ray --trainer-workers 2 --rollout-servers 2``: a
    one-node cluster of this machine's CPUs (2 here: the command declares the 3 it needs)
    runs the demo's steps. (The session cluster keeps running beside it, as another user's
    would; the whole 200-step demo is measured by hand.)"""
    command = [*OSMOSIS, "train", "run", "--demo", "--demo-dir", str(tmp_path / "demo"), "--ray"]
    command += ["--trainer-workers", "2", "--rollout-servers", "2", "--max-steps", "2", "--plain"]
    began = time.monotonic()
    done = subprocess.run(
        command,
        check=False,
        cwd=tmp_path,
        env=cli_env(ray_cluster),
        capture_output=True,
        text=True,
        timeout=540,
    )
    elapsed = time.monotonic() - began
    print(f"the demo's 2 x 2 topology, two steps: {elapsed:.1f}s from the command to its exit")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "2/2 steps" in done.stdout, done.stdout
    assert "1 node(s); 2 trainer worker(s) (gloo on CPU) over 2 rollout server(s)" in done.stderr
    assert "rollout server 1 started" in done.stderr
    assert "trainer workers placed: 2" in done.stderr
    runs = list((tmp_path / "demo" / ".osmosis" / "training").iterdir())
    records = (runs[0] / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["rollouts"] for line in records] == [64, 64]  # both workers' halves
