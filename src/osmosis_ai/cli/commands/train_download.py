"""``osmosis train download NAME [--checkpoint STEP] [-o DIR] [--overwrite]``: fetch a
checkpoint of a training run (a Hugging Face model folder) through signed URLs.

Default: the run's latest checkpoint, into ``.osmosis/checkpoints/<checkpoint name>/`` of the
workspace directory.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client.checkpoints import download_checkpoint


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training run's name (or id)")
    parser.add_argument(
        "--checkpoint", type=int, metavar="STEP", help="the checkpoint's step (default: latest)"
    )
    parser.add_argument("-o", "--output", metavar="DIR", help="the folder to download into")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing folder")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        done = download_checkpoint(
            session.client,
            args.name,
            args.checkpoint,
            output=Path(args.output).expanduser() if args.output else None,
            root=session.workspace.root if session.workspace is not None else Path.cwd(),
            overwrite=args.overwrite,
        )
        answer = done.answer
        resource = {
            "training_run_name": answer.get("training_run_name"),
            "checkpoint_name": answer.get("checkpoint_name"),
            "checkpoint_step": answer.get("checkpoint_step"),
            "files": done.files,
            "bytes": done.bytes,
            "output_path": str(done.path),
            **session.result_context(),
        }
        return OperationResult(
            operation="train.download",
            status="success",
            resource=resource,
            message=f"Checkpoint {answer.get('checkpoint_name')} downloaded: {done.path}",
        )
