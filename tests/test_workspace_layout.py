"""Workspace detection, the doctor scaffold, rollout/run names and the package's exports."""

from __future__ import annotations

import re
import types
from datetime import UTC, datetime, timedelta, timezone

import pytest

import osmosis_ai.workspace as workspace_pkg
from osmosis_ai.errors import UsageError
from osmosis_ai.workspace import (
    InvalidNameError,
    ScaffoldConflictError,
    Workspace,
    WorkspaceNotFoundError,
    check_scaffold,
    find_workspace,
    fix_scaffold,
    generate_run_name,
    validate_rollout_name,
    validate_run_name,
)

SCAFFOLD = [
    "rollouts",
    "configs/training",
    "configs/eval",
    "data",
    "data/.gitkeep",
    "AGENTS.md",
    "CLAUDE.md",
    "configs/AGENTS.md",
]


# --- find_workspace ---------------------------------------------------------------------


@pytest.mark.parametrize("marker", ["rollouts", "configs"])
def test_find_workspace_walks_up_to_the_nearest_marker(tmp_path, marker):
    (tmp_path / marker).mkdir()
    nested = tmp_path / "a" / "b"
    nested.mkdir(parents=True)
    assert find_workspace(nested) == Workspace(tmp_path.resolve())


def test_find_workspace_prefers_the_nearest_of_nested_workspaces(tmp_path):
    (tmp_path / "rollouts").mkdir()
    inner = tmp_path / "sub"
    (inner / "configs").mkdir(parents=True)
    assert find_workspace(inner / "configs").root == inner.resolve()


def test_find_workspace_accepts_a_file_and_defaults_to_cwd(tmp_path, monkeypatch):
    (tmp_path / "configs" / "eval").mkdir(parents=True)
    config = tmp_path / "configs" / "eval" / "x.toml"
    config.write_text("")
    assert find_workspace(config).root == tmp_path.resolve()
    monkeypatch.chdir(tmp_path / "configs")
    assert find_workspace().root == tmp_path.resolve()


def test_find_workspace_needs_no_git_and_says_how_to_fix(tmp_path):
    start = tmp_path / "empty"
    start.mkdir()
    with pytest.raises(WorkspaceNotFoundError) as info:
        find_workspace(start)
    assert isinstance(info.value, UsageError)
    assert str(start.resolve()) in str(info.value)
    assert "osmosis doctor --fix" in str(info.value)
    assert info.value.start == start.resolve()


def test_workspace_paths(tmp_path):
    ws = Workspace(tmp_path)
    assert ws.rollouts_dir == tmp_path / "rollouts"
    assert ws.configs_dir == tmp_path / "configs"
    assert ws.eval_configs_dir == tmp_path / "configs" / "eval"
    assert ws.training_configs_dir == tmp_path / "configs" / "training"
    assert ws.data_dir == tmp_path / "data"
    assert ws.output_dir == tmp_path / ".osmosis"


# --- scaffold ---------------------------------------------------------------------------


def test_check_scaffold_reports_every_missing_path(tmp_path):
    report = check_scaffold(tmp_path)
    assert not report.ok
    assert report.missing == SCAFFOLD
    assert report.present == []
    assert report.to_dict() == {
        "root": str(tmp_path),
        "ok": False,
        "present": [],
        "missing": SCAFFOLD,
    }


def test_fix_scaffold_creates_what_is_missing_once(tmp_path):
    created = fix_scaffold(tmp_path)
    assert tmp_path / "configs" in created  # parents are created and reported too
    assert {str(p.relative_to(tmp_path)) for p in created} >= set(SCAFFOLD)
    report = check_scaffold(tmp_path)
    assert report.ok and report.missing == [] and report.present == SCAFFOLD
    assert fix_scaffold(tmp_path) == []
    assert (tmp_path / "data" / ".gitkeep").read_text() == ""


def test_fix_scaffold_never_overwrites(tmp_path):
    (tmp_path / "AGENTS.md").write_text("mine")
    (tmp_path / "rollouts").mkdir()
    report = check_scaffold(tmp_path)
    assert report.present == ["rollouts", "AGENTS.md"]
    created = fix_scaffold(tmp_path)
    assert tmp_path / "AGENTS.md" not in created
    assert tmp_path / "rollouts" not in created
    assert (tmp_path / "AGENTS.md").read_text() == "mine"


def test_fix_scaffold_refuses_a_path_of_the_wrong_kind(tmp_path):
    (tmp_path / "data").write_text("not a dir")
    assert "data" in check_scaffold(tmp_path).missing
    with pytest.raises(ScaffoldConflictError, match="data"):
        fix_scaffold(tmp_path)
    assert (tmp_path / "data").read_text() == "not a dir"


def test_agent_files_point_at_the_real_commands(tmp_path):
    fix_scaffold(tmp_path)
    agents = (tmp_path / "AGENTS.md").read_text()
    for command in ("osmosis doctor --fix", "osmosis eval run", "osmosis train run"):
        assert command in agents
    assert "_OSMOSIS_ROLLOUT_PORT" in agents
    assert "AGENTS.md" in (tmp_path / "CLAUDE.md").read_text()
    configs = (tmp_path / "configs" / "AGENTS.md").read_text()
    for section in ("[experiment]", "[env]", "[secrets]", "_OSMOSIS_"):
        assert section in configs


# --- names ------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["a", "my-agent", "agent2", "x-1-y"])
def test_valid_rollout_names(name):
    assert validate_rollout_name(name) == name


@pytest.mark.parametrize("name", ["", "default", "My", "1abc", "-a", "a_b", "a.b", "a b", "é"])
def test_invalid_rollout_names(name):
    with pytest.raises(InvalidNameError) as info:
        validate_rollout_name(name)
    assert isinstance(info.value, UsageError)
    assert repr(name) in str(info.value)


def test_default_rollout_name_is_reserved():
    with pytest.raises(InvalidNameError, match="reserved"):
        validate_rollout_name("default")


@pytest.mark.parametrize("name", ["run", "A.b_c-1", "x" * 96, "_x", "1"])
def test_valid_run_names(name):
    assert validate_run_name(name) == name


@pytest.mark.parametrize(
    ("name", "reason"),
    [
        ("", "empty"),
        ("x" * 97, "at most 96"),
        ("a/b", "'/'"),
        ("a b", "' '"),
        ("..", "start with '.'"),
        (".locks", "start with '.'"),
        ("-x", "start with '-'"),
        ("ü", "'ü'"),
    ],
)
def test_invalid_run_names(name, reason):
    with pytest.raises(InvalidNameError) as info:
        validate_run_name(name)
    assert reason in str(info.value)


def test_generate_run_name_shape():
    now = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)
    name = generate_run_name("multiply", "ABCDEF0123456789", now)
    assert name == "multiply-20250304T050607Z-abcdef01"
    other_zone = now.astimezone(timezone(timedelta(hours=5)))
    assert generate_run_name("multiply", "abcdef0123", other_zone) == name


def test_generate_run_name_sanitises_and_bounds_the_stem():
    now = datetime(2025, 1, 1, tzinfo=UTC)
    name = generate_run_name(".my config/ü" + "x" * 200, "0" * 64, now)
    assert len(name) == 96
    assert validate_run_name(name) == name
    assert re.fullmatch(r"my-config-x+-20250101T000000Z-00000000", name)
    assert generate_run_name("...", "0" * 8, now) == "run-20250101T000000Z-00000000"


def test_generate_run_name_defaults_to_now_and_rejects_bad_inputs():
    assert re.fullmatch(r"c-\d{8}T\d{6}Z-12345678", generate_run_name("c", "12345678"))
    with pytest.raises(UsageError, match="timezone-aware"):
        generate_run_name("c", "12345678", datetime(2025, 1, 1))  # naive on purpose
    with pytest.raises(UsageError, match="hex digest"):
        generate_run_name("c", "xyz")


# --- exports ----------------------------------------------------------------------------


def test_all_matches_the_public_names():
    public = {
        name
        for name, value in vars(workspace_pkg).items()
        if not name.startswith("_")
        and not isinstance(value, types.ModuleType)
        and name != "annotations"
    }
    assert public == set(workspace_pkg.__all__)
    assert len(workspace_pkg.__all__) == len(set(workspace_pkg.__all__))
    assert sorted(workspace_pkg.__all__) == sorted(
        [
            "PARQUET_VALIDATION_SKIPPED",
            "CheckpointsSection",
            "ConfigIssue",
            "ConfigValidationError",
            "DatasetError",
            "DatasetRow",
            "DatasetValidation",
            "DatasetWarning",
            "EvalConfig",
            "EvaluationSection",
            "Experiment",
            "InvalidNameError",
            "LoraSection",
            "RowSelectionError",
            "SamplingSection",
            "ScaffoldConflictError",
            "ScaffoldEntry",
            "ScaffoldReport",
            "TrainingConfig",
            "TrainingSection",
            "WarmupSection",
            "Workspace",
            "WorkspaceNotFoundError",
            "check_scaffold",
            "dataset_sha256",
            "find_workspace",
            "fix_scaffold",
            "generate_run_name",
            "load_eval_config",
            "load_training_config",
            "normalize_row",
            "read_rows",
            "select_rows",
            "validate_dataset",
            "validate_rollout_name",
            "validate_run_name",
        ]
    )
