"""The model APIs the policy endpoint speaks besides chat completions, as one abstraction.

A :class:`Dialect` maps its API's request onto an OpenAI chat-completions body (what every
:class:`~osmosis_ai.controller.upstream.Upstream` samples from, and what the proxy records
token ids and logprobs from), and the chat answer back: a whole ``chat.completion``, or a
stream of ``chat.completion.chunk`` payloads rewritten event by event by a
:class:`StreamWriter`. Errors are answered in the API's own shape. The implementations are
in :mod:`osmosis_ai.controller.dialects`; the scripted model server uses the same ones.
"""

from __future__ import annotations

import json
import secrets
from abc import ABC, abstractmethod
from json.encoder import encode_basestring
from typing import Any

from osmosis_ai.controller.errors import ControllerError
from osmosis_ai.rollout.asgi import JSON_ENCODER

__all__ = [
    "Dialect",
    "DialectError",
    "StreamWriter",
    "fresh_id",
    "quoted",
    "sse_event",
    "text_of",
]

Json = dict[str, Any]


class DialectError(ControllerError):
    """A request the dialect cannot map (or an answer it cannot map back): the agent is
    answered with ``status`` and ``message`` in the API's error shape."""

    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


class StreamWriter(ABC):
    """Rewrites one chat-completions stream as ``dialect``'s server-sent events."""

    def __init__(self, dialect: Dialect, body: Json) -> None:
        self.dialect = dialect
        self.body = body

    def refusal(self, status: int, payload: bytes) -> bytes:
        """The whole error answer when the upstream refused before the stream began."""
        return self.dialect.upstream_error(status, payload)

    @abstractmethod
    def feed(self, chunk: Json) -> bytes:
        """The events for one ``chat.completion.chunk`` (often none)."""

    def feed_all(self, chunks: list[Json]) -> bytes:
        """The events for chunks that arrived together, in one piece: what :meth:`feed`
        gives for each in turn, joined."""
        return b"".join([self.feed(chunk) for chunk in chunks])

    @abstractmethod
    def end(self) -> bytes:
        """The closing events once the chat stream ended."""

    @abstractmethod
    def error(self, status: int, message: str) -> bytes:
        """The error event that ends a stream which already started."""


class Dialect(ABC):
    """One model API mapped onto chat completions (see the module docstring)."""

    name: str
    """The route's last path segment (``responses``, ``messages``)."""

    @abstractmethod
    def to_chat(self, body: Json) -> Json:
        """The chat-completions body for request ``body``; :class:`DialectError` when a
        field it carries has no chat equivalent. A stream asks for its usage chunk."""

    @abstractmethod
    def from_chat(self, body: Json, completion: Json) -> Json:
        """The API's answer to ``body`` from the upstream's ``chat.completion``."""

    @abstractmethod
    def writer(self, body: Json) -> StreamWriter:
        """A fresh :class:`StreamWriter` for streaming request ``body``."""

    @abstractmethod
    def error_body(self, status: int, message: str, code: str | None = None) -> bytes:
        """The API's error body for an answer with HTTP ``status``."""

    def upstream_error(self, status: int, payload: bytes) -> bytes:
        """An upstream's OpenAI-style error ``payload`` in the API's shape."""
        return self.error_body(status, error_message(payload))


def error_message(payload: bytes) -> str:
    """The message of an OpenAI-style error body, else its text."""
    try:
        parsed: object = json.loads(payload)
    except ValueError:
        return payload.decode("utf-8", "replace")
    error = parsed.get("error") if isinstance(parsed, dict) else None
    if isinstance(error, dict) and isinstance(error.get("message"), str):
        return str(error["message"])
    return payload.decode("utf-8", "replace")


def sse_event(name: str, data: Json) -> bytes:
    """One named server-sent event."""
    return b"event: " + name.encode() + b"\ndata: " + JSON_ENCODER.encode(data).encode() + b"\n\n"


def quoted(text: str) -> bytes:
    """``text`` as a JSON string (UTF-8), for events written by hand."""
    return encode_basestring(text).encode()


def fresh_id(prefix: str) -> str:
    """A new random id such as ``msg_<24 hex>``."""
    return f"{prefix}_{secrets.token_hex(12)}"


def text_of(content: object, kinds: frozenset[str], where: str) -> str | list[Json]:
    """A chat ``content`` from an API's content: a string as is; a list of parts whose
    ``type`` is in ``kinds`` joined as text, with images as ``image_url`` parts. Any other
    part is refused (``where`` names the field)."""
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise DialectError(f"{where} must be a string or a list of content parts")
    texts: list[str] = []
    parts: list[Json] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in kinds:
            text = str(part.get("text", ""))
            texts.append(text)
            parts.append({"type": "text", "text": text})
        elif kind in ("input_image", "image"):
            parts.append({"type": "image_url", "image_url": {"url": _image_url(part)}})
        else:
            raise DialectError(f"{where}: content part of type {kind!r} is not supported here")
    return "".join(texts) if len(parts) == len(texts) else parts


def _image_url(part: Json) -> str:
    url = part.get("image_url")
    if isinstance(url, str):
        return url
    source = part.get("source")
    if isinstance(source, dict):
        if source.get("type") == "url" and isinstance(source.get("url"), str):
            return str(source["url"])
        if source.get("type") == "base64":
            return f"data:{source.get('media_type', 'image/png')};base64,{source.get('data', '')}"
    raise DialectError("an image part without an image_url or a url/base64 source")


def chat_choice(completion: Json) -> Json:
    """Choice 0 of a ``chat.completion``; :class:`DialectError` (502) when it has none."""
    choices = completion.get("choices")
    if isinstance(choices, list) and choices and isinstance(choices[0], dict):
        return choices[0]
    raise DialectError("the model upstream answered without a choice", 502)


def tool_calls_of(message: Json) -> list[tuple[str, str, str]]:
    """(id, name, arguments) of each function call in a chat ``message``."""
    calls: list[tuple[str, str, str]] = []
    for call in message.get("tool_calls") or ():
        function = call.get("function") or {}
        calls.append(
            (
                str(call.get("id") or fresh_id("call")),
                str(function.get("name", "")),
                str(function.get("arguments") or ""),
            )
        )
    return calls


class ChunkReader:
    """Follows a chat stream: text deltas, tool calls as they open and grow, the finish
    reason and usage. :meth:`read` reports each piece through the writer's callbacks."""

    def __init__(self) -> None:
        self.finish_reason: str | None = None
        self.stop_reason: object = None
        self.usage: Json | None = None
        self.model: str | None = None

    def read(self, chunk: Json, writer: ChunkSink) -> None:
        model = chunk.get("model")
        if model.__class__ is str:
            self.model = model
        usage = chunk.get("usage")
        if usage and usage.__class__ is dict:
            self.usage = usage
        for choice in chunk.get("choices") or ():
            if choice.__class__ is not dict or choice.get("index", 0) != 0:
                continue
            delta = choice.get("delta")
            if delta:
                text = delta.get("content")
                if text:
                    writer.on_text(text if text.__class__ is str else str(text))
                calls = delta.get("tool_calls")
                if calls:
                    self._calls(calls, writer)
            reason = choice.get("finish_reason")
            if reason.__class__ is str:
                self.finish_reason = reason
                self.stop_reason = choice.get("stop_reason")

    @staticmethod
    def _calls(calls: list[Json], writer: ChunkSink) -> None:
        for call in calls:
            function = call.get("function") or {}
            position = call.get("index", 0)
            if call.get("id") or function.get("name"):
                call_id = str(call.get("id") or fresh_id("call"))
                writer.on_call(position, call_id, function.get("name", ""))
            if function.get("arguments"):
                writer.on_arguments(position, str(function["arguments"]))


class ChunkSink(ABC):
    """What a :class:`ChunkReader` reports to."""

    @abstractmethod
    def on_text(self, text: str) -> None: ...

    @abstractmethod
    def on_call(self, position: int, call_id: str, name: str) -> None: ...

    @abstractmethod
    def on_arguments(self, position: int, fragment: str) -> None: ...
