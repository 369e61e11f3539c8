"""What the policy proxy records per model call, and the trajectory report built from it.

A :class:`CallRecorder` reads one answer (a whole body, or stream chunks as they pass) and
never raises on odd input: the proxy forwards bytes unchanged and the record notes problems.
Token ids and logprobs are read in the shapes vLLM, SGLang and OpenAI return them.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from osmosis_ai.rollout.trajectory.report import LlmCallMetrics, TrajectoryReport

_TOKEN_ID_PREFIX = "token_id:"  # vLLM's token names under return_tokens_as_token_ids


@dataclass(frozen=True, slots=True)
class Usage:
    """Token counts as the upstream reported them; ``cached_tokens`` from
    ``usage.prompt_tokens_details.cached_tokens``."""

    prompt_tokens: int | None = None
    completion_tokens: int | None = None
    total_tokens: int | None = None
    cached_tokens: int | None = None

    @property
    def total(self) -> int:
        """``total_tokens``, else prompt plus completion."""
        if self.total_tokens is not None:
            return self.total_tokens
        return (self.prompt_tokens or 0) + (self.completion_tokens or 0)

    @classmethod
    def parse(cls, raw: object) -> Usage | None:
        if not isinstance(raw, dict):
            return None
        details = raw.get("prompt_tokens_details")
        cached = details.get("cached_tokens") if isinstance(details, dict) else None
        return cls(
            _int(raw.get("prompt_tokens")),
            _int(raw.get("completion_tokens")),
            _int(raw.get("total_tokens")),
            _int(cached if cached is not None else raw.get("cached_tokens")),
        )


@dataclass(frozen=True, slots=True)
class CallRecord:
    """One chat-completions call through the proxy, in the order the agent made them.

    ``started_at`` is Unix time; ``latency_ms`` runs to the end of the answer and
    ``first_chunk_ms`` to the first streamed payload. Token ids and ``logprobs`` (one float
    per completion token) are set only when the upstream returned them; ``error`` says what
    failed, or what was odd in an answer that was still passed through.
    """

    rollout_id: str
    index: int
    started_at: float
    latency_ms: float
    stream: bool
    status_code: int
    finish_reason: str | None = None
    usage: Usage | None = None
    model: str | None = None
    prompt_token_ids: list[int] | None = None
    completion_token_ids: list[int] | None = None
    logprobs: list[float] | None = None
    first_chunk_ms: float | None = None
    error: str | None = None
    policy_version: int | None = None  # the policy version that answered, when it says

    @property
    def ok(self) -> bool:
        """Whether the agent got a well-formed successful answer."""
        return self.error is None and self.status_code < 400

    def to_metrics(self, segment: int | None = None) -> LlmCallMetrics:
        """This call as the ``LlmCallMetrics`` of a trajectory report; ``segment`` is its
        token segment (see :func:`token_segments`), kept in ``extra["token_segment"]``."""
        from osmosis_ai.rollout.trajectory.report import LlmCallMetrics

        usage = self.usage or Usage()
        extra: dict[str, Any] = {"latency_ms": round(self.latency_ms, 3), "stream": self.stream}
        if self.finish_reason is not None:
            extra["finish_reason"] = self.finish_reason
        if segment is not None:
            extra["token_segment"] = segment
        return LlmCallMetrics(
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            cached_tokens=usage.cached_tokens,
            prompt_token_ids=self.prompt_token_ids,
            completion_token_ids=self.completion_token_ids,
            logprobs=self.logprobs,
            model_name=self.model,
            extra=extra,
        )


class CallRecorder:
    """Accumulates one call's record; :meth:`finish` freezes it."""

    __slots__ = (
        "_logprobs",
        "_named_ids",
        "_problems",
        "_started",
        "_t0",
        "_t1",
        "completion_ids",
        "finish_reason",
        "first_chunk_ms",
        "index",
        "model",
        "policy_version",
        "prompt_ids",
        "rollout_id",
        "status_code",
        "stream",
        "usage",
    )

    def __init__(self, rollout_id: str, index: int, stream: bool) -> None:
        self.rollout_id = rollout_id
        self.index = index
        self.stream = stream
        self._started = time.time()
        self._t0 = time.perf_counter()
        self._t1: float | None = None
        self.status_code = 200
        self.finish_reason: str | None = None
        self.usage: Usage | None = None
        self.model: str | None = None
        self.policy_version: int | None = None
        self.prompt_ids: list[int] | None = None
        self.completion_ids: list[int] | None = None
        self._logprobs: list[float] | None = None
        self._named_ids: list[int] | None = []
        self._problems: list[str] = []
        self.first_chunk_ms: float | None = None

    def fail(self, status_code: int, error: str) -> None:
        self.status_code = status_code
        self._problems.append(error)

    def note(self, problem: str) -> None:
        if problem not in self._problems:
            self._problems.append(problem)

    def body(self, raw: bytes) -> None:
        """Read a whole ``chat.completion`` body."""
        try:
            parsed: object = json.loads(raw)
        except ValueError:
            self.note(f"upstream body is not JSON: {raw[:120]!r}")
            return
        self.completion(parsed, raw)

    def completion(self, parsed: object, raw: bytes = b"") -> None:
        """Read a ``chat.completion`` body already parsed (``raw`` for the notes)."""
        if not isinstance(parsed, dict) or not isinstance(parsed.get("choices"), list):
            self.note(f"upstream body is not a chat completion: {raw[:120]!r}")
            return
        self._read(parsed)

    def arrived(self) -> None:
        """A stream payload arrived now (the first one sets ``first_chunk_ms``)."""
        if self.first_chunk_ms is None:
            self.first_chunk_ms = (time.perf_counter() - self._t0) * 1000.0

    def answered(self) -> None:
        """The answer is complete: stop the latency clock (reading it may come later)."""
        self._t1 = time.perf_counter()

    def chunk(self, raw: bytes) -> None:
        """Read one stream payload (a ``chat.completion.chunk``)."""
        try:
            parsed: object = json.loads(raw)
        except ValueError:
            self.note(f"upstream stream chunk is not JSON: {raw[:120]!r}")
            return
        self._chunk(raw, parsed)

    def chunks(self, raws: list[bytes]) -> None:
        """:meth:`chunk` each payload in order; well-formed ones are parsed in one go."""
        if not raws:
            return
        try:
            parsed: object = json.loads(b"[" + b",".join(raws) + b"]")
        except ValueError:
            parsed = None
        if not isinstance(parsed, list) or len(parsed) != len(raws):  # a bad one: each alone
            for raw in raws:
                self.chunk(raw)
            return
        for raw, data in zip(raws, parsed, strict=True):
            self._chunk(raw, data)

    def parsed_chunks(self, pairs: list[tuple[bytes, object]]) -> None:
        """:meth:`chunk` each payload already parsed (``None``: it was not JSON)."""
        for raw, parsed in pairs:
            if parsed is None:
                self.chunk(raw)
            else:
                self._chunk(raw, parsed)

    def _chunk(self, raw: bytes, parsed: object) -> None:
        if not isinstance(parsed, dict):
            self.note(f"upstream stream chunk is not an object: {raw[:120]!r}")
        elif "error" in parsed and "choices" not in parsed:
            self.note(f"upstream sent an error chunk: {raw[:300]!r}")
        else:
            self._read(parsed)

    def _read(self, data: dict[str, Any]) -> None:
        try:
            self._read_fields(data)
        except Exception as exc:  # recording must never break the answer to the agent
            self.note(f"could not record the answer: {type(exc).__name__}: {exc}")

    def _read_fields(self, data: dict[str, Any]) -> None:
        model = data.get("model")
        if isinstance(model, str):
            self.model = model
        usage = data.get("usage")
        if usage is not None:
            self.usage = Usage.parse(usage) or self.usage
        version = data.get("policy_version")
        if isinstance(version, int) and not isinstance(version, bool):
            self.policy_version = version
        prompt_ids = data.get("prompt_token_ids")
        choices = data.get("choices")
        choice: object = None
        if isinstance(choices, list):
            for candidate in choices:
                if isinstance(candidate, dict) and candidate.get("index", 0) == 0:
                    choice = candidate
                    break
        if isinstance(choice, dict):
            reason = choice.get("finish_reason")
            if isinstance(reason, str):
                self.finish_reason = reason
            prompt_ids = prompt_ids or choice.get("prompt_token_ids")
            self._tokens(choice.get("token_ids"), choice.get("logprobs"))
        if prompt_ids and self.prompt_ids is None:
            self.prompt_ids = _ids(prompt_ids)
            if self.prompt_ids is None:
                self.note("upstream prompt_token_ids are not a list of integers")

    def _tokens(self, token_ids: object, logprobs: object) -> None:
        if token_ids is not None:
            ids = _ids(token_ids)
            if ids is None:
                self.note("upstream token_ids are not a list of integers")
            elif self.completion_ids is None:
                self.completion_ids = list(ids)
            else:
                self.completion_ids.extend(ids)
        if logprobs is None:
            return
        try:
            values = self._logprob_values(logprobs)
        except (KeyError, TypeError, ValueError):
            self.note("upstream logprobs have an unknown shape")
            return
        if self._logprobs is None:
            self._logprobs = values
        else:
            self._logprobs.extend(values)

    def _logprob_values(self, logprobs: object) -> list[float]:
        """One float per token from OpenAI's ``content`` entries (whose token names may
        carry ids), a legacy ``token_logprobs`` list, or a bare list; raises on any other
        shape."""
        if isinstance(logprobs, dict):
            content = logprobs.get("content")
            if content is None:
                content = logprobs.get("token_logprobs")
                return [float(v) for v in content] if content is not None else []
            values = [float(entry["logprob"]) for entry in content]
            self._names(content)
            return values
        if isinstance(logprobs, list):
            return [float(v) for v in logprobs]
        raise TypeError(type(logprobs).__name__)

    def _names(self, content: list[dict[str, Any]]) -> None:
        # Token ids encoded in token names; used only when no token_ids came at all.
        if self._named_ids is None:
            return
        try:
            for entry in content:
                token = entry["token"]
                if not token.startswith(_TOKEN_ID_PREFIX):
                    self._named_ids = None
                    return
                self._named_ids.append(int(token[len(_TOKEN_ID_PREFIX) :]))
        except (KeyError, TypeError, ValueError, AttributeError):
            self._named_ids = None

    def finish(self) -> CallRecord:
        completion_ids = self.completion_ids
        if completion_ids is None and self._named_ids:
            completion_ids = self._named_ids
        return CallRecord(
            rollout_id=self.rollout_id,
            index=self.index,
            started_at=self._started,
            latency_ms=((self._t1 or time.perf_counter()) - self._t0) * 1000.0,
            stream=self.stream,
            status_code=self.status_code,
            finish_reason=self.finish_reason,
            usage=self.usage,
            model=self.model,
            prompt_token_ids=self.prompt_ids,
            completion_token_ids=completion_ids,
            logprobs=self._logprobs,
            first_chunk_ms=self.first_chunk_ms,
            error="; ".join(self._problems) or None,
            policy_version=self.policy_version,
        )


def token_segments(calls: Sequence[CallRecord]) -> list[int | None]:
    """The token segment of each of ``calls`` (successful ones, in call order).

    A call whose prompt ids extend the previous call's prompt + completion ids continues its
    segment; one whose prompt does not (the agent summarised, truncated or re-rendered its
    conversation) starts the next, numbered from 0. Tokens are only ever joined within a
    segment, so training never stitches a sequence the sampler did not see. A call without
    token ids has no segment (``None``) and leaves the chain as it was.
    """
    segments: list[int | None] = []
    history: list[int] | None = None
    current = -1
    for call in calls:
        prompt, completion = call.prompt_token_ids, call.completion_token_ids
        if prompt is None or completion is None:
            segments.append(None)
            continue
        if history is None or prompt[: len(history)] != history:
            current += 1
        segments.append(current)
        history = prompt + completion
    return segments


def build_report(rollout_id: str, model: str, calls: list[CallRecord]) -> TrajectoryReport:
    """One sample whose ``llm_call_metrics`` are the successful calls in order (a failed
    call made no agent step), each with its token segment; ``final_metrics`` total the usage
    of every call and count the segments (``token_segments``; ``chain_breaks`` is one
    less: where the agent's conversation was rewritten between calls)."""
    from osmosis_ai.rollout.trajectory.report import SampleReport, TrajectoryReport

    ordered = sorted(calls, key=lambda call: call.index)
    succeeded = [call for call in ordered if call.ok]
    segments = token_segments(succeeded)
    metrics = [call.to_metrics(seg) for call, seg in zip(succeeded, segments, strict=True)]
    usages = [call.usage for call in ordered if call.usage is not None]
    final: dict[str, Any] = {
        "llm_calls": len(ordered),
        "failed_llm_calls": len(ordered) - len(metrics),
    }
    counted = {segment for segment in segments if segment is not None}
    if counted:
        final["token_segments"] = len(counted)
        final["chain_breaks"] = len(counted) - 1
    for field in ("prompt_tokens", "completion_tokens", "cached_tokens"):
        values = [v for usage in usages if (v := getattr(usage, field)) is not None]
        if values:
            final[f"total_{field}"] = sum(values)
    sample = SampleReport(model_name=model, llm_call_metrics=metrics, final_metrics=final)
    return TrajectoryReport(model_name=model, samples={rollout_id: sample})


def _int(value: object) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) else None


def _ids(value: object) -> list[int] | None:
    if isinstance(value, list) and all(type(v) is int for v in value):
        return value  # pyright: ignore[reportReturnType]
    return None
