"""Agent-framework integrations: bind a framework's OpenAI-compatible model to the rollout.

Each submodule needs its own framework and imports only it (``agents.openai_agents``,
``agents.strands``, the framework-free ``openai_client``). This package holds what they
share: the model name sent to the controller, and the checks that tie an object to a rollout.
"""

from __future__ import annotations

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.context import RolloutContext, get_rollout_context

__all__ = [
    "NO_API_KEY",
    "ROLLOUT_MODEL",
    "RolloutBindingError",
    "UnboundPlaceholderError",
    "check_bound_rollout",
    "check_client_options",
    "require_rollout",
]

ROLLOUT_MODEL = "osmosis-rollout"
"""The ``model`` field of every request; the controller ignores it and serves its policy."""

NO_API_KEY = "EMPTY"
"""Sent when the rollout has no key, so clients never fall back to ``OPENAI_API_KEY``."""

REJECTED_CLIENT_OPTIONS = frozenset({"base_url", "api_key"})


class RolloutBindingError(UsageError, RuntimeError):
    """An integration object was used outside the rollout it belongs to, or outside any."""


class UnboundPlaceholderError(RolloutBindingError, NotImplementedError):
    """An ``OsmosisRolloutModel`` placeholder was called instead of being bound by its agent."""


def require_rollout(what: str) -> RolloutContext:
    """The active rollout context; :class:`RolloutBindingError` naming ``what`` outside one."""
    rollout = get_rollout_context()
    if rollout is None:
        raise RolloutBindingError(
            f"{what} needs an active rollout: create it inside AgentWorkflow.run, where the "
            "execution backend has entered the RolloutContext (or enter a RolloutContext "
            "yourself in a script)"
        )
    return rollout


def check_bound_rollout(bound: RolloutContext | None, what: str) -> None:
    """Fail when a rollout other than ``bound`` is active (no active rollout is allowed)."""
    current = get_rollout_context()
    if current is None or current is bound:
        return
    if bound is None:
        raise RolloutBindingError(
            f"{what} was created outside any rollout but is used in rollout "
            f"{current.rollout_id!r}: create it inside AgentWorkflow.run"
        )
    raise RolloutBindingError(
        f"{what} belongs to rollout {bound.rollout_id!r} but is used in rollout "
        f"{current.rollout_id!r}: create a new one inside each rollout's AgentWorkflow.run"
    )


def check_client_options(options: dict[str, object], what: str) -> None:
    """Refuse client options that the rollout decides (its URL and key)."""
    clash = sorted(REJECTED_CLIENT_OPTIONS & options.keys())
    if clash:
        raise UsageError(
            f"{what} got {', '.join(clash)}: the rollout sets the endpoint and key "
            "(ctx.chat_completions_url, ctx.api_key); remove them"
        )
