"""Entry point of the ``osmosis`` console script.

Kept to the standard library so that ``osmosis --help`` and ``osmosis --version`` start
in milliseconds; command groups import what they need when they run.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence

from osmosis_ai.consts import PACKAGE_VERSION

USAGE = """\
Usage: osmosis [OPTIONS] COMMAND [ARGS]...

  Build, evaluate and train LLM agents with reinforcement learning.

Options:
  -V, --version  Show the version and exit.
  -h, --help     Show this message and exit.

Serve a rollout:
  python rollouts/<name>/main.py   serves on $_OSMOSIS_ROLLOUT_PORT (default 8000)
"""


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        sys.stdout.write(USAGE)
        return 0
    if args[0] in ("-V", "--version"):
        sys.stdout.write(f"osmosis-ai {PACKAGE_VERSION}\n")
        return 0
    sys.stderr.write(f"Error: no such command {args[0]!r}. Run 'osmosis --help' for usage.\n")
    return 2


if __name__ == "__main__":
    raise SystemExit(main())
