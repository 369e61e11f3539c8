"""The Anthropic Messages API (``POST /v1/messages``) on chat completions.

``system``, ``messages`` with text, image, ``tool_use`` and ``tool_result`` blocks
(``thinking`` blocks are the model's own and are skipped), client ``tools`` with
``input_schema``, ``tool_choice``, ``max_tokens``, ``stop_sequences``, ``temperature``,
``top_p`` and ``top_k`` map onto the chat request; server tools are refused by name.

Token counting (``POST /v1/messages/count_tokens``, which Claude Code calls) maps its body
the same way (:meth:`MessagesDialect.counting_chat`) and answers ``{"input_tokens": N}``:
the prompt's tokens under the policy's chat template where the upstream has one, else
:func:`estimate_tokens`.
"""

from __future__ import annotations

import json
from typing import Any

from osmosis_ai.controller.calls import Usage
from osmosis_ai.controller.dialect import (
    ChunkReader,
    ChunkSink,
    Dialect,
    DialectError,
    StreamWriter,
    chat_choice,
    fresh_id,
    quoted,
    sse_event,
    text_of,
    tool_calls_of,
)
from osmosis_ai.rollout.asgi import JSON_ENCODER

__all__ = ["COUNT_TOKENS", "MessagesDialect", "count_answer", "estimate_tokens"]

Json = dict[str, Any]

COUNT_TOKENS = "/messages/count_tokens"
"""The token-counting route's suffix (after the rollout's path, with or without ``/v1``)."""
CHARS_PER_TOKEN = 4  # the usual rule of thumb for English text and code under BPE tokenizers
MESSAGE_TOKENS = 4  # a message's role and delimiters in a typical chat template

_TEXT = frozenset({"text"})
_SKIPPED = frozenset({"thinking", "redacted_thinking"})
_COPIED = ("model", "temperature", "top_p", "top_k")
_STOP_REASONS = {
    "length": "max_tokens",
    "tool_calls": "tool_use",
    "function_call": "tool_use",
    "content_filter": "refusal",
}
_BLOCK_STOP = b'event: content_block_stop\ndata: {"type":"content_block_stop","index":%d}\n\n'
_MESSAGE_START = (
    b"event: message_start\ndata: "
    b'{"message":{"id":"%s","type":"message","role":"assistant","model":%s,"content":[],'
    b'"stop_reason":null,"stop_sequence":null,"usage":{"input_tokens":0,"output_tokens":0}},'
    b'"type":"message_start"}\n\n'
)
_TEXT_START = (
    b"event: content_block_start\ndata: "
    b'{"index":%d,"content_block":{"type":"text","text":""},"type":"content_block_start"}\n\n'
)
_MESSAGE_STOP = b'event: message_stop\ndata: {"type":"message_stop"}\n\n'
_TEXT_DELTA = (
    b"event: content_block_delta\ndata: "
    b'{"type":"content_block_delta","index":%d,"delta":{"type":"text_delta","text":%s}}\n\n'
)
_JSON_DELTA = (
    b"event: content_block_delta\ndata: "
    b'{"type":"content_block_delta","index":%d,'
    b'"delta":{"type":"input_json_delta","partial_json":%s}}\n\n'
)
_ERROR_TYPES = {
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    413: "request_too_large",
    429: "rate_limit_error",
    529: "overloaded_error",
}


class MessagesDialect(Dialect):
    name = "messages"

    def to_chat(self, body: Json) -> Json:
        max_tokens = body.get("max_tokens")
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise DialectError("max_tokens: a positive integer is required")
        given = body.get("messages")
        if not isinstance(given, list):
            raise DialectError("messages: a list of messages is required")
        messages: list[Json] = []
        system = body.get("system")
        if system:
            messages.append({"role": "system", "content": text_of(system, _TEXT, "system")})
        for position, message in enumerate(given):
            _add_message(messages, message, f"messages.{position}")
        chat: Json = {"messages": messages, "max_tokens": max_tokens}
        for key in _COPIED:
            if body.get(key) is not None:
                chat[key] = body[key]
        if body.get("stop_sequences"):
            chat["stop"] = list(body["stop_sequences"])
        if body.get("tools"):
            chat["tools"] = [_tool(tool, f"tools.{i}") for i, tool in enumerate(body["tools"])]
        choice = body.get("tool_choice")
        if isinstance(choice, dict):
            _tool_choice(chat, choice)
        if body.get("stream"):
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        return chat

    def from_chat(self, body: Json, completion: Json) -> Json:
        choice = chat_choice(completion)
        message = choice.get("message") or {}
        content: list[Json] = []
        if message.get("content"):
            content.append({"type": "text", "text": str(message["content"])})
        for call_id, name, arguments in tool_calls_of(message):
            content.append(
                {"type": "tool_use", "id": call_id, "name": name, "input": _input(arguments)}
            )
        reason, sequence = _stop(body, choice.get("finish_reason"), choice.get("stop_reason"))
        return {
            "id": fresh_id("msg"),
            "type": "message",
            "role": "assistant",
            "model": completion.get("model") or body.get("model") or "",
            "content": content,
            "stop_reason": reason,
            "stop_sequence": sequence,
            "usage": _usage(completion.get("usage")),
        }

    def writer(self, body: Json) -> StreamWriter:
        return _MessagesWriter(self, body)

    def error_body(self, status: int, message: str, code: str | None = None) -> bytes:
        return JSON_ENCODER.encode({"type": "error", "error": _error(status, message)}).encode()

    def counting_chat(self, body: Json) -> Json:
        """The chat request whose prompt a ``count_tokens`` ``body`` describes (``system``,
        ``messages``, ``tools``; it carries no ``max_tokens``)."""
        chat = self.to_chat({**body, "max_tokens": 1, "stream": False})
        del chat["max_tokens"]
        return chat


def estimate_tokens(chat: Json) -> int:
    """About how many tokens the prompt of ``chat`` (a chat request) takes, for an upstream
    with no tokenizer at hand: a token per :data:`CHARS_PER_TOKEN` characters of the
    messages' text, tool calls and tool definitions, plus :data:`MESSAGE_TOKENS` a message."""
    characters = 0
    messages = chat.get("messages") or []
    for message in messages:
        content = message.get("content")
        if isinstance(content, str):
            characters += len(content)
        elif isinstance(content, list):
            characters += sum(len(str(part.get("text", ""))) for part in content)
        if message.get("tool_calls"):
            characters += len(JSON_ENCODER.encode(message["tool_calls"]))
    if chat.get("tools"):
        characters += len(JSON_ENCODER.encode(chat["tools"]))
    return -(-characters // CHARS_PER_TOKEN) + MESSAGE_TOKENS * len(messages)


def count_answer(tokens: int) -> bytes:
    """The body of a ``count_tokens`` answer."""
    return JSON_ENCODER.encode({"input_tokens": tokens}).encode()


def _error(status: int, message: str) -> Json:
    kind = _ERROR_TYPES.get(status, "api_error" if status >= 500 else "invalid_request_error")
    return {"type": kind, "message": message}


def _add_message(messages: list[Json], message: object, where: str) -> None:
    if not isinstance(message, dict) or message.get("role") not in ("user", "assistant", "system"):
        raise DialectError(f"{where}: a message needs role 'user', 'assistant' or 'system'")
    role, content = message["role"], message.get("content")
    if role == "system":  # Claude Code sends context mid-conversation as system messages
        messages.append({"role": "system", "content": text_of(content or "", _TEXT, where)})
        return
    if isinstance(content, str):
        messages.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise DialectError(f"{where}.content must be a string or a list of content blocks")
    parts: list[Json] = []
    calls: list[Json] = []
    for position, block in enumerate(content):
        kind = block.get("type") if isinstance(block, dict) else None
        at = f"{where}.content.{position}"
        if kind in _SKIPPED:
            continue
        if kind == "tool_result" and role == "user":
            result = block.get("content")
            text = text_of(result if result is not None else "", _TEXT, at)
            messages.append(
                {"role": "tool", "tool_call_id": block.get("tool_use_id"), "content": text}
            )
        elif kind == "tool_use" and role == "assistant":
            arguments = json.dumps(block.get("input") or {})
            function = {"name": block.get("name"), "arguments": arguments}
            calls.append({"id": block.get("id"), "type": "function", "function": function})
        else:
            parts.append(block)
    if parts or (role == "assistant" and calls) or not content:
        chat: Json = {"role": role, "content": text_of(parts, _TEXT, where) if parts else None}
        if role == "user" and chat["content"] is None:
            chat["content"] = ""
        if calls:
            chat["tool_calls"] = calls
        messages.append(chat)


def _tool(tool: object, where: str) -> Json:
    if not isinstance(tool, dict) or tool.get("type") not in (None, "custom"):
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise DialectError(f"{where}: tool type {kind!r} is not supported; only client tools are")
    function: Json = {"name": tool.get("name"), "parameters": tool.get("input_schema") or {}}
    if tool.get("description") is not None:
        function["description"] = tool["description"]
    return {"type": "function", "function": function}


def _tool_choice(chat: Json, choice: Json) -> None:
    kind = choice.get("type")
    if kind == "tool":
        chat["tool_choice"] = {"type": "function", "function": {"name": choice.get("name")}}
    elif kind in ("auto", "any", "none"):
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[str(kind)]
    else:
        raise DialectError(f"tool_choice type {kind!r} is not supported")
    if choice.get("disable_parallel_tool_use"):
        chat["parallel_tool_calls"] = False


def _input(arguments: str) -> Json:
    try:
        value: object = json.loads(arguments) if arguments else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


def _stop(body: Json, finish_reason: object, matched: object) -> tuple[str, str | None]:
    """The ``stop_reason`` and ``stop_sequence``; vLLM names the stop string it matched."""
    if (
        finish_reason == "stop"
        and isinstance(matched, str)
        and matched in (body.get("stop_sequences") or ())
    ):
        return "stop_sequence", matched
    return _STOP_REASONS.get(str(finish_reason), "end_turn"), None


def _usage(raw: object) -> Json:
    usage = Usage.parse(raw) or Usage()
    answer = {
        "input_tokens": usage.prompt_tokens or 0,
        "output_tokens": usage.completion_tokens or 0,
    }
    if usage.cached_tokens is not None:
        answer["cache_read_input_tokens"] = usage.cached_tokens
    return answer


class _MessagesWriter(StreamWriter, ChunkSink):
    """``message_start`` … ``message_stop`` from one chat stream."""

    def __init__(self, dialect: Dialect, body: Json) -> None:
        super().__init__(dialect, body)
        self._out: list[bytes] = []
        self._reader = ChunkReader()
        self._blocks = 0  # content blocks started
        self._open: list[int] = []  # started, not yet stopped
        self._text: int | None = None  # the open text block
        self._calls: dict[int, int] = {}  # tool call position -> its block
        self._started = False

    def _emit(self, kind: str, **fields: Any) -> None:
        fields["type"] = kind
        self._out.append(sse_event(kind, fields))

    def _flush(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def _start(self, model: object) -> None:
        if self._started:
            return
        self._started = True
        model = JSON_ENCODER.encode(model or self.body.get("model") or "").encode()
        self._out.append(_MESSAGE_START % (fresh_id("msg").encode(), model))

    def feed(self, chunk: Json) -> bytes:
        return self.feed_all([chunk])

    def feed_all(self, chunks: list[Json]) -> bytes:
        self._start(chunks[0].get("model"))
        read = self._reader.read
        for chunk in chunks:
            read(chunk, self)
        return self._flush()

    def _block(self, block: Json | None) -> int:
        """Start a content block: ``block``, or an empty text block when ``None``."""
        index = self._blocks
        self._blocks += 1
        self._open.append(index)
        if block is None:
            self._out.append(_TEXT_START % index)
        else:
            self._emit("content_block_start", index=index, content_block=block)
        return index

    def _stop_blocks(self) -> None:
        for index in self._open:
            self._out.append(_BLOCK_STOP % index)
        self._open = []
        self._text = None

    def on_text(self, text: str) -> None:
        if self._text is None:
            self._stop_blocks()
            self._text = self._block(None)
        self._out.append(_TEXT_DELTA % (self._text, quoted(text)))  # by hand: on every token

    def on_call(self, position: int, call_id: str, name: str) -> None:
        if position in self._calls:
            return
        if self._text is not None:
            self._stop_blocks()
        block = {"type": "tool_use", "id": call_id, "name": name, "input": {}}
        self._calls[position] = self._block(block)

    def on_arguments(self, position: int, fragment: str) -> None:
        if position not in self._calls:
            self.on_call(position, fresh_id("call"), "")
        self._out.append(_JSON_DELTA % (self._calls[position], quoted(fragment)))

    def end(self) -> bytes:
        reader = self._reader
        self._start(reader.model)
        self._stop_blocks()
        reason, sequence = _stop(self.body, reader.finish_reason, reader.stop_reason)
        usage = _usage(reader.usage)
        self._emit(
            "message_delta",
            delta={"stop_reason": reason, "stop_sequence": sequence},
            usage=usage,
        )
        self._out.append(_MESSAGE_STOP)
        return self._flush()

    def error(self, status: int, message: str) -> bytes:
        self._emit("error", error=_error(status, message))
        return self._flush()
