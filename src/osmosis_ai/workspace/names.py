"""Run names of local evaluations (given with ``--name`` or generated) and the naming error.

A run name becomes a directory name, so the rules keep it to one portable path segment.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime

from osmosis_ai.errors import UsageError

RUN_NAME_MAX_LENGTH = 96
_RUN_NAME_CHARS = re.compile(r"^[A-Za-z0-9._-]+$")
_HEX = re.compile(r"^[0-9a-fA-F]{8,}$")
# "-" + YYYYMMDDTHHMMSSZ + "-" + 8 hex
_GENERATED_SUFFIX_LENGTH = 1 + 16 + 1 + 8


class InvalidNameError(UsageError):
    """A rollout or run name breaks the naming rules; the message says which rule."""

    def __init__(self, kind: str, name: str, reason: str) -> None:
        self.kind = kind
        self.name = name
        self.reason = reason
        super().__init__(f"Invalid {kind} name {name!r}: {reason}")


def validate_run_name(name: str) -> str:
    """Return ``name`` if it is a valid run name (one path segment, see the rules below).

    At most 96 characters of letters, digits, ``.``, ``_`` and ``-``; it must not start
    with ``-`` or ``.`` (which also excludes ``.locks``, the lock directory).
    """
    if not name:
        raise InvalidNameError("run", name, "the name is empty")
    if len(name) > RUN_NAME_MAX_LENGTH:
        raise InvalidNameError(
            "run", name, f"{len(name)} characters; at most {RUN_NAME_MAX_LENGTH} are allowed"
        )
    if not _RUN_NAME_CHARS.match(name):
        bad = sorted({c for c in name if not _RUN_NAME_CHARS.match(c)})
        shown = ", ".join(repr(c) for c in bad)
        raise InvalidNameError(
            "run", name, f"{shown} not allowed; use letters, digits, '.', '_' and '-' only"
        )
    if name[0] in "-.":
        raise InvalidNameError("run", name, f"must not start with {name[0]!r}")
    return name


def generate_run_name(config_stem: str, input_digest: str, now: datetime | None = None) -> str:
    """A one-off run name: ``<stem>-<YYYYMMDDTHHMMSSZ>-<first 8 hex of input_digest>``.

    Characters of the stem a run name cannot hold become ``-`` and the stem is shortened so
    the whole name stays within 96 characters. ``now`` must be timezone-aware (default: now).
    """
    if not _HEX.match(input_digest):
        raise UsageError(
            f"input_digest must be a hex digest of at least 8 characters, got {input_digest!r}"
        )
    if now is None:
        now = datetime.now(UTC)
    elif now.tzinfo is None:
        raise UsageError("now must be timezone-aware: pass datetime.now(UTC)")
    stamp = now.astimezone(UTC).strftime("%Y%m%dT%H%M%SZ")
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", config_stem).lstrip("-.")
    stem = stem[: RUN_NAME_MAX_LENGTH - _GENERATED_SUFFIX_LENGTH] or "run"
    return validate_run_name(f"{stem}-{stamp}-{input_digest[:8].lower()}")
