"""The rollout value types and their rules."""

from __future__ import annotations

import math

import pytest
from pydantic import ValidationError

from osmosis_ai.rollout import (
    AgentWorkflowConfig,
    AgentWorkflowOutput,
    BaseConfig,
    ConcurrencyConfig,
    ExecutionOutcome,
    ExecutionRequest,
    ExecutionResult,
    GraderContext,
    RolloutContext,
    RolloutErrorCategory,
    RolloutSample,
    RolloutStatus,
    SampleSource,
    get_rollout_context,
)
from osmosis_ai.rollout.output import coerce_output
from osmosis_ai.rollout.protocol import (
    CancelRolloutsRequest,
    RolloutInitRequest,
    RolloutInitResponse,
    validate_rollout_id,
)
from osmosis_ai.rollout.status import categorize_exception


class TestRolloutSample:
    def test_trajectory_messages_default_to_a_deep_copy(self):
        messages = [{"role": "user", "content": "hi", "meta": {"k": 1}}]
        sample = RolloutSample(messages=messages)
        assert sample.trajectory_messages == messages
        sample.trajectory_messages[0]["meta"]["k"] = 2  # type: ignore[index]
        assert messages[0]["meta"]["k"] == 1

    def test_explicit_none_disables_trajectory(self):
        assert RolloutSample(messages=[], trajectory_messages=None).trajectory_messages is None

    @pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf, "x", True])
    def test_reward_must_be_finite_number(self, bad):
        with pytest.raises(ValidationError):
            RolloutSample(reward=bad)
        sample = RolloutSample()
        with pytest.raises(ValidationError):
            sample.reward = bad

    def test_numpy_like_scalars_are_coerced(self):
        class Scalar:
            def item(self) -> float:
                return 0.5

        assert RolloutSample(reward=Scalar()).reward == 0.5

    def test_json_safe_copy_drops_non_finite_telemetry(self):
        sample = RolloutSample(
            metrics={"ok": 1.5, "nan": math.nan, "nested": {"inf": math.inf, "v": [1, math.nan]}},
            extra_fields={"obj": object(), "s": "x"},
        )
        safe = sample.json_safe_copy()
        assert safe.metrics == {"ok": 1.5, "nested": {"v": [1]}}
        assert safe.extra_fields == {"s": "x"}
        assert math.isnan(sample.metrics["nan"])  # the original is untouched

    def test_wire_dict_has_no_trajectory_messages(self):
        wire = RolloutSample(messages=[{"role": "user", "content": "x"}], reward=1.0).wire_dict()
        assert set(wire) == {
            "messages",
            "label",
            "reward",
            "remove_sample",
            "metrics",
            "extra_fields",
        }


class TestOutput:
    def test_coercion_rules(self):
        assert coerce_output(None) is None
        assert coerce_output([{"role": "user"}]) == AgentWorkflowOutput(messages=[{"role": "user"}])
        out = AgentWorkflowOutput(messages=[])
        out.metrics["x"] = math.nan  # mutation after construction is caught on coercion
        with pytest.raises(ValidationError):
            coerce_output(out)
        with pytest.raises(TypeError, match="got str"):
            coerce_output("text")

    def test_unknown_keys_and_non_finite_metrics_rejected(self):
        with pytest.raises(ValidationError):
            AgentWorkflowOutput(messages=[], sample=[])  # type: ignore[call-arg]
        with pytest.raises(ValidationError):
            AgentWorkflowOutput(metrics={"x": math.inf})


class TestConfigs:
    def test_extra_fields_and_validation(self):
        cfg = AgentWorkflowConfig(
            name="w", tools=["a"], concurrency=ConcurrencyConfig(max_concurrent=2)
        )
        assert cfg.tools == ["a"]  # type: ignore[attr-defined]
        with pytest.raises(ValidationError):
            ConcurrencyConfig(max_concurrent=0)
        with pytest.raises(ValidationError):
            BaseConfig()  # type: ignore[call-arg]


class TestContexts:
    def test_set_reward_without_sample_raises(self):
        with pytest.raises(ValueError, match="no sample"):
            GraderContext(label="1").set_reward(1.0)

    def test_set_reward_rejects_nan_where_it_is_set(self):
        ctx = GraderContext(sample=RolloutSample())
        with pytest.raises(ValidationError):
            ctx.set_reward(math.nan)
        ctx.set_reward(0.0)
        assert ctx.sample is not None and ctx.sample.reward == 0.0

    def test_rollout_context_is_ambient_and_nests(self):
        assert get_rollout_context() is None
        with RolloutContext(chat_completions_url="http://a", rollout_id="r1") as outer:
            assert get_rollout_context() is outer
            with RolloutContext(chat_completions_url="http://b", rollout_id="r2") as inner:
                assert get_rollout_context() is inner
            assert get_rollout_context() is outer
        assert get_rollout_context() is None

    def test_env_fallback(self, monkeypatch):
        monkeypatch.setenv("OSMOSIS_CHAT_COMPLETIONS_URL", "http://env/v1")
        monkeypatch.setenv("OSMOSIS_API_KEY", "sekrit-value")
        monkeypatch.setenv("OSMOSIS_ROLLOUT_ID", "rid")
        ctx = RolloutContext()
        assert (ctx.chat_completions_url, ctx.api_key, ctx.rollout_id) == (
            "http://env/v1",
            "sekrit-value",
            "rid",
        )
        assert "sekrit-value" not in repr(ctx)

    async def test_exactly_one_sample_source(self):
        class Source(SampleSource):
            async def get_sample(self) -> RolloutSample:
                return RolloutSample(messages=[{"role": "assistant", "content": "x"}])

        ctx = RolloutContext(rollout_id="r")
        assert await ctx.get_sample() is None
        first = Source()
        ctx.set_sample_source(first)
        ctx.set_sample_source(first)  # the same source again is fine
        with pytest.raises(ValueError, match="exactly one"):
            ctx.set_sample_source(Source())
        sample = await ctx.get_sample()
        assert sample is not None and sample.messages[0]["content"] == "x"


class TestExecution:
    @pytest.mark.parametrize("bad", ["", ".", "..", "a/b", "a\\b", "a\x00b"])
    def test_request_id_is_one_path_segment(self, bad):
        with pytest.raises(ValueError):
            ExecutionRequest(id=bad, prompt=[])

    def test_request_timeouts_finite(self):
        with pytest.raises(ValueError, match="agent_timeout_sec"):
            ExecutionRequest(id="r", prompt=[], agent_timeout_sec=math.inf)
        ExecutionRequest(id="r", prompt=[], agent_timeout_sec=-1)  # already expired is allowed

    def test_outcome_result_rules(self):
        ok = ExecutionResult(RolloutStatus.SUCCESS, RolloutSample(messages=[]))
        graded = ExecutionResult(RolloutStatus.SUCCESS, RolloutSample(messages=[], reward=1.0))
        failed = ExecutionResult.failure("boom", RolloutErrorCategory.AGENT_ERROR)
        assert ExecutionOutcome(ok, graded).result is graded
        assert ExecutionOutcome(ok).result is ok
        assert ExecutionOutcome(failed, graded).result.sample is graded.sample
        assert ExecutionOutcome(failed, graded).result.err_message == "boom"
        assert ExecutionOutcome(ok, ExecutionResult.failure("g")).result_to_save is ok


class TestProtocol:
    base = {"initial_messages": [], "chat_completions_url": "http://127.0.0.1:1/v1"}

    def test_generation_is_chosen_by_callback_url(self):
        polling = RolloutInitRequest.model_validate({**self.base, "rollout_id": "r"})
        callback = RolloutInitRequest.model_validate(
            {**self.base, "completion_callback_url": "http://127.0.0.1:1/c"}
        )
        assert (polling.generation, callback.generation) == ("polling", "callback")

    def test_polling_requires_rollout_id(self):
        with pytest.raises(ValidationError, match="rollout_id is required"):
            RolloutInitRequest.model_validate(self.base)

    def test_unknown_keys_ignored_and_bad_values_named(self):
        ok = RolloutInitRequest.model_validate({**self.base, "rollout_id": "r", "future": 1})
        assert ok.rollout_id == "r"
        with pytest.raises(ValidationError, match="llm_api_key"):
            RolloutInitRequest.model_validate({**self.base, "rollout_id": "r", "llm_api_key": ""})
        with pytest.raises(ValidationError, match="grader_timeout_sec"):
            RolloutInitRequest.model_validate(
                {**self.base, "rollout_id": "r", "grader_timeout_sec": math.nan}
            )

    def test_lease_response_rules(self):
        with pytest.raises(ValidationError):
            RolloutInitResponse(
                rollout_id="r",
                polling_lease_token="t",
                result_wait_timeout_sec=30,
                polling_lease_timeout_sec=30,
            )

    def test_cancel_needs_exactly_one_selector(self):
        with pytest.raises(ValidationError):
            CancelRolloutsRequest()
        with pytest.raises(ValidationError):
            CancelRolloutsRequest(ids=["a"], all=True)
        assert CancelRolloutsRequest(prefix="p").prefix == "p"

    def test_validate_rollout_id_accepts_normal_ids(self):
        assert validate_rollout_id("abc-123_x.y:z") == "abc-123_x.y:z"


def test_categorize_exception():
    import httpx

    assert categorize_exception(TimeoutError()) is RolloutErrorCategory.TIMEOUT
    assert categorize_exception(ValueError()) is RolloutErrorCategory.VALIDATION_ERROR
    assert categorize_exception(AssertionError()) is RolloutErrorCategory.VALIDATION_ERROR
    assert categorize_exception(httpx.ConnectError("x")) is RolloutErrorCategory.HTTP_ERROR
    assert categorize_exception(RuntimeError()) is RolloutErrorCategory.AGENT_ERROR


def test_public_names_match_reference():
    import osmosis_ai.rollout as rollout
    import osmosis_ai.rollout.types as types

    documented = {
        "AgentWorkflow", "AgentWorkflowConfig", "AgentWorkflowContext", "AgentWorkflowOutput",
        "BaseConfig", "ConcurrencyConfig", "ExecutionBackend", "ExecutionRequest",
        "ExecutionResult", "Grader", "GraderCompleteRequest", "GraderConfig", "GraderContext",
        "GraderInitRequest", "GraderInitResponse", "GraderStatus", "LocalBackend", "MessageDict",
        "RolloutCompleteRequest", "RolloutContext", "RolloutErrorCategory", "RolloutInitRequest",
        "RolloutInitResponse", "RolloutSample", "RolloutStatus", "SampleSource",
        "get_rollout_context",
    }  # fmt: skip
    assert documented <= set(rollout.__all__)
    for name in rollout.__all__:
        assert getattr(rollout, name) is not None
    assert {
        "Messages",
        "CancelRolloutsRequest",
        "CancelRolloutsResponse",
        "RolloutStatusResponse",
    } <= set(types.__all__)
    with pytest.raises(AttributeError):
        rollout.DoesNotExist  # type: ignore[attr-defined]  # noqa: B018
