"""A training run's checkpoint (a Hugging Face model folder) down through signed URLs.

The files land in a hidden staging folder beside the target, which replaces the target
only once every file is there: an interrupted download leaves the target as it was.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.platform.client.api import JSONObject, PlatformClient, segment
from osmosis_ai.platform.client.errors import AlreadyExistsError, PlatformClientError
from osmosis_ai.platform.client.transfer import safe_name, safe_relative, transfers_for

CHECKPOINTS_DIR = Path(".osmosis") / "checkpoints"


@dataclass(frozen=True)
class DownloadedCheckpoint:
    answer: JSONObject  # the platform's description: run, checkpoint name and step, files
    path: Path
    files: int
    bytes: int


def download_checkpoint(
    client: PlatformClient,
    run: str,
    step: int | None = None,
    *,
    output: Path | None = None,
    root: Path,
    overwrite: bool = False,
) -> DownloadedCheckpoint:
    """Fetch checkpoint ``step`` (default: the latest) of training run ``run`` (name or id)
    into ``output``, by default ``<root>/.osmosis/checkpoints/<checkpoint name>/``."""
    which = "latest" if step is None else str(step)
    answer = client.call(
        "GET", f"/api/cli/training-runs/{segment(run)}/checkpoints/{which}/download"
    )
    name = safe_name(answer.get("checkpoint_name") or f"{run}-step-{which}", "name")
    target = output if output is not None else root / CHECKPOINTS_DIR / name
    if target.exists() and any(target.iterdir()) and not overwrite:
        raise AlreadyExistsError(
            f"{target} already exists. Use --overwrite to replace it.",
            {"output_path": str(target)},
        )
    files = answer.get("files")
    entries = [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []  # pyright: ignore[reportUnknownVariableType]
    if not entries:
        raise PlatformClientError("PLATFORM_ERROR", "The platform listed no checkpoint files.")
    staging = target.with_name(f".{target.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    total = 0
    try:
        with transfers_for(client) as transfers:
            for entry in entries:  # pyright: ignore[reportUnknownVariableType]
                relative = safe_relative(entry.get("path"))  # pyright: ignore[reportUnknownMemberType]
                size = entry.get("size")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                expected = size if isinstance(size, int) and not isinstance(size, bool) else None
                transfers.download(
                    str(entry.get("url")),  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
                    staging.joinpath(*relative.parts),
                    expected_size=expected,
                )
                total += expected or 0
        if target.exists():
            shutil.rmtree(target)
        target.parent.mkdir(parents=True, exist_ok=True)
        staging.replace(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return DownloadedCheckpoint(answer, target, len(entries), total)
