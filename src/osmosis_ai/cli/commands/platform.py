"""Placeholder for platform commands this CLI's platform client does not support yet.

Each answers with one clear ``PLATFORM_ERROR`` instead of a half-working call.
"""

from __future__ import annotations

import argparse
import os

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, Result

PASSTHROUGH = True  # accept the command's real arguments and answer the same way


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("arguments", nargs="*", help=argparse.SUPPRESS)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    raise CLIError(
        CLIErrorCode.PLATFORM_ERROR,
        f"'osmosis {ctx.command}' needs a platform feature this version of the CLI does not "
        "support yet. See 'osmosis --help' for the platform commands it has.",
        {
            "command": ctx.command,
            "reason": "not_supported",
            "platform_url": os.environ.get("OSMOSIS_PLATFORM_URL") or None,
        },
    )
