"""Fakes shipped for users and for our own tests: real servers on 127.0.0.1, not mocks."""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

# Names resolve on first access (PEP 562): the fakes pull in server-side dependencies.
_EXPORTS: dict[str, str] = {
    "CallbackReceiver": "osmosis_ai.testing.controller",
    "ControllerOutcome": "osmosis_ai.testing.controller",
    "ProtocolController": "osmosis_ai.testing.controller",
    "ChatRequest": "osmosis_ai.testing.model_server",
    "RecordedRequest": "osmosis_ai.testing.model_server",
    "ScriptedModelServer": "osmosis_ai.testing.model_server",
    "ScriptedTurn": "osmosis_ai.testing.turns",
    "ToolCall": "osmosis_ai.testing.turns",
}

if TYPE_CHECKING:
    from osmosis_ai.testing.controller import CallbackReceiver as CallbackReceiver
    from osmosis_ai.testing.controller import ControllerOutcome as ControllerOutcome
    from osmosis_ai.testing.controller import ProtocolController as ProtocolController
    from osmosis_ai.testing.model_server import ChatRequest as ChatRequest
    from osmosis_ai.testing.model_server import RecordedRequest as RecordedRequest
    from osmosis_ai.testing.model_server import ScriptedModelServer as ScriptedModelServer
    from osmosis_ai.testing.turns import ScriptedTurn as ScriptedTurn
    from osmosis_ai.testing.turns import ToolCall as ToolCall

__all__ = [  # = sorted(_EXPORTS)
    "CallbackReceiver",
    "ChatRequest",
    "ControllerOutcome",
    "ProtocolController",
    "RecordedRequest",
    "ScriptedModelServer",
    "ScriptedTurn",
    "ToolCall",
]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'osmosis_ai.testing' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_EXPORTS])
