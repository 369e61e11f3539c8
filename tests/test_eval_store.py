"""The durable store of ``osmosis eval run``: journal, run dir, work items, outcomes,
projections and the run log. Real files in tmp_path, real child processes."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import stat
import subprocess
import sys
from datetime import UTC, datetime
from pathlib import Path

import pytest

import osmosis_ai.eval as eval_pkg
from osmosis_ai.errors import ConfigError, ProtocolError, UsageError
from osmosis_ai.eval import (
    REDACTED,
    DatasetLock,
    EvalRunInfo,
    Journal,
    JournalCorruptError,
    JournalRecord,
    JournalState,
    LocalErrorType,
    Projector,
    Provenance,
    Redactor,
    ResumeMismatchError,
    RolloutLock,
    RunInputs,
    RunLock,
    RunLockedError,
    RunLog,
    RunProgress,
    TimeoutsLock,
    VersionsLock,
    WorkItem,
    build_work_items,
    classify_admission_rejection,
    classify_callback_result,
    classify_polling_result,
    count_work,
    open_run,
    pending_items,
    rebuild_projections,
    replay_journal,
    rollout_source_digest,
    supervisor_error_record,
)
from osmosis_ai.eval.inputs import PROTOCOL_VERSIONS
from osmosis_ai.rollout.protocol import (
    POLLING_PROTOCOL_VERSION,
    ROLLOUT_PROTOCOL_VERSION,
    RolloutResultResponse,
)
from osmosis_ai.rollout.sample import RolloutSample

CHILD_ENV = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1] / "src")}


def mode(path: Path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def record(row: int, run: int, status: str = "success", **extra) -> JournalRecord:
    fields = {"rollout_id": f"id{row}x{run}", "duration_ms": 7, **extra}
    return JournalRecord(row_index=row, run_index=run, status=status, **fields)  # type: ignore[arg-type]


def test_public_names():
    expected = {
        "REDACTED",
        "Attempt",
        "DatasetLock",
        "EvalMetrics",
        "EvalRunInfo",
        "FailedRow",
        "IndexEntry",
        "Journal",
        "JournalCorruptError",
        "JournalRecord",
        "JournalState",
        "JournalStatus",
        "LocalErrorType",
        "Manifest",
        "PassAtK",
        "Projections",
        "Projector",
        "Provenance",
        "Redactor",
        "ResumeMismatchError",
        "RewardStats",
        "RolloutLock",
        "RunDir",
        "RunInputs",
        "RunLock",
        "RunLockedError",
        "RunLog",
        "RunProgress",
        "TimeoutsLock",
        "VersionsLock",
        "WorkCounts",
        "WorkItem",
        "WorkKey",
        "aggregate_metrics",
        "archive_run_dir",
        "atomic_write_bytes",
        "atomic_write_json",
        "build_work_items",
        "canonical_json",
        "classify_admission_rejection",
        "classify_callback_result",
        "classify_polling_result",
        "count_work",
        "load_trajectory",
        "new_rollout_id",
        "open_run",
        "pass_at_k",
        "pending_items",
        "project_artifacts",
        "rebuild_projections",
        "replay_journal",
        "rollout_source_digest",
        "supervisor_error_record",
    }
    assert set(eval_pkg.__all__) == expected
    assert all(hasattr(eval_pkg, name) for name in eval_pkg.__all__)


# --------------------------------------------------------------------------- journal


class TestJournal:
    def test_append_writes_canonical_lines_owner_only(self, tmp_path):
        path = tmp_path / "run" / "events.jsonl"
        with Journal.open(path) as journal:
            journal.append(record(0, 1, reward=1, tokens=12, source_row_index=4))
            journal.append(record(1, 0, "failed", error_type="timeout"))
        assert mode(path) == 0o600
        lines = path.read_text().splitlines()
        assert lines[0] == (
            '{"duration_ms":7,"reward":1.0,"rollout_id":"id0x1","row_index":0,"run_index":1,'
            '"source_row_index":4,"status":"success","tokens":12}'
        )
        assert json.loads(lines[1]) == {
            "duration_ms": 7,
            "error_type": "timeout",
            "rollout_id": "id1x0",
            "row_index": 1,
            "run_index": 0,
            "status": "failed",
        }

    def test_replay_latest_wins_and_ignores_unknown_keys(self, tmp_path):
        path = tmp_path / "events.jsonl"
        with Journal.open(path) as journal:
            journal.append(record(0, 0, "failed", rollout_id="first"))
            journal.append(record(1, 0))
            journal.append(record(0, 0, rollout_id="second", reward=0.5))
        with path.open("a") as handle:
            handle.write(
                '{"row_index":2,"run_index":0,"rollout_id":"x","status":"skipped",'
                '"duration_ms":1,"from_the_future":{"a":1}}\n'
            )
        state = Journal.open(path).replay()
        assert [r.rollout_id for r in state.records] == ["first", "id1x0", "second", "x"]
        assert state.latest[(0, 0)].rollout_id == "second"
        assert state.latest[(0, 0)].reward == 0.5
        assert state.latest[(2, 0)].status == "skipped"
        assert state.warnings == ()

    def test_torn_last_line_is_discarded_with_a_warning(self, tmp_path):
        path = tmp_path / "events.jsonl"
        with Journal.open(path) as journal:
            journal.append(record(0, 0))
        with path.open("ab") as handle:
            handle.write(b'{"row_index":1,"run_index":0,"rollout_')
        state = replay_journal(path)  # a read-only replay leaves the file alone
        assert list(state.latest) == [(0, 0)]
        assert len(state.warnings) == 1 and "torn last line" in state.warnings[0]
        # Opening for append cuts the torn tail so the next record starts on its own line.
        with Journal.open(path) as journal:
            journal.append(record(1, 0))
            state = journal.replay()
        assert sorted(state.latest) == [(0, 0), (1, 0)]
        assert any("torn last line" in w for w in state.warnings)
        assert path.read_bytes().count(b"\n") == 2

    def test_damaged_middle_line_is_an_error(self, tmp_path):
        path = tmp_path / "events.jsonl"
        path.write_text('{"row_index":0}\n' + '{"x":1\n')
        with pytest.raises(JournalCorruptError, match="line 1"):
            replay_journal(path)
        path.write_text(
            '{"row_index":0,"run_index":0,"rollout_id":"a","status":"won","duration_ms":1}\n'
        )
        with pytest.raises(JournalCorruptError, match="--fresh"):
            replay_journal(path)
        path.write_text('{"row_index":0,"run_index":0,"rollout_id":"a","status":["x"]}\n')
        with pytest.raises(JournalCorruptError):
            replay_journal(path)

    def test_missing_journal_is_empty(self, tmp_path):
        assert replay_journal(tmp_path / "nope.jsonl") == JournalState()

    @pytest.mark.parametrize(
        "bad",
        [
            {"reward": float("nan")},
            {"reward": float("inf")},
            {"reward": True},
            {"duration_ms": -1},
            {"tokens": 1.5},
            {"rollout_id": "a/b"},
            {"rollout_id": ""},
        ],
    )
    def test_record_rejects_bad_values(self, bad):
        with pytest.raises(UsageError):
            record(0, 0, **bad)

    def test_record_rejects_an_unknown_status(self):
        with pytest.raises(UsageError, match="status"):
            JournalRecord(0, 0, "id", "done", 1)  # type: ignore[arg-type]

    def test_sigkill_loses_nothing_that_append_returned_for(self, tmp_path):
        path = tmp_path / "events.jsonl"
        child = (
            "import sys\n"
            "from osmosis_ai.eval import Journal, JournalRecord\n"
            "journal = Journal.open(sys.argv[1])\n"
            "i = 0\n"
            "while True:\n"
            "    journal.append(JournalRecord(i, 0, f'r{i:06d}', 'success', i, reward=1.0))\n"
            "    sys.stdout.write(f'{i}\\n'); sys.stdout.flush()\n"
            "    i += 1\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", child, str(path)], stdout=subprocess.PIPE, env=CHILD_ENV
        )
        assert proc.stdout is not None
        acked: list[int] = []
        for line in proc.stdout:
            acked.append(int(line))
            if len(acked) >= 150:
                break
        os.kill(proc.pid, signal.SIGKILL)
        acked += [int(line) for line in proc.stdout.read().splitlines() if line.strip()]
        proc.wait(timeout=10)
        assert proc.returncode == -signal.SIGKILL
        state = replay_journal(path)
        found = {r.row_index for r in state.records}
        assert set(acked) <= found
        assert found == set(range(len(found)))  # nothing out of order, nothing duplicated
        with Journal.open(path) as journal:  # and the journal is usable again
            journal.append(record(len(found), 0))
        assert len(replay_journal(path).latest) == len(found) + 1


# --------------------------------------------------------------------------- run dir


def make_inputs(**changes) -> RunInputs:
    base = {
        "model_path": "openai/gpt-5-mini",
        "dataset": DatasetLock(sha256="a" * 64, selected_source_rows=(0, 3, 5)),
        "n": 2,
        "rollout": RolloutLock(name="echo", entrypoint="main.py", source_digest="b" * 64),
        "env": {"MODE": "test"},
        "secret_names": ("OPENAI_API_KEY",),
        "timeouts": TimeoutsLock(agent_timeout_sec=30.0, grader_timeout_sec=10.0),
        "versions": VersionsLock.for_generation("polling"),
    }
    return RunInputs(**{**base, **changes})


NOW = datetime(2025, 3, 4, 5, 6, 7, tzinfo=UTC)


def test_pinned_protocol_versions_are_the_wire_constants():
    # inputs.py writes them out so that planning a run does not import the wire models.
    assert PROTOCOL_VERSIONS == {
        "callback": ROLLOUT_PROTOCOL_VERSION,
        "polling": POLLING_PROTOCOL_VERSION,
    }
    assert VersionsLock.for_generation("callback").rollout_protocol == ROLLOUT_PROTOCOL_VERSION


class TestRunDir:
    def test_create_then_resume(self, tmp_path):
        inputs = make_inputs()
        with open_run(
            tmp_path, "demo", inputs, Provenance(git_head="abc"), fresh=False, now=NOW
        ) as run:
            assert not run.resumed
            first_id = run.local_run_id
            manifest = json.loads((run.path / "manifest.json").read_text())
        assert re.fullmatch(r"[0-9a-f]{32}", first_id)
        assert manifest["schema_version"] == 1
        assert manifest["run_name"] == "demo"
        assert manifest["created_at"] == "2025-03-04T05:06:07.000Z"
        assert manifest["inputs"]["versions"] == {
            "rollout_protocol": "0.4",
            "dataset_normalization": 1,
            "state_schema": 1,
        }
        assert manifest["inputs"]["dataset"] == {
            "sha256": "a" * 64,
            "selected_source_rows": [0, 3, 5],
        }
        assert manifest["provenance"]["git_head"] == "abc"
        assert mode(tmp_path / "demo" / "manifest.json") == 0o600
        # Reordered secret names are the same lock.
        again = make_inputs(secret_names=("OPENAI_API_KEY", "OPENAI_API_KEY"))
        with open_run(tmp_path, "demo", again, Provenance(git_head="zzz"), fresh=False) as run:
            assert run.resumed and run.local_run_id == first_id
            assert run.journal_path == tmp_path / "demo" / "events.jsonl"
            assert run.trial_dir("abc") == tmp_path / "demo" / "rollout_trials" / "abc"

    def test_changed_inputs_are_refused_naming_the_keys(self, tmp_path):
        open_run(tmp_path, "demo", make_inputs(), Provenance(), fresh=False).close()
        changed = make_inputs(
            n=4,
            dataset=DatasetLock(sha256="c" * 64, selected_source_rows=(0, 3, 5)),
            versions=VersionsLock.for_generation("callback"),
        )
        with pytest.raises(ResumeMismatchError) as info:
            open_run(tmp_path, "demo", changed, Provenance(), fresh=False)
        assert info.value.changed_keys == ("dataset", "n", "versions")
        message = str(info.value)
        assert "dataset, n, versions" in message and "--fresh" in message
        assert isinstance(info.value, ConfigError)
        # The refusal released the lock.
        RunLock.acquire(tmp_path, "demo").release()

    def test_fresh_archives_instead_of_deleting(self, tmp_path):
        with open_run(tmp_path, "demo", make_inputs(), Provenance(), fresh=False) as run:
            (run.path / "events.jsonl").write_text("keep me\n")
            old_id = run.local_run_id
        with open_run(tmp_path, "demo", make_inputs(n=3), Provenance(), fresh=True, now=NOW) as run:
            assert not run.resumed and run.local_run_id != old_id
            assert run.archived_to == tmp_path / "demo.archive-20250304T050607Z"
        with open_run(tmp_path, "demo", make_inputs(n=3), Provenance(), fresh=True, now=NOW) as run:
            assert run.archived_to == tmp_path / "demo.archive-20250304T050607Z-1"
        archived = tmp_path / "demo.archive-20250304T050607Z"
        assert (archived / "events.jsonl").read_text() == "keep me\n"
        assert json.loads((archived / "manifest.json").read_text())["local_run_id"] == old_id

    def test_fresh_on_a_new_name_just_creates(self, tmp_path):
        with open_run(tmp_path, "new", make_inputs(), Provenance(), fresh=True) as run:
            assert run.archived_to is None and not run.resumed

    def test_foreign_folder_is_not_resumed(self, tmp_path):
        (tmp_path / "demo").mkdir()
        (tmp_path / "demo" / "notes.txt").write_text("mine")
        with pytest.raises(ConfigError, match=r"no manifest\.json"):
            open_run(tmp_path, "demo", make_inputs(), Provenance(), fresh=False)
        (tmp_path / "empty").mkdir()  # a crash before the manifest: reused
        open_run(tmp_path, "empty", make_inputs(), Provenance(), fresh=False).close()

    @pytest.mark.parametrize("name", ["", ".locks", "../x", "a/b", ".hidden"])
    def test_run_name_must_be_one_safe_segment(self, tmp_path, name):
        with pytest.raises(UsageError):
            open_run(tmp_path, name, make_inputs(), Provenance(), fresh=False)

    def test_run_lock_contention_with_another_process(self, tmp_path):
        child = (
            "import sys\n"
            "from osmosis_ai.eval import RunLock\n"
            "lock = RunLock.acquire(sys.argv[1], 'demo')\n"
            "print('locked', flush=True)\n"
            "sys.stdin.readline()\n"
            "lock.release()\n"
        )
        proc = subprocess.Popen(
            [sys.executable, "-c", child, str(tmp_path)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
            env=CHILD_ENV,
        )
        assert proc.stdin is not None and proc.stdout is not None
        try:
            assert proc.stdout.readline().strip() == "locked"
            with pytest.raises(RunLockedError) as info:
                open_run(tmp_path, "demo", make_inputs(), Provenance(), fresh=False)
            assert info.value.holder_pid == proc.pid
            assert "'demo'" in str(info.value)
            assert "another `osmosis eval run`" in str(info.value)
            assert info.value.lock_path == tmp_path / ".locks" / "demo.lock"
        finally:
            proc.stdin.write("\n")
            proc.stdin.flush()
            proc.wait(timeout=10)
        with open_run(tmp_path, "demo", make_inputs(), Provenance(), fresh=False) as run:
            assert run.lock.held
            with pytest.raises(RunLockedError):  # one process, two holders: refused too
                RunLock.acquire(tmp_path, "demo")
        RunLock.acquire(tmp_path, "demo").release()


def test_rollout_source_digest_ignores_environment_files(tmp_path):
    root = tmp_path / "rollouts" / "echo"
    (root / "pkg").mkdir(parents=True)
    (root / "main.py").write_text("print('hi')\n")
    (root / "pkg" / "util.py").write_text("X = 1\n")
    before = rollout_source_digest(root)
    for noise in (
        ".venv/lib/site.py",
        "__pycache__/main.pyc",
        "demo.egg-info/PKG-INFO",
        "pkg/__pycache__/util.pyc",
        "out/evals/run/events.jsonl",
    ):
        (root / noise).parent.mkdir(parents=True, exist_ok=True)
        (root / noise).write_text("noise")
    (root / "uv.lock").write_text("lock")
    assert rollout_source_digest(root, exclude_dirs=[root / "out"]) == before
    assert rollout_source_digest(root) != before  # the output dir counts unless excluded
    (root / "pkg" / "util.py").write_text("X = 2\n")
    assert rollout_source_digest(root, exclude_dirs=[root / "out"]) != before
    (root / "pkg" / "util.py").write_text("X = 1\n")
    (root / "pkg" / "util.py").rename(root / "pkg" / "other.py")
    assert rollout_source_digest(root, exclude_dirs=[root / "out"]) != before


# --------------------------------------------------------------------------- work items


def test_work_items_and_pending(tmp_path):
    items = build_work_items([7, 2], n=2)
    assert items == [WorkItem(0, 0, 7), WorkItem(0, 1, 7), WorkItem(1, 0, 2), WorkItem(1, 1, 2)]
    path = tmp_path / "events.jsonl"
    with Journal.open(path) as journal:
        journal.append(record(0, 0))
        journal.append(record(0, 1, "failed", error_type="timeout"))
        journal.append(record(1, 0, "skipped"))
    state = replay_journal(path)
    assert pending_items(items, state, retry_failed=False) == [WorkItem(1, 1, 2)]
    assert pending_items(items, state, retry_failed=True) == items[1:]
    counts = count_work(items, state)
    assert (counts.total, counts.succeeded, counts.failed, counts.skipped) == (4, 1, 1, 1)
    assert counts.pending == 1
    first, second = items[1].new_attempt(), items[1].new_attempt()
    assert first.rollout_id != second.rollout_id and re.fullmatch(r"[0-9a-f]{32}", first.rollout_id)
    with pytest.raises(UsageError):
        build_work_items([1, 1], n=1)
    with pytest.raises(UsageError):
        build_work_items([1], n=0)


# --------------------------------------------------------------------------- outcomes

ATTEMPT = WorkItem(row_index=3, run_index=1, source_row_index=9).new_attempt()
RID = ATTEMPT.rollout_id


def result(status, sample=None, err_message=None, err_category=None):
    return {
        "rollout_id": RID,
        "status": status,
        "sample": sample,
        "err_message": err_message,
        "err_category": err_category,
    }


# protocol-0.3.8 §4.3, row by row: (body, expected (status, reward, error_type) or None)
POLLING_TABLE = [
    pytest.param(
        result("success", {"reward": None, "remove_sample": True}),
        ("skipped", None, None),
        id="removed-skipped",
    ),
    pytest.param(
        result("success", {"reward": 0.0, "remove_sample": False}),
        ("success", 0.0, None),
        id="success-reward",
    ),
    pytest.param(
        result("success", {"reward": None, "remove_sample": False}),
        ("success", None, None),
        id="success-no-reward",
    ),
    pytest.param(
        result("failure", None, "boom", "validation_error"),
        ("failed", None, "validation_error"),
        id="failure-category",
    ),
    pytest.param(
        result("failure", None, "lease gone", None),
        ("failed", None, "lease gone"),
        id="failure-message",
    ),
    pytest.param(result("failure"), ("failed", None, "rollout_failed"), id="failure-bare"),
    pytest.param(
        result("failure", {"reward": 0.25}, None, "timeout"),
        ("failed", 0.25, "timeout"),
        id="failure-keeps-reward",
    ),
    pytest.param(result("cancelled"), None, id="cancelled-no-record"),
]


@pytest.mark.parametrize(("body", "expected"), POLLING_TABLE)
def test_polling_outcome_table(body, expected):
    got = classify_polling_result(ATTEMPT, body, duration_ms=1234.4, tokens=50)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.status, got.reward, got.error_type) == expected
    assert (got.row_index, got.run_index, got.source_row_index) == (3, 1, 9)
    assert (got.rollout_id, got.duration_ms, got.tokens) == (RID, 1234, 50)


def test_polling_accepts_the_wire_model():
    body = RolloutResultResponse(rollout_id=RID, status="success", sample=RolloutSample(reward=1.0))  # type: ignore[arg-type]
    got = classify_polling_result(ATTEMPT, body, duration_ms=5)
    assert got is not None and (got.status, got.reward) == ("success", 1.0)
    with pytest.raises(ProtocolError):
        classify_polling_result(ATTEMPT, result("running"), duration_ms=5)
    with pytest.raises(ProtocolError):
        classify_polling_result(
            ATTEMPT, {**result("success"), "rollout_id": "other"}, duration_ms=5
        )


def completion(status, err_category=None):
    return {
        "status": status,
        "rollout_id": RID,
        "extra_fields": None,
        "err_message": None,
        "err_category": err_category,
    }


def grader(status, sample=None, err_category=None):
    return {
        "status": status,
        "rollout_id": RID,
        "sample": sample,
        "err_message": None,
        "err_category": err_category,
    }


OK_SAMPLE = {"reward": 0.75, "remove_sample": False}

# reference §5.3, row by row: (completion, grader, deadline_exceeded, expected)
CALLBACK_TABLE = [
    pytest.param(
        completion("success"), None, True, ("failed", None, "callback_timeout"), id="deadline"
    ),
    pytest.param(
        completion("success"),
        None,
        False,
        ("failed", None, "missing_grader_callback"),
        id="no-grader",
    ),
    pytest.param(
        completion("failure", "agent_error"),
        grader("failure", None, "agent_error"),
        False,
        ("failed", None, "agent_error"),
        id="grader-failure-category",
    ),
    pytest.param(
        completion("success"),
        grader("failure"),
        False,
        ("failed", None, "grader_failed"),
        id="grader-failure-bare",
    ),
    pytest.param(
        completion("success"),
        grader("success", {"reward": None, "remove_sample": True}),
        False,
        ("skipped", None, None),
        id="removed-skipped",
    ),
    pytest.param(
        completion("failure", "timeout"),
        grader("success", OK_SAMPLE),
        False,
        ("failed", 0.75, "timeout"),
        id="completion-failure-category",
    ),
    pytest.param(
        completion("failure"),
        grader("success", OK_SAMPLE),
        False,
        ("failed", 0.75, "workflow_failed"),
        id="completion-failure-bare",
    ),
    pytest.param(
        None,
        grader("success", OK_SAMPLE),
        False,
        ("failed", 0.75, "workflow_failed"),
        id="completion-missing",
    ),
    pytest.param(
        completion("success"),
        grader("success", OK_SAMPLE),
        False,
        ("success", 0.75, None),
        id="success",
    ),
    pytest.param(completion("cancelled"), grader("failure"), False, None, id="cancelled-no-record"),
]


@pytest.mark.parametrize(("done", "graded", "deadline", "expected"), CALLBACK_TABLE)
def test_callback_outcome_table(done, graded, deadline, expected):
    got = classify_callback_result(ATTEMPT, done, graded, duration_ms=9, deadline_exceeded=deadline)
    if expected is None:
        assert got is None
        return
    assert got is not None
    assert (got.status, got.reward, got.error_type) == expected
    assert (got.rollout_id, got.row_index, got.run_index, got.duration_ms) == (RID, 3, 1, 9)


@pytest.mark.parametrize(
    ("status_code", "expected"),
    [
        (400, "rollout_protocol_error"),
        (409, "rollout_protocol_error"),
        (422, "rollout_protocol_error"),
        (429, None),
        (500, None),
        (503, None),
    ],
)
def test_admission_rejections(status_code, expected):
    got = classify_admission_rejection(ATTEMPT, status_code, duration_ms=3)
    if expected is None:
        assert got is None  # process-wide fault: dispatch halts, the item stays pending
    else:
        assert got is not None and (got.status, got.error_type) == ("failed", expected)


def test_supervisor_error_record():
    got = supervisor_error_record(ATTEMPT, duration_ms=-5)
    assert (got.status, got.error_type, got.duration_ms) == (
        "failed",
        LocalErrorType.SUPERVISOR_ERROR,
        0,
    )


# --------------------------------------------------------------------------- projections

RUN_INFO = EvalRunInfo(
    id="f" * 32,
    status="finished",
    name="demo",
    dataset_name="data.jsonl",
    model_name="openai/gpt-5-mini",
    rollout_name="echo",
    duration_ms=1000,
    started_at="2025-03-04T05:06:07.000Z",
    completed_at="2025-03-04T05:06:08.000Z",
)
PROGRESS = RunProgress(total_runs=4, sampled_rows=2, total_dataset_rows=10)


def write_trial(
    run_dir: Path,
    rollout_id: str,
    *,
    session_id: str | None = None,
    artifacts: dict[str, str] | None = None,
) -> None:
    trial = run_dir / "rollout_trials" / rollout_id
    trial.mkdir(parents=True)
    document = {
        "schema_version": "ATIF-v1.7",
        "session_id": session_id or rollout_id,
        "trajectory_id": rollout_id,
        "steps": [],
        "final_metrics": {
            "total_prompt_tokens": 30,
            "total_completion_tokens": 12,
            "total_steps": 1,
        },
    }
    (trial / "trajectory.json").write_text(json.dumps(document, indent=2) + "\n")
    for name, text in (artifacts or {}).items():
        (trial / "artifacts" / name).parent.mkdir(parents=True, exist_ok=True)
        (trial / "artifacts" / name).write_text(text)


def snapshot(run_dir: Path) -> dict[str, bytes]:
    names = ["index.jsonl", "summary.jsonl", "progress.json", "metrics.json"]
    files = {n: (run_dir / n).read_bytes() for n in names}
    for folder in ("trajectories", "artifacts"):
        for path in sorted((run_dir / folder).rglob("*")):
            if path.is_file():
                files[str(path.relative_to(run_dir))] = path.read_bytes()
    return files


def refresh(target, state, resumed=()):
    kwargs = dict(
        run=RUN_INFO, progress=PROGRESS, pass_threshold=0.5, n_runs=2, resumed_ids=resumed
    )
    if isinstance(target, Projector):
        return target.refresh(state, **kwargs)
    return rebuild_projections(target, state, **kwargs)


class TestProjections:
    def build(self, tmp_path) -> tuple[Path, Path]:
        run_dir = tmp_path / "demo"
        outside = tmp_path / "secret.txt"
        outside.write_text("host file")
        write_trial(run_dir, "good", artifacts={"answer.txt": "42", "sub/deep.txt": "d"})
        os.symlink(outside, run_dir / "rollout_trials" / "good" / "artifacts" / "leak.txt")
        os.symlink(tmp_path, run_dir / "rollout_trials" / "good" / "artifacts" / "leakdir")
        os.mkfifo(run_dir / "rollout_trials" / "good" / "artifacts" / "pipe")
        write_trial(run_dir, "mismatch", session_id="someone-else")
        write_trial(run_dir, "skip", artifacts={"a.txt": "s"})
        journal_path = run_dir / "events.jsonl"
        with Journal.open(journal_path) as journal:
            journal.append(record(0, 0, rollout_id="good", reward=1.0, source_row_index=7))
            journal.append(
                record(0, 1, "failed", rollout_id="bad", error_type="timeout", source_row_index=7)
            )
            journal.append(record(1, 0, "skipped", rollout_id="skip", source_row_index=2))
            journal.append(
                record(1, 1, rollout_id="mismatch", reward=0.0, tokens=5, source_row_index=2)
            )
        return run_dir, journal_path

    def test_rebuilt_byte_identically_from_the_same_journal(self, tmp_path):
        run_dir, journal_path = self.build(tmp_path)
        state = replay_journal(journal_path)
        first = refresh(run_dir, state)
        before = snapshot(run_dir)
        refresh(run_dir, state)
        assert snapshot(run_dir) == before
        for name in ("index.jsonl", "summary.jsonl", "metrics.json", "trajectories", "artifacts"):
            target = run_dir / name
            if target.is_dir():
                shutil.rmtree(target)
            else:
                target.unlink()
        again = refresh(run_dir, state)
        assert snapshot(run_dir) == before
        assert again == first

    def test_index_metrics_trajectories_and_failed_rows(self, tmp_path):
        run_dir, journal_path = self.build(tmp_path)
        result = refresh(run_dir, replay_journal(journal_path), resumed={"good"})
        index = (run_dir / "index.jsonl").read_bytes()
        assert (run_dir / "summary.jsonl").read_bytes() == index
        rows = [json.loads(line) for line in index.splitlines()]
        assert rows == [
            {
                "row_index": 0,
                "run_index": 0,
                "rollout_id": "good",
                "trajectory_filename": "trajectory.json",
                "status": "success",
                "reward": 1.0,
                "tokens": 42,
                "duration_ms": 7,
                "resumed": True,
            },
            {
                "row_index": 0,
                "run_index": 1,
                "rollout_id": "bad",
                "status": "failed",
                "duration_ms": 7,
                "error_type": "timeout",
            },
            {
                "row_index": 1,
                "run_index": 0,
                "rollout_id": "skip",
                "trajectory_filename": "trajectory.json",
                "status": "skipped",
                "tokens": 42,
                "duration_ms": 7,
            },
            {
                "row_index": 1,
                "run_index": 1,
                "rollout_id": "mismatch",
                "status": "success",
                "reward": 0.0,
                "tokens": 5,
                "duration_ms": 7,
            },
        ]
        # Trajectory copies only where the ATIF identity matches the rollout id.
        trials = run_dir / "rollout_trials"
        assert (run_dir / "trajectories" / "row_0_run_0.json").read_bytes() == (
            trials / "good" / "trajectory.json"
        ).read_bytes()
        assert (run_dir / "trajectories" / "row_1_run_0.json").exists()
        assert not (run_dir / "trajectories" / "row_1_run_1.json").exists()
        # Artifacts: regular files and folders; no symlink, no FIFO, never followed.
        copied = sorted(
            p.relative_to(run_dir / "artifacts").as_posix()
            for p in (run_dir / "artifacts").rglob("*")
        )
        assert copied == [
            "row_0_run_0",
            "row_0_run_0/answer.txt",
            "row_0_run_0/sub",
            "row_0_run_0/sub/deep.txt",
            "row_1_run_0",
            "row_1_run_0/a.txt",
        ]
        assert (run_dir / "artifacts" / "row_0_run_0" / "answer.txt").read_text() == "42"
        assert json.loads((run_dir / "progress.json").read_text()) == {
            "total_runs": 4,
            "sampled_rows": 2,
            "total_dataset_rows": 10,
        }
        metrics = json.loads((run_dir / "metrics.json").read_text())
        assert metrics["eval_run"]["id"] == "f" * 32 and metrics["eval_run"]["status"] == "finished"
        assert metrics["summary"] == result.metrics.to_json()
        assert metrics["summary"]["tokens_used"] == 89
        assert (metrics["summary"]["completed_samples"], metrics["summary"]["passed"]) == (3, 1)
        assert [f.rollout_id for f in result.failed_rows] == ["bad"]
        failed = result.failed_rows[0]
        assert (failed.row_index, failed.source_row_index, failed.run_index, failed.error_type) == (
            0,
            7,
            1,
            "timeout",
        )
        assert failed.rollout_dir == str(trials / "bad")
        assert mode(run_dir / "index.jsonl") == 0o600

    def test_retry_supersedes_and_clears_the_old_projection(self, tmp_path):
        run_dir, journal_path = self.build(tmp_path)
        projector = Projector(run_dir)
        refresh(projector, replay_journal(journal_path))
        assert (run_dir / "trajectories" / "row_1_run_0.json").exists()
        # --retry-failed: the skipped item runs again and fails without a trajectory; the
        # failed item runs again and succeeds with one.
        write_trial(run_dir, "retry-ok", artifacts={"new.txt": "n"})
        with Journal.open(journal_path) as journal:
            journal.append(record(1, 0, "failed", rollout_id="retry-bad", error_type="agent_error"))
            journal.append(record(0, 1, rollout_id="retry-ok", reward=1.0))
        state = replay_journal(journal_path)
        result = refresh(projector, state)
        assert not (run_dir / "trajectories" / "row_1_run_0.json").exists()
        assert not (run_dir / "artifacts" / "row_1_run_0").exists()
        assert (run_dir / "artifacts" / "row_0_run_1" / "new.txt").read_text() == "n"
        assert [e.rollout_id for e in result.entries] == [
            "good",
            "retry-ok",
            "retry-bad",
            "mismatch",
        ]
        # Superseded attempts stay on disk, unindexed.
        assert (run_dir / "rollout_trials" / "skip" / "trajectory.json").exists()
        incremental = snapshot(run_dir)
        refresh(run_dir, state)  # a from-scratch rebuild agrees with the incremental one
        assert snapshot(run_dir) == incremental

    def test_late_trajectory_is_picked_up(self, tmp_path):
        run_dir = tmp_path / "demo"
        with Journal.open(run_dir / "events.jsonl") as journal:
            journal.append(record(0, 0, rollout_id="late", reward=1.0))
        projector = Projector(run_dir)
        state = replay_journal(run_dir / "events.jsonl")
        assert refresh(projector, state).entries[0].trajectory_filename is None
        write_trial(run_dir, "late")
        assert refresh(projector, state).entries[0].trajectory_filename == "trajectory.json"
        assert (run_dir / "trajectories" / "row_0_run_0.json").exists()


# --------------------------------------------------------------------------- run log


class TestRunLog:
    def test_lines_are_formatted_redacted_and_owner_only(self, tmp_path):
        redactor = Redactor(["sk-live-123456", "tok"])
        redactor.add(
            "", "sk-live-123456-extended", "-----BEGIN KEY-----\nMIIsecret\n-----END KEY-----"
        )
        path = tmp_path / "logs.txt"
        clock = lambda: datetime(2025, 1, 2, 3, 4, 5, 678000, tzinfo=UTC)  # noqa: E731
        with RunLog(path, redactor, clock=clock) as run_log:
            run_log.info(
                "preflight",
                "using key sk-live-123456-extended and tok",
                {"headers": {"Authorization": "Bearer sk-live-123456"}, "tok": ["tok", 1, None]},
            )
            run_log.warning("server", "two\nlines")
            run_log.output(
                "rollout-server", "boot\n\n-----BEGIN KEY-----\nMIIsecret\n-----END KEY-----\nready"
            )
            run_log.error("run", "nan in details", {"x": float("nan")})
        assert mode(path) == 0o600
        lines = path.read_text().splitlines()
        assert lines[0] == (
            "2025-01-02T03:04:05.678Z INFO [preflight] using key [REDACTED] and [REDACTED] "
            '{"[REDACTED]":["[REDACTED]",1,null],"headers":{"Authorization":"Bearer [REDACTED]"}}'
        )
        assert lines[1] == "2025-01-02T03:04:05.678Z WARNING [server] two\\nlines {}"
        assert [line.split(" ", 3)[3] for line in lines[2:5]] == [
            "boot {}",
            "[REDACTED] {}",
            "ready {}",
        ]
        assert lines[5] == '2025-01-02T03:04:05.678Z ERROR [run] nan in details {"x":"nan"}'
        assert len(lines) == 6
        assert "sk-live" not in path.read_text() and "MIIsecret" not in path.read_text()

    def test_redactor(self):
        redactor = Redactor()
        assert redactor.redact("anything") == "anything"
        redactor.add("abc", "abcdef", "x")
        assert redactor.redact("abcdef abc xyz") == f"{REDACTED} {REDACTED} {REDACTED}yz"
        assert len(redactor) == 3
        assert REDACTED == "[REDACTED]"
