"""Value types of command-line options that more than one command takes."""

from __future__ import annotations

import argparse
from collections.abc import Callable


def whole_number(minimum: int = 1, *, rule: str | None = None) -> Callable[[str], int]:
    """An argparse ``type``: a whole number of at least ``minimum``; a smaller one is refused
    saying ``rule`` (default "must be at least <minimum>") and the value given."""
    refusal = rule or f"must be at least {minimum}"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{refusal}, got {value}")
        return value

    return parse


positive_int = whole_number(1)
