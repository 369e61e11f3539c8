"""Training rows from the token ids the policy proxy recorded, never from re-rendered text.

Calls whose prompts extend the previous prompt + completion form one chain (a token
segment, :func:`~osmosis_ai.controller.calls.token_segments`); the tokens in between (tool
results, user turns) join the completion masked out (``env_mask`` 0). A call that rewrites
history (a summary, a truncation) starts a new chain, and tokens are never stitched across
it: :func:`build_rows` makes each chain its own row; :func:`build_row` keeps the chain with
the most model tokens and counts the rest (``chain_breaks``), or in strict mode fails.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from osmosis_ai.controller.calls import CallRecord, token_segments
from osmosis_ai.train.errors import TokenFidelityError

ENV_LOGPROB = 0.0  # placeholder for environment tokens: masked out, never used


@dataclass(frozen=True, slots=True)
class TrainingRow:
    """One ``rollout_func`` entry. ``env_mask`` is 1 on model tokens, 0 on environment ones;
    ``logprobs`` has one value per completion token (the sampler's for model tokens)."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    env_mask: list[int]
    reward: float | None
    calls: int = 0
    dropped_calls: int = 0
    chain_breaks: int = 0
    truncated: bool = False
    excluded: str | None = None
    segment: int = 0  # which unbroken token segment of the rollout this row is
    # (policy version or None when the answer did not say, its model tokens), call by call
    versions: tuple[tuple[int | None, int], ...] = ()

    @property
    def model_tokens(self) -> int:
        return sum(self.env_mask)


@dataclass(slots=True)
class Chain:
    """Calls whose prompts extend one another: the first prompt and everything after it."""

    first_call: int
    prompt: list[int]
    completion: list[int] = field(default_factory=list[int])
    logprobs: list[float] = field(default_factory=list[float])
    mask: list[int] = field(default_factory=list[int])
    calls: int = 0
    finish_reason: str | None = None
    versions: list[tuple[int | None, int]] = field(default_factory=list[tuple[int | None, int]])

    def add(self, record: CallRecord, environment: Sequence[int]) -> None:
        completion = record.completion_token_ids or []
        logprobs = list(record.logprobs or [])
        if len(logprobs) != len(completion):  # unknown or partial: placeholders, not a guess
            logprobs = [ENV_LOGPROB] * len(completion)
        self.completion += [*environment, *completion]
        self.logprobs += [ENV_LOGPROB] * len(environment) + logprobs
        self.mask += [0] * len(environment) + [1] * len(completion)
        self.calls += 1
        self.finish_reason = record.finish_reason
        self.versions.append((record.policy_version, len(completion)))

    @property
    def model_tokens(self) -> int:
        return sum(self.mask)


@dataclass(frozen=True, slots=True)
class ChainBreak:
    """Where call ``index``'s prompt stops extending the chain before it."""

    index: int
    position: int
    expected: tuple[int, ...]
    found: tuple[int, ...]

    def describe(self) -> str:
        return (
            f"call {self.index}'s prompt is not an append-only extension of the previous "
            f"call's prompt + completion: they differ at token {self.position} (expected "
            f"{list(self.expected)}, got {list(self.found)})"
        )


def usable_calls(rollout_id: str, calls: Sequence[CallRecord]) -> list[CallRecord]:
    """The calls that reached the agent, in call order. A successful call without token
    ids cannot be trained on faithfully: :class:`TokenFidelityError`."""
    usable: list[CallRecord] = []
    for record in sorted(calls, key=lambda call: call.index):
        if not record.ok:
            continue  # the agent got an error, not tokens: it is not part of the history
        if record.prompt_token_ids is None or record.completion_token_ids is None:
            raise TokenFidelityError(
                f"rollout {rollout_id}: model call {record.index} came back without token ids "
                f"(model {record.model or '?'}): training builds rows from the ids the policy "
                "proxy records, so the upstream must return prompt_token_ids and token_ids "
                "(the local policy and vLLM do; enable request_token_data on the proxy)"
            )
        usable.append(record)
    return usable


def split_chains(calls: Sequence[CallRecord]) -> tuple[list[Chain], list[ChainBreak]]:
    """Group ``calls`` (usable, in order) into append-only chains and the breaks between."""
    chains: list[Chain] = []
    breaks: list[ChainBreak] = []
    last: int | None = None
    for record, segment in zip(calls, token_segments(calls), strict=True):
        prompt = record.prompt_token_ids or []
        if chains:
            chain = chains[-1]
            history = chain.prompt + chain.completion
            if segment == last:
                chain.add(record, prompt[len(history) :])
                continue
            breaks.append(_break(record.index, history, prompt))
        last = segment
        chain = Chain(record.index, list(prompt))
        chain.add(record, ())
        chains.append(chain)
    return chains, breaks


def build_row(
    rollout_id: str,
    calls: Sequence[CallRecord],
    reward: float | None,
    *,
    max_response_length: int,
    strict: bool = False,
) -> TrainingRow | None:
    """The training row of one rollout, or ``None`` when no call produced a model token.

    ``strict`` turns a chain break into :class:`TokenFidelityError`. A completion longer
    than ``max_response_length`` is cut there (``truncated``), as is one whose last call
    stopped on its token budget.
    """
    chains, breaks = split_chains(usable_calls(rollout_id, calls))
    if breaks and strict:
        raise TokenFidelityError(
            f"rollout {rollout_id}: {breaks[0].describe()}. The agent rewrote the "
            "conversation (re-rendered or edited messages), so its calls are not one "
            "append-only token sequence; keep the history as the model produced it, or run "
            "without strict token chains to train on each unbroken chain as a row of its own"
        )
    candidates = [chain for chain in chains if chain.model_tokens > 0]
    if not candidates:
        return None
    best = max(reversed(candidates), key=lambda chain: chain.model_tokens)  # ties: the later
    used = sum(chain.calls for chain in chains)
    return _chain_row(
        best,
        reward,
        max_response_length,
        segment=chains.index(best),
        dropped_calls=used - best.calls,
        chain_breaks=len(breaks),
    )


def build_rows(
    rollout_id: str,
    calls: Sequence[CallRecord],
    reward: float | None,
    *,
    max_response_length: int,
) -> list[TrainingRow]:
    """One training row per unbroken token segment of one rollout, in call order, each
    with the rollout's ``reward``: where the agent rewrote its conversation between calls,
    the calls after the rewrite are a row of their own, never joined to tokens the sampler
    did not see together. Segments without a model token make no row; each row is cut at
    ``max_response_length`` on its own (``truncated``)."""
    chains, breaks = split_chains(usable_calls(rollout_id, calls))
    rows: list[TrainingRow] = []
    for segment, chain in enumerate(chains):
        row = _chain_row(
            chain, reward, max_response_length, segment=segment, chain_breaks=len(breaks)
        )
        if row is not None:
            rows.append(row)
    return rows


def _chain_row(
    chain: Chain,
    reward: float | None,
    max_response_length: int,
    *,
    segment: int,
    chain_breaks: int,
    dropped_calls: int = 0,
) -> TrainingRow | None:
    """``chain`` as a row cut at ``max_response_length``; ``None`` with no model token."""
    completion, logprobs, mask = chain.completion, chain.logprobs, chain.mask
    truncated = chain.finish_reason == "length"
    versions = chain.versions
    if len(completion) > max_response_length:
        completion = completion[:max_response_length]
        logprobs, mask = logprobs[:max_response_length], mask[:max_response_length]
        versions = _kept_versions(versions, sum(mask))
        truncated = True
    if not any(mask):
        return None
    return TrainingRow(
        prompt_ids=list(chain.prompt),
        completion_ids=list(completion),
        logprobs=list(logprobs),
        env_mask=list(mask),
        reward=reward,
        calls=chain.calls,
        dropped_calls=dropped_calls,
        chain_breaks=chain_breaks,
        truncated=truncated,
        segment=segment,
        versions=tuple(versions),
    )


def _kept_versions(
    versions: Sequence[tuple[int | None, int]], kept: int
) -> list[tuple[int | None, int]]:
    """The calls' (version, model tokens) pairs for the first ``kept`` model tokens."""
    out: list[tuple[int | None, int]] = []
    for version, count in versions:
        if kept <= 0:
            break
        out.append((version, min(count, kept)))
        kept -= count
    return out


def excluded_row(prompt_ids: Sequence[int], stop_id: int, reason: str) -> TrainingRow:
    """A row that carries no reward and no loss: the prompt, one masked stop token."""
    if not prompt_ids:
        raise TokenFidelityError(f"an excluded rollout ({reason}) needs a non-empty prompt")
    return TrainingRow(
        prompt_ids=list(prompt_ids),
        completion_ids=[stop_id],
        logprobs=[ENV_LOGPROB],
        env_mask=[0],
        reward=None,
        excluded=reason,
    )


def _break(index: int, history: Sequence[int], prompt: Sequence[int]) -> ChainBreak:
    position = next(
        (i for i, (a, b) in enumerate(zip(history, prompt, strict=False)) if a != b),
        min(len(history), len(prompt)),
    )
    return ChainBreak(
        index,
        position,
        tuple(history[position : position + 4]),
        tuple(prompt[position : position + 4]),
    )
