"""The local policy as an :class:`~osmosis_ai.controller.upstream.Upstream`, so the policy
proxy serves a checkpoint in-process: the request is queued from the event loop to the
policy's engine thread, and the answer is the JSON (or SSE payloads) an OpenAI-compatible
server would send.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.controller.asgi import refused
from osmosis_ai.controller.upstream import Preflight, run_preflight
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.asgi import JSON_ENCODER

if TYPE_CHECKING:
    from osmosis_ai.controller.policy.engine import LocalPolicy


class AnsweringUpstream:
    """An :class:`~osmosis_ai.controller.upstream.Upstream` whose answers are built in
    Python (a whole chat completion, or its chunks) rather than fetched: a subclass sets
    the model and target names and implements :meth:`answer`."""

    def __init__(self, *, model: str, target: str) -> None:
        self._model = model
        self._target = target

    @property
    def model(self) -> str:
        return self._model

    @property
    def target(self) -> str:
        return self._target

    async def answer(self, body: dict[str, Any], *, chunks: bool) -> Any:
        """The completion for ``body`` (its ``model`` already set), or its chunks."""
        raise NotImplementedError

    async def complete(self, body: dict[str, Any]) -> bytes:
        body["model"] = self._model
        return JSON_ENCODER.encode(await self.answer(body, chunks=False)).encode()

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        body["model"] = self._model
        for chunk in await self.answer(body, chunks=True):
            yield JSON_ENCODER.encode(chunk).encode()
        yield b"[DONE]"

    async def preflight(self) -> Preflight:
        return await run_preflight(self)

    async def aclose(self) -> None:
        return None


class LocalPolicyUpstream(AnsweringUpstream):
    """Serves ``policy`` to the proxy. ``model`` is the name in answers and records
    (default ``local:<model dir>``); bad requests raise :class:`UpstreamRequestError` 400."""

    def __init__(self, policy: LocalPolicy, *, model: str | None = None) -> None:
        super().__init__(model=model or f"local:{policy.name}", target=f"local:{policy.name}")
        self.policy = policy

    async def answer(self, body: dict[str, Any], *, chunks: bool) -> Any:
        try:
            if chunks:
                return await self.policy.achat_chunks(body)
            return await self.policy.achat(body)
        except (UsageError, RuntimeError) as exc:  # (torch reports out of memory so)
            status, message, kind = failure_answer(exc)
            context = f"local policy {self.policy.name} failed the request"
            raise refused(
                message, status=status, kind=kind, url=self.target, context=context
            ) from exc

    async def count_tokens(self, chat: dict[str, Any]) -> int:
        """The prompt tokens of chat request ``chat`` under the policy's chat template (as a
        call would sample from them: with the assistant's turn opener)."""
        extra = chat.get("chat_template_kwargs")
        kwargs: dict[str, Any] = dict(extra) if isinstance(extra, dict) else {}
        try:
            text = self.policy.render(chat.get("messages") or [], chat.get("tools"), **kwargs)
            return len(self.policy.encode(text))
        except UsageError as exc:
            status, message, kind = failure_answer(exc)
            context = f"local policy {self.policy.name} cannot count these tokens"
            raise refused(
                message, status=status, kind=kind, url=self.target, context=context
            ) from exc


def failure_answer(exc: BaseException) -> tuple[int, str, str]:
    """How a failure of the local policy answers the call: ``(HTTP status, message, OpenAI
    error type)``. A bad request (:class:`PolicyRequestError`, bad weights) is the caller's
    fault (400); anything else, such as torch running out of memory, is the server's (500)."""
    if isinstance(exc, UsageError):
        return 400, str(exc), "invalid_request_error"
    return 500, f"{type(exc).__name__}: {exc}", "server_error"


def open_local_upstream(
    model_dir: str | Path, *, device: str = "cpu", max_model_len: int | None = None
) -> LocalPolicyUpstream:
    """Load ``model_dir`` and serve it: what ``model_path = "local:<dir>"`` resolves to.
    Raises :class:`~osmosis_ai.errors.MissingExtraError` without the ``train`` extra."""
    from osmosis_ai.controller.policy.engine import LocalPolicy

    return LocalPolicyUpstream(LocalPolicy(model_dir, device=device, max_model_len=max_model_len))
