"""A thin :class:`~osmosis_ai.controller.upstream.Upstream` over LiteLLM, for providers that
are not OpenAI-compatible (``anthropic/…``, ``bedrock/…``). Needs the ``litellm`` extra;
provider keys come from the process environment, as LiteLLM reads them.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from osmosis_ai.controller.errors import (
    UpstreamConnectionError,
    UpstreamError,
    UpstreamRequestError,
    error_for_status,
)
from osmosis_ai.controller.upstream import (
    DEFAULT_TIMEOUT_SEC,
    Preflight,
    import_litellm,
    run_preflight,
)

_CONNECTION_ERRORS = ("APIConnectionError", "Timeout", "ServiceUnavailableError")


class LiteLLMUpstream:
    """Calls ``litellm.acompletion`` with the whole request (no ``drop_params``); answers are
    re-encoded as OpenAI JSON so the proxy treats them like any upstream's."""

    def __init__(
        self,
        model_path: str,
        *,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT_SEC,
    ) -> None:
        self._litellm = import_litellm(model_path)
        self._model = model_path
        self._extra = dict(extra_body or {})
        self._timeout = timeout

    @property
    def model(self) -> str:
        return self._model

    @property
    def target(self) -> str:
        return f"litellm:{self._model}"

    def _arguments(self, body: dict[str, Any]) -> dict[str, Any]:
        body.update(self._extra)
        body["model"] = self._model
        body.setdefault("timeout", self._timeout)
        return body

    def _error(self, exc: Exception) -> UpstreamError:
        name = type(exc).__name__
        message = str(getattr(exc, "message", None) or exc)
        status = getattr(exc, "status_code", None)
        if any(part in name for part in _CONNECTION_ERRORS):
            return UpstreamConnectionError(
                f"LiteLLM could not reach {self._model}: {name}: {message}",
                url=self.target,
                provider_message=message,
            )
        if not isinstance(status, int):
            return UpstreamRequestError(
                f"LiteLLM failed calling {self._model}: {name}: {message}",
                url=self.target,
                provider_message=message,
            )
        body = json.dumps({"error": {"message": message, "type": name, "code": None}}).encode()
        return error_for_status(status, body, url=self.target, model=self._model)

    async def complete(self, body: dict[str, Any]) -> bytes:
        body.pop("stream", None)
        try:
            response = await self._litellm.acompletion(**self._arguments(body))
        except Exception as exc:  # LiteLLM raises many provider-specific types
            raise self._error(exc) from exc
        return str(response.model_dump_json()).encode()

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        body["stream"] = True
        try:
            response = await self._litellm.acompletion(**self._arguments(body))
            async for chunk in response:
                yield str(chunk.model_dump_json()).encode()
        except Exception as exc:  # LiteLLM raises many provider-specific types
            raise self._error(exc) from exc

    async def preflight(self) -> Preflight:
        return await run_preflight(self)

    async def aclose(self) -> None:
        return None
