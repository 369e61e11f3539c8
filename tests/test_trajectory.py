"""Trajectory persistence: sample → ATIF conversion, the controller report overlay, file writing."""

from __future__ import annotations

import asyncio
import copy
import json
import logging
import math

import pytest

import osmosis_ai.rollout.trajectory as trajectory_pkg
from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.rollout.execution import ExecutionResult
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.rollout.trajectory import (
    LlmCallMetrics,
    SampleReport,
    TrajectoryReport,
    convert_sample_to_trajectory,
    report_from_response,
    save_trajectory,
)


def _call(call_id, name, arguments):
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


TOOL_CONVERSATION = [
    {"role": "system", "content": "You add numbers."},
    {"role": "user", "content": "What is 1+2 and 3+4?"},
    {
        "role": "assistant",
        "content": None,
        "reasoning_content": "Two sums.",
        "tool_calls": [
            _call("c1", "add", '{"a": 1, "b": 2}'),
            _call("c2", "add", '{"a": 3, "b": 4}'),
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "content": "3"},
    {"role": "tool", "tool_call_id": "c2", "content": "7"},
    {"role": "assistant", "content": "3 and 7."},
    {"role": "user", "content": "Thanks"},
    {"role": "assistant", "content": "You're welcome."},
]


def _convert(messages, **kwargs):
    sample = RolloutSample(messages=messages, reward=kwargs.pop("sample_reward", None))
    return convert_sample_to_trajectory(rollout_id="r-1", sample=sample, **kwargs)


def _report(*calls, **sample_kwargs):
    return TrajectoryReport(
        samples={"any-key": SampleReport(llm_call_metrics=list(calls), **sample_kwargs)}
    )


def test_exported_names():
    assert sorted(trajectory_pkg.__all__) == [
        "LlmCallMetrics",
        "SampleReport",
        "TrajectoryReport",
        "convert_sample_to_trajectory",
        "report_from_response",
        "save_trajectory",
    ]


def test_multi_turn_tool_conversation():
    doc = _convert(TOOL_CONVERSATION, status="success")

    assert doc["schema_version"] == "ATIF-v1.7"
    assert doc["session_id"] == doc["trajectory_id"] == "r-1"
    assert doc["agent"] == {"name": "osmosis-rollout-sdk", "version": PACKAGE_VERSION}
    steps = doc["steps"]
    assert [s["step_id"] for s in steps] == [1, 2, 3, 4, 5, 6]
    assert [s["source"] for s in steps] == ["system", "user", "agent", "agent", "user", "agent"]
    assert steps[2]["reasoning_content"] == "Two sums."
    assert steps[2]["message"] == ""
    assert steps[2]["tool_calls"] == [
        {"tool_call_id": "c1", "function_name": "add", "arguments": {"a": 1, "b": 2}},
        {"tool_call_id": "c2", "function_name": "add", "arguments": {"a": 3, "b": 4}},
    ]
    assert steps[2]["observation"] == {
        "results": [
            {"source_call_id": "c1", "content": "3"},
            {"source_call_id": "c2", "content": "7"},
        ]
    }
    assert steps[3]["message"] == "3 and 7."
    assert "observation" not in steps[3]
    assert doc["final_metrics"] == {"total_steps": 6}
    assert doc["extra"]["osmosis"]["status"] == "success"


def test_roles_and_content():
    doc = _convert(
        [
            {"role": "developer", "content": "dev"},
            {"role": "critic", "content": "hmm"},
            {"content": "no role"},
            {"role": ["tool"], "content": "odd role"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}],
            },
            {"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]},
            {"role": "user", "content": {"k": 1}},
        ]
    )
    steps = doc["steps"]
    assert [s["source"] for s in steps] == ["system"] + ["user"] * 6
    assert steps[1]["extra"] == {"original_role": "critic"}
    assert steps[2]["extra"] == {"original_role": None}
    assert steps[3]["extra"] == {"original_role": ["tool"]}
    assert "extra" not in steps[0]
    assert steps[4]["message"] == "a\nb"
    assert json.loads(steps[5]["message"]) == [{"type": "image_url", "image_url": {"url": "x"}}]
    assert json.loads(steps[6]["message"]) == {"k": 1}


def test_unmatched_tool_results():
    doc = _convert(
        [
            {"role": "tool", "tool_call_id": "early", "content": "orphan"},
            {"role": "assistant", "content": "", "tool_calls": [_call("c1", "f", "{}")]},
            {"role": "tool", "tool_call_id": "c1", "content": "ok"},
            {"role": "tool", "tool_call_id": "nope", "content": "lost"},
        ]
    )
    first, agent = doc["steps"]
    assert first["source"] == "user"
    assert first["message"] == "orphan"
    assert first["extra"] == {"original_role": "tool"}
    assert agent["observation"] == {"results": [{"source_call_id": "c1", "content": "ok"}]}
    assert agent["extra"]["unmatched_tool_results"] == [
        {"role": "tool", "tool_call_id": "nope", "content": "lost"}
    ]


def test_legacy_function_call_matched_by_name():
    doc = _convert(
        [
            {"role": "assistant", "function_call": {"name": "lookup", "arguments": '{"q": "x"}'}},
            {"role": "function", "name": "lookup", "content": "found"},
        ]
    )
    (step,) = doc["steps"]
    (call,) = step["tool_calls"]
    assert call["function_name"] == "lookup"
    assert call["arguments"] == {"q": "x"}
    assert step["observation"]["results"] == [
        {"source_call_id": call["tool_call_id"], "content": "found"}
    ]


@pytest.mark.parametrize(
    ("arguments", "expected"),
    [
        ('{"x": [1, 2]}', {"x": [1, 2]}),
        ("{not json", {"_raw": "{not json"}),
        ("[1, 2]", {"_raw": "[1, 2]"}),
        ({"already": "parsed"}, {"already": "parsed"}),
        ("", {}),
        (None, {}),
    ],
)
def test_tool_call_arguments(arguments, expected):
    doc = _convert([{"role": "assistant", "tool_calls": [_call("c", "f", arguments)]}])
    assert doc["steps"][0]["tool_calls"][0]["arguments"] == expected


def test_usage_model_and_timestamps_in_both_naming_styles():
    doc = _convert(
        [
            {"role": "user", "content": "hi", "timestamp": "2024-01-01T00:00:00Z"},
            {
                "role": "assistant",
                "content": "a",
                "model": "chat-model",
                "created_at": 0,
                "usage": {
                    "prompt_tokens": 10,
                    "completion_tokens": 4,
                    "prompt_tokens_details": {"cached_tokens": 6},
                    "cost_usd": 0.25,
                },
            },
            {
                "role": "assistant",
                "content": "b",
                "extra": {
                    "response": {
                        "model": "responses-model",
                        "completed_at": 1700000000.5,
                        "usage": {
                            "input_tokens": 20,
                            "output_tokens": 5,
                            "input_tokens_details": {"cached_tokens": 1},
                        },
                    }
                },
            },
        ]
    )
    user, chat, responses = doc["steps"]
    assert user["timestamp"] == "2024-01-01T00:00:00Z"
    assert chat["metrics"] == {
        "prompt_tokens": 10,
        "completion_tokens": 4,
        "cached_tokens": 6,
        "cost_usd": 0.25,
    }
    assert chat["model_name"] == "chat-model"
    assert chat["timestamp"] == "1970-01-01T00:00:00+00:00"
    assert chat["llm_call_count"] == 1
    assert responses["metrics"] == {"prompt_tokens": 20, "completion_tokens": 5, "cached_tokens": 1}
    assert responses["model_name"] == "responses-model"
    assert responses["timestamp"].startswith("2023-11-14T22:13:20.5")
    assert doc["agent"]["model_name"] == "chat-model"
    assert doc["final_metrics"] == {
        "total_prompt_tokens": 30,
        "total_completion_tokens": 9,
        "total_cached_tokens": 7,
        "total_cost_usd": 0.25,
        "total_steps": 3,
    }


def test_report_overlay_with_matching_counts():
    messages = [
        {"role": "user", "content": "q"},
        {
            "role": "assistant",
            "content": "a1",
            "usage": {"prompt_tokens": 1, "completion_tokens": 1},
        },
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "a2"},
    ]
    report = _report(
        LlmCallMetrics(prompt_tokens=5, prompt_token_ids=[1, 2], logprobs=[-0.5], model_name="m"),
        LlmCallMetrics(completion_tokens=3, completion_token_ids=[9], cost_usd=0.1),
    )
    doc = _convert(messages, report=report)

    first, second = doc["steps"][1], doc["steps"][3]
    assert first["metrics"] == {
        "prompt_tokens": 5,
        "completion_tokens": 1,
        "prompt_token_ids": [1, 2],
        "logprobs": [-0.5],
    }
    assert first["model_name"] == "m"
    assert second["metrics"] == {
        "completion_tokens": 3,
        "completion_token_ids": [9],
        "cost_usd": 0.1,
    }
    assert second["llm_call_count"] == 1
    assert "unmatched_llm_call_metrics" not in doc["extra"]["osmosis"]
    assert doc["final_metrics"] == {
        "total_prompt_tokens": 5,
        "total_completion_tokens": 4,
        "total_cost_usd": 0.1,
        "total_steps": 4,
    }


def test_report_overlay_with_mismatched_counts():
    messages = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "a", "usage": {"prompt_tokens": 100}},
    ]
    report = _report(LlmCallMetrics(prompt_tokens=5), LlmCallMetrics(prompt_tokens=7))
    doc = _convert(messages, report=report)

    agent = doc["steps"][1]
    assert agent["metrics"] == {"prompt_tokens": 100}
    unmatched = doc["extra"]["osmosis"]["unmatched_llm_call_metrics"]
    assert [c["prompt_tokens"] for c in unmatched] == [5, 7]
    assert doc["final_metrics"] == {"total_prompt_tokens": 12, "total_steps": 2}


def test_several_sample_reports_are_preserved_not_overlaid():
    report = TrajectoryReport(
        model_name="report-model",
        samples={
            "a": SampleReport(llm_call_metrics=[LlmCallMetrics(prompt_tokens=1)]),
            "b": SampleReport(llm_call_metrics=[LlmCallMetrics(prompt_tokens=2)]),
        },
    )
    doc = _convert([{"role": "assistant", "content": "x"}], report=report)

    assert "metrics" not in doc["steps"][0]
    preserved = doc["extra"]["osmosis"]["unmatched_sample_reports"]
    assert set(preserved) == {"a", "b"}
    assert preserved["b"]["llm_call_metrics"][0]["prompt_tokens"] == 2
    assert doc["agent"]["model_name"] == "report-model"
    assert doc["final_metrics"] == {"total_steps": 1}


def test_controller_final_metrics_win_except_total_steps():
    report = _report(
        LlmCallMetrics(prompt_tokens=5, completion_tokens=2),
        final_metrics={"total_prompt_tokens": 50, "total_steps": 99, "total_reward_calls": 3},
        model_name="sample-model",
    )
    doc = _convert([{"role": "assistant", "content": "x"}], report=report, model_name="explicit")

    assert doc["final_metrics"] == {
        "total_prompt_tokens": 50,
        "total_completion_tokens": 2,
        "total_steps": 1,
        "total_reward_calls": 3,
    }
    assert doc["agent"]["model_name"] == "explicit"


def test_non_finite_telemetry_is_dropped():
    sample = RolloutSample(
        messages=[
            {
                "role": "assistant",
                "content": "x",
                "usage": {"cost_usd": math.inf, "prompt_tokens": 3},
            }
        ],
        metrics={"ok": 1.0, "bad": math.nan},
        extra_fields={"nested": [1.0, math.inf]},
    )
    report = _report(
        LlmCallMetrics(
            cost_usd=math.nan, logprobs=[-0.1, -math.inf], extra={"ok": 1, "bad": math.nan}
        )
    )
    doc = convert_sample_to_trajectory(
        rollout_id="r",
        sample=sample,
        report=report,
        request_metadata={"score": -math.inf, "keep": "yes"},
    )

    json.dumps(doc, allow_nan=False)
    osmosis = doc["extra"]["osmosis"]
    assert osmosis["sample_metrics"] == {"ok": 1.0}
    assert osmosis["sample_extra_fields"] == {"nested": [1.0]}
    assert osmosis["request_metadata"] == {"keep": "yes"}
    assert doc["steps"][0]["metrics"] == {"prompt_tokens": 3, "extra": {"ok": 1}}


def test_non_finite_values_in_unmatched_reports_are_dropped():
    call = LlmCallMetrics(prompt_tokens=1, extra={"bad": math.inf, "ok": 2})
    report = TrajectoryReport(
        samples={"a": SampleReport(llm_call_metrics=[call]), "b": SampleReport()}
    )
    doc = _convert([], report=_report(call, call))
    assert doc["extra"]["osmosis"]["unmatched_llm_call_metrics"][0]["extra"] == {"ok": 2}
    doc = _convert([], report=report)
    preserved = doc["extra"]["osmosis"]["unmatched_sample_reports"]
    assert preserved["a"]["llm_call_metrics"][0]["extra"] == {"ok": 2}
    json.dumps(doc, allow_nan=False)


def test_report_from_response(caplog):
    body = {
        "ok": True,
        "trajectory": {
            "model_name": "m",
            "unknown": 1,
            "samples": {"s": {"llm_call_metrics": [{"prompt_tokens": 2, "future_key": 1}]}},
        },
    }
    report = report_from_response(body)
    assert report is not None
    assert report.model_name == "m"
    assert report.samples["s"].llm_call_metrics[0].prompt_tokens == 2
    assert report_from_response(json.dumps(body)) == report
    assert report_from_response({"ok": True}) is None
    assert report_from_response(None) is None

    with caplog.at_level(logging.WARNING):
        assert report_from_response({"trajectory": {"samples": [1, 2]}}) is None
        assert report_from_response("{not json") is None
    assert "malformed trajectory report" in caplog.text


def _result(sample=None, **kwargs):
    return ExecutionResult(RolloutStatus.SUCCESS, sample, **kwargs)


async def test_save_writes_strict_pretty_json_with_one_line_arrays(tmp_path):
    sample = RolloutSample(messages=TOOL_CONVERSATION, reward=0.5, label="7")
    report = _report(
        LlmCallMetrics(prompt_token_ids=[1, 2, 3], logprobs=[-0.25, -1.5]),
        LlmCallMetrics(completion_token_ids=[4, 5]),
        LlmCallMetrics(),
    )
    path = await save_trajectory(
        rollout_id="r-1", result=_result(sample), report=report, artifact_root=tmp_path
    )

    assert path == tmp_path / "r-1" / "trajectory.json"
    text = path.read_text()
    assert '"prompt_token_ids": [1, 2, 3],' in text
    assert '"logprobs": [-0.25, -1.5]' in text
    assert '"completion_token_ids": [4, 5]' in text
    assert '\n  "steps": [\n' in text
    doc = json.loads(text)
    assert doc == convert_sample_to_trajectory(
        rollout_id="r-1", sample=sample, report=report, status="success"
    )
    assert not (tmp_path / "r-1" / "diagnostics.json").exists()
    assert sorted(p.name for p in (tmp_path / "r-1").iterdir()) == ["trajectory.json"]


async def test_save_archives_real_reward_and_falls_back_to_request_label(artifact_root):
    sample = RolloutSample(
        messages=[{"role": "user", "content": "q"}], reward=1.0, remove_sample=True
    )
    result = ExecutionResult(
        RolloutStatus.FAILURE, sample, "boom", RolloutErrorCategory.AGENT_ERROR
    )
    path = await save_trajectory(
        rollout_id="r-2",
        result=result,
        request_label="gold",
        request_metadata={"task": 1},
        request_extra_fields={"x": "y"},
    )

    assert path == artifact_root / "r-2" / "trajectory.json"
    osmosis = json.loads(path.read_text())["extra"]["osmosis"]
    assert osmosis == {
        "rollout_id": "r-2",
        "label": "gold",
        "reward": 1.0,
        "status": "failure",
        "err_message": "boom",
        "err_category": "agent_error",
        "sample_metrics": {},
        "sample_extra_fields": {},
        "request_metadata": {"task": 1},
        "request_extra_fields": {"x": "y"},
    }


async def test_no_trajectory_file_without_trajectory_messages(tmp_path):
    sample = RolloutSample(messages=[{"role": "user", "content": "q"}], trajectory_messages=None)
    assert (
        await save_trajectory(rollout_id="r", result=_result(sample), artifact_root=tmp_path)
        is None
    )
    assert await save_trajectory(rollout_id="r", result=_result(), artifact_root=tmp_path) is None
    assert not (tmp_path / "r").exists()


async def test_diagnostics_file_merges_and_diagnostics_win(tmp_path):
    result = _result(extra_fields={"backend": "local", "exit_code": 1, "bad": math.nan})
    path = await save_trajectory(
        rollout_id="r", result=result, artifact_root=tmp_path, diagnostics={"exit_code": 2}
    )

    assert path is None
    diagnostics = json.loads((tmp_path / "r" / "diagnostics.json").read_text())
    assert diagnostics == {"backend": "local", "exit_code": 2}


@pytest.mark.parametrize("rollout_id", ["a/b", "..", "", "a\\b", "x\x00"])
async def test_invalid_rollout_id_returns_none(tmp_path, rollout_id, caplog):
    sample = RolloutSample(messages=[{"role": "user", "content": "q"}])
    with caplog.at_level(logging.WARNING):
        path = await save_trajectory(
            rollout_id=rollout_id,
            result=_result(sample, extra_fields={"k": 1}),
            artifact_root=tmp_path,
        )
    assert path is None
    assert list(tmp_path.iterdir()) == []
    assert "could not save rollout" in caplog.text


async def test_unwritable_root_and_bad_input_return_none(tmp_path):
    blocker = tmp_path / "root"
    blocker.write_text("a file where the folder should be")
    sample = RolloutSample(messages=[{"role": "user", "content": "q"}])

    result = _result(sample, extra_fields={"k": 1})
    assert await save_trajectory(rollout_id="r", result=result, artifact_root=blocker) is None
    assert await save_trajectory(rollout_id="r", result=None, artifact_root=tmp_path) is None  # type: ignore[arg-type]
    assert blocker.read_text() == "a file where the folder should be"


async def test_saving_leaves_the_result_unchanged(tmp_path):
    messages = copy.deepcopy(TOOL_CONVERSATION)
    sample = RolloutSample(
        messages=messages, reward=0.0, metrics={"m": math.nan}, extra_fields={"e": [1]}
    )
    result = _result(sample, extra_fields={"diag": {"nested": True}})
    before_sample = copy.deepcopy(sample.model_dump())
    before_extra = copy.deepcopy(result.extra_fields)

    path = await save_trajectory(
        rollout_id="r",
        result=result,
        artifact_root=tmp_path,
        diagnostics={"more": 1},
        report=_report(LlmCallMetrics(prompt_tokens=1)),
    )

    assert path is not None
    after = sample.model_dump()
    assert math.isnan(after["metrics"].pop("m"))
    assert math.isnan(before_sample["metrics"].pop("m"))
    assert after == before_sample
    assert result.extra_fields == before_extra
    assert result.sample is sample
    assert messages == TOOL_CONVERSATION


def test_malformed_controller_final_metrics_are_ignored(caplog):
    report = _report(LlmCallMetrics(prompt_tokens=4), final_metrics={"total_prompt_tokens": "many"})
    with caplog.at_level(logging.WARNING):
        doc = _convert([{"role": "assistant", "content": "x"}], report=report)
    assert doc["final_metrics"] == {"total_prompt_tokens": 4, "total_steps": 1}
    assert "ignored the controller's final_metrics" in caplog.text


async def test_concurrent_saves(tmp_path):
    sample = RolloutSample(messages=TOOL_CONVERSATION)
    paths = await asyncio.gather(
        *(
            save_trajectory(rollout_id=f"r{i}", result=_result(sample), artifact_root=tmp_path)
            for i in range(8)
        )
    )
    assert paths == [tmp_path / f"r{i}" / "trajectory.json" for i in range(8)]
    assert all(json.loads(p.read_text())["session_id"] == p.parent.name for p in paths)
