"""The request side of the local policy's OpenAI wire: sampling parameters, messages and
prompts read from a chat- or text-completions body, with errors that name the field.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from osmosis_ai.errors import UsageError

GREEDY_BELOW = 1e-5  # a temperature under this samples greedily (vLLM's epsilon)
_MAX_N = 128
_MAX_TOP_LOGPROBS = 20


class PolicyRequestError(UsageError):
    """A request the local policy cannot serve: a bad parameter, or a prompt too long.
    Served as HTTP 400; ``param`` names the request field when one is at fault."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


@dataclass(frozen=True, slots=True)
class SamplingParams:
    """How to sample. ``temperature`` under 1e-5 is greedy; ``max_tokens`` ``None`` runs to
    the end of the context; ``stop`` strings end a sample and are cut from its text."""

    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int | None = None
    n: int = 1
    stop: tuple[str, ...] = ()
    seed: int | None = None
    logprobs: bool = False
    top_logprobs: int = 0

    @property
    def greedy(self) -> bool:
        return self.temperature < GREEDY_BELOW

    @classmethod
    def from_body(cls, body: Mapping[str, Any], *, chat: bool = True) -> SamplingParams:
        """Read ``temperature``, ``top_p``, ``max_completion_tokens``/``max_tokens``, ``n``,
        ``stop``, ``seed``, ``logprobs`` and ``top_logprobs`` (chat), or ``logprobs`` as a
        count (text completions). Other fields are ignored."""
        temperature = _number(body, "temperature", 1.0)
        if temperature < 0:
            raise PolicyRequestError(f"temperature={temperature} must be >= 0", param="temperature")
        top_p = _number(body, "top_p", 1.0)
        if not 0 < top_p <= 1:
            raise PolicyRequestError(f"top_p={top_p} must be in (0, 1]", param="top_p")
        newer = body.get("max_completion_tokens") is not None
        field = "max_completion_tokens" if newer else "max_tokens"
        max_tokens = _integer(body, field, None, low=1)
        n = _integer(body, "n", 1, low=1, high=_MAX_N)
        assert n is not None
        stop = body.get("stop")
        if stop is None:
            stops: tuple[str, ...] = ()
        elif isinstance(stop, str):
            stops = (stop,)
        elif isinstance(stop, list) and all(isinstance(s, str) for s in stop):
            stops = tuple(str(s) for s in stop)
        else:
            raise PolicyRequestError(f"stop={stop!r} must be a string or strings", param="stop")
        if any(not s for s in stops):
            raise PolicyRequestError("stop strings must not be empty", param="stop")
        seed = _integer(body, "seed", None)
        raw = body.get("logprobs")
        if chat:
            if raw is not None and not isinstance(raw, bool):
                raise PolicyRequestError(f"logprobs={raw!r} must be a boolean", param="logprobs")
            top = _integer(body, "top_logprobs", 0, low=0, high=_MAX_TOP_LOGPROBS)
            wanted = bool(raw) or bool(top)
        else:
            top = _integer(body, "logprobs", None, low=0, high=_MAX_TOP_LOGPROBS)
            wanted = top is not None
        return cls(temperature, top_p, max_tokens, n, stops, seed, wanted, top or 0)


def chat_messages(body: Mapping[str, Any]) -> list[dict[str, Any]]:
    """The request's ``messages`` with text content parts joined into one string, as chat
    templates expect (``None`` content stays ``None``)."""
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise PolicyRequestError("'messages' must be a non-empty list", param="messages")
    plain: list[dict[str, Any]] = []
    for message in messages:
        if not isinstance(message, dict):
            raise PolicyRequestError("every message must be an object", param="messages")
        content = message.get("content")
        copy = dict(message)
        if isinstance(content, list):
            texts: list[str] = []
            for part in content:
                if not isinstance(part, dict) or part.get("type") != "text":
                    raise PolicyRequestError(
                        "the local policy reads text content parts only", param="messages"
                    )
                texts.append(str(part.get("text", "")))
            copy["content"] = "".join(texts)
        plain.append(copy)
    return plain


def prompt_list(body: Mapping[str, Any]) -> list[str | list[int]]:
    """The ``prompt`` of a text-completions request as a list: text or token ids each."""
    prompt = body.get("prompt")

    def is_ids(value: object) -> bool:
        return isinstance(value, list) and bool(value) and all(type(t) is int for t in value)

    if isinstance(prompt, str) or is_ids(prompt):
        return [prompt]  # pyright: ignore[reportReturnType]
    if isinstance(prompt, list) and prompt and all(isinstance(p, str) or is_ids(p) for p in prompt):
        return list(prompt)
    raise PolicyRequestError(
        "'prompt' must be text, token ids, or a non-empty list of either", param="prompt"
    )


def _number(body: Mapping[str, Any], name: str, default: float) -> float:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise PolicyRequestError(f"{name}={value!r} must be a number", param=name)
    return float(value)


def _integer(
    body: Mapping[str, Any],
    name: str,
    default: int | None,
    *,
    low: int | None = None,
    high: int | None = None,
) -> int | None:
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int):
        raise PolicyRequestError(f"{name}={value!r} must be an integer", param=name)
    if (low is not None and value < low) or (high is not None and value > high):
        bounds = f"from {low}" + (f" to {high}" if high is not None else " up")
        raise PolicyRequestError(f"{name}={value} must be {bounds}", param=name)
    return value
