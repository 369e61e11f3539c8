"""The reward curve renderers and the result's start/end reward windows."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_ai.train.chart import binned, save_png, text_chart
from osmosis_ai.train.events import EvalSummary, TrainRunResult, window_mean


def test_binning_and_windows_skip_missing_values():
    assert binned([0.0, 1.0, None, 1.0], 2) == [0.5, 1.0]
    assert binned([], 10) == []
    values = [0.1] * 10 + [0.5] * 80 + [0.9] * 10
    assert window_mean(values, head=True) == pytest.approx(0.1)
    assert window_mean(values, head=False) == pytest.approx(0.9)
    assert window_mean([None, float("nan")], head=True) is None


def test_text_chart_rises_with_the_reward():
    lines = text_chart([i / 99 for i in range(100)], width=10, height=4)
    assert lines[0].startswith("training reward (steps 1-100, 10 bins)")
    top, bottom = lines[1].split("│")[1], lines[4].split("│")[1]
    assert top[0] == " " and top[-1] != " "  # low early, high late
    assert bottom[-1] == "█" and set(bottom) <= set(" ▁▂▃▄▅▆▇█")
    assert lines[-1].startswith("0.00 └")
    assert text_chart([]) == []


def test_png_and_result_resource(tmp_path: Path):
    pytest.importorskip("matplotlib", reason="needs the 'train' extra (matplotlib)")
    validations = (EvalSummary(0, 40, 40, 0.2, 0.2), EvalSummary(10, 40, 40, 0.8, 0.8))
    rewards = tuple(i / 10 for i in range(10))
    path = tmp_path / "reward.png"
    assert save_png(path, rewards, validations)
    assert path.read_bytes()[:4] == b"\x89PNG"
    result = TrainRunResult(
        run_name="r",
        run_dir=tmp_path,
        status="success",
        steps_done=10,
        total_steps=10,
        resumed=False,
        duration_ms=5,
        rewards=rewards,
        validations=validations,
        checkpoints=(tmp_path / "checkpoints" / "step-000010",),
        plot_path=path,
    )
    resource = result.to_resource()
    assert resource["training_reward"] == {"start": 0.0, "end": pytest.approx(0.9)}
    assert resource["final_checkpoint"].endswith("step-000010")
    assert [v["mean_reward"] for v in resource["validation"]] == [0.2, 0.8]
