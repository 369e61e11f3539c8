"""The :class:`~osmosis_ai.controller.dialect.Dialect` implementations, by route name."""

from __future__ import annotations

from osmosis_ai.controller.dialect import Dialect
from osmosis_ai.controller.dialects.messages import MessagesDialect
from osmosis_ai.controller.dialects.responses import ResponsesDialect

__all__ = ["DIALECTS", "MessagesDialect", "ResponsesDialect"]

DIALECTS: dict[str, Dialect] = {d.name: d for d in (ResponsesDialect(), MessagesDialect())}
"""``responses`` (OpenAI Responses API) and ``messages`` (Anthropic Messages API)."""
