"""``osmosis train run --ray`` on the local two-node cluster: two trainer workers (gloo DDP
on CPU), each with its own policy, over a fleet of rollout servers, train the tiny model on
the copy-digit template as one process does. Faults and changes: a trainer worker killed
with -9 restarts the group from its last state; a rollout server killed mid-step loses and
doubles no sample; a node that joins gets a rollout server, and one that leaves is dropped;
Ctrl-C on the driver finishes the step, saves, and ``--resume`` continues."""

from __future__ import annotations

import json
import math
import os
import re
import signal
import sys
import threading
import time
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.events import StepEvent
from osmosis_ai.train.plan import TrainRunOptions
from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import LEARNING_CONFIG, LEARNING_MARGIN, LEARNING_WINDOW, SMOKE_CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

# The Ray run and the one-process run share seed and data order but not the sampler's random
# draws (two workers draw their halves of a step apart), and the one process is not
# repeatable either (its policy batches requests as they arrive): over repeated runs its
# last-window mean reward ended at 0.38-0.58, the two workers' at 0.54-0.61, so two such
# ends differ by up to about 0.25.
CURVE_TOLERANCE = 0.3


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ray-model") / "tiny")


def workspace(root: Path, model_dir: Path, name: str, config: str) -> Path:
    setup_workspace(root)
    (root / "models").mkdir(exist_ok=True)
    link = root / "models" / "tiny"
    if not link.exists():
        link.symlink_to(model_dir)
    (root / "configs" / "training" / f"{name}.toml").write_text(config)
    return root


def options(
    root: Path, name: str, config: str | None = None, **overrides: object
) -> TrainRunOptions:
    """Run ``name`` of ``configs/training/<config>.toml`` (``config``: ``name``)."""
    values: dict[str, object] = {
        "config_path": root / "configs" / "training" / f"{config or name}.toml",
        "cwd": root,
        "eval_rows": 4,
        "torch_threads": 1,
        "handle_signals": False,
        "name": name,
    }
    values.update(overrides)
    return TrainRunOptions(**values)  # type: ignore[arg-type]


def metrics(run_dir: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def rewards_of(run_dir: Path) -> list[float]:
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    return [json.loads(line)["training_reward"] for line in lines]


def window_means(rewards: list[float]) -> tuple[float, float]:
    return (
        sum(rewards[:LEARNING_WINDOW]) / LEARNING_WINDOW,
        sum(rewards[-LEARNING_WINDOW:]) / LEARNING_WINDOW,
    )


# At lr 1e-3 Adam's first update moves every weight of the warmed model by about 1e-3: on
# some batches that flattens the policy (entropy 3.2 -> 5.4) until no group of 64 samples
# scores, and with no signal left the run never recovers, one process or two workers alike.
# A 5-step learning-rate ramp keeps the first updates small; both runs below use it.
RAMPED_CONFIG = LEARNING_CONFIG.replace("seed = 0\n", "seed = 0\nlr_warmup_steps = 5\n")


def test_two_trainer_workers_raise_the_reward_as_one_process_does(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    assert "lr_warmup_steps = 5" in RAMPED_CONFIG
    root = workspace(tmp_path, model_dir, "learn", RAMPED_CONFIG)
    one = run_training(options(root, "one", config="learn"))
    ray = run_training(
        options(
            root,
            "two",
            config="learn",
            ray_address=ray_cluster.address,
            trainer_workers=2,
            resume_every=40,
        )
    )
    assert one.status == ray.status == "success"
    assert ray.steps_done == one.steps_done == 40
    records = metrics(ray.run_dir)
    assert [r["step"] for r in records] == list(range(1, 41))
    assert all(r["rollouts"] == 64 for r in records)  # both workers' halves counted, once
    single, double = rewards_of(one.run_dir), rewards_of(ray.run_dir)
    assert all(isinstance(r, float) and math.isfinite(r) for r in double)
    first, last = window_means(double)
    one_first, one_last = window_means(single)
    print(
        f"one process {one_first:.3f} -> {one_last:.3f}; two Ray workers {first:.3f} -> "
        f"{last:.3f}; {one.duration_ms / 1000:.0f}s vs {ray.duration_ms / 1000:.0f}s"
    )
    assert last >= first + LEARNING_MARGIN, f"no learning on Ray: {double}"
    assert abs(first - one_first) <= CURVE_TOLERANCE  # the same warmed policy at the start
    # One-sided: the two workers must learn at least as well as one process does (a one
    # process run that ended low, 0.27 once, is no failure of the Ray path).
    assert last >= one_last - CURVE_TOLERANCE
    assert ray.plot_path is not None and ray.plot_path.is_file()
    assert (ray.run_dir / "checkpoints" / "step-000040" / "config.json").is_file()
    log = (ray.run_dir / "logs.txt").read_text()
    assert "trainer worker 0 of 2 started" in log and "trainer worker 1 of 2 started" in log
    nodes = set(re.findall(r'trainer worker \d of 2 started .*"node":"([\d.]+)"', log))
    assert nodes <= {"127.0.0.2", "127.0.0.3"}, nodes  # cluster traffic stays on loopback


def test_a_killed_trainer_worker_restarts_the_run_from_its_checkpoint(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    root = workspace(tmp_path, model_dir, "smoke", SMOKE_CONFIG)
    run_dir = root / ".osmosis" / "training" / "fault"
    killed: list[int] = []

    def kill_worker_one(event: object) -> None:
        if killed or not isinstance(event, StepEvent) or event.step != 3:
            return
        found = re.findall(
            r'trainer worker 1 of 2 started .*"pid":(\d+)', (run_dir / "logs.txt").read_text()
        )
        killed.append(int(found[-1]))
        os.kill(killed[-1], signal.SIGKILL)

    result = run_training(
        options(
            root,
            "fault",
            config="smoke",
            ray_address=ray_cluster.address,
            trainer_workers=2,
            max_steps=6,
        ),
        kill_worker_one,
    )
    assert killed, "the run never reached step 3"
    assert result.status == "success" and result.steps_done == 6
    log = (run_dir / "logs.txt").read_text()
    restart = re.search(
        r"the trainer workers restarted after a failure \(start 2 of this invocation\): "
        r"resuming after step (\d+) \(checkpoint-\d+\)",
        log,
    )
    assert restart is not None, log[-3000:]
    resumed_after = int(restart.group(1))
    assert 2 <= resumed_after < 6  # the state is saved every step (resume_every 1)
    records = metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]  # each step recorded once
    assert len(result.rewards) == 6
    names = sorted(p.name for p in (run_dir / "checkpoints").iterdir())
    assert names[-1] == "step-000006"
    assert len(re.findall(r"trainer worker 1 of 2 started", log)) == 2


SLOW_CONFIG = (
    SMOKE_CONFIG.replace('rollout = "copy-digit"', 'rollout = "copy-digit-slow"').replace(
        "eval_interval = 2", "eval_interval = 0"
    )
    + '\n[env]\nCOPY_DIGIT_DELAY_S = "2"\n'
)


def on_fleet(address: str, root: Path, name: str, **extra: object) -> TrainRunOptions:
    """``slow.toml`` on the cluster at ``address``: 2 trainer workers over 2 rollout servers."""
    return options(
        root,
        name,
        config="slow",
        ray_address=address,
        trainer_workers=2,
        rollout_servers=2,
        **extra,
    )


def slow_rollout(root: Path) -> None:
    """The template's rollout, each rollout first waiting ``COPY_DIGIT_DELAY_S`` seconds (so a
    step's rollouts are surely in flight when a server is killed), and while the file
    ``COPY_DIGIT_GATE`` names exists (so a run waits for a change of the cluster however slow
    the machine is)."""
    source = (root / "rollouts" / "copy-digit" / "main.py").read_text()
    call = "        completion = await post_json("
    assert call in source and "import os\n" in source
    slow = source.replace("import os\n", "import asyncio\nimport os\n").replace(
        call,
        "        await asyncio.sleep(float(os.environ.get('COPY_DIGIT_DELAY_S', '0')))\n"
        "        gate = os.environ.get('COPY_DIGIT_GATE')\n"
        "        while gate and os.path.exists(gate):\n"
        "            await asyncio.sleep(0.05)\n"
        "        print('slow rollout served', flush=True)\n" + call,
    )
    (root / "rollouts" / "copy-digit-slow").mkdir()
    (root / "rollouts" / "copy-digit-slow" / "main.py").write_text(slow)


def test_a_rollout_server_killed_mid_step_loses_and_doubles_no_sample(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    root = workspace(tmp_path, model_dir, "slow", SLOW_CONFIG)
    slow_rollout(root)
    run_dir = root / ".osmosis" / "training" / "server-fault"
    killed: list[int] = []

    def kill_server_one() -> None:
        time.sleep(1.0)  # step 3's rollouts are waiting out their 2 s
        found = re.findall(r"rollout server 1 started: \S+ on node \S+ \(pid (\d+)\)", log())
        killed.append(int(found[-1]))
        os.kill(killed[-1], signal.SIGKILL)

    def log() -> str:
        return (run_dir / "logs.txt").read_text()

    def on_event(event: object) -> None:
        if not killed and isinstance(event, StepEvent) and event.step == 2:
            threading.Thread(target=kill_server_one, daemon=True).start()

    result = run_training(
        on_fleet(ray_cluster.address, root, "server-fault", max_steps=6), on_event
    )
    assert killed, "the run never reached step 2"
    assert result.status == "success" and result.steps_done == 6
    records = metrics(run_dir)
    assert [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    # every step: its 16 rollouts (4 prompts x 4 samples over both workers), each counted once
    assert [r["rollouts"] for r in records] == [16] * 6
    assert all(r["failed_rollouts"] == 0 for r in records), records
    text = log()
    assert re.search(r"rollout server 1 \(\S+, node \S+\) died", text), text[-3000:]
    # a trainer worker saw it die under its rollouts in flight (mid-step), not between steps
    assert re.search(r"\[worker-\d\] rollout server http\S+ died", text), text[-3000:]
    assert re.search(r"rollout server 2 replaced server 1: \S+ on node \S+", text), text[-3000:]


def test_a_node_that_joins_gets_a_rollout_server_and_one_that_leaves_is_dropped(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    gate = tmp_path / "node-joining"  # step 3's rollouts wait while it exists
    config = SLOW_CONFIG.replace('"2"', '"1"').replace("total_epochs = 4", "total_epochs = 8")
    config += f'COPY_DIGIT_GATE = "{gate}"\n'
    root = workspace(tmp_path, model_dir, "slow", config)
    slow_rollout(root)
    run_dir = root / ".osmosis" / "training" / "elastic"
    cluster = ray_cluster.cluster
    added: list[int] = []
    left = threading.Event()
    threads: list[threading.Thread] = []

    def log() -> str:
        return (run_dir / "logs.txt").read_text()

    def joined() -> re.Match[str] | None:
        return re.search(
            rf"rollout server (\d+) joined with its node: \S+ on node {NEW_NODE}", log()
        )

    def served_by_new_node() -> list[str]:
        found = joined()
        if found is None:
            return []
        return re.findall(rf"\[rollout-server-{found.group(1)}\] slow rollout served", log())

    def add_node() -> None:
        try:
            added.append(cluster.add_node(NEW_NODE))
            deadline = time.monotonic() + 120
            while joined() is None and time.monotonic() < deadline:
                time.sleep(0.2)
        finally:
            gate.unlink(missing_ok=True)  # the run goes on, with the new node's server

    def on_event(event: object) -> None:
        if not isinstance(event, StepEvent):
            return
        if event.step == 2 and not threads:
            gate.touch()
            threads.append(threading.Thread(target=add_node, daemon=True))
            threads[-1].start()
        # the node leaves once its server has served a step's rollouts
        if added and not left.is_set() and served_by_new_node():
            left.set()
            threading.Thread(target=cluster.stop_node, args=(added[0],), daemon=True).start()

    try:
        result = run_training(
            on_fleet(ray_cluster.address, root, "elastic", max_steps=14), on_event
        )
    finally:
        for thread in threads:
            thread.join(timeout=180)
        gate.unlink(missing_ok=True)
        if added:
            cluster.stop_node(added[0])  # (the session's other tests expect two nodes)
    assert added and left.is_set(), "the node was not added and stopped in time"
    assert result.status == "success" and result.steps_done == 14
    records = metrics(run_dir)
    assert [r["rollouts"] for r in records] == [16] * 14  # none lost, none counted twice
    assert all(r["failed_rollouts"] == 0 for r in records), records
    text = log()
    found = joined()
    assert found is not None, text[-3000:]
    server = found.group(1)
    served = served_by_new_node()
    assert served, "the new node's server got no rollout"
    assert re.search(rf"rollout server {server} \(\S+, node {NEW_NODE}\) died", text)
    assert "replaced server" not in text  # it went with its node: dropped, not replaced
    print(f"the joined node's server ran {len(served)} rollouts")


NEW_NODE = "127.0.0.4"


def test_ctrl_c_on_the_driver_finishes_the_step_saves_and_resumes(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    root = workspace(tmp_path, model_dir, "slow", SLOW_CONFIG.replace('"2"', '"0.5"'))
    slow_rollout(root)
    sent: list[int] = []

    def interrupt(event: object) -> None:
        if not sent and isinstance(event, StepEvent) and event.step == 2:
            sent.append(event.step)
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C, to this (the driver's) process

    stopped = run_training(
        on_fleet(ray_cluster.address, root, "ctrl-c", handle_signals=True, max_steps=10), interrupt
    )
    assert sent and stopped.status == "interrupted"
    last = stopped.steps_done
    assert 2 < last < 10, last  # the workers finished the step in flight, then stopped
    run_dir = stopped.run_dir
    assert (run_dir / "checkpoints" / f"step-{last:06d}" / "config.json").is_file()
    assert (run_dir / "resume" / f"checkpoint-{last}" / "trainer_state.json").is_file()
    assert json.loads((run_dir / "run.json").read_text())["status"] == "interrupted"
    assert (
        "stop requested: the trainer workers finish the step, then save"
        in (run_dir / "logs.txt").read_text()
    )
    done = run_training(
        on_fleet(ray_cluster.address, root, "ctrl-c", resume=True, max_steps=last + 2)
    )
    assert done.status == "success" and done.steps_done == last + 2
    assert [r["step"] for r in metrics(run_dir)] == list(range(1, last + 3))
