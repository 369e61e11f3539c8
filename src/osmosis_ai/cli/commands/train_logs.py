"""``osmosis train logs NAME [--limit N] [--cursor C]``: a training run's logs."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import training_runs
from osmosis_ai.cli.output import Context, Result
from osmosis_ai.cli.platform_session import add_log_arguments, logs_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the training run's name (or id)")
    add_log_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return logs_result(
        ctx, f"{training_runs.base_path(args.name)}/logs", f"Training run logs: {args.name}", args
    )
