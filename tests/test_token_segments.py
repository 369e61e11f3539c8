"""The strict token chain: a rollout whose agent rewrites its conversation between calls
(a summary, a truncation) is recorded as token segments, and training makes each unbroken
segment its own row instead of stitching tokens the sampler never saw together."""

from __future__ import annotations

import asyncio

import anthropic

from osmosis_ai.controller import CallRecord, OpenAICompatibleUpstream, PolicyProxy
from osmosis_ai.controller.calls import token_segments
from osmosis_ai.testing.model_server import ScriptedModelServer
from osmosis_ai.testing.serving import serve_in_task
from osmosis_ai.train.tokens import build_row, build_rows

PROMPT = [1, 2, 3]
FIRST = [10, 11]
TOOL = [4, 5]
SECOND = [12, 13, 14]
SUMMARY = [7, 8, 9]  # the rewritten conversation: a summary instead of the history
THIRD = [15, 16, 17, 18]


def record(index: int, prompt: list[int] | None, completion: list[int] | None) -> CallRecord:
    logprobs = None if completion is None else [-0.1 * (i + 1) for i in range(len(completion))]
    return CallRecord(
        rollout_id="r1",
        index=index,
        started_at=0.0,
        latency_ms=1.0,
        stream=False,
        status_code=200,
        finish_reason="stop",
        prompt_token_ids=prompt,
        completion_token_ids=completion,
        logprobs=logprobs,
    )


def summarised() -> list[CallRecord]:
    """Two calls that extend one another, then one after the agent summarised."""
    second_prompt = [*PROMPT, *FIRST, *TOOL]
    return [
        record(0, PROMPT, FIRST),
        record(1, second_prompt, SECOND),
        record(2, SUMMARY, THIRD),
    ]


def test_segments_start_where_a_prompt_stops_extending_the_tokens_before_it():
    assert token_segments(summarised()) == [0, 0, 1]
    assert token_segments([]) == []
    # a call without token ids has no segment and does not move the chain
    calls = [record(0, PROMPT, FIRST), record(1, None, None), record(2, [*PROMPT, *FIRST], [9])]
    assert token_segments(calls) == [0, None, 0]
    # a prompt that only drops the tail of the history (truncation) is a break as well
    truncated = [record(0, PROMPT, FIRST), record(1, [*PROMPT, FIRST[0]], [9])]
    assert token_segments(truncated) == [0, 1]


def test_each_unbroken_segment_is_its_own_row_never_stitched():
    rows = build_rows("r1", summarised(), 0.75, max_response_length=64)
    assert [row.segment for row in rows] == [0, 1]
    first, second = rows
    assert first.prompt_ids == PROMPT
    assert first.completion_ids == [*FIRST, *TOOL, *SECOND]
    assert first.env_mask == [1] * len(FIRST) + [0] * len(TOOL) + [1] * len(SECOND)
    assert second.prompt_ids == SUMMARY  # the rewritten prompt, as the sampler saw it
    assert second.completion_ids == THIRD and second.env_mask == [1] * len(THIRD)
    assert second.logprobs == [-0.1 * (i + 1) for i in range(len(THIRD))]
    assert all(row.reward == 0.75 and row.chain_breaks == 1 for row in rows)
    assert all(row.dropped_calls == 0 for row in rows)
    assert (first.calls, second.calls) == (2, 1)
    # no row holds a token sequence that crosses the break
    for row in rows:
        assert not set(SUMMARY) & set(row.completion_ids)
    # build_row keeps its one-row contract: the segment with the most model tokens
    kept = build_row("r1", summarised(), 0.75, max_response_length=64)
    assert kept is not None and kept.segment == 0 and kept.dropped_calls == 1
    # an unbroken rollout is one row, the same as build_row's
    whole = build_rows("r1", summarised()[:2], 1.0, max_response_length=64)
    assert whole == [build_row("r1", summarised()[:2], 1.0, max_response_length=64)]


def test_rows_are_cut_one_by_one_and_empty_segments_make_none():
    rows = build_rows("r1", summarised(), 1.0, max_response_length=3)
    assert [len(row.completion_ids) for row in rows] == [3, 3]
    assert all(row.truncated for row in rows)
    empty = [record(0, PROMPT, FIRST), record(1, SUMMARY, [])]
    assert [row.segment for row in build_rows("r1", empty, 1.0, max_response_length=8)] == [0]


async def test_the_proxy_records_the_break_of_an_agent_that_summarises_its_history():
    """An agent on the Messages API summarises its conversation before its third call: the
    rollout's report marks the new segment, and training makes two rows of it."""
    async with (
        ScriptedModelServer(["It is 42.", "Yes, 42."]) as model,
        serve_in_task(
            proxy := PolicyProxy(
                OpenAICompatibleUpstream(model.base_url, None, "policy", timeout=20),
                request_token_data=True,
            ),
            access_log=False,
        ) as origin,
    ):
        proxy.register("r1")
        client = anthropic.AsyncAnthropic(
            base_url=proxy.chat_base_url("r1", origin), api_key=proxy.token, max_retries=0
        )
        history = [{"role": "user", "content": "What is 6 times 7?"}]
        for follow_up in ("Sure?", None):
            answer = await client.messages.create(model="m", max_tokens=64, messages=history)
            text = answer.content[0].text  # pyright: ignore[reportAttributeAccessIssue]
            history += [{"role": "assistant", "content": text}]
            if follow_up:
                history += [{"role": "user", "content": follow_up}]
        summary = [
            {"role": "user", "content": "Summary so far: the answer is 42. Anything else?"},
            {"role": "assistant", "content": "No."},
            {"role": "user", "content": "Check once more."},
        ]
        await client.messages.create(model="m", max_tokens=64, messages=summary)
        for _ in range(500):  # a call is recorded just after its answer went out
            if len(calls := proxy.calls("r1")) == 3:
                break
            await asyncio.sleep(0.01)
        report = proxy.trajectory_report("r1").samples["r1"]
        await proxy.upstream.aclose()
    assert len(calls) == 3 and all(call.ok for call in calls)
    segments = [m.extra["token_segment"] for m in report.llm_call_metrics if m.extra]
    assert segments == [0, 0, 1]
    assert report.final_metrics is not None
    assert (report.final_metrics["token_segments"], report.final_metrics["chain_breaks"]) == (2, 1)
    rows = build_rows("r1", calls, 1.0, max_response_length=4096)
    assert len(rows) == 2
    assert rows[0].prompt_ids == calls[0].prompt_token_ids
    assert rows[1].prompt_ids == calls[2].prompt_token_ids
    assert rows[1].completion_ids == calls[2].completion_token_ids
    assert bytes(rows[1].completion_ids).decode() == "Yes, 42."  # turn 1: one assistant message
