"""``osmosis eval logs NAME [--limit N] [--cursor C]``: an eval run's logs, oldest first."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.eval_platform import run_path
from osmosis_ai.cli.output import Context, Result
from osmosis_ai.cli.platform_session import add_log_arguments, logs_result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the eval run's name (or id)")
    add_log_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return logs_result(ctx, run_path(args.name, "logs"), f"Eval run logs: {args.name}", args)
