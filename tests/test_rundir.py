"""The floor beneath eval and train: one durable-write policy, one run log, one timestamp
format and one dataset lookup, whichever run uses them."""

from __future__ import annotations

import json
import os
import re
import stat
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone
from pathlib import Path

import pytest

from osmosis_ai.eval.inputs import (
    DatasetLock,
    Provenance,
    RolloutLock,
    RunInputs,
    TimeoutsLock,
    VersionsLock,
)
from osmosis_ai.eval.rundir import open_run
from osmosis_ai.rundir.datasets import DATASET_SUFFIXES, DatasetError, resolve_dataset
from osmosis_ai.rundir.durable import atomic_write_bytes, atomic_write_json
from osmosis_ai.rundir.logs import Redactor, RunLog
from osmosis_ai.rundir.timestamps import iso_utc
from osmosis_ai.train.demo import setup_workspace
from osmosis_ai.train.plan import TrainPlan, TrainRunOptions, build_plan
from osmosis_ai.train.rundir import RunDir as TrainRunDir
from osmosis_ai.workspace import DatasetError as WorkspaceDatasetError

LINE = r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z (INFO|WARNING|ERROR) \[[^\]]+\] .* \{.*\}$"


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(autouse=True)
def usual_umask() -> Iterator[None]:
    """A umask that leaves new files group- and world-readable, as on most machines: a file
    is owner-only only because the run made it so."""
    previous = os.umask(0o022)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.fixture
def train_plan(tmp_path: Path) -> TrainPlan:
    workspace = tmp_path / "ws"
    setup_workspace(workspace)
    (workspace / "models" / "tiny").mkdir(parents=True)
    (workspace / "models" / "tiny" / "config.json").write_text("{}")
    options = TrainRunOptions(
        config_path=Path("configs/training/copy-digit.toml"), cwd=workspace, name="floor"
    )
    return build_plan(options)


# --- the drift: training's logs.txt was world-readable ----------------------------------------


def test_a_training_run_writes_its_log_and_files_owner_only(train_plan: TrainPlan):
    rundir = TrainRunDir(train_plan)
    try:
        rundir.journal.info("run", "started", pid=123)
        rundir.append_metrics({"step": 1, "reward": 0.5})
    finally:
        rundir.close()
    for name in ("logs.txt", "run.json", "inputs.json", "config.toml", "metrics.jsonl"):
        assert mode(rundir.path / name) == 0o600, name


def test_an_eval_run_writes_its_log_owner_only(tmp_path: Path):
    inputs = RunInputs(
        model_path="openai/gpt-5-mini",
        dataset=DatasetLock(sha256="a" * 64, selected_source_rows=(0,)),
        n=1,
        rollout=RolloutLock(name="echo", entrypoint="main.py", source_digest="b" * 64),
        env={},
        secret_names=(),
        timeouts=TimeoutsLock(agent_timeout_sec=30.0, grader_timeout_sec=10.0),
        versions=VersionsLock.for_generation("polling"),
    )
    with open_run(tmp_path, "demo", inputs, Provenance(), fresh=False) as run:
        with RunLog(run.logs_path, Redactor()) as run_log:
            run_log.info("run", "started", {"pid": 123})
        assert mode(run.logs_path) == 0o600
        assert mode(run.path / "manifest.json") == 0o600


def test_training_and_eval_logs_share_one_line_format_and_redaction(
    train_plan: TrainPlan, tmp_path: Path
):
    train_plan.secrets["OPENAI_API_KEY"] = "sk-train-secret"
    rundir = TrainRunDir(train_plan)
    try:
        rundir.journal.info("run", "key sk-train-secret\nnext", pid=7, key="sk-train-secret")
        rundir.journal.add_secrets("tok-added")
        rundir.journal.warning("run", "token tok-added")
        rundir.journal.output("rollout-server", "one\n\ntwo")
    finally:
        rundir.close()
    rundir.journal.info("run", "after close")  # dropped, not raised
    text = (rundir.path / "logs.txt").read_text()
    lines = text.splitlines()
    assert len(lines) == 4, lines
    for line in lines:
        assert re.match(LINE, line), line
    assert lines[0].endswith(' key [REDACTED]\\nnext {"key":"[REDACTED]","pid":7}')
    assert lines[1].endswith(" token [REDACTED] {}")
    assert [line.split(" ", 3)[3] for line in lines[2:]] == ["one {}", "two {}"]
    assert "sk-train-secret" not in text and "tok-added" not in text

    path = tmp_path / "eval-logs.txt"
    with RunLog(path, Redactor(["sk-train-secret"])) as run_log:
        run_log.info("run", "key sk-train-secret\nnext", {"pid": 7}, key="sk-train-secret")
    assert path.read_text().split(" ", 1)[1] == lines[0].split(" ", 1)[1] + "\n"


# --- durable writes ----------------------------------------------------------------------------


def test_atomic_writes_are_whole_owner_only_and_leave_no_temp_file(tmp_path: Path):
    target = tmp_path / "new" / "deeper" / "file.json"
    atomic_write_json(target, {"b": 1, "a": "é"})
    assert json.loads(target.read_text(encoding="utf-8")) == {"a": "é", "b": 1}
    assert mode(target) == 0o600
    target.chmod(0o644)
    atomic_write_bytes(target, b"two")
    assert target.read_bytes() == b"two" and mode(target) == 0o600
    assert sorted(p.name for p in target.parent.iterdir()) == ["file.json"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temp_file(tmp_path: Path):
    target = tmp_path / "file.json"
    atomic_write_json(target, {"ok": True})
    with pytest.raises(ValueError):
        atomic_write_json(target, {"bad": float("nan")})
    assert json.loads(target.read_text()) == {"ok": True}
    assert [p.name for p in tmp_path.iterdir()] == ["file.json"]


# --- timestamps ---------------------------------------------------------------------------------


def test_iso_utc_is_milliseconds_in_utc():
    moment = datetime(2025, 1, 2, 3, 4, 5, 678999, tzinfo=timezone(timedelta(hours=2)))
    assert iso_utc(moment) == "2025-01-02T01:04:05.678Z"
    assert iso_utc().endswith("Z") and abs(
        datetime.fromisoformat(iso_utc().replace("Z", "+00:00")) - datetime.now(UTC)
    ) < timedelta(seconds=5)


# --- datasets -----------------------------------------------------------------------------------


def test_a_bare_name_tries_each_suffix_in_order(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.csv").write_text("x\n")
    (data / "rows.parquet").write_text("")
    path, name = resolve_dataset(
        "rows", root=tmp_path, data_dir=data, dataset_file=None, cwd=tmp_path
    )
    assert (path, name) == ((data / "rows.csv").resolve(), "rows")
    (data / "rows.jsonl").write_text("{}\n")
    path, _ = resolve_dataset("rows", root=tmp_path, data_dir=data, dataset_file=None, cwd=tmp_path)
    assert path == (data / "rows.jsonl").resolve()
    assert DATASET_SUFFIXES == (".jsonl", ".csv", ".parquet")


def test_a_name_with_a_suffix_is_a_workspace_path_then_a_data_file(tmp_path: Path):
    data = tmp_path / "data"
    data.mkdir()
    (data / "rows.jsonl").write_text("{}\n")
    found = resolve_dataset(
        "rows.jsonl", root=tmp_path, data_dir=data, dataset_file=None, cwd=tmp_path
    )
    assert found == ((data / "rows.jsonl").resolve(), "rows")
    (tmp_path / "rows.jsonl").write_text("{}\n")
    found = resolve_dataset(
        "rows.jsonl", root=tmp_path, data_dir=data, dataset_file=None, cwd=tmp_path
    )
    assert found == ((tmp_path / "rows.jsonl").resolve(), "rows")


def test_an_explicit_file_wins_and_a_missing_one_is_named(tmp_path: Path):
    (tmp_path / "other.csv").write_text("x\n")
    found = resolve_dataset(
        "rows",
        root=tmp_path,
        data_dir=tmp_path / "data",
        dataset_file=Path("other.csv"),
        cwd=tmp_path,
    )
    assert found == ((tmp_path / "other.csv").resolve(), "other")
    with pytest.raises(DatasetError, match=r"--dataset-file gone.csv: file not found"):
        resolve_dataset(
            "rows",
            root=tmp_path,
            data_dir=tmp_path / "data",
            dataset_file=Path("gone.csv"),
            cwd=tmp_path,
        )


def test_a_missing_dataset_names_every_place_looked(tmp_path: Path):
    with pytest.raises(WorkspaceDatasetError) as caught:
        resolve_dataset(
            "rows", root=tmp_path, data_dir=tmp_path / "data", dataset_file=None, cwd=tmp_path
        )
    assert str(caught.value) == (
        "dataset 'rows' (experiment.dataset) was not found in the workspace: looked for "
        "data/rows.jsonl, data/rows.csv, data/rows.parquet. Put the file there, or pass "
        "--dataset-file PATH"
    )
