"""What the policy proxy needs of a model: the :class:`Upstream` protocol and its preflight.

An :class:`Upstream` takes an OpenAI chat-completions body and answers raw bytes (one JSON
body, or the ``data:`` payloads of an SSE stream) so the proxy can pass them through as is.
:func:`run_preflight` is the one tiny call every upstream makes before a run. The
implementations and :func:`~osmosis_ai.controller.upstreams.upstream_from_model_path`, which
maps a config ``model_path`` to one, live in :mod:`osmosis_ai.controller.upstreams` (remote
models) and :mod:`osmosis_ai.controller.policy.upstream` (a checkpoint served in-process).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any, Protocol

from osmosis_ai.controller.errors import UpstreamError, UpstreamRequestError
from osmosis_ai.deadlines import MODEL_CALL

__all__ = ["DEFAULT_TIMEOUT_SEC", "Preflight", "Upstream", "run_preflight"]

DEFAULT_TIMEOUT_SEC = MODEL_CALL.default_s
_PREFLIGHT_MAX_TOKENS = 16
_PREFLIGHT_MESSAGES = [{"role": "user", "content": "hi"}]


@dataclass(frozen=True, slots=True)
class Preflight:
    """A passed preflight. ``rate_limited`` means the provider answered 429: the model and
    key are fine but calls may be throttled; ``warning`` says so in words."""

    model: str
    target: str
    latency_ms: float
    rate_limited: bool = False
    warning: str | None = None


class Upstream(Protocol):
    """A chat-completions model. ``body`` is an OpenAI request that the upstream may modify
    (it sets ``model``); errors are :class:`UpstreamError` subclasses."""

    @property
    def model(self) -> str:
        """The policy model name sent upstream (the name callers ask for is ignored)."""
        ...

    @property
    def target(self) -> str:
        """Where calls go, for messages: a URL or ``litellm:<provider/model>``."""
        ...

    async def complete(self, body: dict[str, Any]) -> bytes:
        """One non-streaming call: the raw JSON body of a 2xx answer."""
        ...

    def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        """One streaming call: each SSE ``data:`` payload as it arrives, ending with
        ``[DONE]`` when the upstream sends it (the iterator may then still tidy up its
        connection). An error status raises before the first payload. An empty payload
        carries no data: it says the upstream accepted the call (skip it)."""
        ...

    async def preflight(self) -> Preflight:
        """One tiny call that fails fast on a wrong key, model or URL (429 passes)."""
        ...

    async def aclose(self) -> None:
        """Release connections."""
        ...


async def run_preflight(upstream: Upstream) -> Preflight:
    """Send ``hi`` with a small ``max_tokens``; raise on auth, not-found, request or
    connection errors; pass on 429 with a warning. Retries once with
    ``max_completion_tokens`` when a reasoning model rejects ``max_tokens``."""
    started = time.perf_counter()
    body: dict[str, Any] = {"messages": _PREFLIGHT_MESSAGES, "max_tokens": _PREFLIGHT_MAX_TOKENS}
    try:
        try:
            raw = await upstream.complete(dict(body))
        except UpstreamError as exc:
            said = (exc.provider_message or "").lower()
            if exc.status_code != 400 or "max_tokens" not in said:
                raise
            body["max_completion_tokens"] = body.pop("max_tokens")
            raw = await upstream.complete(dict(body))
    except UpstreamError as exc:
        if exc.status_code != 429:
            raise
        return Preflight(
            upstream.model,
            upstream.target,
            (time.perf_counter() - started) * 1000.0,
            rate_limited=True,
            warning=f"model upstream is rate limiting (HTTP 429): {exc.provider_message}",
        )
    try:
        parsed: object = json.loads(raw)
    except ValueError:
        parsed = None
    if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list):
        raise UpstreamRequestError(
            f"model upstream {upstream.target} answered 200 with a body that is not a chat "
            f"completion: {raw[:200]!r}; check the base URL (it usually ends in /v1)",
            url=upstream.target,
            body=raw,
        )
    return Preflight(upstream.model, upstream.target, (time.perf_counter() - started) * 1000.0)
