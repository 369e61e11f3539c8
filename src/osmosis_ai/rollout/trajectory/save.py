"""Writing a rollout's ``trajectory.json`` and ``diagnostics.json`` under the artifact root.

Saving is best effort: it never raises and never blocks the event loop (files are written
atomically in a worker thread). Numeric arrays stay on one line inside the pretty JSON so
token ids and logprobs do not take one line per number.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.rollout.ids import validate_rollout_id
from osmosis_ai.rollout.trajectory.atif import json_safe
from osmosis_ai.rollout.trajectory.convert import convert_sample_to_trajectory

if TYPE_CHECKING:
    from osmosis_ai.rollout.execution import ExecutionResult
    from osmosis_ai.rollout.trajectory.report import TrajectoryReport

logger = logging.getLogger(__name__)

ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
TRAJECTORY_FILE = "trajectory.json"
DIAGNOSTICS_FILE = "diagnostics.json"


async def save_trajectory(
    *,
    rollout_id: str,
    result: ExecutionResult,
    request_label: str | None = None,
    request_metadata: dict[str, Any] | None = None,
    request_extra_fields: dict[str, Any] | None = None,
    report: TrajectoryReport | None = None,
    artifact_root: str | Path | None = None,
    diagnostics: dict[str, Any] | None = None,
    model_name: str | None = None,
) -> Path | None:
    """Archive one rollout under ``<artifact_root>/<rollout_id>/``; return the trajectory path.

    Writes ``diagnostics.json`` when ``diagnostics`` or ``result.extra_fields`` is non-empty
    (``diagnostics`` wins on shared keys) and ``trajectory.json`` when ``result`` holds a
    sample whose ``trajectory_messages`` is not ``None``. ``artifact_root`` defaults to
    ``$_OSMOSIS_ROLLOUT_ARTIFACT_ROOT``, else ``~/.osmosis``. Never raises: any failure is
    logged as a warning and yields ``None``. ``result`` is not modified.
    """
    try:
        return await _save(
            rollout_id,
            result,
            _rollout_dir(rollout_id, artifact_root),
            request_label=request_label,
            request_metadata=request_metadata,
            request_extra_fields=request_extra_fields,
            report=report,
            diagnostics=diagnostics,
            model_name=model_name,
        )
    except Exception as exc:  # the contract: saving never fails a rollout
        logger.warning("could not save rollout %r: %s: %s", rollout_id, type(exc).__name__, exc)
        return None


async def _save(
    rollout_id: str,
    result: ExecutionResult,
    folder: Path,
    *,
    request_label: str | None,
    request_metadata: dict[str, Any] | None,
    request_extra_fields: dict[str, Any] | None,
    report: TrajectoryReport | None,
    diagnostics: dict[str, Any] | None,
    model_name: str | None,
) -> Path | None:
    merged = {**(result.extra_fields or {}), **(diagnostics or {})}
    if merged:
        dropped: list[str] = []
        safe = json_safe(merged, dropped, "diagnostics")
        if dropped:
            logger.warning("dropped non-JSON diagnostics: %s", ", ".join(dropped))
        await _write(folder / DIAGNOSTICS_FILE, safe, rollout_id)
    sample = result.sample
    if sample is None or sample.trajectory_messages is None:
        return None
    document = convert_sample_to_trajectory(
        rollout_id=rollout_id,
        sample=sample,
        label=sample.label if sample.label is not None else request_label,
        reward=sample.reward,
        status=str(result.status),
        err_message=result.err_message,
        err_category=str(result.err_category) if result.err_category else None,
        request_metadata=request_metadata,
        request_extra_fields=request_extra_fields,
        report=report,
        model_name=model_name,
    )
    return await _write(folder / TRAJECTORY_FILE, document, rollout_id)


def _rollout_dir(rollout_id: str, artifact_root: str | Path | None) -> Path:
    validate_rollout_id(rollout_id)
    if artifact_root is None:
        artifact_root = os.environ.get(ARTIFACT_ROOT_ENV) or Path.home() / ".osmosis"
    return Path(artifact_root).expanduser() / rollout_id


async def _write(path: Path, data: Mapping[str, Any], rollout_id: str) -> Path | None:
    try:
        await asyncio.to_thread(_write_atomic, path, data)
    except Exception as exc:  # the contract: saving never fails a rollout
        logger.warning("could not write %s for rollout %r: %s", path.name, rollout_id, exc)
        return None
    return path


def _write_atomic(path: Path, data: Mapping[str, Any]) -> None:
    """Write via a temporary file in the same folder so readers never see half a file.

    No fsync: a trajectory is an archive, not an acknowledgement. The durable record of a
    result is the controller's journal; syncing here cost ~3 ms on every rollout's
    critical path (the result is published only after the save).
    """
    text = dumps_compact_arrays(data)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def dumps_compact_arrays(value: Any, indent: int = 2) -> str:
    """Strict JSON, indented, except that arrays of numbers are written on one line."""
    return _render(value, indent, 0) + "\n"


def _render(value: Any, indent: int, level: int) -> str:
    pad = " " * (indent * (level + 1))
    end = " " * (indent * level)
    if isinstance(value, Mapping) and value:
        items = (
            f"{pad}{json.dumps(str(k), ensure_ascii=False)}: {_render(v, indent, level + 1)}"
            for k, v in value.items()
        )
        return "{\n" + ",\n".join(items) + "\n" + end + "}"
    if isinstance(value, (list, tuple)) and value and not _is_numeric_array(value):
        items = (f"{pad}{_render(v, indent, level + 1)}" for v in value)
        return "[\n" + ",\n".join(items) + "\n" + end + "]"
    return json.dumps(value, ensure_ascii=False, allow_nan=False)


def _is_numeric_array(values: list[Any] | tuple[Any, ...]) -> bool:
    return all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in values)
