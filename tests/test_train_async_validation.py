"""Validation beside asynchronous training, through the full path on the tiny model: with
``max_staleness = 1`` a validation runs on a policy copy pinned at the step it validates
while training goes on, and the next step's rollouts are still dispatched ahead."""

from __future__ import annotations

from pathlib import Path

import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("trl", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")

from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.plan import TrainRunOptions
from osmosis_ai.train.runner import run_training
from osmosis_ai.train.tiny_model import build_tiny_model
from test_train_smoke import SMOKE_CONFIG, metrics

# the smoke run's shape, validated every 2 steps
CONFIG = SMOKE_CONFIG.replace("[training]\n", "[training]\nmax_staleness = {staleness}\n")


def run(tmp_path: Path, staleness: int, steps: int):
    setup_workspace(tmp_path)
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "tiny").symlink_to(build_tiny_model(tmp_path / "tiny"))
    config = tmp_path / "configs" / "training" / "async.toml"
    config.write_text(CONFIG.format(staleness=staleness))
    options = TrainRunOptions(
        config_path=config,
        cwd=tmp_path,
        eval_rows=4,
        eval_samples=2,
        torch_threads=1,
        handle_signals=False,
        max_steps=steps,
        name=f"async-{staleness}",
    )
    result = run_training(options)
    return result, metrics(result.run_dir)


def test_validation_runs_beside_training_on_the_version_it_validates(tmp_path: Path):
    result, records = run(tmp_path, staleness=1, steps=6)
    assert result.status == "success" and [r["step"] for r in records] == [1, 2, 3, 4, 5, 6]
    summaries = {v.step: v for v in result.validations}
    assert sorted(summaries) == [0, 2, 4, 6]
    # step 0 and the final one as before; the others answered by their pinned copy
    assert [summaries[s].policy_version for s in (0, 2, 4, 6)] == [None, 2, 4, None]
    assert all(v.rollouts == 8 and v.scored == 8 for v in result.validations)
    recorded = [r for r in records if "validation_policy_version" in r]
    assert recorded and recorded[0]["validation_policy_version"] == 2
    for record in recorded:  # each in a later step's record, with its own values
        summary = summaries[record["validation_policy_version"]]
        assert record["step"] > summary.step
        assert record["validation_reward"] == summary.mean_reward
        assert record["validation_pass_rate"] == summary.pass_rate
    # dispatch ahead went on across the validations: the rollouts of steps 3 and 5 started
    # before the trainer asked for them, on the policy of the step before (whether a sample
    # was made before that step's update synced depends on speed: at least one was)
    for record in (records[2], records[4]):
        assert record["rollout_wait_seconds"] < record["rollout_seconds"]
        assert record["max_staleness"] == 1
    assert max(records[2]["staleness_mean"], records[4]["staleness_mean"]) > 0


def test_synchronous_runs_keep_their_validation_records(tmp_path: Path):
    result, records = run(tmp_path, staleness=0, steps=3)
    assert [v.step for v in result.validations] == [0, 2, 3]
    assert all(v.policy_version is None for v in result.validations)
    assert records[1]["validation_reward"] == result.validations[1].mean_reward
    assert all("validation_policy_version" not in r for r in records)
    assert all(r["staleness_mean"] == 0 for r in records)
