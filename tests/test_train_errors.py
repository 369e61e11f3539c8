"""Bad input to ``osmosis train run``: each error names the value and the fix."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from osmosis_ai.errors import ConfigError, UsageError
from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.plan import TrainRunOptions, build_plan, data_order
from osmosis_ai.workspace import ConfigValidationError, DatasetError

CONFIG = "configs/training/copy-digit.toml"


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    setup_workspace(tmp_path)
    (tmp_path / "models" / "tiny").mkdir(parents=True)
    (tmp_path / "models" / "tiny" / "config.json").write_text("{}")
    return tmp_path


def plan(workspace: Path, **overrides: object):
    values: dict[str, object] = {"config_path": Path(CONFIG), "cwd": workspace}
    values.update(overrides)
    return build_plan(TrainRunOptions(**values))  # type: ignore[arg-type]


def edit(workspace: Path, old: str, new: str) -> None:
    path = workspace / CONFIG
    text = path.read_text()
    assert old in text
    path.write_text(text.replace(old, new))


def test_the_template_plans_two_hundred_steps_in_a_fixed_order(workspace: Path):
    first = plan(workspace)
    assert (first.steps, first.batch, first.group, len(first.rows)) == (200, 8, 8, 10)
    assert first.order == plan(workspace).order  # deterministic
    assert first.order[:10] != first.order[10:20]  # a new permutation per epoch
    assert sorted(first.order[:10]) == list(range(10))
    assert data_order(10, 2, 0) != data_order(10, 2, 1)
    assert plan(workspace, max_steps=5).steps == 5


def test_a_missing_model_dir_names_the_path(workspace: Path):
    shutil.rmtree(workspace / "models")
    with pytest.raises(ConfigValidationError, match=r"local model directory .* not found"):
        plan(workspace)


def test_a_dataset_without_labels_is_refused(workspace: Path):
    data = workspace / "data" / "copy-digit.jsonl"
    data.write_text("".join(json.dumps({"user_prompt": f"Copy: {d}"}) + "\n" for d in range(5)))
    with pytest.raises(DatasetError, match="no row has a label"):
        plan(workspace)
    lines = [{"user_prompt": f"Copy: {d}", "ground_truth": str(d) if d else None} for d in range(5)]
    data.write_text("".join(json.dumps(line) + "\n" for line in lines))
    with pytest.raises(DatasetError, match=r"rows 0 have no 'ground_truth'.*sft_steps = 0"):
        plan(workspace)
    edit(workspace, "sft_steps = 60", "sft_steps = 0")
    assert plan(workspace).warnings[0][0] == "ROWS_WITHOUT_LABEL"


def test_group_and_batch_sizes_are_checked(workspace: Path):
    edit(workspace, "n_samples_per_prompt = 8", "n_samples_per_prompt = 1")
    with pytest.raises(ConfigError, match=r"n_samples_per_prompt = 1: GRPO .* at least 2"):
        plan(workspace)
    edit(workspace, "n_samples_per_prompt = 1", "n_samples_per_prompt = 8")
    edit(workspace, "total_epochs = 160", "total_epochs = 1")
    edit(workspace, "rollout_batch_size = 8", "rollout_batch_size = 32")
    with pytest.raises(ConfigError, match=r"rollout_batch_size = 32 .* 10 rows"):
        plan(workspace)
    edit(workspace, "rollout_batch_size = 32", "rollout_batch_size = 8")
    with pytest.raises(UsageError, match="micro_batch_size=7 must divide the 64"):
        plan(workspace, micro_batch_size=7)


def test_missing_secrets_and_runs_are_named(workspace: Path):
    (workspace / CONFIG).write_text(
        (workspace / CONFIG).read_text() + '\n[secrets]\nrequired = ["JUDGE_KEY"]\n'
    )
    with pytest.raises(ConfigError, match="JUDGE_KEY not set"):
        plan(workspace, environ={})
    assert plan(workspace, environ={"JUDGE_KEY": "x"}).secrets == {"JUDGE_KEY": "x"}
    with pytest.raises(UsageError, match="no training run 'nope'"):
        plan(workspace, environ={"JUDGE_KEY": "x"}, name="nope", resume=True)
    with pytest.raises(UsageError, match=r"no earlier run of copy-digit\.toml"):
        plan(workspace, environ={"JUDGE_KEY": "x"}, resume=True)


def test_an_out_of_memory_batch_names_the_sizes_and_the_fix(workspace: Path):
    pytest.importorskip("torch", reason="needs the 'train' extra")
    from osmosis_ai.train import engine
    from osmosis_ai.train.errors import OutOfMemoryError

    def boom() -> None:
        raise RuntimeError("DefaultCPUAllocator: can't allocate memory: you tried 9 GB")

    with pytest.raises(
        OutOfMemoryError, match=r"8 × n_samples_per_prompt 8 = 64 .*--micro-batch-size"
    ):
        engine._guard_memory(boom, plan(workspace), "a GRPO step", None)
    with pytest.raises(RuntimeError, match="other"):
        engine._guard_memory(
            lambda: (_ for _ in ()).throw(RuntimeError("other")), plan(workspace), "x", None
        )


def test_a_tokenizer_without_a_chat_template_is_refused(tmp_path: Path):
    pytest.importorskip("torch", reason="needs the 'train' extra")
    from osmosis_ai.train import engine
    from osmosis_ai.train.tiny_model import build_tiny_model

    model = build_tiny_model(tmp_path / "tiny")
    (model / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((model / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    (model / "tokenizer_config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"no chat template.*chat_template\.jinja"):
        engine.load_model(str(model), "cpu")
    with pytest.raises(ConfigError, match=r"no config\.json"):
        engine.load_model(str(tmp_path), "cpu")


def test_cli_without_a_config_says_what_to_pass(capsys):
    from cli_support import invoke

    outcome = invoke(capsys, "--json", "train", "run")
    assert outcome.code == 1
    assert "--demo" in outcome.error()["error"]["message"]


def test_the_template_never_overwrites_other_files(tmp_path: Path):
    assert setup_workspace(tmp_path) != []
    assert setup_workspace(tmp_path) == []  # identical files: nothing to do
    data = tmp_path / "data" / "copy-digit.jsonl"
    data.write_text("mine\n")
    with pytest.raises(UsageError, match="pick an empty directory for the demo"):
        setup_workspace(tmp_path)
    assert data.read_text() == "mine\n"


def test_the_public_names_resolve_without_torch_at_import():
    import osmosis_ai.train as train

    assert sorted(train.__all__) == train.__all__
    for name in train.__all__:
        assert getattr(train, name) is not None, name


def test_lr_warmup_steps_ramps_trls_learning_rate(workspace: Path, tmp_path: Path):
    pytest.importorskip("trl", reason="needs the 'train' extra")
    from osmosis_ai.train import engine

    steady = engine.grpo_config(plan(workspace), tmp_path / "a", "cpu", [])
    assert (steady.lr_scheduler_type, steady.warmup_steps) == ("constant", 0)
    edit(workspace, "seed = 0", "seed = 0\nlr_warmup_steps = 5")
    ramped = engine.grpo_config(plan(workspace), tmp_path / "b", "cpu", [])
    assert (ramped.lr_scheduler_type, ramped.warmup_steps) == ("constant_with_warmup", 5)
    edit(workspace, "lr_warmup_steps = 5", "lr_warmup_steps = -1")
    with pytest.raises(ConfigValidationError, match="lr_warmup_steps"):
        plan(workspace)
