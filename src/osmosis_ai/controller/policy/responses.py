"""The response side of the local policy's OpenAI wire: ``chat.completion`` and
``text_completion`` bodies and stream chunks built from samples, with vLLM's token fields
(``prompt_token_ids``, ``token_ids``), our ``policy_version``, and parsed tool calls.
"""

from __future__ import annotations

import json
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from osmosis_ai.controller.policy.requests import SamplingParams

_LOGPROB_FLOOR = -9999.0  # what vLLM reports for -inf: JSON has no infinities
_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

TokenBytes = Callable[[int], bytes]


@dataclass(slots=True)
class Sample:
    """One completion. ``token_ids`` always hold at least one token and keep the eos token
    or the tokens that completed a stop string; ``text`` omits both. ``logprobs`` has one
    value per token; ``top_logprobs`` one ``(id, logprob)`` list per token when asked."""

    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str
    text: str
    top_logprobs: list[list[tuple[int, float]]] | None = None


def byte_symbols() -> dict[int, str]:
    """GPT-2's byte-to-unicode table: each byte as one printable character, the alphabet
    of byte-level BPE vocabularies (how a token's ``bytes`` are recovered)."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1)]
    printable += range(ord("®"), ord("ÿ") + 1)
    table = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in table:
            table[byte] = chr(256 + shifted)
            shifted += 1
    return table


def split_tool_calls(text: str) -> tuple[str | None, list[dict[str, Any]]]:
    """``(content, tool_calls)`` of a completion in the chat template's tool-call format::

        optional content
        <tool_call>
        {"name": "<function>", "arguments": {...}}
        </tool_call>

    Every ``<tool_call>`` block must hold a JSON object with a string ``name``, else the
    text is all content. Content is what precedes the first block (``None`` when empty).
    """
    matches = list(_TOOL_CALL.finditer(text))
    calls: list[dict[str, Any]] = []
    for match in matches:
        try:
            parsed: object = json.loads(match.group(1))
        except ValueError:
            return text, []
        if not isinstance(parsed, dict) or not isinstance(parsed.get("name"), str):
            return text, []
        arguments = parsed.get("arguments", {})
        if not isinstance(arguments, str):
            arguments = json.dumps(arguments, ensure_ascii=False)
        function = {"name": parsed["name"], "arguments": arguments}
        calls.append(
            {"id": f"call_{secrets.token_hex(12)}", "type": "function", "function": function}
        )
    if not calls:
        return text, []
    content = text[: matches[0].start()].rstrip("\n")
    return content or None, calls


class Renderer:
    """Builds response bodies for one request from its samples."""

    def __init__(
        self,
        *,
        model: str,
        prompt_ids: Sequence[Sequence[int]],
        version: int,
        token_bytes: TokenBytes,
        as_token_ids: bool = False,
    ) -> None:
        self.model = model
        self.prompt_ids = [list(ids) for ids in prompt_ids]
        self.version = version
        self.token_bytes = token_bytes
        self.as_token_ids = as_token_ids
        self.created = int(time.time())

    def _name(self, token_id: int, raw: bytes) -> str:
        if self.as_token_ids:
            return f"token_id:{token_id}"
        return raw.decode("utf-8", "replace")

    def _entry(self, token_id: int, logprob: float) -> dict[str, Any]:
        raw = self.token_bytes(token_id)
        return {"token": self._name(token_id, raw), "logprob": _finite(logprob), "bytes": list(raw)}

    def chat_logprobs(
        self, sample: Sample, start: int = 0, stop: int | None = None
    ) -> dict[str, Any]:
        content: list[dict[str, Any]] = []
        end = len(sample.token_ids) if stop is None else stop
        for i in range(start, end):
            entry = self._entry(sample.token_ids[i], sample.logprobs[i])
            top = sample.top_logprobs[i] if sample.top_logprobs is not None else []
            entry["top_logprobs"] = [self._entry(t, lp) for t, lp in top]
            content.append(entry)
        return {"content": content}

    def usage(self, samples: Sequence[Sample], prompts: int = 1) -> dict[str, int]:
        prompt = sum(len(ids) for ids in self.prompt_ids[:prompts])
        completion = sum(len(s.token_ids) for s in samples)
        return {
            "prompt_tokens": prompt,
            "completion_tokens": completion,
            "total_tokens": prompt + completion,
        }

    def chat(self, samples: Sequence[Sample], params: SamplingParams) -> dict[str, Any]:
        """A ``chat.completion`` body; tool calls are parsed out of each sample's text."""
        prompt = self.prompt_ids[0]
        choices: list[dict[str, Any]] = []
        for index, sample in enumerate(samples):
            content, calls = split_tool_calls(sample.text)
            message: dict[str, Any] = {"role": "assistant", "content": content}
            finish = sample.finish_reason
            if calls:
                message["tool_calls"] = calls
                finish = "tool_calls" if finish == "stop" else finish
            choices.append(
                {
                    "index": index,
                    "message": message,
                    "logprobs": self.chat_logprobs(sample) if params.logprobs else None,
                    "finish_reason": finish,
                    "prompt_token_ids": prompt,
                    "token_ids": sample.token_ids,
                    "policy_version": self.version,
                }
            )
        return {
            "id": f"chatcmpl-{secrets.token_hex(12)}",
            "object": "chat.completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(samples),
            "prompt_token_ids": prompt,
            "policy_version": self.version,
        }

    def chat_chunks(
        self, samples: Sequence[Sample], params: SamplingParams, *, include_usage: bool
    ) -> list[dict[str, Any]]:
        """The ``chat.completion.chunk`` payloads of the same answer: per choice a role chunk,
        one chunk per token (its text, id and logprob), a tool-call chunk, a finish chunk."""
        whole = self.chat(samples, params)
        head = {k: whole[k] for k in ("id", "object", "created", "model")}
        head["object"] = "chat.completion.chunk"
        chunks: list[dict[str, Any]] = []

        def chunk(index: int, delta: dict[str, Any], **extra: Any) -> dict[str, Any]:
            choice = {"index": index, "delta": delta, "logprobs": None, "finish_reason": None}
            choice.update(extra)
            return {**head, "choices": [choice], "policy_version": self.version}

        for sample, choice in zip(samples, whole["choices"], strict=True):
            index = choice["index"]
            message = choice["message"]
            first = chunk(index, {"role": "assistant", "content": ""})
            first["prompt_token_ids"] = choice["prompt_token_ids"]
            chunks.append(first)
            pieces = _pieces(sample.token_ids, message["content"] or "", self.token_bytes)
            for i, piece in enumerate(pieces):
                delta = {"content": piece} if piece else {}
                lp = self.chat_logprobs(sample, i, i + 1) if params.logprobs else None
                chunks.append(chunk(index, delta, token_ids=[sample.token_ids[i]], logprobs=lp))
            if "tool_calls" in message:
                calls = [{"index": k, **call} for k, call in enumerate(message["tool_calls"])]
                chunks.append(chunk(index, {"tool_calls": calls}))
            chunks.append(chunk(index, {}, finish_reason=choice["finish_reason"]))
        if include_usage:
            chunks.append({**head, "choices": [], "usage": whole["usage"]})
        return chunks

    def completion(
        self, samples: Sequence[Sample], params: SamplingParams, *, per_prompt: int
    ) -> dict[str, Any]:
        """A ``text_completion`` body; sample ``i`` answers prompt ``i // per_prompt``."""
        choices: list[dict[str, Any]] = []
        for index, sample in enumerate(samples):
            logprobs: dict[str, Any] | None = None
            if params.logprobs:
                raws = [self.token_bytes(t) for t in sample.token_ids]
                offsets, offset = [], 0
                for raw in raws:
                    offsets.append(offset)
                    offset += len(raw.decode("utf-8", "replace"))
                tops = sample.top_logprobs or [[] for _ in sample.token_ids]
                logprobs = {
                    "tokens": [
                        self._name(t, r) for t, r in zip(sample.token_ids, raws, strict=True)
                    ],
                    "token_logprobs": [_finite(lp) for lp in sample.logprobs],
                    "top_logprobs": [
                        {self._name(t, self.token_bytes(t)): _finite(lp) for t, lp in top}
                        for top in tops
                    ],
                    "text_offset": offsets,
                }
            choices.append(
                {
                    "index": index,
                    "text": sample.text,
                    "logprobs": logprobs,
                    "finish_reason": sample.finish_reason,
                    "prompt_token_ids": self.prompt_ids[index // per_prompt],
                    "token_ids": sample.token_ids,
                    "policy_version": self.version,
                }
            )
        return {
            "id": f"cmpl-{secrets.token_hex(12)}",
            "object": "text_completion",
            "created": self.created,
            "model": self.model,
            "choices": choices,
            "usage": self.usage(samples, prompts=len(self.prompt_ids)),
            "policy_version": self.version,
        }


def _pieces(token_ids: Sequence[int], content: str, token_bytes: TokenBytes) -> list[str]:
    # Each token's share of ``content``: bytes accumulate until they decode, so a character
    # split over tokens goes out whole with its last token; text past the content (a stop
    # string, a tool call, an eos) goes out nowhere.
    pieces: list[str] = []
    pending = b""
    emitted = 0
    for token_id in token_ids:
        pending += token_bytes(token_id)
        try:
            text = pending.decode("utf-8")
        except UnicodeDecodeError:
            if len(pending) < 4:  # a character still incomplete: wait for its next byte
                pieces.append("")
                continue
            text = pending.decode("utf-8", "replace")
        pending = b""
        if text and content.startswith(text, emitted):
            emitted += len(text)
            pieces.append(text)
        else:
            pieces.append("")
    if emitted < len(content) and pieces:
        pieces[-1] += content[emitted:]
    return pieces


def _finite(value: float) -> float:
    return value if value >= _LOGPROB_FLOOR else _LOGPROB_FLOOR
