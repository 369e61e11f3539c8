"""Strands Agents integration (extra ``strands``): the rollout-bound model and agent.

``OsmosisStrandsAgent`` swaps the ``OsmosisRolloutModel`` placeholder for Strands' own
``OpenAIModel`` at the rollout-scoped URL and key, and is the rollout's sample source.
Strands' OpenAI provider (and with it ``openai``) is imported only when a model is bound.
"""

from __future__ import annotations

import copy
import importlib.util
import logging
from collections.abc import AsyncIterable, Mapping, Sequence
from typing import Any, cast

from osmosis_ai.errors import MissingExtraError

try:
    from strands import Agent
    from strands.hooks import BeforeModelCallEvent
    from strands.models.model import Model
    from strands.types.content import Messages
    from strands.types.streaming import StreamEvent
except ModuleNotFoundError as exc:
    raise MissingExtraError("strands", "the Strands integration", exc.name) from exc

if importlib.util.find_spec("openai") is None:  # Strands' OpenAI provider needs it
    raise MissingExtraError("strands", "the Strands integration", "openai")

from osmosis_ai.rollout.context import RolloutContext, SampleSource
from osmosis_ai.rollout.integrations import (
    NO_API_KEY,
    ROLLOUT_MODEL,
    UnboundPlaceholderError,
    check_bound_rollout,
    check_client_options,
    require_rollout,
)
from osmosis_ai.rollout.sample import RolloutSample

__all__ = ["OsmosisRolloutModel", "OsmosisStrandsAgent", "StrandsAgentSampleSource"]

logger = logging.getLogger(__name__)

_PLACEHOLDER_CALLED = (
    "OsmosisRolloutModel is a placeholder and cannot be called: build the agent with "
    "OsmosisStrandsAgent(model=OsmosisRolloutModel(...), ...) inside AgentWorkflow.run so the "
    "model is bound to the active rollout"
)


class OsmosisRolloutModel(Model):
    """Placeholder for the rollout's policy model, to put in a workflow config.

    Takes the config of Strands' ``OpenAIModel`` (``params={"temperature": 1.0, ...}``,
    ``stream=False`` for plain requests, ``model_id`` to override ``"osmosis-rollout"``) and
    ``client_args`` for ``AsyncOpenAI`` (not ``base_url``/``api_key``: the rollout sets those).
    :class:`OsmosisStrandsAgent` binds it; calling it raises :class:`UnboundPlaceholderError`.
    """

    def __init__(self, *, client_args: Mapping[str, Any] | None = None, **model_config: Any):
        self.client_args = dict(client_args or {})
        check_client_options(self.client_args, "OsmosisRolloutModel(client_args=...)")
        self.config: dict[str, Any] = dict(model_config)

    def __repr__(self) -> str:
        return f"OsmosisRolloutModel(config={self.config!r})"

    def update_config(self, **model_config: Any) -> None:
        self.config.update(model_config)

    def get_config(self) -> dict[str, Any]:
        return dict(self.config)

    def bind(self, rollout: RolloutContext | None = None) -> Model:
        """Strands' ``OpenAIModel`` at the endpoint of ``rollout`` (default: the active one)."""
        # imports openai: only when needed
        from openai import AsyncOpenAI
        from strands.models.openai import OpenAIModel

        from osmosis_ai.rollout.integrations.openai_client import bound_http_client

        rollout = rollout or require_rollout("OsmosisRolloutModel")
        client_args: dict[str, Any] = {
            # over the loop's shared pool: Strands would build a client per request
            "http_client": bound_http_client(rollout),
            **self.client_args,
            "base_url": rollout.chat_completions_url,
            "api_key": rollout.api_key or NO_API_KEY,
        }
        config: dict[str, Any] = {"model_id": ROLLOUT_MODEL, **self.config}
        return OpenAIModel(client=AsyncOpenAI(**client_args), **config)

    def structured_output(self, *args: Any, **kwargs: Any) -> Any:
        raise UnboundPlaceholderError(_PLACEHOLDER_CALLED)

    def stream(self, *args: Any, **kwargs: Any) -> AsyncIterable[StreamEvent]:
        raise UnboundPlaceholderError(_PLACEHOLDER_CALLED)


class OsmosisStrandsAgent(Agent):
    """``strands.Agent`` that binds an :class:`OsmosisRolloutModel` placeholder to the rollout.

    Initial ``messages`` with string (or OpenAI text-part) content become Strands content
    blocks, so ``messages=ctx.prompt`` works. With the placeholder, the agent registers
    itself as the rollout's sample source (one agent per rollout) and refuses to call the
    model from another rollout. Any other ``model`` is used as given.
    """

    def __init__(
        self,
        *args: Any,
        messages: Sequence[Mapping[str, Any]] | None = None,
        model: Model | str | None = None,
        **kwargs: Any,
    ) -> None:
        rollout: RolloutContext | None = None
        if isinstance(model, OsmosisRolloutModel):
            rollout = require_rollout("OsmosisRolloutModel")
            model = model.bind(rollout)
        initial = None if messages is None else to_strands_messages(messages)
        super().__init__(*args, model=model, messages=initial, **kwargs)
        self._osmosis_rollout = rollout
        if rollout is not None:
            rollout.set_sample_source(StrandsAgentSampleSource(self))
            self.hooks.add_callback(BeforeModelCallEvent, self._check_rollout)

    def _check_rollout(self, event: BeforeModelCallEvent) -> None:
        check_bound_rollout(self._osmosis_rollout, "this OsmosisStrandsAgent")


class StrandsAgentSampleSource(SampleSource):
    """The sample of a Strands agent: ``agent.messages`` (Strands content blocks).

    ``trajectory_messages`` is the same conversation as Strands' OpenAI provider sends it
    (system prompt first), best effort: ``None`` when it cannot be rendered.
    """

    def __init__(self, agent: Agent) -> None:
        self.agent = agent

    async def get_sample(self) -> RolloutSample:
        return self._sample(self.agent.messages)

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        return self._sample(self.agent.messages[-max_messages:] if max_messages > 0 else [])

    def _sample(self, messages: Messages) -> RolloutSample:
        copied = copy.deepcopy(list(messages))
        plain: list[dict[str, Any]] = [dict(message) for message in copied]
        chat = _chat_messages(copied, self.agent.system_prompt)
        return RolloutSample(messages=plain, trajectory_messages=chat)


def _chat_messages(messages: Messages, system_prompt: str | None) -> list[dict[str, Any]] | None:
    from strands.models.openai import OpenAIModel

    try:
        return OpenAIModel.format_request_messages(messages, system_prompt)
    except Exception:  # a foreign formatter that rejects content kinds in many ways
        logger.warning("could not render the agent's messages as chat messages", exc_info=True)
        return None


def to_strands_messages(messages: Sequence[Mapping[str, Any]]) -> Messages:
    """Chat messages as Strands messages: string or ``{"type": "text"}`` content becomes
    ``[{"text": ...}]`` blocks; content that already holds Strands blocks is kept."""
    converted: list[dict[str, Any]] = []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            blocks: list[Any] = [{"text": content}]
        elif isinstance(content, list):
            blocks = [_block(part) for part in cast(list[Any], content)]
        else:
            blocks = []
        converted.append({"role": message.get("role"), "content": blocks})
    return cast(Messages, converted)


def _block(part: Any) -> Any:
    if isinstance(part, str):
        return {"text": part}
    if isinstance(part, Mapping) and part.get("type") == "text" and "text" in part:
        return {"text": part["text"]}
    return part
