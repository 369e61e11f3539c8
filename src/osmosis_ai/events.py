"""Progress events shared by the long-running library operations (eval run, train run).

A runner never prints: it hands events to the caller's sink and the CLI renders them.
The events here are common to every runner; each runner adds its own beside them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class StageEvent:
    """A stage began or ended (``starting rollout server (main.py)``)."""

    message: str


@dataclass(frozen=True)
class WarningEvent:
    """A non-fatal problem with a stable ``code``."""

    code: str
    message: str


@dataclass(frozen=True)
class LogEvent:
    """One redacted log line, sent only with ``verbose``."""

    line: str
