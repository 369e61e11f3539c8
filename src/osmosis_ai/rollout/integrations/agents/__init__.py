"""Agent-framework integrations, one module per framework (each needs its own extra).

Import the module you use: ``osmosis_ai.rollout.integrations.agents.openai_agents`` or
``osmosis_ai.rollout.integrations.agents.strands``. This package imports neither.
"""

from __future__ import annotations

__all__: list[str] = []
