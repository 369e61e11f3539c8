"""Placeholder for local commands whose implementation has not landed yet."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, Result

PASSTHROUGH = True  # accept the command's future arguments and answer the same way


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    raise CLIError(
        CLIErrorCode.VALIDATION,
        f"'osmosis {ctx.command}' is not available yet in this version of osmosis-ai.",
        {"command": ctx.command, "available": False},
    )
