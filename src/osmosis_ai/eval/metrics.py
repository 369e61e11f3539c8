"""Run metrics over the indexed attempts (reference §5.7, as the platform worker computes them).

Pass rate over non-skipped items, reward statistics, and the unbiased pass@k estimator over
rows with several runs. Every number produced is finite, so the output is always valid JSON.
"""

from __future__ import annotations

import math
import statistics
import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import asdict, dataclass
from typing import Protocol

from pydantic import JsonValue

from osmosis_ai.errors import UsageError


class ScoredItem(Protocol):
    """What metrics read from an indexed attempt (a journal record or an index entry)."""

    @property
    def row_index(self) -> int: ...
    @property
    def status(self) -> str: ...
    @property
    def reward(self) -> float | None: ...
    @property
    def tokens(self) -> int | None: ...


@dataclass(frozen=True, slots=True)
class RewardStats:
    """Statistics of the numeric rewards; ``std`` is the population standard deviation."""

    mean: float
    median: float
    std: float
    min: float
    max: float

    def to_json(self) -> dict[str, JsonValue]:
        return asdict(self)


@dataclass(frozen=True, slots=True)
class PassAtK:
    """One point of the pass@k curve."""

    k: int
    value: float


@dataclass(frozen=True, slots=True)
class EvalMetrics:
    """The ``summary`` block of ``metrics.json`` and of the ``eval.run`` JSON result."""

    total_samples: int
    completed_samples: int
    graded: int
    passed: int
    failed: int
    skipped: int
    pass_rate: float
    pass_threshold: float
    tokens_used: int
    reward_stats: RewardStats | None = None
    n_runs: int | None = None
    pass_at_k: tuple[PassAtK, ...] | None = None

    def to_json(self) -> dict[str, JsonValue]:
        """Every field in declaration order; the optional ones only when present."""
        data = {key: value for key, value in asdict(self).items() if value is not None}
        if "pass_at_k" in data:
            data["pass_at_k"] = list(data["pass_at_k"])
        return data


def aggregate_metrics(
    index_records: Iterable[ScoredItem], pass_threshold: float, n_runs: int
) -> EvalMetrics:
    """Aggregate the selected attempt of every indexed work item.

    ``completed_samples`` excludes skipped items and is the pass-rate denominator; ``graded``
    counts numeric rewards; an item passes when its reward is at least ``pass_threshold`` (a
    failed item without a reward is a non-pass). ``n_runs`` and ``pass_at_k`` appear only
    when ``n_runs >= 2``; pass@k for k = 1, 2, 4, … ≤ ``n_runs`` averages the per-row
    unbiased estimate over rows with at least k non-skipped attempts, and is emitted only
    with two points or more.
    """
    if not math.isfinite(pass_threshold):
        raise UsageError(f"pass_threshold must be a finite number, got {pass_threshold!r}")
    if n_runs < 1:
        raise UsageError(f"n_runs must be at least 1, got {n_runs}")
    total = graded = passed = failed = skipped = tokens_used = 0
    rewards: list[float] = []
    attempts: dict[int, int] = {}
    passes: dict[int, int] = {}
    for item in index_records:
        total += 1
        if item.tokens is not None:
            tokens_used += item.tokens
        if item.status == "skipped":
            skipped += 1
            continue
        if item.status == "failed":
            failed += 1
        reward = item.reward
        is_pass = False
        if reward is not None and math.isfinite(reward):
            graded += 1
            rewards.append(float(reward))
            is_pass = reward >= pass_threshold
            passed += int(is_pass)
        attempts[item.row_index] = attempts.get(item.row_index, 0) + 1
        passes[item.row_index] = passes.get(item.row_index, 0) + int(is_pass)
    completed = total - skipped
    points = _pass_at_k_points(attempts, passes, n_runs) if n_runs >= 2 else ()
    return EvalMetrics(
        total_samples=total,
        completed_samples=completed,
        graded=graded,
        passed=passed,
        failed=failed,
        skipped=skipped,
        pass_rate=passed / completed if completed else 0.0,
        pass_threshold=float(pass_threshold),
        tokens_used=tokens_used,
        reward_stats=_reward_stats(rewards) if rewards else None,
        n_runs=n_runs if n_runs >= 2 else None,
        pass_at_k=points if len(points) >= 2 else None,
    )


def pass_at_k(attempts: int, passes: int, k: int) -> float:
    """Unbiased pass@k of one row: ``1 - C(attempts - passes, k) / C(attempts, k)``."""
    if not (0 <= passes <= attempts and 1 <= k <= attempts):
        raise UsageError(
            f"pass@k needs 0 <= passes <= attempts and 1 <= k <= attempts, got "
            f"attempts={attempts}, passes={passes}, k={k}"
        )
    if attempts - passes < k:
        return 1.0
    return 1.0 - math.comb(attempts - passes, k) / math.comb(attempts, k)


def _pass_at_k_points(
    attempts: dict[int, int], passes: dict[int, int], n_runs: int
) -> tuple[PassAtK, ...]:
    points: list[PassAtK] = []
    k = 1
    while k <= n_runs:
        values = [
            pass_at_k(attempts[row], passes[row], k)
            for row in sorted(attempts)
            if attempts[row] >= k
        ]
        if values:
            points.append(PassAtK(k=k, value=statistics.fmean(values)))
        k *= 2
    return tuple(points)


# Rewards this large are scaled by a power of two (exact) before the statistics, so that sums and
# squares cannot overflow to infinity.
_SCALE_FROM = 2.0**500


def _reward_stats(rewards: Sequence[float]) -> RewardStats:
    largest = max(abs(r) for r in rewards)
    exponent = math.frexp(largest)[1] if largest >= _SCALE_FROM else 0
    scaled = [math.ldexp(r, -exponent) for r in rewards]

    def stat(fn: Callable[[list[float]], float]) -> float:
        value = fn(scaled)
        try:
            value = math.ldexp(value, exponent)
        except OverflowError:
            value = math.copysign(sys.float_info.max, value)
        return value if math.isfinite(value) else 0.0

    return RewardStats(
        mean=stat(statistics.fmean),
        median=stat(statistics.median),
        std=stat(statistics.pstdev) if len(rewards) > 1 else 0.0,
        min=min(rewards),
        max=max(rewards),
    )
