"""``osmosis train download NAME [--checkpoint STEP] [-o DIR] [--overwrite]``: fetch a
checkpoint of a training run (a Hugging Face model folder) through signed URLs.

Default: the run's latest checkpoint, into ``.osmosis/checkpoints/<checkpoint name>/`` of the
workspace directory.
"""

from __future__ import annotations

import argparse
import shutil
from pathlib import Path, PurePosixPath

from osmosis_ai.cli import training_runs
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session

CHECKPOINTS_DIR = Path(".osmosis") / "checkpoints"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training run's name (or id)")
    parser.add_argument(
        "--checkpoint", type=int, metavar="STEP", help="the checkpoint's step (default: latest)"
    )
    parser.add_argument("-o", "--output", metavar="DIR", help="the folder to download into")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        step = "latest" if args.checkpoint is None else str(args.checkpoint)
        answer = session.client.call(
            "GET", f"{training_runs.base_path(args.name)}/checkpoints/{step}/download"
        )
        name = _segment(answer.get("checkpoint_name") or f"{args.name}-step-{step}")
        root = session.workspace.root if session.workspace is not None else Path.cwd()
        target = Path(args.output).expanduser() if args.output else root / CHECKPOINTS_DIR / name
        if target.exists() and any(target.iterdir()) and not args.overwrite:
            raise CLIError(
                CLIErrorCode.CONFLICT,
                f"{target} already exists. Use --overwrite to replace it.",
                {"output_path": str(target)},
            )
        files = answer.get("files")
        entries = [f for f in files if isinstance(f, dict)] if isinstance(files, list) else []  # pyright: ignore[reportUnknownVariableType]
        if not entries:
            raise CLIError(CLIErrorCode.PLATFORM_ERROR, "The platform listed no checkpoint files.")
        staging = target.with_name(f".{target.name}.partial")
        shutil.rmtree(staging, ignore_errors=True)
        total = 0
        try:
            with session.transfers() as transfers:
                for entry in entries:  # pyright: ignore[reportUnknownVariableType]
                    relative = _relative(entry.get("path"))  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
                    size = entry.get("size")  # pyright: ignore[reportUnknownMemberType, reportUnknownVariableType]
                    expected = (
                        size if isinstance(size, int) and not isinstance(size, bool) else None
                    )
                    transfers.download(
                        str(entry.get("url")),  # pyright: ignore[reportUnknownMemberType, reportUnknownArgumentType]
                        staging / relative,
                        expected_size=expected,
                    )
                    total += expected or 0
            if target.exists():
                shutil.rmtree(target)
            target.parent.mkdir(parents=True, exist_ok=True)
            staging.replace(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        resource = {
            "training_run_name": answer.get("training_run_name"),
            "checkpoint_name": answer.get("checkpoint_name"),
            "checkpoint_step": answer.get("checkpoint_step"),
            "files": len(entries),
            "bytes": total,
            "output_path": str(target),
            **session.result_context(),
        }
        return OperationResult(
            operation="train.download",
            status="success",
            resource=resource,
            message=f"Checkpoint {answer.get('checkpoint_name')} downloaded: {target}",
        )


def _segment(name: object) -> str:
    base = PurePosixPath(str(name).replace("\\", "/")).name
    if base in ("", ".", ".."):
        raise CLIError(CLIErrorCode.PLATFORM_ERROR, f"The platform sent a bad name: {name!r}")
    return base


def _relative(path: object) -> Path:
    """A file path from the platform, kept inside the download folder."""
    text = str(path or "").replace("\\", "/")
    parts = PurePosixPath(text).parts
    if not parts or text.startswith("/") or any(p in ("", ".", "..") for p in parts):
        raise CLIError(CLIErrorCode.PLATFORM_ERROR, f"The platform sent a bad file path: {path!r}")
    return Path(*parts)
