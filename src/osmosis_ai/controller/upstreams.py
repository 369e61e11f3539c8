"""The upstreams that reach a model over the network, and the factory of every upstream.

:class:`OpenAICompatibleUpstream` speaks to any OpenAI-compatible server; :class:`LiteLLMUpstream`
reaches providers that are not (the ``litellm`` extra). :func:`upstream_from_model_path` maps a
config ``model_path`` to one of them, or to the in-process
:class:`~osmosis_ai.controller.policy.upstream.LocalPolicyUpstream` for ``local:<dir>``. The
:class:`~osmosis_ai.controller.upstream.Upstream` protocol they follow lives in
:mod:`osmosis_ai.controller.upstream`.
"""

from __future__ import annotations

import asyncio
import importlib
import json
from collections.abc import AsyncIterator, Mapping
from typing import Any

from osmosis_ai.controller.errors import (
    UpstreamConnectionError,
    UpstreamError,
    UpstreamRequestError,
    UpstreamTimeoutError,
    error_for_status,
    provider_message,
)
from osmosis_ai.controller.transport import open_transport
from osmosis_ai.controller.upstream import DEFAULT_TIMEOUT_SEC, Preflight, Upstream, run_preflight
from osmosis_ai.deadlines import MODEL_CALL
from osmosis_ai.errors import ConfigError, MissingExtraError
from osmosis_ai.rollout.asgi import JSON_ENCODER
from osmosis_ai.rollout.sse import SSEDecoder

__all__ = [
    "OPENAI_DEFAULT_BASE_URL",
    "LiteLLMUpstream",
    "OpenAICompatibleUpstream",
    "import_litellm",
    "sse_payloads",
    "upstream_from_model_path",
]

OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"
_DRAIN_TIMEOUT_SEC = 0.25
_LITELLM_CONNECTION_ERRORS = ("APIConnectionError", "Timeout", "ServiceUnavailableError")
# Names, anywhere in an exception's causes, of a call that got no HTTP answer: LiteLLM reports
# a refused connection to some providers as InternalServerError (500) caused by one of these.
_NO_ANSWER_ERRORS = ("ConnectError", "ConnectionError", "ConnectorError", "Timeout")


class OpenAICompatibleUpstream:
    """Any OpenAI-compatible server (OpenAI, vLLM, SGLang, Ollama, llama.cpp, …) over one
    keep-alive connection pool, created on first use on the calling event loop: a lean
    HTTP/1.1 client for ``http://`` URLs, httpx for ``https://`` (see
    :mod:`~osmosis_ai.controller.transport`).

    ``extra_body`` keys are merged into every request and win over the caller's.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None,
        model: str,
        *,
        extra_body: Mapping[str, Any] | None = None,
        timeout: float = DEFAULT_TIMEOUT_SEC,
        connect_timeout: float = 10.0,
        max_connections: int = 1024,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._model = model
        self._target = f"{self.base_url}/chat/completions"
        self._extra = dict(extra_body or {})
        headers = {"content-type": "application/json", "accept": "*/*"}
        if api_key:
            headers["authorization"] = f"Bearer {api_key}"
        self._transport = open_transport(
            self._target,
            headers,
            timeout=timeout,
            connect_timeout=min(connect_timeout, timeout),
            max_connections=max_connections,
        )

    @property
    def model(self) -> str:
        return self._model

    @property
    def target(self) -> str:
        return self._target

    def _encode(self, body: dict[str, Any]) -> bytes:
        if self._extra:
            body.update(self._extra)
        body["model"] = self._model
        return JSON_ENCODER.encode(body).encode()

    async def complete(self, body: dict[str, Any]) -> bytes:
        answer = await self._transport.post(self._encode(body))
        raw = await answer.read()
        if answer.status >= 400:
            raise error_for_status(answer.status, raw, url=self._target, model=self._model)
        return raw

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        answer = await self._transport.post(self._encode(body))
        try:
            if answer.status >= 400:
                raw = await answer.read()
                raise error_for_status(answer.status, raw, url=self._target, model=self._model)
            if "json" in answer.content_type:
                raw = await answer.read()
                raise UpstreamRequestError(
                    f"model upstream {self._target} answered a stream request with JSON, not "
                    f"server-sent events: {provider_message(raw)}",
                    url=self._target,
                    status_code=502,
                    body=raw,
                )
            yield b""  # accepted: the proxy can answer its headers before the first tokens
            chunks = answer.chunks()
            async for payload in sse_payloads(chunks, self._target):
                yield payload
            await _drain(chunks)
        finally:
            await answer.aclose()

    async def preflight(self) -> Preflight:
        return await run_preflight(self)

    async def aclose(self) -> None:
        await self._transport.aclose()


async def _drain(chunks: AsyncIterator[bytes]) -> None:
    # The connection goes back to the pool only once the body is read to its end; what
    # follows [DONE] is normally just the chunked terminator. A server that holds the stream
    # open past [DONE] costs its connection, not the agent's time.
    try:
        async with asyncio.timeout(_DRAIN_TIMEOUT_SEC):
            async for _ in chunks:
                pass
    except TimeoutError:
        pass


async def sse_payloads(chunks: AsyncIterator[bytes], url: str) -> AsyncIterator[bytes]:
    """The ``data:`` payloads of a server-sent event stream, up to and including ``[DONE]``.

    An ``event: error`` raises :class:`UpstreamRequestError` with its payload.
    """
    decoder = SSEDecoder()
    async for chunk in chunks:
        for event, payload in decoder.feed(chunk):
            if event == b"error":
                raise _error_event(payload, url)
            yield payload
            if payload == b"[DONE]":
                return
    for event, payload in decoder.flush():
        if event == b"error":
            raise _error_event(payload, url)
        yield payload


def _error_event(payload: bytes, url: str) -> UpstreamRequestError:
    said = provider_message(payload)
    return UpstreamRequestError(
        f"model upstream {url} sent an error event mid-stream: {said}",
        url=url,
        body=payload,
        provider_message=said,
    )


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
        if "Timeout" in name:
            return MODEL_CALL.error(
                UpstreamTimeoutError,
                f"LiteLLM got no answer from {self._model} ({name}: {message})",
                self._timeout,
                url=self.target,
                provider_message=message,
            )
        if any(part in name for part in _LITELLM_CONNECTION_ERRORS) or _got_no_answer(exc):
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


def _got_no_answer(exc: BaseException) -> bool:
    seen: set[int] = set()
    cause: BaseException | None = exc
    while cause is not None and id(cause) not in seen:
        seen.add(id(cause))
        if isinstance(cause, ConnectionError | TimeoutError):
            return True
        if any(part in type(cause).__name__ for part in _NO_ANSWER_ERRORS):
            return True
        cause = cause.__cause__ or cause.__context__
    return False


def upstream_from_model_path(
    model_path: str,
    env: Mapping[str, str],
    *,
    extra_body: Mapping[str, Any] | None = None,
    timeout: float | None = None,
) -> Upstream:
    """The upstream for a config ``model_path``; each wait on it is bounded by ``timeout``,
    by default the model call deadline (``OSMOSIS_MODEL_TIMEOUT_S`` in ``env``, else 600 s).

    * ``openai/<model>``: :class:`OpenAICompatibleUpstream` at ``OPENAI_BASE_URL`` (or
      ``OPENAI_API_BASE``, else the OpenAI API) with ``OPENAI_API_KEY``; this reaches any
      OpenAI-compatible server (vLLM, SGLang, Ollama, llama.cpp) without extras.
    * ``local:<dir>``: a Hugging Face checkpoint served in-process (``LocalPolicyUpstream``,
      the ``train`` extra; ``OSMOSIS_POLICY_DEVICE`` picks the device, default cpu).
    * any other ``provider/model``: LiteLLM, when installed (the ``litellm`` extra).
    """
    if model_path.startswith("local:"):
        return _local_policy(model_path.removeprefix("local:"), env)
    if timeout is None:
        timeout = MODEL_CALL.seconds(env)
    provider, _, model = model_path.partition("/")
    if not provider or not model:
        raise ConfigError(
            f"model_path {model_path!r} is not 'provider/model': use e.g. 'openai/gpt-4o-mini', "
            "or 'openai/<served name>' with OPENAI_BASE_URL for an OpenAI-compatible server"
        )
    if provider == "openai":
        base_url = env.get("OPENAI_BASE_URL") or env.get("OPENAI_API_BASE")
        api_key = env.get("OPENAI_API_KEY") or None
        if not base_url and not api_key:
            raise ConfigError(
                f"model_path {model_path!r} targets the OpenAI API but OPENAI_API_KEY is not "
                "set: set it, or set OPENAI_BASE_URL to an OpenAI-compatible server"
            )
        return OpenAICompatibleUpstream(
            base_url or OPENAI_DEFAULT_BASE_URL,
            api_key,
            model,
            extra_body=extra_body,
            timeout=timeout,
        )
    return LiteLLMUpstream(model_path, extra_body=extra_body, timeout=timeout)


def _local_policy(directory: str, env: Mapping[str, str]) -> Upstream:
    # A Hugging Face checkpoint served in-process; torch loads only here (the train extra).
    from osmosis_ai.controller.policy.upstream import open_local_upstream

    return open_local_upstream(directory, device=env.get("OSMOSIS_POLICY_DEVICE", "cpu"))


def import_litellm(model_path: str) -> Any:
    """The ``litellm`` module, or a :class:`MissingExtraError` that names the extra and the
    way to reach an OpenAI-compatible server without it."""
    try:
        return importlib.import_module("litellm")
    except ModuleNotFoundError as exc:
        feature = (
            f"model_path {model_path!r} (OpenAI-compatible servers such as vLLM, SGLang or "
            "Ollama need no extra: use 'openai/<model>' with OPENAI_BASE_URL)"
        )
        raise MissingExtraError("litellm", feature, exc.name) from exc
