"""``osmosis train run --ray`` with ``max_staleness = 1`` on the local two-node cluster: two
trainer workers (gloo DDP on CPU) over two rollout servers each dispatch their share of the
next step's prompts to their own copy of the policy while the step updates, sync the copy
after the optimizer step, and correct the stale tokens; the step stats are summed over the
workers, the staleness bound holds, and TRL's logprob mismatch is recorded."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from test_train_ray import metrics, options, workspace

from osmosis_ai.train.plan import TrainRunOptions
from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import SMOKE_CONFIG

pytestmark = [pytest.mark.ray, pytest.mark.timeout(900)]

# No validation between steps: a step after one is never dispatched ahead.
ASYNC_CONFIG = SMOKE_CONFIG.replace("[training]\n", "[training]\nmax_staleness = 1\n").replace(
    "eval_interval = 2", "eval_interval = 0"
)
STEPS, RESUMED_TO = 3, 5
GRADED = 'ctx.set_reward(1.0 if answer == (ctx.label or "").strip() else 0.0)'
# Partial credit by the answer's characters: the barely warmed policy's varied answers give
# every group a spread of rewards, so each step changes the weights and a stale sample's
# probabilities differ from the trained ones.
PARTIAL = "ctx.set_reward(sum(map(ord, answer)) % 5 / 4)"


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("ray-async-model") / "tiny")


def async_run(address: str, root: Path, **extra: object) -> TrainRunOptions:
    return options(
        root, "async", ray_address=address, trainer_workers=2, rollout_servers=2, **extra
    )


def test_two_workers_train_on_samples_at_most_one_version_stale(
    ray_cluster, tmp_path: Path, model_dir: Path
):
    assert "max_staleness = 1" in ASYNC_CONFIG and "eval_interval = 0" in ASYNC_CONFIG
    root = workspace(tmp_path, model_dir, "async", ASYNC_CONFIG)
    main = root / "rollouts" / "copy-digit" / "main.py"
    assert GRADED in main.read_text()
    main.write_text(main.read_text().replace(GRADED, PARTIAL))
    result = run_training(async_run(ray_cluster.address, root, max_steps=STEPS))
    assert (result.status, result.steps_done) == ("success", STEPS)
    records = metrics(result.run_dir)
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for record in records:
        assert record["rollouts"] == 16  # both workers' halves counted, once
        assert record["max_staleness"] == 1
        staleness_max = record["staleness_max"]
        assert isinstance(staleness_max, int) and 0 <= staleness_max <= 1, record
        assert isinstance(record["logprob_mismatch"], float), record
        assert isinstance(record["importance_ratio_mean"], float), record
    # step 1 has nothing dispatched ahead; a later one trained samples the copy generated
    # while the previous step updated
    assert records[0]["staleness_mean"] == 0.0
    stale = [r for r in records if float(r["staleness_mean"]) > 0]  # type: ignore[arg-type]
    assert stale, [r["staleness_mean"] for r in records]
    assert all(r["staleness_max"] == 1 for r in stale)
    assert all(float(r["grad_norm"]) > 0 for r in records)  # type: ignore[arg-type]
    # the trainer's probabilities of a stale sample's tokens are those of the weights one
    # update on (each worker's copy synced after every optimizer step), not the sampler's
    assert any(float(r["logprob_mismatch"]) > 1e-4 for r in stale)  # type: ignore[arg-type]
    log = (result.run_dir / "logs.txt").read_text()
    assert "trainer worker 1 of 2 started" in log
    assert "max_staleness 1" in log  # the workers' GRPO stage names the overlap

    # Resumed, each worker's copy takes the checkpoint's weights before the first rollouts:
    # that step's samples (none dispatched ahead) match the trained weights
    resumed = run_training(async_run(ray_cluster.address, root, resume=True, max_steps=RESUMED_TO))
    assert (resumed.status, resumed.steps_done) == ("success", RESUMED_TO)
    records = metrics(result.run_dir)
    assert [r["step"] for r in records] == list(range(1, RESUMED_TO + 1))
    first = records[STEPS]
    assert (first["staleness_mean"], first["staleness_max"]) == (0.0, 0), first
    assert float(first["logprob_mismatch"]) < 1e-4, first  # type: ignore[arg-type]
    assert all(r["staleness_max"] <= 1 for r in records[STEPS:])
