"""Token fidelity on a recorded multi-turn tool-calling rollout (no torch needed).

The ids below follow the tiny model's ChatML layout: a user turn, an assistant tool call,
the tool result, a second assistant turn, a user follow-up and a final answer. Every rule is
checked on the proxy's CallRecords: rows come from recorded ids, tool and user tokens are
masked, a rewritten history is never silently spliced, failures carry no reward and no
empty completion.
"""

from __future__ import annotations

import math

import pytest

from osmosis_ai.controller.calls import CallRecord
from osmosis_ai.controller.dispatch import DispatchOutcome, DispatchRequest
from osmosis_ai.rollout.protocol import RolloutResultResponse
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.train.collect import (
    REWARD_FIELD,
    RolloutCollector,
    outcome_reward,
    prompt_for,
    reward_from_rollouts,
    row_index,
)
from osmosis_ai.train.errors import NoRewardError, TokenFidelityError
from osmosis_ai.train.tokens import build_row, excluded_row, split_chains
from osmosis_ai.workspace import DatasetRow

IM_START, IM_END, NL = 258, 259, 10
USER, ASSISTANT, TOOL = 261, 262, 263

SYSTEM_AND_USER = [IM_START, USER, NL, *b"What is 6*7?", IM_END, NL, IM_START, ASSISTANT, NL]
TOOL_CALL = [264, NL, *b'{"name": "multiply", "arguments": {"a": 6, "b": 7}}', NL, 265, IM_END]
TOOL_TURN = [NL, IM_START, TOOL, NL, *b"42", IM_END, NL, IM_START, ASSISTANT, NL]
ANSWER = [*b"It is 42", IM_END]
USER_TURN = [NL, IM_START, USER, NL, *b"Sure?", IM_END, NL, IM_START, ASSISTANT, NL]
FINAL = [*b"Yes, 42", IM_END]


def call(
    index: int,
    prompt: list[int] | None,
    completion: list[int] | None,
    *,
    status: int = 200,
    finish: str = "stop",
    logprobs: list[float] | None = None,
) -> CallRecord:
    if logprobs is None and completion is not None:
        logprobs = [-0.01 * (i + 1) for i in range(len(completion))]
    return CallRecord(
        rollout_id="r1",
        index=index,
        started_at=0.0,
        latency_ms=1.0,
        stream=False,
        status_code=status,
        finish_reason=finish,
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=logprobs,
        error=None if status < 400 else "upstream failed",
    )


def tool_rollout() -> list[CallRecord]:
    """Three calls whose prompts each extend the previous prompt + completion."""
    p0 = SYSTEM_AND_USER
    p1 = p0 + TOOL_CALL + TOOL_TURN
    p2 = p1 + ANSWER + USER_TURN
    return [call(0, p0, TOOL_CALL), call(1, p1, ANSWER), call(2, p2, FINAL)]


def test_row_is_built_from_the_recorded_ids_only():
    calls = tool_rollout()
    row = build_row("r1", calls, 1.0, max_response_length=1024)
    assert row is not None
    assert row.prompt_ids == SYSTEM_AND_USER  # the first call's recorded prompt, verbatim
    assert row.completion_ids == TOOL_CALL + TOOL_TURN + ANSWER + USER_TURN + FINAL
    assert (row.calls, row.chain_breaks, row.dropped_calls, row.truncated) == (3, 0, 0, False)
    assert row.reward == 1.0
    # Model tokens keep the sampler's logprobs, in order.
    model_logprobs = [lp for lp, m in zip(row.logprobs, row.env_mask, strict=True) if m]
    assert model_logprobs == [*calls[0].logprobs, *calls[1].logprobs, *calls[2].logprobs]


def test_tool_and_user_tokens_are_masked_out_of_the_loss():
    row = build_row("r1", tool_rollout(), 1.0, max_response_length=1024)
    assert row is not None
    expected = (
        [1] * len(TOOL_CALL)
        + [0] * len(TOOL_TURN)  # the tool result and the template's turn glue
        + [1] * len(ANSWER)
        + [0] * len(USER_TURN)  # the user's follow-up
        + [1] * len(FINAL)
    )
    assert row.env_mask == expected
    assert len(row.logprobs) == len(row.completion_ids) == len(row.env_mask)
    assert all(lp == 0.0 for lp, m in zip(row.logprobs, row.env_mask, strict=True) if not m)
    assert row.model_tokens == len(TOOL_CALL) + len(ANSWER) + len(FINAL)


def test_rewritten_history_becomes_its_own_chain_never_silent_drift():
    calls = tool_rollout()
    # The agent re-rendered its tool call differently (e.g. re-serialised the JSON):
    # call 1's prompt no longer starts with call 0's prompt + completion.
    rewritten = [*SYSTEM_AND_USER, *b"<call multiply 6 7>", IM_END, *TOOL_TURN]
    calls[1] = call(1, rewritten, ANSWER)
    calls[2] = call(2, rewritten + ANSWER + USER_TURN, FINAL)
    chains, breaks = split_chains(calls)
    assert [c.calls for c in chains] == [1, 2]
    assert len(breaks) == 1 and breaks[0].index == 1
    assert breaks[0].position == len(SYSTEM_AND_USER)  # where the histories part

    row = build_row("r1", calls, 0.5, max_response_length=1024)
    assert row is not None
    # The chain with the most model tokens is the row (here the first: the long tool call);
    # the other chain's calls are counted as dropped, never spliced onto it.
    assert row.prompt_ids == SYSTEM_AND_USER
    assert row.completion_ids == TOOL_CALL
    assert (row.chain_breaks, row.dropped_calls, row.calls) == (1, 2, 1)
    # With a longer second chain, that one is the row.
    long_final = [*b"Yes, it is 42 because 6 times 7 is 42." * 2, IM_END]
    calls[2] = call(2, [*rewritten, *ANSWER, *USER_TURN], long_final)
    row = build_row("r1", calls, 0.5, max_response_length=1024)
    assert row is not None
    assert row.prompt_ids == rewritten
    assert row.completion_ids == [*ANSWER, *USER_TURN, *long_final]
    assert (row.chain_breaks, row.dropped_calls, row.calls) == (1, 1, 2)

    with pytest.raises(TokenFidelityError, match="not an append-only extension") as info:
        build_row("r1", calls, 0.5, max_response_length=1024, strict=True)
    assert f"differ at token {len(SYSTEM_AND_USER)}" in str(info.value)


def test_failed_calls_are_not_history_and_missing_ids_fail_loudly():
    p0 = SYSTEM_AND_USER
    p1 = p0 + TOOL_CALL + TOOL_TURN
    # Call 1 failed upstream (the agent saw an error and retried as call 2): it is not part
    # of the history, so the chain continues through the retry.
    calls = [
        call(0, p0, TOOL_CALL),
        call(1, p1, None, status=500),
        call(2, p1, ANSWER),
        call(3, p1 + ANSWER + USER_TURN, FINAL),
    ]
    row = build_row("r1", calls, 1.0, max_response_length=1024)
    assert row is not None and row.calls == 3 and row.chain_breaks == 0
    assert row.completion_ids == TOOL_CALL + TOOL_TURN + ANSWER + USER_TURN + FINAL

    with pytest.raises(TokenFidelityError, match="without token ids"):
        build_row("r1", [call(0, None, None)], 1.0, max_response_length=1024)


def test_long_completions_are_cut_and_marked_truncated():
    row = build_row("r1", tool_rollout(), 1.0, max_response_length=len(TOOL_CALL) + 3)
    assert row is not None and row.truncated
    assert len(row.completion_ids) == len(TOOL_CALL) + 3
    cut = build_row(
        "r1", [call(0, SYSTEM_AND_USER, ANSWER, finish="length")], 1.0, max_response_length=64
    )
    assert cut is not None and cut.truncated


def test_failed_rollouts_carry_no_reward_and_never_an_empty_completion():
    assert build_row("r1", [], 1.0, max_response_length=8) is None  # no model call
    assert build_row("r1", [call(0, SYSTEM_AND_USER, [])], 1.0, max_response_length=8) is None
    row = excluded_row(SYSTEM_AND_USER, IM_END, "the grader set no reward")
    assert row.reward is None and row.completion_ids == [IM_END] and row.env_mask == [0]
    with pytest.raises(TokenFidelityError):
        excluded_row([], IM_END, "no prompt")


# -- the collector: prompts → rollouts → TRL's rollout_func output ------------------------


def outcome(
    rollout_id: str, reward: float | None, calls: list[CallRecord], status=RolloutStatus.SUCCESS
):
    sample = RolloutSample(messages=[{"role": "assistant", "content": "x"}], reward=reward)
    result = RolloutResultResponse(rollout_id=rollout_id, status=status, sample=sample)
    if status != RolloutStatus.SUCCESS:
        result = RolloutResultResponse(
            rollout_id=rollout_id, status=status, err_message="Sample has no reward after grading"
        )
    return DispatchOutcome(
        rollout_id=rollout_id,
        generation="polling",
        kind="result",
        admitted=True,
        result=result,
        calls=tuple(calls),
    )


class FakeUpstream:
    policy_version = 3
    batches = None  # not a local policy: no batch count in the metrics

    def hold(self, held: bool) -> bool:
        return False  # cannot hold: nothing is dispatched ahead


class FakeBridge:
    """Answers each request from a script keyed by row index."""

    def __init__(self, script: dict[int, list[DispatchOutcome]]) -> None:
        self.script = script
        self.upstream = FakeUpstream()
        self.requests: list[DispatchRequest] = []

    def launch(self, requests: list[DispatchRequest]) -> list[DispatchRequest]:
        self.requests.extend(requests)
        return requests

    def finish(self, requests: list[DispatchRequest]) -> list[DispatchOutcome]:
        return [self.script[r.extra_fields["row_index"]].pop(0) for r in requests]

    def run(self, requests: list[DispatchRequest]) -> list[DispatchOutcome]:
        return self.finish(self.launch(requests))


class FakeTrainer:
    class state:
        global_step = 3


ROWS = [
    DatasetRow([{"role": "user", "content": "What is 6*7?"}], "42", None, 0),
    DatasetRow([{"role": "user", "content": "Copy: 7"}], "7", {"k": 1}, 1),
]


def collector(
    script: dict[int, list[DispatchOutcome]], group: int = 2, *, sampler_logprobs: bool = True
) -> RolloutCollector:
    return RolloutCollector(
        FakeBridge(script),  # type: ignore[arg-type]
        ROWS,
        fallback_prompt=lambda row: [1, 2, 3],
        stop_id=IM_END,
        agent_timeout_sec=10,
        grader_timeout_sec=10,
        max_response_length=1024,
        group_size=group,
        sampler_logprobs=sampler_logprobs,
    )


def test_trl_gets_logprobs_only_for_a_sampler_it_corrects_and_no_mask_of_ones():
    single = [call(0, SYSTEM_AND_USER, [*b"7", IM_END])]
    script = {1: [outcome("e", 1.0, single), outcome("f", 0.0, single)]}
    out = collector(script, sampler_logprobs=False)([prompt_for(1, ROWS[1])] * 2, FakeTrainer())
    # as with TRL's own generation: no sampler logprobs, and no env_mask when nothing is masked
    assert out["logprobs"] is None and "env_mask" not in out
    assert out[REWARD_FIELD] == [1.0, 0.0] and out["completion_ids"] == [[*b"7", IM_END]] * 2


def test_collector_maps_each_prompt_to_its_row_and_returns_trl_fields():
    single = [call(0, SYSTEM_AND_USER, [*b"7", IM_END])]
    script = {
        0: [outcome("a", 1.0, tool_rollout()), outcome("b", 0.0, tool_rollout())],
        1: [outcome("c", 1.0, single), outcome("d", None, single, RolloutStatus.FAILURE)],
    }
    c = collector(script)
    prompts = [prompt_for(0, ROWS[0])] * 2 + [prompt_for(1, ROWS[1])] * 2
    assert [row_index(p) for p in prompts] == [0, 0, 1, 1]
    out = c(prompts, FakeTrainer())
    requests = c.bridge.requests  # type: ignore[attr-defined]
    assert [r.label for r in requests] == ["42", "42", "7", "7"]
    assert requests[2].metadata == {"k": 1}
    assert [r.extra_fields["sample_index"] for r in requests] == [0, 1, 0, 1]
    assert out[REWARD_FIELD] == [1.0, 0.0, 1.0, None]
    assert set(out) == {"prompt_ids", "completion_ids", "logprobs", "env_mask", REWARD_FIELD}
    assert all(len(ids) >= 1 for ids in out["completion_ids"])
    assert out["env_mask"][3] == [0]  # the failed rollout adds nothing to the loss
    stats = c.last
    assert stats is not None
    assert (stats.rollouts, stats.scored, stats.failed) == (4, 3, 1)
    assert stats.groups == 2 and stats.groups_without_signal == 1  # row 1: one scored sample
    assert stats.policy_version == 3 and stats.policy_version_lag == 0
    metrics = stats.to_metrics()
    assert all(not isinstance(v, float) or math.isfinite(v) for v in metrics.values())
    assert "policy_batches" not in metrics
    # TRL's reward function hands the rewards back unchanged (None → excluded).
    assert reward_from_rollouts(prompts, [None] * 4, **{REWARD_FIELD: out[REWARD_FIELD]}) == [
        1.0,
        0.0,
        1.0,
        None,
    ]


def test_equal_rewards_in_a_group_are_reported_not_fatal():
    single = [call(0, SYSTEM_AND_USER, [*b"7", IM_END])]
    script = {1: [outcome(f"x{i}", 0.0, single) for i in range(4)]}
    c = collector(script, group=4)
    out = c([prompt_for(1, ROWS[1])] * 4, FakeTrainer())
    assert out[REWARD_FIELD] == [0.0] * 4
    assert c.last is not None and c.last.groups_without_signal == c.last.groups == 1


def test_a_step_where_no_rollout_got_a_reward_fails_with_the_cause():
    single = [call(0, SYSTEM_AND_USER, [*b"7", IM_END])]
    script = {1: [outcome(f"x{i}", None, single, RolloutStatus.FAILURE) for i in range(2)]}
    with pytest.raises(NoRewardError, match="no reward after grading"):
        collector(script)([prompt_for(1, ROWS[1])] * 2, FakeTrainer())


def test_outcome_reward_names_why_there_is_none():
    failed = outcome("x", None, [], RolloutStatus.FAILURE)
    assert outcome_reward(failed) == (None, "Sample has no reward after grading")
    unset = outcome("y", None, [])
    assert outcome_reward(unset)[1] is not None and "set_reward" in outcome_reward(unset)[1]
    timeout = DispatchOutcome(
        rollout_id="z", generation="polling", kind="timeout", admitted=True, detail="too slow"
    )
    assert outcome_reward(timeout) == (None, "timeout: too slow")
