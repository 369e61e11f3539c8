"""Placeholder for commands that talk to an Osmosis platform, which this build cannot reach yet.

The self-hosted platform (``OSMOSIS_PLATFORM_URL``) is coming; until then every such command
answers with one clear ``PLATFORM_ERROR``.
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
        f"'osmosis {ctx.command}' needs a platform: set OSMOSIS_PLATFORM_URL to a self-hosted "
        "osmosis platform (coming; this version has no platform client yet).",
        {
            "command": ctx.command,
            "reason": "platform_unavailable",
            "platform_url": os.environ.get("OSMOSIS_PLATFORM_URL") or None,
        },
    )
