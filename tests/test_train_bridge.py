"""Token fidelity end to end: a multi-turn tool-calling rollout served by the tiny model
through the real path (rollout server process, protocol, policy proxy, local policy).

The rows are built from what the proxy recorded and checked against what the model and the
environment actually produced: model tokens are the sampled ids, the tool turn between the
calls is masked, and an agent that edits its own history yields a counted chain break.
"""

from __future__ import annotations

import copy
import textwrap
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

pytest.importorskip("torch", reason="needs the 'train' extra: pip install \"osmosis-ai[train]\"")
pytest.importorskip("transformers", reason="needs the 'train' extra")

from osmosis_ai.controller.dispatch import DispatchRequest
from osmosis_ai.controller.policy import LocalPolicy
from osmosis_ai.errors import UsageError
from osmosis_ai.train.bridge import POLICY_PIN_FIELD, RolloutBridge, TrainingUpstream
from osmosis_ai.train.collect import REWARD_FIELD, RolloutCollector, prompt_for
from osmosis_ai.train.errors import TokenFidelityError
from osmosis_ai.train.tiny_model import build_tiny_model
from osmosis_ai.train.tokens import build_row, split_chains, usable_calls
from osmosis_ai.train.validation import PinnedValidations
from osmosis_ai.workspace import DatasetRow

MAX_TOKENS = 3

TOOL_ROLLOUT = '''
"""Two model calls with a multiply tool turn between them; metadata.mode "edit" makes the
agent rewrite its own first answer before the second call (history drift)."""
from __future__ import annotations

import functools

from osmosis_ai.rollout import (
    AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend, get_rollout_context,
)
from osmosis_ai.rollout.http import async_client
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

TOOLS = [{"type": "function", "function": {"name": "multiply", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}}}}]


@functools.cache
def client():
    return async_client(timeout=60.0)


class ToolWorkflow(AgentWorkflow):
    async def run(self, ctx):
        rollout = get_rollout_context()
        url = rollout.chat_completions_url + "/chat/completions"
        headers = {"Authorization": f"Bearer {rollout.api_key}"}
        messages = list(ctx.prompt)
        seed = int((ctx.metadata or {}).get("seed", 0))
        for turn in range(2):
            body = {"model": "m", "messages": messages, "tools": TOOLS, "max_tokens": 64,
                    "seed": seed * 10 + turn, "temperature": 0.0}
            response = await client().post(url, json=body, headers=headers)
            response.raise_for_status()
            message = response.json()["choices"][0]["message"]
            if (ctx.metadata or {}).get("mode") == "edit":
                message = {"role": "assistant", "content": "Note: " + (message.get("content") or "")}
            messages.append(message)
            if turn == 0:
                messages.append({"role": "tool", "tool_call_id": "call_0", "content": "42"})
        return AgentWorkflowOutput(messages=messages)


class AlwaysOne(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


app = create_rollout_server(
    backend=LocalBackend(workflow=ToolWorkflow, grader=AlwaysOne), configure_logging=False,
    save_trajectories=False,
)

if __name__ == "__main__":
    run_rollout_server(app, log_level="warning")
'''


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("bridge") / "tiny")


@pytest.fixture(scope="module")
def served(tiny: Path, tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("ws")
    rollout = root / "rollouts" / "tool"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(textwrap.dedent(TOOL_ROLLOUT))
    policy = LocalPolicy(tiny, seed=0)
    upstream = TrainingUpstream(temperature=1.0, top_p=1.0, max_tokens=MAX_TOKENS)
    upstream.serve_local(policy)
    bridge = RolloutBridge(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=root / "artifacts",
        upstream=upstream,
    ).start()
    yield policy, bridge
    bridge.close()


def requests(mode: str, count: int) -> list[DispatchRequest]:
    return [
        DispatchRequest(
            initial_messages=[{"role": "user", "content": "What is 6 times 7?"}],
            label="42",
            metadata={"mode": mode, "seed": i},
            agent_timeout_sec=60,
            grader_timeout_sec=30,
        )
        for i in range(count)
    ]


def test_multi_turn_rows_hold_the_sampled_ids_and_mask_the_tool_turn(served):
    policy, bridge = served
    before = policy.batches
    outcomes = bridge.run(requests("faithful", 12))
    assert all(o.kind == "result" and o.sample is not None for o in outcomes)
    # Told how many rollouts are in flight, the policy batches each turn's calls together
    # (24 calls in two rounds) instead of decoding whoever happened to arrive first.
    assert 2 <= policy.batches - before <= 6
    clean = 0
    for outcome in outcomes:
        calls = usable_calls(outcome.rollout_id, outcome.calls)
        assert len(calls) == 2
        first, second = calls
        # The run's sampling settings win over the agent's: at most MAX_TOKENS new tokens.
        assert all(1 <= len(c.completion_token_ids or []) <= MAX_TOKENS for c in calls)
        # What the proxy recorded is what the model saw: the chat template's rendering.
        expected_prompt = policy.encode(
            policy.render([{"role": "user", "content": "What is 6 times 7?"}], tools=_TOOLS)
        )
        assert first.prompt_token_ids == expected_prompt
        row = build_row(outcome.rollout_id, outcome.calls, 1.0, max_response_length=4096)
        assert row is not None
        history = [*(first.prompt_token_ids or []), *(first.completion_token_ids or [])]
        if (second.prompt_token_ids or [])[: len(history)] != history:
            # The re-rendered answer did not re-tokenize to the sampled ids: never spliced,
            # the row is one call's recorded prompt and completion, the other is counted.
            assert row.chain_breaks == 1 and row.dropped_calls == 1
            assert (row.prompt_ids, row.completion_ids) in [
                (c.prompt_token_ids, c.completion_token_ids) for c in calls
            ]
            continue
        assert row.prompt_ids == expected_prompt
        clean += 1
        environment = (second.prompt_token_ids or [])[len(history) :]
        sampled = [
            *(first.completion_token_ids or []),
            *environment,
            *(second.completion_token_ids or []),
        ]
        assert row.completion_ids == sampled
        assert row.env_mask == (
            [1] * len(first.completion_token_ids or [])
            + [0] * len(environment)
            + [1] * len(second.completion_token_ids or [])
        )
        # The masked span is the tool turn: its text is the tool result in the template.
        text = policy.tokenizer.decode(environment)
        assert "tool\n42" in text and text.rstrip().endswith("assistant")
        model = [lp for lp, m in zip(row.logprobs, row.env_mask, strict=True) if m]
        assert model == [*(first.logprobs or []), *(second.logprobs or [])]
    assert clean >= 1


def test_an_agent_that_edits_its_history_is_caught(served):
    _policy, bridge = served
    for outcome in bridge.run(requests("edit", 3)):
        chains, breaks = split_chains(usable_calls(outcome.rollout_id, outcome.calls))
        assert len(chains) == 2 and len(breaks) == 1
        row = build_row(outcome.rollout_id, outcome.calls, 1.0, max_response_length=4096)
        assert row is not None and row.chain_breaks == 1 and row.calls == 1
        with pytest.raises(TokenFidelityError, match="append-only"):
            build_row(outcome.rollout_id, outcome.calls, 1.0, max_response_length=4096, strict=True)


ROWS = [
    DatasetRow([{"role": "user", "content": f"What is {i} times 7?"}], str(7 * i), {"seed": i})
    for i in range(4)
]
STEPS = {1: [0, 0, 1, 1], 2: [2, 2, 3, 3]}


def collector(
    bridge: RolloutBridge, policy: LocalPolicy, next_rows: Any, max_staleness: int = 0
) -> RolloutCollector:
    return RolloutCollector(
        bridge,
        ROWS,
        fallback_prompt=lambda row: policy.encode(policy.render(row.initial_messages)),
        stop_id=int(policy.tokenizer.eos_token_id),
        agent_timeout_sec=60,
        grader_timeout_sec=30,
        max_response_length=64,
        group_size=2,
        next_rows=next_rows,
        sampler_logprobs=max_staleness > 0,
        max_staleness=max_staleness,
    )


def step_prompts(step: int) -> list[Any]:
    return [prompt_for(i, ROWS[i]) for i in STEPS[step]]


def recorded_versions(policy: LocalPolicy, monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The policy version of every answer the policy sends from now on."""
    versions: list[int] = []
    submit = policy.submit_chat

    def recording(body: dict[str, Any], reply: Any, **options: Any) -> None:
        def replied(answer: Any, error: BaseException | None) -> None:
            if answer is not None:
                versions.append(answer["policy_version"])
            reply(answer, error)

        submit(body, replied, **options)

    monkeypatch.setattr(policy, "submit_chat", recording)
    return versions


def wait_for(condition: Any, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, "timed out waiting"
        time.sleep(0.02)


def test_the_next_step_is_dispatched_ahead_and_generated_after_the_update(served, monkeypatch):
    policy, bridge = served
    versions = recorded_versions(policy, monkeypatch)
    rollouts = collector(bridge, policy, STEPS.get)
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0))
    with policy.updating(0):
        pass
    first = rollouts(step_prompts(1), trainer)
    assert first[REWARD_FIELD] == [1.0] * 4 and versions == [0] * 8
    # Step 2's rollouts are running: their first model calls wait for the trainer's update.
    batches = policy.batches
    time.sleep(0.5)
    assert policy.batches == batches and len(versions) == 8
    with policy.updating(1):
        pass
    trainer.state.global_step = 1
    second = rollouts(step_prompts(2), trainer)
    assert second[REWARD_FIELD] == [1.0] * 4
    assert versions[8:] == [1] * 8  # every sample of step 2 from the updated policy
    stats = rollouts.last
    assert stats is not None and stats.wait_seconds < stats.seconds
    assert stats.policy_batches is not None and stats.policy_batches >= 2  # two turns


def test_rollouts_dispatched_for_the_wrong_prompts_are_cancelled_and_redone(served):
    policy, bridge = served
    rollouts = collector(bridge, policy, lambda step: STEPS[1])  # a wrong guess for step 2
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=0))
    rollouts(step_prompts(1), trainer)
    trainer.state.global_step = 1
    second = rollouts(step_prompts(2), trainer)
    assert second[REWARD_FIELD] == [1.0] * 4
    # the rows are those of step 2's prompts (each row's prompt starts with its first call's)
    for i, prompt in zip(STEPS[2], second["prompt_ids"], strict=True):
        expected = policy.encode(policy.render(ROWS[i].initial_messages, tools=_TOOLS))
        assert prompt[: len(expected)] == expected
    assert rollouts.next_rows is None  # no more guessing for the rest of the run
    assert len(bridge.run(requests("faithful", 2))) == 2  # nothing was left held


def asynchronous(
    served: tuple[LocalPolicy, RolloutBridge], monkeypatch: pytest.MonkeyPatch
) -> tuple[LocalPolicy, list[int], RolloutCollector, SimpleNamespace]:
    """A max_staleness = 1 collector over ``served`` at policy version 0, before step 1:
    the policy, the versions its answers record, the collector, the trainer's state."""
    policy, bridge = served
    versions = recorded_versions(policy, monkeypatch)
    rollouts = collector(bridge, policy, STEPS.get, max_staleness=1)
    with policy.updating(0):
        pass
    return policy, versions, rollouts, SimpleNamespace(state=SimpleNamespace(global_step=0))


def test_with_max_staleness_the_next_step_generates_during_the_update(served, monkeypatch):
    policy, versions, rollouts, trainer = asynchronous(served, monkeypatch)
    asked = time.perf_counter()
    first = rollouts(step_prompts(1), trainer)
    answered = time.perf_counter()
    assert first[REWARD_FIELD] == [1.0] * 4 and set(versions) == {0} and len(versions) >= 8
    assert first["logprobs"] is not None  # for the importance-ratio correction
    # Step 2's rollouts started when step 1 was asked for, beside step 1's own (its weights
    # were in place), not once step 1's were in; nothing is held: they run both their
    # turns on the weights there are.
    (ahead,) = rollouts._ahead
    assert ahead.step == 2 and ahead.started - asked < (answered - asked) / 2
    wait_for(lambda: len(versions) == 16)
    assert versions[8:] == [0] * 8
    with policy.updating(1):  # the update of step 1 ends
        pass
    trainer.state.global_step = 1
    second = rollouts(step_prompts(2), trainer)
    assert second[REWARD_FIELD] == [1.0] * 4 and len(versions) == 16
    stats = rollouts.last
    assert stats is not None
    assert (stats.staleness_max, stats.stale_regenerated) == (1, 0)
    assert stats.to_metrics()["staleness_mean"] == 1.0  # every token one version behind
    assert stats.to_metrics()["max_staleness"] == 1
    # rows carry the sampled tokens' logprobs, one per completion token
    for ids, logprobs in zip(second["completion_ids"], second["logprobs"] or [], strict=True):
        assert len(ids) == len(logprobs)


def test_samples_older_than_the_bound_are_generated_again_not_trained(served, monkeypatch):
    policy, versions, rollouts, trainer = asynchronous(served, monkeypatch)
    rollouts(step_prompts(1), trainer)
    wait_for(lambda: len(versions) == 16)  # step 2's samples, all from version 0
    with policy.updating(3):  # the policy moved three versions on meanwhile
        pass
    trainer.state.global_step = 1
    second = rollouts(step_prompts(2), trainer)
    assert second[REWARD_FIELD] == [1.0] * 4
    stats = rollouts.last
    assert stats is not None and stats.stale_regenerated == 4
    assert versions[16:] == [3] * 8  # generated again by the current policy
    assert stats.staleness_max == 0
    assert stats.policy_version == 3


_TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "multiply",
            "parameters": {
                "type": "object",
                "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
            },
        },
    }
]


def pinned_copy(policy: LocalPolicy, version: int) -> LocalPolicy:
    """A frozen copy of ``policy``'s model at ``version``, as a run pins it for validation."""
    pinned = LocalPolicy.from_model(copy.deepcopy(policy.model), policy.tokenizer, seed=0)
    pinned.update_weights([], version)
    return pinned


def test_a_pinned_rollout_is_answered_by_the_pinned_version_after_the_policy_moved_on(
    served, monkeypatch
):
    policy, bridge = served
    with policy.updating(5):
        pass
    pinned = pinned_copy(policy, 5)
    with policy.updating(6):  # the served policy moves on
        pass
    live = recorded_versions(policy, monkeypatch)
    fields = bridge.upstream.pin(pinned)
    try:
        routed = [replace(r, upstream_fields=fields) for r in requests("faithful", 2)]
        outcomes = bridge.run([*routed, *requests("faithful", 2)])
    finally:
        bridge.upstream.unpin(5)
    versions = [[call.policy_version for call in o.calls] for o in outcomes]
    assert versions == [[5, 5], [5, 5], [6, 6], [6, 6]]
    assert live == [6] * 4  # the served policy answered only the unpinned rollouts


def test_an_unknown_pin_is_an_error_answer_naming_it(served):
    _policy, bridge = served
    routed = [replace(r, upstream_fields={POLICY_PIN_FIELD: 99}) for r in requests("x", 1)]
    (outcome,) = bridge.run(routed)
    errors = [call.error or "" for call in outcome.calls]
    assert errors and "osmosis_policy_pin=99" in errors[0], errors


def test_validation_beside_training_reports_the_pinned_version(served, monkeypatch):
    policy, bridge = served
    with policy.updating(2):
        pass
    pinned = pinned_copy(policy, 2)
    answered = recorded_versions(pinned, monkeypatch)
    rollouts = collector(bridge, policy, None, max_staleness=1)
    validations = PinnedValidations(bridge, rollouts)
    validations.launch(2, pinned, [0, 1], 2)
    with policy.updating(3):  # training goes on meanwhile
        pass
    trainer = SimpleNamespace(state=SimpleNamespace(global_step=3))
    assert rollouts(step_prompts(1), trainer)[REWARD_FIELD] == [1.0] * 4
    (summary,) = validations.collect(wait=True)
    assert (summary.step, summary.policy_version) == (2, 2)
    assert (summary.rollouts, summary.scored, summary.mean_reward) == (4, 4, 1.0)
    assert answered == [2] * 8 and validations.pending == 0
    with pytest.raises(UsageError, match="osmosis_policy_pin=2"):  # the copy is dropped
        bridge.upstream.policy_for({POLICY_PIN_FIELD: 2})
