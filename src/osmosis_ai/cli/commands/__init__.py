"""One module per command, registered by a line in :mod:`osmosis_ai.cli.registry`.

A module defines ``add_arguments(parser)`` (argparse) and ``run(args, ctx) -> Result``:
parse, call one library function, return a result from :mod:`osmosis_ai.cli.output`.
"""

from __future__ import annotations

import argparse
import importlib
from typing import TYPE_CHECKING, NoReturn, Protocol, cast

from osmosis_ai.cli.errors import CLIUsageError

if TYPE_CHECKING:
    from osmosis_ai.cli.output import Context, Result


class CommandModule(Protocol):
    """What a command module provides.

    ``PASSTHROUGH = True`` (optional) makes unknown arguments land in ``args.passthrough``
    instead of failing, for placeholders that accept any command line.
    """

    def add_arguments(self, parser: argparse.ArgumentParser) -> None: ...

    def run(self, args: argparse.Namespace, ctx: Context) -> Result | None: ...


class ArgumentParser(argparse.ArgumentParser):
    """argparse, but a bad command line raises ``CLIUsageError`` instead of exiting."""

    def error(self, message: str) -> NoReturn:
        raise CLIUsageError(message, prog=self.prog, usage=self.format_usage())


def load(module: str) -> CommandModule:
    """Import ``osmosis_ai.cli.commands.<module>``."""
    return cast(CommandModule, importlib.import_module(f"{__name__}.{module}"))


def parse(module: CommandModule, prog: str, help: str, argv: list[str]) -> argparse.Namespace:
    """Build the command's parser and parse ``argv`` (``--help`` prints and exits 0).

    Every command takes ``-y/--yes``: the ones that ask for confirmation skip it, the others
    accept it and do nothing, so a script can pass it to every command.
    """
    parser = ArgumentParser(
        prog=prog,
        description=help,
        epilog="Global options (anywhere on the line): --json, --plain.",
        conflict_handler="resolve",  # a command may describe -y/--yes its own way
    )
    parser.add_argument("-y", "--yes", action="store_true", help="do not ask for confirmation")
    module.add_arguments(parser)
    if getattr(module, "PASSTHROUGH", False):
        namespace, extra = parser.parse_known_args(argv)
        namespace.passthrough = extra
        return namespace
    return parser.parse_args(argv)
