"""Training metric names on the platform and in ``osmosis train info``'s export (reference §6.5).

A training step's record (``metrics.jsonl`` of ``osmosis train run``) names its values the
way the export shows them (``training_reward``, ``entropy``, ...). The platform stores and
answers the trainer-side keys the hosted platform uses (``rollout/raw_reward``, ...), and the
CLI maps them back, so the CLI reads this platform and the hosted one alike. Keys without a
mapping travel unchanged. Standard library only: the CLI imports it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

# export key -> platform (wire) key
WIRE_KEYS: dict[str, str] = {
    "training_reward": "rollout/raw_reward",
    "validation_reward": "eval/validation/reward",
    "entropy": "train/entropy_loss",
    "response_length": "rollout/response_lengths",
    "total_length": "rollout/total_lengths",
    "truncation_ratio": "rollout/truncated_ratio",
}
EXPORT_KEYS: dict[str, str] = {wire: key for key, wire in WIRE_KEYS.items()}
TITLES: dict[str, str] = {
    "training_reward": "Training Reward",
    "validation_reward": "Validation Reward",
    "entropy": "Model Entropy",
    "response_length": "Response Length",
    "total_length": "Total Length",
    "truncation_ratio": "Truncation Ratio",
}
# Display titles of other metrics, where the name's capitalized words would read wrong
# (asynchronous training: staleness in policy versions, the off-policy correction).
LABELS: dict[str, str] = {
    "max_staleness": "Max staleness (setting)",
    "staleness_mean": "Staleness, mean (versions)",
    "staleness_max": "Staleness, max (versions)",
    "stale_regenerated": "Stale samples regenerated",
    "logprob_mismatch": "Logprob mismatch, mean",
    "logprob_mismatch_max": "Logprob mismatch, max",
    "importance_ratio_mean": "Importance ratio, mean",
    "importance_ratio_max": "Importance ratio, max",
    "validation_policy_version": "Validation policy version",
}
# Record fields that are not metrics.
NOT_METRICS = frozenset({"step", "time"})


def wire_key(key: str) -> str:
    return WIRE_KEYS.get(key, key)


def export_key(key: str) -> str:
    return EXPORT_KEYS.get(key, key)


def title(key: str) -> str:
    """A metric's display title, from either form of its key."""
    name = export_key(key)
    if name in TITLES:
        return TITLES[name]
    if name in LABELS:
        return LABELS[name]
    return name.rsplit("/", 1)[-1].replace("_", " ").strip().capitalize() or key


def order(keys: Iterable[str]) -> list[str]:
    """The charted metrics first, in the platform's order, then the rest by name."""
    ranked = list(TITLES)

    def rank(key: str) -> tuple[int, str]:
        name = export_key(key)
        return (ranked.index(name), "") if name in TITLES else (len(ranked), key)

    return sorted(set(keys), key=rank)


def finite(value: object) -> float | None:
    """``value`` as a float, or ``None`` when it is not a finite number."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def step_values(record: Mapping[str, object]) -> dict[str, float | None]:
    """A step record's numeric values under their platform keys (non-finite → ``None``)."""
    values: dict[str, float | None] = {}
    for key, value in record.items():
        if key in NOT_METRICS or isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            values[wire_key(key)] = finite(value)
    return values


def summarize(values: Iterable[object]) -> dict[str, float | None]:
    """``{initial, latest, delta, min, max}`` over the finite values, in step order."""
    points = [v for v in (finite(value) for value in values) if v is not None]
    if not points:
        return {"initial": None, "latest": None, "delta": None, "min": None, "max": None}
    return {
        "initial": points[0],
        "latest": points[-1],
        "delta": points[-1] - points[0],
        "min": min(points),
        "max": max(points),
    }
