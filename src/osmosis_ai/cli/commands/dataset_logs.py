"""``osmosis dataset logs NAME [--limit N] [--cursor C]``: a dataset's processing logs."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, Result
from osmosis_ai.cli.platform_session import add_log_arguments, logs_result
from osmosis_ai.platform.client import segment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the dataset's name (or id)")
    add_log_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return logs_result(
        ctx, f"/api/cli/datasets/{segment(args.name)}/logs", f"Dataset logs: {args.name}", args
    )
