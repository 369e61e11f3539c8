"""``osmosis dataset validate FILE``: check a dataset file locally against the dataset format."""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, DetailResult, Result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", type=Path, help="the dataset file (.jsonl, .csv or .parquet)"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.workspace import validate_dataset

    path: Path = args.file
    if not path.exists():
        raise CLIError(CLIErrorCode.NOT_FOUND, f"File not found: {path}", {"file": str(path)})
    validation = validate_dataset(path)
    for warning in validation.warnings:
        ctx.warn(warning.code, warning.message)
    data = validation.to_dict()
    if not validation.valid:
        problems = "\n".join(f"  - {error}" for error in validation.errors)
        raise CLIError(CLIErrorCode.VALIDATION, f"{path} is not a valid dataset:\n{problems}", data)
    size = validation.file_size
    return DetailResult(
        title=f"Valid dataset: {validation.file_name}",
        data=data,
        fields=[
            ("File", data["file"]),
            ("Format", validation.extension),
            ("Size", None if size is None else f"{size} bytes"),
            ("Rows", validation.row_count),
        ],
    )
