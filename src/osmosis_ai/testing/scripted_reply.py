"""Renders one scripted reply as a ``chat.completion`` body or as SSE chunks (which a
:class:`~osmosis_ai.controller.dialect.Dialect` rewrites for the other APIs).

Owns :class:`ScriptedReply` and the fake tokenisation behind it (one token per UTF-8 byte,
deterministic logprobs); :mod:`osmosis_ai.testing.model_server` decides what to reply.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from typing import TYPE_CHECKING, Any

from osmosis_ai.controller.asgi import dumps

if TYPE_CHECKING:
    from osmosis_ai.testing.turns import ScriptedTurn

__all__ = ["ScriptedReply", "content_text"]

_WORD = re.compile(r"\s*\S+|\s+")
_MAX_CONTENT_PIECES = 32


class ScriptedReply:
    """One scripted turn rendered for a request ``body``, as :meth:`full` or :meth:`sse`;
    ``n`` is the request's choice count, already checked by the server."""

    def __init__(
        self, body: dict[str, Any], messages: list[dict[str, Any]], turn: ScriptedTurn, n: int
    ):
        self.n = n
        self.turn = turn
        self.id = f"chatcmpl-{secrets.token_hex(12)}"
        self.created = int(time.time())
        self.model = body.get("model") or "scripted"
        self.logprobs = bool(body.get("logprobs"))
        self.token_ids = bool(body.get("return_token_ids"))
        options = body.get("stream_options")
        self.include_usage = isinstance(options, dict) and bool(options.get("include_usage"))
        self.finish_reason = turn.finish_reason or ("tool_calls" if turn.tool_calls else "stop")
        self.calls = [
            (
                call.id or f"call_{secrets.token_hex(12)}",
                call.name,
                call.arguments if isinstance(call.arguments, str) else json.dumps(call.arguments),
            )
            for call in turn.tool_calls or ()
        ]
        # Fake tokenisation: one token per UTF-8 byte of a plain rendering of the text.
        self.prompt = _render_prompt(messages).encode()
        self.call_texts = [
            json.dumps({"name": name, "arguments": args}).encode() for _, name, args in self.calls
        ]
        content = (turn.content or "").encode()
        completion_tokens = len(content) + sum(len(t) for t in self.call_texts)
        self.usage = turn.usage or {
            "prompt_tokens": len(self.prompt),
            "completion_tokens": n * completion_tokens,
            "total_tokens": len(self.prompt) + n * completion_tokens,
        }

    def _tokens(self, choice: dict[str, Any], data: bytes, offset: int) -> None:
        if self.logprobs:
            choice["logprobs"] = {"content": [_logprob(b, offset + i) for i, b in enumerate(data)]}
        if self.token_ids:
            choice["token_ids"] = list(data)

    def full(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": "assistant", "content": self.turn.content}
        if self.calls:
            message["tool_calls"] = [
                {"id": id_, "type": "function", "function": {"name": name, "arguments": args}}
                for id_, name, args in self.calls
            ]
        data = (self.turn.content or "").encode() + b"".join(self.call_texts)
        choices: list[dict[str, Any]] = []
        for index in range(self.n):
            choice: dict[str, Any] = {
                "index": index,
                "message": message,
                "logprobs": None,
                "finish_reason": self.finish_reason,
            }
            self._tokens(choice, data, 0)
            if self.token_ids:
                choice["prompt_token_ids"] = list(self.prompt)
            choices.append(choice)
        body: dict[str, Any] = {
            "id": self.id,
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage,
        }
        if self.token_ids:  # vLLM puts the prompt ids at the top level too
            body["prompt_token_ids"] = list(self.prompt)
        return body

    def sse(self) -> bytes:
        """The SSE body: each of :meth:`chunks`, then ``[DONE]``."""
        return b"".join(b"data: " + dumps(c) + b"\n\n" for c in self.chunks()) + b"data: [DONE]\n\n"

    def chunks(self) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` payloads of the streamed reply, usage included when
        the request asked for it."""
        head = {
            "id": self.id,
            "object": "chat.completion.chunk",
            "created": self.created,
            "model": self.model,
        }
        chunks = [{**head, "choices": [c]} for i in range(self.n) for c in self._choice_chunks(i)]
        if self.token_ids:  # top level as vLLM does, and per choice as in the full body
            chunks[0]["prompt_token_ids"] = list(self.prompt)
        if self.include_usage:
            chunks.append({**head, "choices": [], "usage": self.usage})
        return chunks

    def _choice_chunks(self, index: int) -> list[dict[str, Any]]:
        def chunk(delta: dict[str, Any], data: bytes = b"") -> dict[str, Any]:
            nonlocal offset
            choice: dict[str, Any] = {
                "index": index,
                "delta": delta,
                "logprobs": None,
                "finish_reason": None,
            }
            if data:
                self._tokens(choice, data, offset)
                offset += len(data)
            return choice

        offset = 0
        first = chunk({"role": "assistant", "content": None if self.turn.content is None else ""})
        if self.token_ids:
            first["prompt_token_ids"] = list(self.prompt)
        chunks = [first]
        for piece in _pieces(self.turn.content or ""):
            chunks.append(chunk({"content": piece}, piece.encode()))
        for position, ((id_, name, args), text) in enumerate(
            zip(self.calls, self.call_texts, strict=True)
        ):
            head = {"name": name, "arguments": ""}
            call = {"index": position, "id": id_, "type": "function", "function": head}
            chunks.append(chunk({"tool_calls": [call]}, text))
            step = max(1, -(-len(args) // 3))
            for start in range(0, len(args), step):
                fragment = {"arguments": args[start : start + step]}
                chunks.append(chunk({"tool_calls": [{"index": position, "function": fragment}]}))
        chunks.append(chunk({}))
        chunks[-1]["finish_reason"] = self.finish_reason
        return chunks


def content_text(content: object) -> str:
    """The text of a message ``content``: a string, or the joined text of content parts."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts
        return "".join(str(part.get("text", "")) for part in content if isinstance(part, dict))
    return ""


def prompt_tokens(messages: list[dict[str, Any]]) -> int:
    """How many fake prompt tokens ``messages`` make (what a reply's usage reports)."""
    return len(_render_prompt(messages).encode())


def _render_prompt(messages: list[dict[str, Any]]) -> str:
    parts: list[str] = []
    for message in messages:
        parts.append(f"<|{message.get('role')}|>\n{content_text(message.get('content'))}\n")
        if message.get("tool_calls"):
            parts.append(json.dumps(message["tool_calls"]) + "\n")
    parts.append("<|assistant|>\n")
    return "".join(parts)


def _pieces(text: str) -> list[str]:
    words = _WORD.findall(text)
    if len(words) <= _MAX_CONTENT_PIECES:
        return words
    step = -(-len(words) // _MAX_CONTENT_PIECES)
    return ["".join(words[i : i + step]) for i in range(0, len(words), step)]


def _logprob(byte: int, position: int) -> dict[str, Any]:
    token = chr(byte) if byte < 0x80 else f"bytes:\\x{byte:02x}"
    value = -(((byte * 31 + position * 17) % 97) + 1) / 100.0
    return {"token": token, "logprob": value, "bytes": [byte], "top_logprobs": []}
