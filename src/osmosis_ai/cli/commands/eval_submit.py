"""``osmosis eval submit CONFIG [-y] [--secrets-file PATH|-]``: a managed evaluation run."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, Result
from osmosis_ai.cli.run_submit import EVAL, submit
from osmosis_ai.cli.run_submit import add_arguments as _add_arguments


def add_arguments(parser: argparse.ArgumentParser) -> None:
    _add_arguments(parser, EVAL)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return submit(args, ctx, EVAL)
