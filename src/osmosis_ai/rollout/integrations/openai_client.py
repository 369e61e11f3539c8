"""A framework-free ``openai.AsyncOpenAI`` client bound to the active rollout.

Its HTTP transport records each chat-completions exchange (request messages, reply) in a
:class:`ChatTranscriptSource`, the rollout's sample source, so plain openai code, LangGraph
or any framework that takes a client (or an httpx client) needs no adapter of its own.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any, cast

import httpx

from osmosis_ai.errors import MissingExtraError, UsageError

try:
    from openai import AsyncOpenAI
except ModuleNotFoundError as exc:
    raise MissingExtraError("openai-agents", "the OpenAI client integration", exc.name) from exc

from osmosis_ai.rollout.context import RolloutContext, SampleSource
from osmosis_ai.rollout.http import fast_cookies, shared_transport
from osmosis_ai.rollout.integrations import (
    NO_API_KEY,
    check_bound_rollout,
    check_client_options,
    require_rollout,
)
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.sse import sse_events

__all__ = [
    "ChatTranscriptSource",
    "RecordedCall",
    "bound_http_client",
    "rollout_http_client",
    "rollout_openai_client",
]

logger = logging.getLogger(__name__)

_CHAT_SUFFIX = "/chat/completions"
_TIMEOUT = httpx.Timeout(600.0, connect=5.0)  # the openai SDK's default


@dataclass(frozen=True)
class RecordedCall:
    """One chat-completions exchange: the request's ``messages`` and the assistant reply."""

    messages: list[dict[str, Any]]
    reply: dict[str, Any]


class ChatTranscriptSource(SampleSource):
    """The rollout's sample, from the chat-completions calls its clients made.

    The sample is the last call's messages followed by its reply: for the usual loop, where
    each request carries the whole conversation so far, that is the full conversation.
    """

    def __init__(self) -> None:
        self.calls: list[RecordedCall] = []

    def conversation(self) -> list[dict[str, Any]]:
        """The last call's messages plus its reply (a copy); empty before any call."""
        if not self.calls:
            return []
        last = self.calls[-1]
        return copy.deepcopy([*last.messages, last.reply])

    async def get_sample(self) -> RolloutSample | None:
        if not self.calls:
            return None
        return RolloutSample(messages=self.conversation())

    async def get_preview(self, max_messages: int) -> RolloutSample | None:
        messages = self.conversation()
        return RolloutSample(messages=messages[-max_messages:] if max_messages > 0 else [])


def rollout_openai_client(**options: Any) -> AsyncOpenAI:
    """An ``AsyncOpenAI`` at the active rollout's endpoint and key that records the conversation.

    ``options`` go to ``AsyncOpenAI`` (``timeout``, ``max_retries``, ``default_headers``…);
    the endpoint, key and HTTP client are the rollout's. Every client of one rollout records
    into the same :class:`ChatTranscriptSource`; a rollout that already has another sample
    source (an agent, a session) refuses it. Send any ``model``: the controller ignores it.
    """
    check_client_options(options, "rollout_openai_client")
    if "http_client" in options:
        raise UsageError("rollout_openai_client records through its own http_client; remove it")
    rollout = require_rollout("rollout_openai_client()")
    return AsyncOpenAI(
        base_url=rollout.chat_completions_url,
        api_key=rollout.api_key or NO_API_KEY,
        http_client=cast(Any, rollout_http_client()),  # openai 3 types httpx2, accepts httpx
        **options,
    )


def rollout_http_client(**options: Any) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` that records the active rollout's chat-completions calls.

    For frameworks that build their own OpenAI client from a base URL, a key and an httpx
    client (pass ``ctx.chat_completions_url`` and ``ctx.api_key`` alongside). ``options`` go
    to ``httpx.AsyncClient``.
    """
    rollout = require_rollout("rollout_http_client()")
    source = rollout.sample_source
    if not isinstance(source, ChatTranscriptSource):
        source = ChatTranscriptSource()
        rollout.set_sample_source(source)
    return bound_http_client(rollout, source, **options)


def bound_http_client(
    rollout: RolloutContext, transcript: ChatTranscriptSource | None = None, **options: Any
) -> httpx.AsyncClient:
    """An ``httpx.AsyncClient`` for ``rollout``'s model calls, recording into ``transcript``.

    Its requests go over the event loop's shared pool (:func:`shared_transport`), so a
    client per rollout costs no TLS context and no new connections, and closing it (or
    collecting it late, as agent frameworks' reference cycles do) holds or closes nothing
    shared. It refuses chat calls made while another rollout is active.
    """
    options.setdefault("timeout", _TIMEOUT)
    options.setdefault("follow_redirects", True)
    client = httpx.AsyncClient(transport=_RolloutTransport(rollout, transcript), **options)
    return fast_cookies(client)


class _RolloutTransport(httpx.AsyncBaseTransport):
    """Checks the rollout on chat calls and tees their successful replies into the transcript."""

    def __init__(self, rollout: RolloutContext, transcript: ChatTranscriptSource | None) -> None:
        self._rollout = rollout
        self._source = transcript

    async def handle_async_request(self, request: httpx.Request) -> httpx.Response:
        inner = shared_transport()  # the pool of the loop sending, whichever that is
        if request.method != "POST" or not request.url.path.endswith(_CHAT_SUFFIX):
            return await inner.handle_async_request(request)
        check_bound_rollout(self._rollout, "this rollout's OpenAI client")
        source = self._source
        if source is None:
            return await inner.handle_async_request(request)
        messages = _request_messages(request)
        request.headers["Accept-Encoding"] = "identity"  # the tee reads the body as sent
        response = await inner.handle_async_request(request)
        stream = response.stream
        if messages is None or response.status_code != 200:
            return response
        if not isinstance(stream, httpx.AsyncByteStream):
            return response
        is_sse = response.headers.get("content-type", "").startswith("text/event-stream")

        def record(body: bytes) -> None:
            reply = _reply_from_sse(body) if is_sse else _reply_from_json(body)
            if reply is None:
                logger.debug("rollout %s: unrecognised chat reply", self._rollout.rollout_id)
                return
            source.calls.append(RecordedCall(messages, reply))

        response.stream = _Tee(stream, record)
        return response

    async def aclose(self) -> None:
        """Nothing to close: the pool is the event loop's, shared by every rollout."""


class _Tee(httpx.AsyncByteStream):
    """Yields the body unchanged; hands what was read to ``done`` once, at its end or close.

    Clients stop reading an SSE body at ``[DONE]`` and close it, so the close counts too;
    the parsers refuse a body cut short.
    """

    def __init__(self, inner: httpx.AsyncByteStream, done: Callable[[bytes], None]) -> None:
        self._inner = inner
        self._done: Callable[[bytes], None] | None = done
        self._chunks: list[bytes] = []

    async def __aiter__(self) -> AsyncIterator[bytes]:
        async for chunk in self._inner:
            self._chunks.append(chunk)
            yield chunk
        self._finish()

    async def aclose(self) -> None:
        self._finish()
        await self._inner.aclose()

    def _finish(self) -> None:
        done, self._done = self._done, None
        if done is not None:
            done(b"".join(self._chunks))


def _request_messages(request: httpx.Request) -> list[dict[str, Any]] | None:
    try:
        body = json.loads(request.content)
    except (httpx.RequestNotRead, ValueError):
        return None
    messages = body.get("messages") if isinstance(body, dict) else None
    if not isinstance(messages, list):
        return None
    return [dict(m) for m in cast(list[Any], messages) if isinstance(m, dict)]


def _reply_from_json(body: bytes) -> dict[str, Any] | None:
    try:
        data = json.loads(body)
    except ValueError:
        return None
    choice = _first_choice(data)
    message = choice.get("message") if choice is not None else None
    if not isinstance(message, dict):
        return None
    reply = {k: v for k, v in cast(dict[str, Any], message).items() if v is not None}
    reply.setdefault("role", "assistant")
    reply.setdefault("content", None)
    return reply


def _reply_from_sse(body: bytes) -> dict[str, Any] | None:
    content: list[str] = []
    reasoning: list[str] = []
    calls: dict[int, dict[str, Any]] = {}
    seen = finished = False
    for event, payload in sse_events(body):
        if event == b"error":
            return None
        if payload == b"[DONE]":
            finished = True
            break
        try:
            chunk = json.loads(payload)
        except ValueError:
            return None
        if isinstance(chunk, dict) and "error" in chunk:
            return None
        choice = _first_choice(chunk)
        delta = choice.get("delta") if choice is not None else None
        if choice is None or not isinstance(delta, dict):
            continue
        seen = True
        finished = finished or choice.get("finish_reason") is not None
        _merge_delta(cast(dict[str, Any], delta), content, reasoning, calls)
    if not (seen and finished):
        return None
    reply: dict[str, Any] = {"role": "assistant", "content": "".join(content) if content else None}
    if reasoning:
        reply["reasoning_content"] = "".join(reasoning)
    if calls:
        reply["tool_calls"] = [calls[index] for index in sorted(calls)]
    return reply


def _merge_delta(
    delta: dict[str, Any],
    content: list[str],
    reasoning: list[str],
    calls: dict[int, dict[str, Any]],
) -> None:
    if isinstance(delta.get("content"), str):
        content.append(delta["content"])
    thought = delta.get("reasoning_content", delta.get("reasoning"))
    if isinstance(thought, str):
        reasoning.append(thought)
    for raw in delta.get("tool_calls") or []:
        if not isinstance(raw, dict):
            continue
        part = cast(dict[str, Any], raw)
        index = part.get("index", len(calls))
        call = calls.setdefault(
            index, {"id": None, "type": "function", "function": {"name": "", "arguments": ""}}
        )
        if part.get("id"):
            call["id"] = part["id"]
        function = part.get("function")
        if isinstance(function, dict):
            for key in ("name", "arguments"):
                piece = cast(dict[str, Any], function).get(key)
                if isinstance(piece, str):
                    call["function"][key] += piece


def _first_choice(data: Any) -> dict[str, Any] | None:
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list):
        return None
    for choice in cast(list[Any], choices):
        if isinstance(choice, dict) and cast(dict[str, Any], choice).get("index", 0) == 0:
            return cast(dict[str, Any], choice)
    return None
