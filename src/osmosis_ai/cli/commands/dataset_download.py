"""``osmosis dataset download NAME [-o FILE|DIR] [--overwrite]``: fetch a stored dataset."""

from __future__ import annotations

import argparse
from functools import partial

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.cli.transfer_progress import transfer_progress
from osmosis_ai.platform.client.datasets import download_dataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the dataset's name (or id)")
    parser.add_argument(
        "-o", "--output", help="file, or directory (existing, or ending in /) to download into"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        done = download_dataset(
            session.client,
            args.name,
            args.output,
            overwrite=args.overwrite,
            progress=partial(transfer_progress, ctx),
        )
        resource = {
            **records.dataset(done.record),
            "output_path": str(done.path),
            **session.result_context(),
        }
        return OperationResult(
            operation="dataset.download",
            status="success",
            resource=resource,
            message=f"Dataset downloaded: {done.path}",
        )
