"""Training runs on a platform as the ``train`` commands show them: the run and checkpoint
records, the metrics export of ``train info`` (reference §6.5), and one-line sparklines.

The export maps the platform's metric keys to the export's (``rollout/raw_reward`` →
``training_reward``, ...), turns millisecond timestamps into ISO 8601, and writes non-finite
values as ``null``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from typing import Any

from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.client import PlatformClient, segment
from osmosis_ai.rundir.timestamps import iso_utc

TRAINING_RUN_KEYS = (
    "id",
    "name",
    "status",
    "model_name",
    "dataset_name",
    "rollout_name",
    "creator_name",
    "created_at",
    "started_at",
    "completed_at",
    "current_step",
    "total_steps",
    "reward",
)
CHECKPOINT_KEYS = ("id", "checkpoint_name", "checkpoint_step", "status", "created_at")
NOT_STARTED = frozenset({"pending", "queued"})
TERMINAL = frozenset({"finished", "failed", "crashed", "stopped", "killed", "unknown"})
_BLOCKS = "▁▂▃▄▅▆▇█"


def base_path(name: str) -> str:
    return f"/api/cli/training-runs/{segment(name)}"


def training_run(record: Mapping[str, Any]) -> dict[str, object]:
    data: dict[str, object] = {key: record.get(key) for key in TRAINING_RUN_KEYS}
    url = record.get("platform_url")
    if isinstance(url, str) and url:
        data["platform_url"] = url
    return data


def checkpoint(record: Mapping[str, Any]) -> dict[str, object]:
    data: dict[str, object] = {key: record.get(key) for key in CHECKPOINT_KEYS}
    data["reward"] = training_metrics.finite(record.get("reward"))
    return data


def detail(client: PlatformClient, name: str) -> dict[str, Any]:
    """``GET /api/cli/training-runs/{name}``: the answer, with the run block as ``run``."""
    body = client.call("GET", base_path(name))
    block = body.get("training_run")
    run: dict[str, Any] = dict(block) if isinstance(block, dict) else dict(body)  # pyright: ignore[reportUnknownArgumentType]
    return {**body, "run": run}


def checkpoints(client: PlatformClient, name: str) -> list[dict[str, object]]:
    body = client.call("GET", f"{base_path(name)}/checkpoints")
    raw = body.get("checkpoints")
    items = raw if isinstance(raw, list) else []
    return [checkpoint(item) for item in items if isinstance(item, dict)]  # pyright: ignore[reportUnknownArgumentType, reportUnknownVariableType]


def _iso(value: object) -> object:
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return iso_utc(datetime.fromtimestamp(value / 1000, UTC))
    return value


def metrics_export(run: Mapping[str, Any], metrics: Mapping[str, Any]) -> dict[str, object]:
    """The ``train info`` export: ``{training_run{...}, summary{...}, metrics[...]}``."""
    overview = metrics.get("overview")
    overview = overview if isinstance(overview, dict) else {}
    series: list[dict[str, object]] = []
    summary: dict[str, dict[str, float | None]] = {}
    raw = metrics.get("metrics")
    for item in raw if isinstance(raw, list) else []:  # pyright: ignore[reportUnknownVariableType]
        if not isinstance(item, dict):
            continue
        wire = str(item.get("metric_key") or item.get("key") or "")  # pyright: ignore[reportUnknownArgumentType, reportUnknownMemberType]
        if not wire:
            continue
        key = training_metrics.export_key(wire)
        points = item.get("data_points")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
        data = [
            {
                "step": point.get("step"),
                "value": training_metrics.finite(point.get("value")),
                "timestamp": _iso(point.get("timestamp")),
            }
            for point in (points if isinstance(points, list) else [])  # pyright: ignore[reportUnknownVariableType]
            if isinstance(point, dict)
        ]
        series.append(
            {"key": key, "title": item.get("title") or training_metrics.title(key), "data": data}  # pyright: ignore[reportUnknownMemberType]
        )
        summary[key] = training_metrics.summarize(point["value"] for point in data)
    model = run.get("model_name") or (run.get("model") or {}).get("name")
    return {
        "training_run": {
            "id": run.get("id"),
            "status": metrics.get("status") or run.get("status"),
            "name": run.get("name"),
            "base_model_name": model,
            "dataset_name": run.get("dataset_name"),
            "rollout_name": run.get("rollout_name"),
            "duration_ms": overview.get("duration_ms"),
            "started_at": run.get("started_at"),
            "completed_at": run.get("completed_at"),
            "rows_processed": overview.get("examples_processed_count"),
            "latest_step": overview.get("latest_step"),
            "total_steps": overview.get("total_steps"),
        },
        "summary": summary,
        "metrics": series,
    }


def sparkline(values: Sequence[float | None], width: int = 40) -> str:
    """One line of block characters for ``values`` (binned to ``width``), gaps as spaces."""
    count = len(values)
    if count == 0:
        return ""
    bins = min(width, count)
    columns: list[float | None] = []
    for b in range(bins):
        part = [
            v
            for v in values[b * count // bins : (b + 1) * count // bins]
            if v is not None and math.isfinite(v)
        ]
        columns.append(sum(part) / len(part) if part else None)
    finite = [v for v in columns if v is not None]
    if not finite:
        return ""
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    top = len(_BLOCKS) - 1
    return "".join(" " if v is None else _BLOCKS[round((v - low) / span * top)] for v in columns)


def duration_text(ms: object) -> str | None:
    if not isinstance(ms, int | float) or isinstance(ms, bool):
        return None
    seconds = int(ms // 1000)
    hours, rest = divmod(seconds, 3600)
    minutes, seconds = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m {seconds}s"
    return f"{minutes}m {seconds}s" if minutes else f"{seconds}s"
