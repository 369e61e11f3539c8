"""What a scripted model says: the turns of a :class:`~osmosis_ai.testing.ScriptedModelServer`
script. :mod:`osmosis_ai.testing.model_server` picks a turn per request and
:mod:`osmosis_ai.testing.scripted_reply` renders it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import UsageError

__all__ = ["ScriptedTurn", "ToolCall"]


@dataclass(frozen=True, slots=True)
class ToolCall:
    """One tool call the scripted assistant makes; ``arguments`` as a dict or a JSON string."""

    name: str
    arguments: dict[str, Any] | str
    id: str | None = None


@dataclass(frozen=True, slots=True)
class ScriptedTurn:
    """One assistant reply. ``finish_reason`` and ``usage`` are filled in when left ``None``;
    ``latency_ms`` overrides the server's; ``status_code >= 400`` answers an error instead."""

    content: str | None = None
    tool_calls: list[ToolCall] | None = None
    finish_reason: str | None = None
    latency_ms: float | None = None
    usage: dict[str, int] | None = None
    status_code: int = 200
    error: str | None = None

    def __post_init__(self) -> None:
        if self.error is not None and self.status_code < 400:
            raise UsageError(
                f"ScriptedTurn(error={self.error!r}) has status_code={self.status_code}: "
                "pass status_code >= 400 to script an error reply"
            )
