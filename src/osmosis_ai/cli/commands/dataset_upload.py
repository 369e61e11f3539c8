"""``osmosis dataset upload FILE [--overwrite] [-y]``: validate, then upload to the platform.

The file is checked with the same rules as ``osmosis dataset validate``; the dataset is
named after the file's stem. The bytes go to presigned URLs (one PUT, or parts with their
ETags), streamed from disk; on failure or Ctrl-C the platform is told to abort.
"""

from __future__ import annotations

import argparse
from functools import partial
from pathlib import Path

from osmosis_ai.cli import records
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.cli.transfer_progress import transfer_progress
from osmosis_ai.platform.client.datasets import check_dataset_file, upload_dataset


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", type=Path, help="the dataset file (.jsonl, .csv or .parquet)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a dataset of the same name"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        file = check_dataset_file(args.file, warn=ctx.warn)
        name = file.name
        confirm(
            f"Replace the dataset '{name}' with {file.path.name}?"
            if args.overwrite
            else f"Upload {file.path.name} as dataset '{name}'?",
            yes=args.yes,
            summary={"File": file.path.name, "Size": records.size_text(file.size), "Dataset": name},
            warnings=["--overwrite replaces the dataset of the same name."]
            if args.overwrite
            else [],
        )
        dataset = upload_dataset(
            session.client, file, overwrite=args.overwrite, progress=partial(transfer_progress, ctx)
        )
        resource = {**records.dataset(dataset), **session.result_context()}
        url = dataset.get("platform_url")
        return OperationResult(
            operation="dataset.upload",
            status="success",
            resource=resource,
            message=f"Dataset uploaded: {dataset.get('file_name') or name}",
            next_steps=[
                f"Processing continues on the platform: {url}"
                if url
                else f"Processing continues on the platform; check it with: osmosis dataset "
                f"info {name}"
            ],
            next_steps_structured=[{"label": "View dataset", "url": url}]
            if url
            else [{"action": "dataset_info", "id": dataset.get("id")}],
            extra={"warnings": file.warnings} if file.warnings else {},
        )
