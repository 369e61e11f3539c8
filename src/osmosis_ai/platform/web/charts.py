"""Chart data for the dashboard: metric series read in one statement, downsampled on the server.

A 10,000-step training has 10,000 points per metric; a chart 600 pixels wide shows no more
than a few hundred, so each series is cut down with Largest-Triangle-Three-Buckets (LTTB:
it keeps the first and last point and, per bucket, the point that spans the largest triangle
with its neighbours, so peaks and dips survive). Non-finite values (stored as ``NULL``) are
left out of the chart and kept as empty cells in the CSV, which always holds every point.
"""

from __future__ import annotations

import csv
import io
import math
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.store.orm import RunMetric

# The six charts of a training run's overview, by wire key (reference §6.5).
CHARTS: tuple[str, ...] = tuple(training_metrics.WIRE_KEYS.values())
DEFAULT_POINTS = 500
MAX_POINTS = 5000
MAX_KEYS = 500  # metrics charted per run

# Every metric a run logs gets a chart, in these groups (export names, in chart order); a
# metric in none of them goes under "Other". The six charts of the overview are always shown.
GROUPS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "Reward and validation",
        (
            "training_reward",
            "validation_reward",
            "validation_pass_rate",
            "reward_std",
            "frac_reward_zero_std",
        ),
    ),
    ("Optimization", ("loss", "grad_norm", "learning_rate")),
    ("Policy", ("kl", "clip_ratio", "entropy")),
    ("Lengths", ("response_length", "total_length", "truncation_ratio")),
    (
        "Throughput and step time",
        (
            "tokens_per_s",
            "rollouts_per_s",
            "step_seconds",
            "rollout_seconds",
            "rollout_wait_seconds",
        ),
    ),
    (
        "Rollouts and learning signal",
        (
            "rollouts",
            "failed_rollouts",
            "groups_without_signal",
            "steps_without_signal",
            "token_segments",
            "chain_breaks",
            "dropped_calls",
            "policy_batches",
            "policy_version",
            "policy_version_lag",
        ),
    ),
    (
        "Staleness and off-policy correction",
        (
            "max_staleness",
            "staleness_mean",
            "staleness_max",
            "stale_regenerated",
            "logprob_mismatch",
            "logprob_mismatch_max",
            "importance_ratio_mean",
            "importance_ratio_max",
            "validation_policy_version",
        ),
    ),
)
OTHER_GROUP = "Other"

Point = tuple[int, float]
ChartRef = tuple[str, str, str]  # wire key, export name, title


def chart_groups(keys: Iterable[str]) -> list[tuple[str, list[ChartRef]]]:
    """The charts of a run that logs ``keys`` (wire keys), grouped: the six overview charts
    always, every other logged metric once; groups without a chart are left out."""
    present = {training_metrics.export_key(k) for k in keys} | {
        training_metrics.export_key(k) for k in CHARTS
    }
    grouped: list[tuple[str, list[ChartRef]]] = []
    placed: set[str] = set()
    for title, names in GROUPS:
        refs = [_ref(name) for name in names if name in present]
        placed.update(names)
        if refs:
            grouped.append((title, refs))
    rest = sorted(present - placed)
    if rest:
        grouped.append((OTHER_GROUP, [_ref(name) for name in rest]))
    return grouped


# Display titles where the name's capitalized words would read wrong.
TITLES = {
    "kl": "KL divergence",
    "grad_norm": "Grad norm",
    "tokens_per_s": "Tokens per second",
    "rollouts_per_s": "Rollouts per second",
    "step_seconds": "Step time (s)",
    "rollout_seconds": "Rollout time (s)",
    "rollout_wait_seconds": "Rollout wait (s)",
    "reward_std": "Reward std",
    "frac_reward_zero_std": "Groups with zero reward std",
}


def _ref(name: str) -> ChartRef:
    return (training_metrics.wire_key(name), name, TITLES.get(name) or training_metrics.title(name))


def metric_keys(session: Session, run_id: str) -> list[str]:
    """The wire keys of every metric the run has logged: one index seek per key (the next key
    after the last), not a scan of every point as DISTINCT would do."""
    connection = session.connection()
    keys: list[str] = []
    while len(keys) < MAX_KEYS:
        query = select(func.min(RunMetric.key)).where(RunMetric.run_id == run_id)
        if keys:
            query = query.where(RunMetric.key > keys[-1])
        found = connection.execute(query).scalar()
        if found is None:
            break
        keys.append(found)
    return keys


def read_points(
    session: Session, run_id: str, keys: Sequence[str] | None = None
) -> dict[str, list[tuple[int, float | None]]]:
    """The run's metric points (or ``keys``'), by key, in step order, without timestamps.

    The chart payload's read: plain rows through the connection (no ORM row objects, no
    timestamp conversion), since a long run has tens of thousands of points per chart."""
    query = select(RunMetric.key, RunMetric.step, RunMetric.value).where(RunMetric.run_id == run_id)
    if keys is not None:
        query = query.where(RunMetric.key.in_(list(keys)))
    series: dict[str, list[tuple[int, float | None]]] = {}
    current: list[tuple[int, float | None]] = []
    last_key: str | None = None
    rows = session.connection().execute(query.order_by(RunMetric.key, RunMetric.step)).all()
    for key, step, value in rows:
        if key != last_key:
            current = series.setdefault(key, [])
            last_key = key
        # stored values are finite floats or NULL (the writers store non-finite as NULL)
        current.append((step, value if value is None or math.isfinite(value) else None))
    return series


def latest_summary(session: Session, run_id: str, key: str) -> dict[str, float | None]:
    """``summarize`` of one metric from SQL aggregates (first and last by step, min, max)."""
    base = select(RunMetric.value).where(
        RunMetric.run_id == run_id, RunMetric.key == key, RunMetric.value.is_not(None)
    )
    connection = session.connection()
    first = connection.execute(base.order_by(RunMetric.step).limit(1)).scalar()
    last = connection.execute(base.order_by(RunMetric.step.desc()).limit(1)).scalar()
    low, high = connection.execute(
        select(func.min(RunMetric.value), func.max(RunMetric.value)).where(
            RunMetric.run_id == run_id, RunMetric.key == key
        )
    ).one()
    if first is None or last is None:
        return training_metrics.summarize([])
    return {"initial": first, "latest": last, "delta": last - first, "min": low, "max": high}


def lttb(points: Sequence[Point], threshold: int) -> list[Point]:
    """At most ``threshold`` of ``points`` (sorted by x), chosen by LTTB; all when fewer."""
    count = len(points)
    if threshold >= count or count <= 2:
        return list(points)
    if threshold < 3:
        return [points[0], points[-1]]
    xs = [p[0] for p in points]
    ys = [p[1] for p in points]
    chosen: list[Point] = [points[0]]
    every = (count - 2) / (threshold - 2)
    anchor = 0
    for bucket in range(threshold - 2):
        start = int(bucket * every) + 1
        end = min(int((bucket + 1) * every) + 1, count - 1)
        # the average of the next bucket is the third corner of the triangle
        next_start = end
        next_end = min(int((bucket + 2) * every) + 1, count)
        span = max(1, next_end - next_start)
        avg_x = sum(xs[next_start : next_start + span]) / span
        avg_y = sum(ys[next_start : next_start + span]) / span
        ax, ay = xs[anchor], ys[anchor]
        # twice the triangle's area, as a linear function of (x, y): c_y*y - c_x*x + c0
        c_x, c_y = avg_y - ay, ax - avg_x
        best, best_area = start, -1.0
        for i in range(start, max(start + 1, end)):
            area = abs(c_y * (ys[i] - ay) - c_x * (xs[i] - ax))
            if area > best_area:
                best, best_area = i, area
        chosen.append(points[best])
        anchor = best
    chosen.append(points[-1])
    return chosen


def read_series(
    session: Session, run_id: str, keys: Sequence[str] | None = None
) -> dict[str, list[tuple[int, float | None, datetime]]]:
    """Every point of the run's metrics (or of ``keys``), by key, in step order."""
    query = select(RunMetric.key, RunMetric.step, RunMetric.value, RunMetric.timestamp).where(
        RunMetric.run_id == run_id
    )
    if keys is not None:
        query = query.where(RunMetric.key.in_(list(keys)))
    series: dict[str, list[tuple[int, float | None, datetime]]] = {}
    for key, step, value, stamp in session.execute(query.order_by(RunMetric.key, RunMetric.step)):
        series.setdefault(key, []).append((step, training_metrics.finite(value), stamp))
    return series


def chart_payload(
    series: Mapping[str, Sequence[tuple[int, float | None]]],
    points: int,
    keys: Sequence[str] | None = None,
) -> list[dict[str, object]]:
    """Every chart (``keys``, else the six and each logged metric), grouped as the page
    shows them, each downsampled to ``points``."""
    wanted = None if keys is None else set(keys)
    charts: list[dict[str, object]] = []
    for group, refs in chart_groups(series):
        for key, name, title in refs:
            if wanted is not None and key not in wanted:
                continue
            stored = series.get(key, [])
            finite = [(step, value) for step, value in stored if value is not None]
            kept = lttb(finite, points)
            charts.append(
                {
                    "key": key,
                    "name": name,
                    "title": title,
                    "group": group,
                    "count": len(stored),
                    "steps": [p[0] for p in kept],
                    "values": [p[1] for p in kept],
                    **_summary(finite),
                }
            )
    return charts


def _summary(finite: Sequence[Point]) -> dict[str, float | None]:
    if not finite:
        return training_metrics.summarize([])
    values = [value for _, value in finite]
    first, last = values[0], values[-1]
    return {
        "initial": first,
        "latest": last,
        "delta": last - first,
        "min": min(values),
        "max": max(values),
    }


def series_csv(key: str, stored: Sequence[tuple[int, float | None, datetime]]) -> str:
    """Every point of one metric as CSV: ``step,<name>,timestamp`` (ISO 8601, UTC)."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["step", training_metrics.export_key(key), "timestamp"])
    for step, value, stamp in stored:
        moment = stamp.astimezone(UTC).isoformat().replace("+00:00", "Z")
        writer.writerow([step, "" if value is None else repr(value), moment])
    return out.getvalue()


def histogram(values: Sequence[float], bins: int = 10) -> dict[str, list[float]]:
    """Counts of ``values`` in ``bins`` equal bins over [0, 1], widened to their range."""
    if not values:
        return {"edges": [], "counts": []}
    low, high = min(0.0, *values), max(1.0, *values)
    width = (high - low) / bins
    counts = [0.0] * bins
    for value in values:
        index = min(bins - 1, int((value - low) / width))
        counts[index] += 1
    return {"edges": [low + width * i for i in range(bins + 1)], "counts": counts}
