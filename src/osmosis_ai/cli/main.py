"""Entry point of the ``osmosis`` console script: argv in, exit code out.

``osmosis --version`` is answered here before anything else is imported; everything else
goes to :mod:`osmosis_ai.cli.dispatch`. Exit codes: 0 success or declined prompt,
1 handled error, 2 usage error, 130 interrupted.
"""

from __future__ import annotations

import os
import sys

from osmosis_ai.consts import PACKAGE_VERSION, package_name

# Not typing.TYPE_CHECKING: importing typing alone costs more than the rest of `--help`.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Sequence

_VERSION_LINE = ("-V", "--version", "--json", "--plain")


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``osmosis`` with ``argv`` (default ``sys.argv[1:]``); return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args and all(arg in _VERSION_LINE for arg in args) and {"-V", "--version"} & set(args):
        sys.stdout.write(f"{package_name} {PACKAGE_VERSION}\n")
        return 0
    try:
        from osmosis_ai.cli.dispatch import run

        return run(args)
    except BrokenPipeError:  # e.g. `osmosis ... | head`: stop quietly
        _silence_stdout()
        return 1
    except KeyboardInterrupt:
        return 130


def _silence_stdout() -> None:
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):
        pass


if __name__ == "__main__":
    raise SystemExit(main())
