"""OpenAI Agents SDK integration (extra ``openai-agents``): rollout-bound model, agent, session.

``OsmosisAgent`` swaps the ``OsmosisRolloutModel`` placeholder for the SDK's own
chat-completions model over an ``AsyncOpenAI`` client at the rollout-scoped URL and key;
``OsmosisMemorySession`` keeps the conversation and is the rollout's sample source.
"""

from __future__ import annotations

import copy
import logging
import uuid
from collections.abc import AsyncIterator
from typing import Any, Generic, TypeVar, cast

from osmosis_ai.errors import MissingExtraError, UsageError

try:
    from agents import Agent
    from agents.agent_output import AgentOutputSchemaBase
    from agents.exceptions import ModelBehaviorError
    from agents.handoffs import Handoff
    from agents.items import ModelResponse, TResponseInputItem, TResponseStreamEvent
    from agents.memory.session import Session, SessionABC
    from agents.model_settings import ModelSettings
    from agents.models.chatcmpl_converter import Converter
    from agents.models.interface import Model, ModelTracing
    from agents.models.openai_chatcompletions import OpenAIChatCompletionsModel
    from agents.tool import Tool
    from agents.usage import Usage
    from openai import AsyncOpenAI
    from openai.types.responses import Response
    from openai.types.responses.response_prompt_param import ResponsePromptParam
except ModuleNotFoundError as exc:
    raise MissingExtraError("openai-agents", "the OpenAI Agents integration", exc.name) from exc

from osmosis_ai.rollout.context import RolloutContext, SampleSource, get_rollout_context
from osmosis_ai.rollout.integrations import (
    NO_API_KEY,
    ROLLOUT_MODEL,
    UnboundPlaceholderError,
    check_bound_rollout,
    check_client_options,
    require_rollout,
)
from osmosis_ai.rollout.integrations.openai_client import bound_http_client
from osmosis_ai.rollout.sample import RolloutSample

__all__ = [
    "OsmosisAgent",
    "OsmosisLitellmModel",
    "OsmosisMemorySession",
    "OsmosisRolloutModel",
    "SessionSampleSource",
]

logger = logging.getLogger(__name__)

TContext = TypeVar("TContext")

_PLACEHOLDER_CALLED = (
    "OsmosisRolloutModel is a placeholder and cannot be called: build the agent with "
    "OsmosisAgent(model=OsmosisRolloutModel(), ...) inside AgentWorkflow.run so the model is "
    "bound to the active rollout"
)


class OsmosisRolloutModel(Model):
    """Placeholder for the rollout's policy model, to put in a workflow config.

    :class:`OsmosisAgent` replaces it with an :class:`OsmosisLitellmModel` bound to the
    active rollout, passing ``stream`` and ``client_options`` on. Calling the placeholder
    itself raises :class:`UnboundPlaceholderError` (a ``NotImplementedError``).
    """

    def __init__(self, *, stream: bool = False, **client_options: Any) -> None:
        check_client_options(client_options, "OsmosisRolloutModel")
        self.stream = stream
        self.client_options = client_options

    def __repr__(self) -> str:
        return f"OsmosisRolloutModel(stream={self.stream!r})"

    def bind(self) -> OsmosisLitellmModel:
        """The real model for the active rollout (what :class:`OsmosisAgent` calls)."""
        return OsmosisLitellmModel(stream=self.stream, **self.client_options)

    async def get_response(self, *args: Any, **kwargs: Any) -> ModelResponse:
        raise UnboundPlaceholderError(_PLACEHOLDER_CALLED)

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        raise UnboundPlaceholderError(_PLACEHOLDER_CALLED)


class OsmosisLitellmModel(OpenAIChatCompletionsModel):
    """The SDK's chat-completions model bound to the active rollout's endpoint and key.

    The name is kept from earlier releases; LiteLLM is not involved. By default
    (``stream=False``) ``Runner.run`` sends plain requests and ``Runner.run_streamed``
    streams, as the SDK's own model does: a controller answers a rollout's model call whole
    either way, and a plain answer costs less CPU than one parsed from a stream.
    ``stream=True`` streams every request, ``Runner.run`` included (its response is
    assembled from the stream), for an endpoint that only streams. ``client_options`` go to
    ``AsyncOpenAI`` (e.g. ``timeout``, ``max_retries``). It refuses to call the model before
    a sample source is registered, which catches a ``Runner.run`` without
    ``session=OsmosisMemorySession()``.
    """

    def __init__(self, *, stream: bool = False, **client_options: Any) -> None:
        rollout = require_rollout("OsmosisLitellmModel")
        check_client_options(client_options, "OsmosisLitellmModel")
        # a cheap client over the loop's shared pool: nothing of it outlives the rollout
        client_options.setdefault("http_client", cast(Any, bound_http_client(rollout)))
        client = AsyncOpenAI(
            base_url=rollout.chat_completions_url,
            api_key=rollout.api_key or NO_API_KEY,
            **client_options,
        )
        super().__init__(model=ROLLOUT_MODEL, openai_client=client)
        self.rollout = rollout
        self.stream = stream

    def _check_call(self) -> None:
        check_bound_rollout(self.rollout, "this OsmosisLitellmModel")
        if self.rollout.sample_source is None:
            raise UsageError(
                f"rollout {self.rollout.rollout_id!r} has no sample source, so its conversation "
                "would be lost: pass session=OsmosisMemorySession() to Runner.run"
            )

    async def get_response(  # noqa: PLR0917 (the SDK's signature)
        self,
        system_instructions: str | None,
        input: str | list[TResponseInputItem],
        model_settings: ModelSettings,
        tools: list[Tool],
        output_schema: AgentOutputSchemaBase | None,
        handoffs: list[Handoff],
        tracing: ModelTracing,
        previous_response_id: str | None = None,
        conversation_id: str | None = None,
        prompt: ResponsePromptParam | None = None,
    ) -> ModelResponse:
        self._check_call()
        args = (system_instructions, input, model_settings, tools, output_schema, handoffs, tracing)
        if not self.stream:
            return await super().get_response(
                *args,
                previous_response_id=previous_response_id,
                conversation_id=conversation_id,
                prompt=prompt,
            )
        final: Response | None = None
        events = self.stream_response(
            *args,
            previous_response_id=previous_response_id,
            conversation_id=conversation_id,
            prompt=prompt,
        )
        async for event in events:
            if event.type == "response.completed":
                final = event.response
        if final is None:
            raise ModelBehaviorError("the model's stream ended without a completed response")
        return ModelResponse(
            output=list(final.output),
            usage=_usage(final),
            response_id=None,
            request_id=getattr(final, "_request_id", None),
        )

    def stream_response(self, *args: Any, **kwargs: Any) -> AsyncIterator[TResponseStreamEvent]:
        """The SDK's ``stream_response`` (its arguments, passed on as given), once the call is
        allowed. A plain def: the check runs at call time and the SDK's generator is returned
        as is."""
        self._check_call()
        return super().stream_response(*args, **kwargs)


def _usage(response: Response) -> Usage:
    usage = response.usage
    if usage is None:
        return Usage(requests=1)
    return Usage(
        requests=1,
        input_tokens=usage.input_tokens,
        output_tokens=usage.output_tokens,
        total_tokens=usage.total_tokens,
        input_tokens_details=usage.input_tokens_details,
        output_tokens_details=usage.output_tokens_details,
    )


class OsmosisAgent(Agent[TContext], Generic[TContext]):
    """``agents.Agent`` that binds an :class:`OsmosisRolloutModel` placeholder to the rollout.

    Any other ``model`` is used as given. Build it inside ``AgentWorkflow.run``.
    """

    def __init__(self, *args: Any, model: str | Model | None = None, **kwargs: Any) -> None:
        if isinstance(model, OsmosisRolloutModel):
            model = model.bind()
        super().__init__(*args, model=model, **kwargs)


class OsmosisMemorySession(SessionABC):
    """In-memory session that is also the rollout's sample source.

    Created inside a rollout it registers a :class:`SessionSampleSource` with it (one per
    rollout) and refuses to be used in another rollout; created outside any rollout it is a
    plain in-memory session.
    """

    def __init__(self, session_id: str | None = None) -> None:
        self.session_id = session_id or uuid.uuid4().hex
        self.items: list[TResponseInputItem] = []
        self.rollout: RolloutContext | None = get_rollout_context()
        if self.rollout is not None:
            self.rollout.set_sample_source(SessionSampleSource(self))

    def _check(self) -> None:
        check_bound_rollout(self.rollout, "this OsmosisMemorySession")

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        self._check()
        if limit is None:
            return list(self.items)
        return list(self.items[-limit:]) if limit > 0 else []

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        self._check()
        self.items.extend(items)

    async def pop_item(self) -> TResponseInputItem | None:
        self._check()
        return self.items.pop() if self.items else None

    async def clear_session(self) -> None:
        self._check()
        self.items.clear()


class SessionSampleSource(SampleSource):
    """The sample of any Agents SDK session: its Responses-API items as ``messages``.

    ``trajectory_messages`` is the SDK's chat-completions rendering of the same items, best
    effort: items the converter cannot render (hosted tools, references) leave it ``None``,
    which skips ``trajectory.json`` rather than failing a successful rollout.
    """

    def __init__(self, session: Session) -> None:
        self.session = session

    async def get_sample(self) -> RolloutSample:
        return _sample(await self.session.get_items())

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        if max_messages <= 0:
            return RolloutSample(messages=[], trajectory_messages=[])
        return _sample(await self.session.get_items(limit=max_messages))


def _sample(items: list[TResponseInputItem]) -> RolloutSample:
    messages: list[dict[str, Any]] = [dict(item) for item in copy.deepcopy(items)]
    return RolloutSample(messages=messages, trajectory_messages=_chat_messages(items))


def _chat_messages(items: list[TResponseInputItem]) -> list[dict[str, Any]] | None:
    try:
        converted = Converter.items_to_messages(items, preserve_tool_output_all_content=True)
    except Exception:  # the SDK's converter rejects many item kinds, in many ways
        logger.warning("could not render the session as chat messages", exc_info=True)
        return None
    return [dict(message) for message in copy.deepcopy(converted)]
