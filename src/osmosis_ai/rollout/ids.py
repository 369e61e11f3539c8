"""Rollout ids: one URL path segment and one directory name."""

from __future__ import annotations


def validate_rollout_id(value: str) -> str:
    """Check that ``value`` is usable as one URL path segment and one directory name."""
    if not value:
        raise ValueError("rollout_id must not be empty")
    if value in {".", ".."}:
        raise ValueError(f"rollout_id {value!r} is not allowed: it is a relative path")
    for bad, name in (("/", "'/'"), ("\\", "'\\\\'"), ("\x00", "a NUL byte")):
        if bad in value:
            raise ValueError(
                f"rollout_id {value!r} must be a single path segment: it contains {name}"
            )
    return value
