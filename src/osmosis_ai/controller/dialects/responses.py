"""The OpenAI Responses API (``POST /responses``) on chat completions.

``input`` (a string, or items: messages, ``function_call``, ``function_call_output``;
``reasoning`` items carry nothing a sampler can use and are skipped), ``instructions``,
function ``tools``, ``tool_choice``, ``max_output_tokens``, ``temperature``, ``top_p``,
``parallel_tool_calls`` and ``text.format`` map onto the chat request; a stored
conversation (``previous_response_id``) and built-in tools are refused by name.
"""

from __future__ import annotations

import time
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

__all__ = ["ResponsesDialect"]

Json = dict[str, Any]

_TEXT_PARTS = frozenset({"input_text", "output_text", "text"})
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_COPIED = ("model", "temperature", "top_p", "parallel_tool_calls", "user", "seed")
_ERROR_TYPES = {401: "authentication_error", 403: "permission_error", 404: "not_found_error"}
_SNAPSHOT = b'event: %s\ndata: {"type":"%s","sequence_number":%d,"response":%s}\n\n'
_FINAL = b'event: %s\ndata: {"response":%s,"type":"%s","sequence_number":%d}\n\n'
_TEXT_DONE = (
    b"event: response.output_text.done\ndata: "
    b'{"type":"response.output_text.done","sequence_number":%d,"item_id":"%s",'
    b'"output_index":%d,"content_index":0,"text":%s,"logprobs":[]}\n\n'
)
_PART_DONE = (
    b"event: response.content_part.done\ndata: "
    b'{"type":"response.content_part.done","sequence_number":%d,"item_id":"%s",'
    b'"output_index":%d,"content_index":0,'
    b'"part":{"type":"output_text","text":%s,"annotations":[]}}\n\n'
)
_TEXT_ITEM_DONE = (
    b"event: response.output_item.done\ndata: "
    b'{"output_index":%d,"item":{"id":"%s","type":"message","role":"assistant",'
    b'"status":"completed","content":[{"type":"output_text","text":%s,"annotations":[]}]},'
    b'"type":"response.output_item.done","sequence_number":%d}\n\n'
)
_TEXT_DELTA = (  # %%d: the sequence number, %%s: the delta (filled on each token)
    b"event: response.output_text.delta\ndata: "
    b'{"type":"response.output_text.delta","sequence_number":%%d,"item_id":"%s",'
    b'"output_index":%d,"content_index":0,"delta":%%s,"logprobs":[]}\n\n'
)
_TEXT_ADDED = (
    b"event: response.output_item.added\ndata: "
    b'{"output_index":%d,"item":{"id":"%s","type":"message","role":"assistant",'
    b'"status":"in_progress","content":[]},"type":"response.output_item.added",'
    b'"sequence_number":%d}\n\n'
    b"event: response.content_part.added\ndata: "
    b'{"item_id":"%s","output_index":%d,"content_index":0,'
    b'"part":{"type":"output_text","text":"","annotations":[]},'
    b'"type":"response.content_part.added","sequence_number":%d}\n\n'
)
_ARGUMENTS_DELTA = (
    b"event: response.function_call_arguments.delta\ndata: "
    b'{"type":"response.function_call_arguments.delta","sequence_number":%d,'
    b'"item_id":"%s","output_index":%d,"delta":%s}\n\n'
)


class ResponsesDialect(Dialect):
    name = "responses"

    def to_chat(self, body: Json) -> Json:
        if body.get("previous_response_id") is not None:
            raise DialectError(
                "previous_response_id is not supported: this endpoint stores no responses; "
                "send the whole conversation in 'input'"
            )
        messages = _messages(body)
        chat: Json = {"messages": messages}
        for key in _COPIED:
            if body.get(key) is not None:
                chat[key] = body[key]
        if body.get("max_output_tokens") is not None:
            chat["max_tokens"] = body["max_output_tokens"]
        if body.get("tools"):
            chat["tools"] = [_tool(tool) for tool in body["tools"]]
        choice = body.get("tool_choice")
        if choice is not None:
            chat["tool_choice"] = _tool_choice(choice)
        text = body.get("text")
        if isinstance(text, dict) and isinstance(text.get("format"), dict):
            chat_format = _response_format(text["format"])
            if chat_format is not None:
                chat["response_format"] = chat_format
        if body.get("stream"):
            chat["stream"] = True
            chat["stream_options"] = {"include_usage": True}
        return chat

    def from_chat(self, body: Json, completion: Json) -> Json:
        choice = chat_choice(completion)
        message = choice.get("message") or {}
        output: list[Json] = []
        content = message.get("content")
        if content:
            output.append(_message_item(fresh_id("msg"), str(content), "completed"))
        for call_id, name, arguments in tool_calls_of(message):
            output.append(_call_item(fresh_id("fc"), call_id, name, arguments, "completed"))
        answer = _response_head(
            body,
            response_id=fresh_id("resp"),
            created=int(time.time()),
            model=completion.get("model"),
            output=output,
            finish_reason=choice.get("finish_reason"),
        )
        answer.update(_request_fields(body))
        answer["usage"] = _usage(completion.get("usage"))
        return answer

    def writer(self, body: Json) -> StreamWriter:
        return _ResponsesWriter(self, body)

    def error_body(self, status: int, message: str, code: str | None = None) -> bytes:
        kind = _ERROR_TYPES.get(
            status, "server_error" if status >= 500 else "invalid_request_error"
        )
        error = {"message": message, "type": kind, "param": None, "code": code}
        return JSON_ENCODER.encode({"error": error}).encode()

    def upstream_error(self, status: int, payload: bytes) -> bytes:
        return payload  # already an OpenAI-style error body


def _messages(body: Json) -> list[Json]:
    messages: list[Json] = []
    instructions = body.get("instructions")
    if instructions:
        content = text_of(instructions, _TEXT_PARTS, "instructions")
        messages.append({"role": "system", "content": content})
    given = body.get("input")
    if isinstance(given, str):
        messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for position, item in enumerate(given):
            _add_item(messages, item, f"input[{position}]")
    else:
        raise DialectError("'input' is required: a string or a list of input items")
    return messages


def _add_item(messages: list[Json], item: object, where: str) -> None:
    if not isinstance(item, dict):
        raise DialectError(f"{where} must be an object")
    kind = item.get("type", "message")
    if kind == "message":
        role = _ROLES.get(str(item.get("role")))
        if role is None:
            raise DialectError(f"{where}: role {item.get('role')!r} is not supported")
        messages.append({"role": role, "content": text_of(item.get("content"), _TEXT_PARTS, where)})
    elif kind == "function_call":
        call = {
            "id": str(item.get("call_id") or item.get("id") or fresh_id("call")),
            "type": "function",
            "function": {"name": item.get("name"), "arguments": item.get("arguments") or "{}"},
        }
        last = messages[-1] if messages else None
        if last is not None and last["role"] == "assistant":  # the calls of one turn
            last.setdefault("tool_calls", []).append(call)
        else:
            messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
    elif kind == "function_call_output":
        output = item.get("output")
        content = output if isinstance(output, str) else text_of(output, _TEXT_PARTS, where)
        messages.append({"role": "tool", "tool_call_id": item.get("call_id"), "content": content})
    elif kind != "reasoning":
        raise DialectError(f"{where}: input items of type {kind!r} are not supported here")


def _tool(tool: object) -> Json:
    if not isinstance(tool, dict) or tool.get("type") != "function":
        kind = tool.get("type") if isinstance(tool, dict) else type(tool).__name__
        raise DialectError(f"tools: type {kind!r} is not supported; only function tools are")
    function = {
        "name": tool.get("name"),
        "parameters": tool.get("parameters") or {"type": "object"},
    }
    for key in ("description", "strict"):
        if tool.get(key) is not None:
            function[key] = tool[key]
    return {"type": "function", "function": function}


def _tool_choice(choice: object) -> object:
    if isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function":
        return {"type": "function", "function": {"name": choice.get("name")}}
    raise DialectError(f"tool_choice {choice!r} is not supported: use a string or a function")


def _response_format(spec: Json) -> Json | None:
    kind = spec.get("type")
    if kind == "json_schema":
        schema = {k: spec[k] for k in ("name", "schema", "strict", "description") if k in spec}
        return {"type": "json_schema", "json_schema": schema}
    if kind == "json_object":
        return {"type": "json_object"}
    return None


def _message_item(item_id: str, text: str, status: str) -> Json:
    part = {"type": "output_text", "text": text, "annotations": []}
    return {
        "id": item_id,
        "type": "message",
        "role": "assistant",
        "status": status,
        "content": [part],
    }


def _call_item(item_id: str, call_id: str, name: str, arguments: str, status: str) -> Json:
    return {
        "id": item_id,
        "type": "function_call",
        "call_id": call_id,
        "name": name,
        "arguments": arguments,
        "status": status,
    }


def _usage(raw: object) -> Json | None:
    usage = Usage.parse(raw)
    if usage is None:
        return None
    return {
        "input_tokens": usage.prompt_tokens or 0,
        "input_tokens_details": {"cached_tokens": usage.cached_tokens or 0},
        "output_tokens": usage.completion_tokens or 0,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": usage.total,
    }


def _response_head(
    body: Json,
    *,
    response_id: str,
    created: int,
    model: object,
    output: list[Json],
    finish_reason: object,
    status: str | None = None,
) -> Json:
    """The fields of a response before those echoing the request (then comes the usage)."""
    if status is None:
        status = "incomplete" if finish_reason == "length" else "completed"
    incomplete = {"reason": "max_output_tokens"} if status == "incomplete" else None
    return {
        "id": response_id,
        "object": "response",
        "created_at": created,
        "status": status,
        "model": model or body.get("model") or "",
        "output": output,
        "error": None,
        "incomplete_details": incomplete,
    }


def _request_fields(body: Json) -> Json:
    """The fields of a response that echo its request, between the head and the usage."""
    return {
        "instructions": body.get("instructions"),
        "max_output_tokens": body.get("max_output_tokens"),
        "metadata": body.get("metadata") or {},
        "parallel_tool_calls": body.get("parallel_tool_calls", True),
        "temperature": body.get("temperature"),
        "top_p": body.get("top_p"),
        "tool_choice": body.get("tool_choice", "auto"),
        "tools": body.get("tools") or [],
        "text": body.get("text") or {"format": {"type": "text"}},
    }


class _ResponsesWriter(StreamWriter, ChunkSink):
    """``response.created`` … ``response.completed`` from one chat stream."""

    def __init__(self, dialect: Dialect, body: Json) -> None:
        super().__init__(dialect, body)
        self._id = fresh_id("resp")
        self._created = int(time.time())
        self._sequence = 0
        self._out: list[bytes] = []
        self._output: list[Json] = []
        self._reader = ChunkReader()
        self._text: Json | None = None  # the open message item
        self._delta = b""  # its delta event, to fill with the sequence number and text
        self._texts: list[str] = []
        self._calls: dict[int, tuple[Json, list[str]]] = {}  # open function calls
        self._started = False
        self._request = b""  # the encoded fields that echo the request

    def _emit(self, kind: str, **fields: Any) -> None:
        fields["type"] = kind
        fields["sequence_number"] = self._sequence
        self._sequence += 1
        self._out.append(sse_event(kind, fields))

    def _snapshot(self, status: str | None = None) -> tuple[bytes, str]:
        """The response so far, encoded, and its status. The fields echoing the request
        (its tools among them) are encoded once a stream."""
        reader = self._reader
        head = _response_head(
            self.body,
            response_id=self._id,
            created=self._created,
            model=reader.model,
            output=self._output,
            finish_reason=reader.finish_reason,
            status=status,
        )
        if not self._request:
            self._request = JSON_ENCODER.encode(_request_fields(self.body)).encode()[1:-1]
        usage = JSON_ENCODER.encode(_usage(reader.usage)).encode()
        encoded = JSON_ENCODER.encode(head).encode()[:-1]
        return b'%s,%s,"usage":%s}' % (encoded, self._request, usage), head["status"]

    def _flush(self) -> bytes:
        out, self._out = self._out, []
        return b"".join(out)

    def _start(self) -> None:
        if not self._started:
            self._started = True
            snapshot = self._snapshot("in_progress")[0]
            for kind in (b"response.created", b"response.in_progress"):  # one encoding
                self._out.append(_SNAPSHOT % (kind, kind, self._sequence, snapshot))
                self._sequence += 1

    def feed(self, chunk: Json) -> bytes:
        return self.feed_all([chunk])

    def feed_all(self, chunks: list[Json]) -> bytes:
        if not self._started and isinstance(chunks[0].get("model"), str):
            self._reader.model = chunks[0]["model"]
        self._start()
        read = self._reader.read
        for chunk in chunks:
            read(chunk, self)
        return self._flush()

    def on_text(self, text: str) -> None:
        if self._text is None:
            self._open_text()
        self._texts.append(text)
        # the event on every token, from its template: the generic encoder costs more
        self._out.append(self._delta % (self._sequence, quoted(text)))
        self._sequence += 1

    def _open_text(self) -> None:
        item = self._text = _message_item(fresh_id("msg"), "", "in_progress")
        item["content"] = []
        self._texts = []
        self._output.append(item)
        index = len(self._output) - 1
        key = item["id"].encode()
        sequence = self._sequence
        self._out.append(_TEXT_ADDED % (index, key, sequence, key, index, sequence + 1))
        self._sequence += 2
        self._delta = _TEXT_DELTA % (key, index)

    def _close_text(self) -> None:
        item, self._text = self._text, None
        if item is None:
            return
        index = self._output.index(item)
        text = "".join(self._texts)
        part = {"type": "output_text", "text": text, "annotations": []}
        key, encoded = item["id"].encode(), quoted(text)
        sequence = self._sequence
        self._out.append(_TEXT_DONE % (sequence, key, index, encoded))
        self._out.append(_PART_DONE % (sequence + 1, key, index, encoded))
        self._out.append(_TEXT_ITEM_DONE % (index, key, encoded, sequence + 2))
        self._sequence += 3
        item.update(status="completed", content=[part])

    def on_call(self, position: int, call_id: str, name: str) -> None:
        if position in self._calls:
            return
        self._close_text()
        item = _call_item(fresh_id("fc"), call_id, name, "", "in_progress")
        self._calls[position] = (item, [])
        self._output.append(item)
        self._emit(
            "response.output_item.added", output_index=len(self._output) - 1, item=dict(item)
        )

    def on_arguments(self, position: int, fragment: str) -> None:
        if position not in self._calls:
            self.on_call(position, fresh_id("call"), "")
        item, fragments = self._calls[position]
        fragments.append(fragment)
        index = self._output.index(item)
        self._out.append(
            _ARGUMENTS_DELTA % (self._sequence, item["id"].encode(), index, quoted(fragment))
        )
        self._sequence += 1

    def end(self) -> bytes:
        self._start()
        self._close_text()
        for item, fragments in self._calls.values():
            index = self._output.index(item)
            arguments = "".join(fragments)
            self._emit(
                "response.function_call_arguments.done",
                item_id=item["id"],
                output_index=index,
                name=item["name"],
                arguments=arguments,
            )
            item.update(arguments=arguments, status="completed")
            self._emit("response.output_item.done", output_index=index, item=item)
        self._calls = {}
        response, status = self._snapshot()
        kind = b"response." + status.encode()
        self._out.append(_FINAL % (kind, response, kind, self._sequence))
        self._sequence += 1
        return self._flush()

    def error(self, status: int, message: str) -> bytes:
        code = "server_error" if status >= 500 else "invalid_request_error"
        self._emit("error", code=code, message=message, param=None)
        return self._flush()
