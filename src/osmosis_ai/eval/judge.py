"""The judge endpoint: one ``provider/model`` behind one connection pool, and its errors.

``openai/<model>`` goes straight to any OpenAI-compatible chat-completions endpoint over
httpx; other providers go through LiteLLM when it is installed. A judge that rejects the
score's response format is asked again with a plainer one.
"""

from __future__ import annotations

import importlib
import ipaddress
import json
import os
from types import TracebackType
from typing import Any
from urllib.parse import urlsplit

import httpx

from osmosis_ai.errors import ConfigError, MissingExtraError, OsmosisError, UsageError
from osmosis_ai.rollout.http import async_client

__all__ = [
    "DEFAULT_CONCURRENCY",
    "DEFAULT_OPENAI_BASE_URL",
    "DEFAULT_TIMEOUT_S",
    "SNIPPET_CHARS",
    "Judge",
    "LiteLLMNotInstalledError",
    "MissingAPIKeyError",
    "ModelNotFoundError",
    "ProviderRequestError",
]

DEFAULT_OPENAI_BASE_URL = "https://api.openai.com/v1"
DEFAULT_TIMEOUT_S = 120.0
DEFAULT_CONCURRENCY = 8
SNIPPET_CHARS = 300  # of a provider's reply, quoted in an error

_SCORE_SCHEMA: dict[str, object] = {
    "type": "json_schema",
    "json_schema": {
        "name": "rubric_score",
        "strict": True,
        "schema": {
            "type": "object",
            "properties": {"score": {"type": "number"}, "explanation": {"type": "string"}},
            "required": ["score", "explanation"],
            "additionalProperties": False,
        },
    },
}
# Tried in order: a judge that rejects one (HTTP 400/422) is asked again with the next.
_RESPONSE_FORMATS: tuple[dict[str, object] | None, ...] = (
    _SCORE_SCHEMA,
    {"type": "json_object"},
    None,
)
_FORMAT_REJECTED = (400, 422)


# --- errors ---------------------------------------------------------------------------------


class MissingAPIKeyError(ConfigError):
    """No API key for the judge's provider: pass ``api_key=`` or set ``env_var``."""

    def __init__(self, provider: str, model: str, env_var: str) -> None:
        self.provider = provider
        self.model = model
        self.env_var = env_var
        super().__init__(
            f"No API key for the {provider} judge model {model!r}: set {env_var} (or pass api_key=)"
        )


class ProviderRequestError(OsmosisError):
    """The judge's provider failed a request, or answered something that is not a score.

    ``status_code`` is the HTTP status when there was one; ``detail`` keeps the provider's
    own message.
    """

    def __init__(
        self, provider: str, model: str, detail: str, *, status_code: int | None = None
    ) -> None:
        self.provider = provider
        self.model = model
        self.detail = detail
        self.status_code = status_code
        super().__init__(f"The {provider} judge request for {model!r} failed: {detail}")


class ModelNotFoundError(ProviderRequestError):
    """The provider does not know the judge model (HTTP 404 or ``model_not_found``)."""


class LiteLLMNotInstalledError(MissingExtraError):
    """A judge outside ``openai/…`` needs LiteLLM, which is not installed."""

    def __init__(self, model: str) -> None:
        feature = (
            f"the judge model {model!r} (an OpenAI-compatible endpoint needs no extra: use "
            "'openai/<model>' with OPENAI_BASE_URL or base_url=)"
        )
        super().__init__("litellm", feature, "litellm")


# --- the judge endpoint ---------------------------------------------------------------------


def _split_model(model: str) -> tuple[str, str]:
    provider, _, name = model.partition("/")
    if not provider or not name:
        raise ValueError(
            f"model must be 'provider/model' (e.g. 'openai/gpt-4o-mini'), got {model!r}"
        )
    return provider, name


def _is_loopback(url: str) -> bool:
    host = urlsplit(url).hostname or ""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class Judge:
    """One judge model behind one connection pool; remembers the response format it accepts.

    Open it with ``async with``; :meth:`complete` sends one conversation.
    """

    def __init__(
        self,
        model: str,
        *,
        api_key: str | None,
        base_url: str | None,
        timeout: float | None,
        max_connections: int = DEFAULT_CONCURRENCY,
    ) -> None:
        self.provider, self.name = _split_model(model)
        self.model = model
        if timeout is not None and not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout}")
        self.timeout = DEFAULT_TIMEOUT_S if timeout is None else timeout
        self._max_connections = max_connections
        self._format = 0  # index into _RESPONSE_FORMATS of the richest format that worked
        self._client: httpx.AsyncClient | None = None
        self._litellm: Any = None
        if self.provider == "openai":
            env_base = os.environ.get("OPENAI_BASE_URL") or os.environ.get("OPENAI_API_BASE")
            self.base_url: str | None = (base_url or env_base or DEFAULT_OPENAI_BASE_URL).rstrip(
                "/"
            )
            self.api_key = api_key or os.environ.get("OPENAI_API_KEY") or None
            if self.api_key is None and not _is_loopback(self.base_url):
                raise MissingAPIKeyError(self.provider, model, "OPENAI_API_KEY")
        else:
            self._litellm = _import_litellm(model)
            self.base_url = base_url.rstrip("/") if base_url else None
            self.api_key = api_key or None
            if self.api_key is None and not (self.base_url and _is_loopback(self.base_url)):
                self._check_litellm_key()

    def _check_litellm_key(self) -> None:
        validate = getattr(self._litellm, "validate_environment", None)
        if validate is None:
            return
        found = validate(model=self.model)
        missing = found.get("missing_keys") if isinstance(found, dict) else None
        if isinstance(found, dict) and not found.get("keys_in_environment") and missing:
            raise MissingAPIKeyError(self.provider, self.model, str(missing[0]))

    async def __aenter__(self) -> Judge:
        if self._litellm is None:
            self._client = async_client(max_connections=self._max_connections, timeout=self.timeout)
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def complete(self, messages: list[dict[str, str]]) -> str:
        """The judge's reply text; raises :class:`ProviderRequestError` (or a subclass)."""
        index = self._format
        while True:
            response_format = _RESPONSE_FORMATS[index]
            try:
                text = await self._send(messages, response_format)
            except ModelNotFoundError:
                raise
            except ProviderRequestError as exc:
                # Only a format that a later one can replace is worth a retry; the last
                # attempt (no format) reports the provider's message about the request itself.
                if response_format is None or exc.status_code not in _FORMAT_REJECTED:
                    raise
                index += 1
                continue
            # Remember a downgrade only once it worked, so one bad request cannot spoil the rest.
            self._format = max(self._format, index)
            return text

    async def _send(
        self, messages: list[dict[str, str]], response_format: dict[str, object] | None
    ) -> str:
        if self._litellm is not None:
            return await self._send_litellm(messages, response_format)
        if self._client is None:
            raise UsageError("the judge is not open: use it with `async with`")
        url = f"{self.base_url}/chat/completions"
        body: dict[str, object] = {"model": self.name, "messages": messages}
        if response_format is not None:
            body["response_format"] = response_format
        headers = {"Authorization": f"Bearer {self.api_key}"} if self.api_key else {}
        try:
            response = await self._client.post(url, json=body, headers=headers)
        except (httpx.ConnectError, httpx.ConnectTimeout) as exc:
            # httpx-aiohttp reports a refused connection as ConnectTimeout: say "cannot reach".
            detail = f"cannot reach {url}: {type(exc).__name__}: {exc}"
            raise ProviderRequestError(self.provider, self.model, detail) from exc
        except httpx.TimeoutException as exc:
            detail = f"no reply from {url} within {self.timeout:g} s"
            raise ProviderRequestError(self.provider, self.model, detail) from exc
        except httpx.HTTPError as exc:
            detail = f"the request to {url} failed: {type(exc).__name__}: {exc}"
            raise ProviderRequestError(self.provider, self.model, detail) from exc
        if response.status_code >= 400:
            raise self._status_error(response)
        try:
            data = response.json()
        except ValueError as exc:
            detail = f"HTTP {response.status_code} with a body that is not JSON"
            raise ProviderRequestError(self.provider, self.model, detail) from exc
        return self._content(data)

    def _status_error(self, response: httpx.Response) -> ProviderRequestError:
        status = response.status_code
        message, code = _error_message(response)
        detail = f"HTTP {status}: {message}"
        if status == 404 or code == "model_not_found":
            detail += f" (is {self.name!r} served at {self.base_url}?)"
            return ModelNotFoundError(self.provider, self.model, detail, status_code=status)
        return ProviderRequestError(self.provider, self.model, detail, status_code=status)

    def _content(self, data: object) -> str:
        try:
            content: object = data["choices"][0]["message"]["content"]  # type: ignore[index]
        except (KeyError, IndexError, TypeError):
            content = None
        if isinstance(content, list):  # content parts
            content = "".join(
                str(part.get("text", "")) for part in content if isinstance(part, dict)
            )
        if not isinstance(content, str) or not content.strip():
            raise ProviderRequestError(
                self.provider, self.model, "the reply has no message content to read a score from"
            )
        return content

    async def _send_litellm(
        self, messages: list[dict[str, str]], response_format: dict[str, object] | None
    ) -> str:
        import openai  # LiteLLM depends on it; its exceptions derive from openai's

        options: dict[str, object] = {
            "model": self.model,
            "messages": messages,
            "timeout": self.timeout,
        }
        if response_format is not None:
            options["response_format"] = response_format
        if self.api_key is not None:
            options["api_key"] = self.api_key
        if self.base_url is not None:
            options["api_base"] = self.base_url
        try:
            response = await self._litellm.acompletion(**options)
        except openai.APIError as exc:
            status = getattr(exc, "status_code", None)
            status = status if isinstance(status, int) else None
            message = getattr(exc, "message", None) or str(exc)
            detail = f"HTTP {status}: {message}" if status else str(message)
            if status == 404 or isinstance(exc, openai.NotFoundError):
                return_type = ModelNotFoundError
            else:
                return_type = ProviderRequestError
            raise return_type(self.provider, self.model, detail, status_code=status) from exc
        dump = getattr(response, "model_dump", None)
        return self._content(dump() if callable(dump) else response)


def _error_message(response: httpx.Response) -> tuple[str, str | None]:
    """The provider's own error message and code, from an OpenAI-style error body if any."""
    try:
        body = response.json()
    except ValueError:
        text = response.text.strip()
        return (text[:SNIPPET_CHARS] or response.reason_phrase or "no body"), None
    if isinstance(body, dict):
        error = body.get("error", body)
        if isinstance(error, dict):
            message = error.get("message") or error.get("detail") or json.dumps(error)
            code = error.get("code")
            return str(message), code if isinstance(code, str) else None
        if isinstance(error, str):
            return error, None
    return json.dumps(body)[:SNIPPET_CHARS], None


def _import_litellm(model: str) -> Any:
    try:
        return importlib.import_module("litellm")
    except ModuleNotFoundError as exc:
        raise LiteLLMNotInstalledError(model) from exc
