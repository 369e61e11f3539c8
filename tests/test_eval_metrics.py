"""Metrics of a local evaluation (reference §5.7): counts, reward stats and pass@k."""

from __future__ import annotations

import json
import math
import statistics

import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.eval import JournalRecord, aggregate_metrics, pass_at_k


def rec(
    row: int,
    run: int,
    status: str = "success",
    reward: float | None = None,
    tokens: int | None = None,
):
    return JournalRecord(
        row_index=row,
        run_index=run,
        rollout_id=f"r{row}x{run}",
        status=status,  # type: ignore[arg-type]
        duration_ms=10,
        reward=reward,
        tokens=tokens,
    )


def rows_with_passes(passes: list[int], n: int) -> list[JournalRecord]:
    return [
        rec(row, run, reward=1.0 if run < p else 0.0, tokens=5)
        for row, p in enumerate(passes)
        for run in range(n)
    ]


def test_pass_at_k_on_known_per_row_pass_counts():
    # n = 4 runs per row; the rows pass 0, 1, 2 and 4 times.
    metrics = aggregate_metrics(rows_with_passes([0, 1, 2, 4], 4), pass_threshold=0.5, n_runs=4)
    # pass@1 per row = p/4: 0, 1/4, 2/4, 4/4.
    k1 = (0 + 0.25 + 0.5 + 1.0) / 4
    # pass@2 per row = 1 - C(4-p, 2)/C(4, 2) = 1 - C(4-p, 2)/6: 1-6/6, 1-3/6, 1-1/6, 1-0.
    k2 = (0.0 + 0.5 + 5 / 6 + 1.0) / 4
    # pass@4 per row = 1 - C(4-p, 4)/1: 0 for p=0, 1 otherwise.
    k4 = (0.0 + 1.0 + 1.0 + 1.0) / 4
    assert metrics.n_runs == 4
    assert metrics.pass_at_k is not None
    assert [p.k for p in metrics.pass_at_k] == [1, 2, 4]
    assert [p.value for p in metrics.pass_at_k] == pytest.approx([k1, k2, k4])
    assert k1 == 0.4375 and k4 == 0.75

    assert metrics.total_samples == 16
    assert metrics.completed_samples == 16
    assert metrics.graded == 16
    assert metrics.passed == 7
    assert metrics.failed == 0
    assert metrics.pass_rate == 7 / 16
    assert metrics.tokens_used == 80
    stats = metrics.reward_stats
    assert stats is not None
    assert stats.mean == pytest.approx(7 / 16)
    assert stats.median == 0.0  # nine zeros, seven ones
    assert stats.std == pytest.approx(math.sqrt(7 / 16 * 9 / 16))
    assert (stats.min, stats.max) == (0.0, 1.0)


def test_pass_at_k_estimator():
    assert pass_at_k(4, 0, 1) == 0.0
    assert pass_at_k(4, 4, 4) == 1.0
    assert pass_at_k(5, 2, 2) == pytest.approx(1 - math.comb(3, 2) / math.comb(5, 2))
    assert pass_at_k(4, 3, 2) == 1.0  # fewer failures than k: every k-draw holds a pass
    with pytest.raises(UsageError):
        pass_at_k(2, 3, 1)
    with pytest.raises(UsageError):
        pass_at_k(2, 1, 3)


def test_counts_skip_failed_and_graded():
    records = [
        rec(0, 0, reward=0.9, tokens=10),
        rec(1, 0, "failed", tokens=3),  # failed without a reward: a non-pass
        rec(2, 0, "failed", reward=0.7),  # failed with a reward: judged by the reward
        rec(3, 0, "skipped", tokens=4),  # out of the denominator, tokens still counted
        rec(4, 0, reward=0.2),
    ]
    m = aggregate_metrics(records, pass_threshold=0.5, n_runs=1)
    assert (m.total_samples, m.completed_samples, m.skipped) == (5, 4, 1)
    assert (m.graded, m.passed, m.failed) == (3, 2, 2)
    assert m.pass_rate == 0.5
    assert m.tokens_used == 17
    assert m.reward_stats is not None
    assert m.reward_stats.median == 0.7
    assert m.reward_stats.std == pytest.approx(statistics.pstdev([0.9, 0.7, 0.2]))
    data = m.to_json()
    assert "n_runs" not in data and "pass_at_k" not in data
    assert set(data) == {
        "total_samples",
        "completed_samples",
        "graded",
        "passed",
        "failed",
        "skipped",
        "pass_rate",
        "pass_threshold",
        "tokens_used",
        "reward_stats",
    }
    assert set(data["reward_stats"]) == {"mean", "median", "std", "min", "max"}  # type: ignore[arg-type]


def test_threshold_is_inclusive_and_single_reward_has_zero_std():
    m = aggregate_metrics([rec(0, 0, reward=0.5)], pass_threshold=0.5, n_runs=1)
    assert m.passed == 1
    assert m.reward_stats is not None and m.reward_stats.std == 0.0


def test_empty_and_all_skipped_runs():
    empty = aggregate_metrics([], pass_threshold=1.0, n_runs=1)
    assert empty.to_json() == {
        "total_samples": 0,
        "completed_samples": 0,
        "graded": 0,
        "passed": 0,
        "failed": 0,
        "skipped": 0,
        "pass_rate": 0.0,
        "pass_threshold": 1.0,
        "tokens_used": 0,
    }
    skipped = aggregate_metrics([rec(0, 0, "skipped")], pass_threshold=1.0, n_runs=1)
    assert skipped.pass_rate == 0.0 and skipped.reward_stats is None


def test_pass_at_k_needs_two_points():
    # n = 2 but every row has one attempt so far: n_runs shows, pass@k (one point) does not.
    partial = aggregate_metrics([rec(0, 0, reward=1.0), rec(1, 0, reward=0.0)], 0.5, n_runs=2)
    assert partial.n_runs == 2 and partial.pass_at_k is None
    # n = 3: k over 1 and 2 only.
    m = aggregate_metrics(rows_with_passes([1, 3], 3), 0.5, n_runs=3)
    assert m.pass_at_k is not None
    assert [p.k for p in m.pass_at_k] == [1, 2]
    assert m.pass_at_k[1].value == pytest.approx((1 - math.comb(2, 2) / math.comb(3, 2) + 1) / 2)
    assert m.to_json()["pass_at_k"] == [{"k": p.k, "value": p.value} for p in m.pass_at_k]


def test_skipped_attempts_do_not_count_towards_pass_at_k():
    records = [
        rec(0, 0, reward=1.0),
        rec(0, 1, "skipped"),
        rec(1, 0, reward=0.0),
        rec(1, 1, reward=1.0),
    ]
    m = aggregate_metrics(records, 0.5, n_runs=2)
    assert m.pass_at_k is not None
    # pass@1: row 0 has one attempt (1/1), row 1 two (1/2); pass@2 only row 1 qualifies.
    assert [(p.k, p.value) for p in m.pass_at_k] == [(1, 0.75), (2, 1.0)]


def test_non_finite_never_reaches_output():
    huge = [rec(0, 0, reward=1.7e308), rec(1, 0, reward=1.7e308), rec(2, 0, reward=-1.7e308)]
    m = aggregate_metrics(huge, 0.0, n_runs=1)
    assert m.reward_stats is not None
    values = m.reward_stats.to_json().values()
    assert all(math.isfinite(v) for v in values)  # type: ignore[arg-type]
    assert m.reward_stats.mean == pytest.approx(1.7e308 / 3)
    json.dumps(m.to_json(), allow_nan=False)
    with pytest.raises(UsageError):
        aggregate_metrics([], math.nan, n_runs=1)
    with pytest.raises(UsageError):
        aggregate_metrics([], 0.5, n_runs=0)
