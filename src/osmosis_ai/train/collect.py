"""TRL's ``rollout_func``: each prompt of a step becomes a rollout through the protocol,
each rollout a training row with its reward (``None`` when it has none: excluded).

A rollout whose agent rewrote its conversation between calls has several unbroken token
segments (:func:`~osmosis_ai.train.tokens.build_rows`), each a row of its own: TRL takes
exactly one completion per prompt, so the rollout's slot gets its longest segment and the
others wait in :meth:`RolloutCollector.take_segments` until the trainer appends them to the
step's batch with the rollout's advantage (:func:`~osmosis_ai.train.engine.append_segments`).

With the local policy, the next step's rollouts are dispatched as soon as a step's rows are
handed over, so the rollout server starts them while the trainer computes the update; the
policy holds their model calls until the trainer asks for that step, after the update, so
every sample still comes from the current policy. A step whose prompts turn out different
is cancelled and dispatched anew.

With ``max_staleness = K >= 1`` nothing is held: the rollouts of the next K steps run on
the weights the policy has (a copy the trainer refreshes after every optimizer step), so
their model calls and tool waits overlap the update. A step's rollouts are dispatched once
the policy is at most K versions behind the weights that step trains, so each token lags at
most K versions; a sample that lags more all the same (its calls answered by an older
policy) is generated again, never trained on. TRL corrects each token's loss by its
truncated importance ratio (:func:`~osmosis_ai.train.engine.correct_off_policy`).

Prompts carry their dataset row (``osmosis_row`` on their messages) for the label and
metadata; rewards reach TRL as the extra field ``osmosis_reward``.
"""

from __future__ import annotations

import contextlib
import logging
import math
import time
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from osmosis_ai.controller.dispatch import DispatchOutcome, DispatchRequest
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.train.bridge import RolloutBatch, RolloutBridge
from osmosis_ai.train.errors import NoRewardError
from osmosis_ai.train.events import EvalSummary
from osmosis_ai.train.step_watch import StepWatch
from osmosis_ai.train.tokens import TrainingRow, build_row, build_rows, excluded_row
from osmosis_ai.workspace import DatasetRow

logger = logging.getLogger(__name__)

ROW_KEY = "osmosis_row"
REWARD_FIELD = "osmosis_reward"


def prompt_for(index: int, row: DatasetRow) -> list[dict[str, Any]]:
    """The dataset ``prompt`` of row ``index``: its messages, each tagged with the index."""
    messages = row.initial_messages or [{"role": "user", "content": ""}]
    return [{**message, ROW_KEY: index} for message in messages]


def row_index(prompt: Any) -> int:
    if isinstance(prompt, list) and prompt and isinstance(prompt[0], dict):
        value = prompt[0].get(ROW_KEY)
        if isinstance(value, int):
            return value
    raise ValueError(f"a training prompt without its {ROW_KEY!r} tag: {str(prompt)[:200]}")


def reward_from_rollouts(
    prompts: list[Any], completions: list[Any], **kwargs: Any
) -> list[float | None]:
    """The reward function TRL calls: the rewards the graders set, ``None`` when none."""
    del completions
    rewards = kwargs.get(REWARD_FIELD)
    if not isinstance(rewards, list) or len(rewards) != len(prompts):
        raise ValueError(f"expected {len(prompts)} rollout rewards in {REWARD_FIELD!r}")
    return list(rewards)


def outcome_reward(outcome: DispatchOutcome) -> tuple[float | None, str | None]:
    """The rollout's reward, or ``None`` and why there is none."""
    if outcome.kind != "result":
        return None, f"{outcome.kind}: {outcome.detail or 'no terminal result'}"
    sample = outcome.sample
    if outcome.status != RolloutStatus.SUCCESS or sample is None:
        return None, _failure_message(outcome)
    if sample.remove_sample:
        return None, "the grader removed the sample (remove_sample)"
    if sample.reward is None or not math.isfinite(sample.reward):
        return None, "the grader set no reward: call ctx.set_reward(x) in Grader.grade"
    return float(sample.reward), None


def _failure_message(outcome: DispatchOutcome) -> str:
    for body in (outcome.result, outcome.grader, outcome.completion):
        message = getattr(body, "err_message", None)
        if message:
            return str(message)
    status = outcome.status.value if outcome.status is not None else "no status"
    return f"rollout ended with {status} and no sample"


@dataclass
class StepStats:
    """Rollout-side numbers of one step, merged into its metrics record."""

    rollouts: int = 0
    scored: int = 0
    failed: int = 0
    groups: int = 0
    groups_without_signal: int = 0
    token_segments: int = 0  # rows trained: scored rollouts' unbroken token segments
    chain_breaks: int = 0
    dropped_calls: int = 0
    truncated: int = 0
    model_tokens: int = 0
    env_tokens: int = 0
    total_tokens: int = 0
    seconds: float = 0.0
    wait_seconds: float = 0.0
    policy_version: int = 0
    policy_version_lag: int = 0
    policy_batches: int | None = None  # generation batches of the local policy, when local
    max_staleness: int = 0
    stale_tokens: int = 0  # model tokens trained, and their summed and largest staleness
    staleness_sum: int = 0
    staleness_max: int = 0
    stale_regenerated: int = 0  # samples past max_staleness, generated again
    reasons: Counter[str] = field(default_factory=Counter[str])

    def add_staleness(self, row: TrainingRow, version: int, dispatched: int) -> None:
        """Count ``row``'s model tokens, each as stale as the policy versions between the
        one that generated it (``dispatched`` where its answer did not say) and ``version``,
        the one the step trains."""
        for generated, tokens in row.versions:
            lag = max(0, version - (dispatched if generated is None else generated))
            self.stale_tokens += tokens
            self.staleness_sum += lag * tokens
            if tokens:
                self.staleness_max = max(self.staleness_max, lag)

    def to_metrics(self) -> dict[str, Any]:
        seconds = max(self.seconds, 1e-9)
        batches = {} if self.policy_batches is None else {"policy_batches": self.policy_batches}
        return {
            "rollouts": self.rollouts,
            "failed_rollouts": self.failed,
            "groups_without_signal": self.groups_without_signal,
            "token_segments": self.token_segments,
            "chain_breaks": self.chain_breaks,
            "dropped_calls": self.dropped_calls,
            "truncation_ratio": self.truncated / max(self.scored, 1),
            "total_length": self.total_tokens / max(self.scored, 1),
            "rollout_seconds": round(self.seconds, 4),
            "rollout_wait_seconds": round(self.wait_seconds, 4),
            "rollouts_per_s": self.rollouts / seconds,
            "tokens_per_s": (self.model_tokens + self.env_tokens) / seconds,
            "policy_version": self.policy_version,
            "policy_version_lag": self.policy_version_lag,
            "max_staleness": self.max_staleness,
            "staleness_mean": round(self.staleness_sum / max(self.stale_tokens, 1), 4),
            "staleness_max": self.staleness_max,
            "stale_regenerated": self.stale_regenerated,
            **batches,
        }


@dataclass(frozen=True)
class _Ahead:
    """A step's rollouts dispatched before TRL asked for them."""

    step: int
    indices: list[int]
    batch: RolloutBatch
    started: float
    batches: int | None  # the policy's batch count when they were dispatched
    version: int  # the policy version then (for answers that do not say theirs)


class RolloutCollector:
    """The ``rollout_func``: dispatches one rollout per prompt and builds their rows.

    ``fallback_prompt(row)`` tokenizes a row's prompt for rollouts that made no model call
    (their excluded row needs a prompt); ``stop_id`` is the token such a row completes with.
    ``next_rows(step)`` gives the dataset rows of ``step``'s prompts (in order) when its
    rollouts may be dispatched ahead, else ``None``; without it nothing is.
    ``sampler_logprobs``: hand TRL the sampled tokens' logprobs (its vLLM importance
    sampling correction reads them; nothing else does).
    ``strict``: a rollout whose calls break the token chain fails the run; otherwise each
    of its unbroken segments is trained as a row (see :meth:`take_segments`).
    ``max_staleness``: how many policy versions a sample may lag behind the weights it
    trains (0: every sample comes from the current policy, the next step's model calls held
    until the update is done).
    """

    def __init__(
        self,
        bridge: RolloutBridge,
        rows: Sequence[DatasetRow],
        *,
        fallback_prompt: Callable[[DatasetRow], list[int]],
        stop_id: int,
        agent_timeout_sec: float,
        grader_timeout_sec: float,
        max_response_length: int,
        group_size: int,
        strict: bool = False,
        on_failure: Callable[[str, str], None] | None = None,
        next_rows: Callable[[int], list[int] | None] | None = None,
        sampler_logprobs: bool = False,
        max_staleness: int = 0,
    ) -> None:
        self.bridge = bridge
        self.rows = rows
        self.fallback_prompt = fallback_prompt
        self.stop_id = stop_id
        self.agent_timeout_sec = agent_timeout_sec
        self.grader_timeout_sec = grader_timeout_sec
        self.max_response_length = max_response_length
        self.group_size = group_size
        self.strict = strict
        self.on_failure = on_failure
        self.next_rows = next_rows
        self.sampler_logprobs = sampler_logprobs
        self.max_staleness = max_staleness
        self.last: StepStats | None = None
        self.watch: StepWatch | None = None  # the trainer step deadline, paused for rollouts
        self._fallbacks: dict[int, list[int]] = {}
        self._ahead: list[_Ahead] = []  # in step order
        self._segments: list[tuple[int, TrainingRow]] = []

    def request(self, index: int, sample: int, **extra: Any) -> DispatchRequest:
        row = self.rows[index]
        return DispatchRequest(
            initial_messages=row.initial_messages,
            label=row.label,
            metadata=row.metadata,
            agent_timeout_sec=self.agent_timeout_sec,
            grader_timeout_sec=self.grader_timeout_sec,
            extra_fields={"row_index": index, "sample_index": sample, **extra},
        )

    def requests(self, indices: Sequence[int], step: int, version: int) -> list[DispatchRequest]:
        """One rollout per prompt of ``step`` (rows repeat: each sample is numbered)."""
        seen: Counter[int] = Counter()
        requests: list[DispatchRequest] = []
        for index in indices:
            requests.append(self.request(index, seen[index], step=step, policy_version=version))
            seen[index] += 1
        return requests

    def __call__(self, prompts: list[Any], trainer: Any) -> dict[str, list[Any] | None]:
        called = time.perf_counter()
        step = int(trainer.state.global_step) + 1
        version = self.bridge.upstream.policy_version
        indices = [row_index(prompt) for prompt in prompts]
        ahead = self._take_ahead(step, indices)
        if ahead is None:
            started, batches = time.perf_counter(), self.bridge.upstream.batches
            batch = self.bridge.launch(self.requests(indices, step, version))
            dispatched = version
        else:
            started, batch, batches = ahead.started, ahead.batch, ahead.batches
            dispatched = ahead.version
        if self.max_staleness:  # the later steps' rollouts start now, beside this step's
            self._fill_ahead(step, version)
        with self.watch.paused() if self.watch is not None else contextlib.nullcontext():
            outcomes = self.bridge.finish(batch)
            stats = StepStats(policy_version=version, max_staleness=self.max_staleness)
            if self.max_staleness:
                outcomes = self._admit(
                    step, indices, outcomes, version=version, dispatched=dispatched, stats=stats
                )
        done = time.perf_counter()
        stats.seconds, stats.wait_seconds = done - started, done - called
        after = self.bridge.upstream.batches
        if batches is not None and after is not None:
            stats.policy_batches = after - batches
        stats.policy_version_lag = max(0, step - 1 - version)
        rows: list[TrainingRow] = []
        segments: list[tuple[int, TrainingRow]] = []
        for index, outcome in zip(indices, outcomes, strict=True):
            first, *others = self._rows(index, outcome, stats)
            for row in (first, *others):
                stats.add_staleness(row, version, dispatched)
            segments += [(len(rows), row) for row in others]
            rows.append(first)
        _count_groups(stats, [row.reward for row in rows], self.group_size)
        self.last = stats
        if stats.scored == 0:
            reason, _count = stats.reasons.most_common(1)[0] if stats.reasons else ("?", 0)
            raise NoRewardError(
                f"none of the {stats.rollouts} rollouts of step {step} got a reward; the most "
                f"common failure: {reason}. Fix the rollout (try `osmosis eval run` on the "
                "same rollout), then resume with --resume"
            )
        self._segments = segments
        if not self.max_staleness:
            self._dispatch_ahead(step + 1, version + 1)
        output: dict[str, list[Any] | None] = {
            "prompt_ids": [row.prompt_ids for row in rows],
            "completion_ids": [row.completion_ids for row in rows],
            # TRL reads the sampler's logprobs only to correct for a vLLM sampler or a stale
            # sample; like its own generation path it gets none otherwise (and pads nothing)
            "logprobs": [row.logprobs for row in rows] if self.sampler_logprobs else None,
            REWARD_FIELD: [row.reward for row in rows],
        }
        if any(0 in row.env_mask for row in rows):  # a mask of ones is no mask at all
            output["env_mask"] = [row.env_mask for row in rows]
        return output

    def _admit(
        self,
        step: int,
        indices: list[int],
        outcomes: list[DispatchOutcome],
        *,
        version: int,
        dispatched: int,
        stats: StepStats,
    ) -> list[DispatchOutcome]:
        """``outcomes`` with every sample older than ``max_staleness`` versions (an answer
        from a policy more than that behind ``version``) replaced by one generated now."""
        oldest = version - self.max_staleness
        outcomes = list(outcomes)
        for _attempt in range(3):  # a regenerated sample comes from the current policy
            stale = [
                position
                for position, outcome in enumerate(outcomes)
                if _oldest_version(outcome, dispatched) < oldest
            ]
            if not stale:
                break
            stats.stale_regenerated += len(stale)
            logger.info(
                "step %d: %d samples lag more than %d policy versions; generating them again",
                step,
                len(stale),
                self.max_staleness,
            )
            requests = self.requests(indices, step, version)
            fresh = self.bridge.run([requests[position] for position in stale])
            for position, outcome in zip(stale, fresh, strict=True):
                outcomes[position] = outcome
            dispatched = version
        return outcomes

    def _fill_ahead(self, step: int, version: int) -> None:
        """Dispatch the rollouts of the steps after ``step`` that may run now: up to
        ``max_staleness`` steps ahead, on the weights the policy has (``version``, the ones
        ``step`` trains: each of those steps trains at most ``max_staleness`` versions on).
        Called as soon as the trainer asks for ``step`` (its weights are then in place), so
        those rollouts run while ``step``'s own finish, not only once its update begins."""
        for ahead in range(step + 1, step + 1 + self.max_staleness):
            if any(queued.step == ahead for queued in self._ahead):
                continue
            indices = self.next_rows(ahead) if self.next_rows is not None else None
            if not indices:
                return
            started, batches = time.perf_counter(), self.bridge.upstream.batches
            batch = self.bridge.launch(self.requests(indices, ahead, version))
            self._ahead.append(_Ahead(ahead, indices, batch, started, batches, version))

    def _dispatch_ahead(self, step: int, version: int) -> None:
        """Start ``step``'s rollouts now (to be served by ``version``), their model calls
        held until the trainer asks for that step."""
        indices = self.next_rows(step) if self.next_rows is not None else None
        if not indices or not self.bridge.upstream.hold(True):
            return
        started, batches = time.perf_counter(), self.bridge.upstream.batches
        batch = self.bridge.launch(self.requests(indices, step, version))
        self._ahead.append(_Ahead(step, indices, batch, started, batches, version))

    def _take_ahead(self, step: int, indices: list[int]) -> _Ahead | None:
        """The rollouts dispatched ahead for this step, if they are for these prompts (any
        others are cancelled); held model calls are released either way."""
        if not self._ahead:
            return None
        ahead = self._ahead[0]
        if ahead.step == step and ahead.indices == indices:
            self._ahead.pop(0)
            if not self.max_staleness:
                self.bridge.upstream.hold(False)
            return ahead
        self.drop_ahead()
        self.next_rows = None  # the trainer's order is not the predicted one: stop guessing
        logger.warning(
            "step %d's prompts differ from the rollouts dispatched ahead for it; they were "
            "cancelled and later steps are dispatched only when the trainer asks",
            step,
        )
        return None

    def drop_ahead(self) -> None:
        """Cancel rollouts dispatched ahead for steps that will not run."""
        ahead, self._ahead = self._ahead, []
        if ahead and not self.max_staleness:
            self.bridge.upstream.hold(False)
        for queued in ahead:
            self.bridge.abandon(queued.batch)

    def take_segments(self) -> list[tuple[int, TrainingRow]]:
        """The last step's further segment rows, each with the position of its rollout's row
        among the rows handed to TRL; taken once, by the trainer, which appends them to its
        batch (the step's ``token_segments`` counts them from then on)."""
        segments, self._segments = self._segments, []
        if self.last is not None:
            self.last.token_segments += len(segments)
        return segments

    def _rows(self, index: int, outcome: DispatchOutcome, stats: StepStats) -> list[TrainingRow]:
        """The rollout's rows: the one for its slot first (its longest segment, or an
        excluded row), then its other segments in call order."""
        stats.rollouts += 1
        reward, reason = outcome_reward(outcome)
        rows: list[TrainingRow] = []
        if reward is not None:
            rows = self._segment_rows(outcome, reward)
            if not rows:
                reason = "the rollout made no model call that produced tokens"
        if not rows:
            stats.failed += 1
            text = reason or "unknown"
            stats.reasons[text] += 1
            if self.on_failure is not None:
                self.on_failure(outcome.rollout_id, text)
            return [excluded_row(self._prompt_of(index, outcome), self.stop_id, text)]
        stats.scored += 1
        stats.token_segments += 1  # the others count once the trainer takes them
        stats.chain_breaks += rows[0].chain_breaks
        stats.dropped_calls += sum(1 for call in outcome.calls if call.ok) - sum(
            row.calls for row in rows
        )
        stats.truncated += int(any(row.truncated for row in rows))
        for row in rows:
            stats.model_tokens += row.model_tokens
            stats.env_tokens += len(row.env_mask) - row.model_tokens
            stats.total_tokens += len(row.prompt_ids) + len(row.completion_ids)
        return rows

    def _segment_rows(self, outcome: DispatchOutcome, reward: float) -> list[TrainingRow]:
        if self.strict:  # a break fails the run; without one there is a single segment
            row = build_row(
                outcome.rollout_id,
                outcome.calls,
                reward,
                max_response_length=self.max_response_length,
                strict=True,
            )
            return [] if row is None else [row]
        rows = build_rows(
            outcome.rollout_id, outcome.calls, reward, max_response_length=self.max_response_length
        )
        if len(rows) > 1:  # the slot takes the longest (ties: the later), as build_row would
            first = max(reversed(rows), key=lambda row: row.model_tokens)
            rows = [first, *(row for row in rows if row is not first)]
        return rows

    def _prompt_of(self, index: int, outcome: DispatchOutcome) -> list[int]:
        for call in outcome.calls:
            if call.prompt_token_ids:
                return list(call.prompt_token_ids)
        cached = self._fallbacks.get(index)
        if cached is None:
            cached = self._fallbacks[index] = self.fallback_prompt(self.rows[index])
        return cached

    def evaluate(self, indices: Sequence[int], samples: int, step: int) -> EvalSummary:
        """Sample every row of ``indices`` ``samples`` times with the current policy."""
        requests = self.eval_requests(indices, samples, step)
        with self.watch.paused() if self.watch is not None else contextlib.nullcontext():
            outcomes = self.bridge.run(requests)
        return eval_summary(step, outcomes)

    def eval_requests(
        self,
        indices: Sequence[int],
        samples: int,
        step: int,
        upstream_fields: Mapping[str, Any] | None = None,
    ) -> list[DispatchRequest]:
        """The validation rollouts: every row of ``indices`` ``samples`` times, their model
        requests carrying ``upstream_fields`` (the policy that answers them)."""
        return [
            replace(self.request(i, s, step=step, validation=True), upstream_fields=upstream_fields)
            for i in indices
            for s in range(samples)
        ]


def eval_summary(
    step: int, outcomes: Sequence[DispatchOutcome], policy_version: int | None = None
) -> EvalSummary:
    """Validation at ``step`` from its rollouts' outcomes (answered by ``policy_version``,
    when pinned)."""
    rewards = [outcome_reward(o)[0] for o in outcomes]
    scored = [r for r in rewards if r is not None]
    mean = sum(scored) / len(scored) if scored else None
    passed = sum(1 for r in scored if r >= 1.0) / len(scored) if scored else None
    return EvalSummary(step, len(outcomes), len(scored), mean, passed, policy_version)


def _oldest_version(outcome: DispatchOutcome, dispatched: int) -> int:
    """The oldest policy version that answered one of ``outcome``'s model calls
    (``dispatched`` for an answer that did not say)."""
    versions = [
        dispatched if call.policy_version is None else call.policy_version
        for call in outcome.calls
        if call.ok
    ]
    return min(versions, default=dispatched)


def _count_groups(stats: StepStats, rewards: Sequence[float | None], group: int) -> None:
    for start in range(0, len(rewards), group):
        scored = [r for r in rewards[start : start + group] if r is not None]
        stats.groups += 1
        if len(scored) < 2 or max(scored) == min(scored):
            stats.groups_without_signal += 1
