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
from collections.abc import Sequence
from datetime import UTC, datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.store.orm import RunMetric

# The six charts of a training run's overview, by wire key (reference §6.5).
CHARTS: tuple[str, ...] = tuple(training_metrics.WIRE_KEYS.values())
DEFAULT_POINTS = 500
MAX_POINTS = 5000

Point = tuple[int, float]


def lttb(points: Sequence[Point], threshold: int) -> list[Point]:
    """At most ``threshold`` of ``points`` (sorted by x), chosen by LTTB; all when fewer."""
    count = len(points)
    if threshold >= count or count <= 2:
        return list(points)
    if threshold < 3:
        return [points[0], points[-1]]
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
        avg_x = sum(points[i][0] for i in range(next_start, next_start + span)) / span
        avg_y = sum(points[i][1] for i in range(next_start, next_start + span)) / span
        ax, ay = points[anchor]
        best, best_area = start, -1.0
        for i in range(start, max(start + 1, end)):
            x, y = points[i]
            area = abs((ax - avg_x) * (y - ay) - (ax - x) * (avg_y - ay))
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
    series: dict[str, list[tuple[int, float | None, datetime]]], points: int
) -> list[dict[str, object]]:
    """The six charts (and any other metric after them), each downsampled to ``points``."""
    keys = training_metrics.order([*CHARTS, *series])
    charts: list[dict[str, object]] = []
    for key in keys:
        stored = series.get(key, [])
        finite = [(step, value) for step, value, _ in stored if value is not None]
        kept = lttb(finite, points)
        charts.append(
            {
                "key": key,
                "name": training_metrics.export_key(key),
                "title": training_metrics.title(key),
                "count": len(stored),
                "steps": [p[0] for p in kept],
                "values": [p[1] for p in kept],
                **training_metrics.summarize(value for _, value, _ in stored),
            }
        )
    return charts


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
