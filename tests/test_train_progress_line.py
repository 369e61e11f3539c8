"""The per-step progress line of ``osmosis train run`` (plain ``→`` lines and the rich bar's
status): the reward, failed rollouts, and the mean staleness when training asynchronously."""

from __future__ import annotations

from osmosis_ai.cli.commands.train_run import _reward_text  # pyright: ignore[reportPrivateUsage]
from osmosis_ai.train.events import StepEvent


def line(**metrics: object) -> str:
    return _reward_text(StepEvent(step=3, total=10, metrics=dict(metrics), elapsed_s=1.0))


def test_a_synchronous_step_shows_no_staleness():
    assert line(training_reward=0.5) == "reward 0.500"
    assert line(training_reward=0.5, max_staleness=0, staleness_mean=0.0) == "reward 0.500"
    assert line(training_reward=None, failed_rollouts=2) == "reward n/a, 2 failed"


def test_an_asynchronous_step_shows_its_mean_staleness():
    shown = line(training_reward=0.5, max_staleness=2, staleness_mean=1.25, failed_rollouts=1)
    assert shown == "reward 0.500, stale 1.25, 1 failed"


def test_a_missing_or_non_finite_staleness_is_left_out():
    assert line(training_reward=0.5, max_staleness=2) == "reward 0.500"
    assert line(training_reward=0.5, max_staleness=2, staleness_mean=float("nan")) == (
        "reward 0.500"
    )
    assert line(training_reward=0.5, max_staleness=2, staleness_mean=None) == "reward 0.500"
