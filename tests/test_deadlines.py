"""Every stall ends as a named error: one test per stage of the Deadlines table in
docs/architecture.md, each with real processes and its deadline set short through the
setting that changes it.

Each test measures the time from the start of the wait to the named error and prints it
(``pytest -s`` shows the figures); the guarantee is twice the deadline, which the suite
does not assert as a timing bound (a loaded machine stretches it), only the error.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
import textwrap
import threading
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import pytest

from cli_support import invoke
from osmosis_ai.deadlines import (
    DATASET_PROCESSING,
    ENVIRONMENT_BUILD,
    MODEL_CALL,
    ROLLOUT_IO,
    RUN_HEARTBEAT,
    Deadline,
)
from osmosis_ai.errors import ConfigError, DeadlineError
from osmosis_ai.testing.model_server import ScriptedModelServer
from test_eval_run_cli import CONFIG, enter_workspace


def report(stage: str, deadline_s: float, elapsed_s: float) -> None:
    print(f"\n[deadline] {stage}: deadline {deadline_s:g}s, named error after {elapsed_s:.2f}s")


@contextlib.contextmanager
def silent_server() -> Generator[str]:
    """A TCP server on 127.0.0.1 that accepts every connection and never answers; yields
    its ``http://`` base URL."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        listener.settimeout(0.1)
        while not stop.is_set():
            with contextlib.suppress(TimeoutError, OSError):
                held.append(listener.accept()[0])  # held open, never read or answered

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{listener.getsockname()[1]}/v1"
    finally:
        stop.set()
        thread.join(timeout=5)
        for connection in held:
            connection.close()
        listener.close()


@pytest.fixture
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    return enter_workspace(tmp_path, monkeypatch, rows=4)


def eval_run(capsys: Any, *args: str) -> Any:
    return invoke(capsys, "eval", "run", *args, "-y", "--json")


def add_rollout(ws: Path, name: str, source: str, evaluation: str = "") -> str:
    folder = ws / "rollouts" / name
    folder.mkdir()
    (folder / "main.py").write_text(textwrap.dedent(source))
    config = ws / "configs" / "eval" / f"{name}.toml"
    config.write_text(CONFIG.format(rollout=name, evaluation=evaluation))
    return f"configs/eval/{name}.toml"


# -- the settings ---------------------------------------------------------------------------


def test_a_deadline_setting_that_is_not_seconds_is_refused_naming_the_value():
    stage = Deadline("test stage", "OSMOSIS_TEST_DEADLINE_S", 5.0, floor_s=1.0)
    assert stage.seconds({}) == 5.0
    assert stage.seconds({"OSMOSIS_TEST_DEADLINE_S": " 2.5 "}) == 2.5
    for bad in ("soon", "0.5", "-1", "inf", "nan"):
        with pytest.raises(ConfigError, match=f"OSMOSIS_TEST_DEADLINE_S='{bad}'") as caught:
            stage.seconds({"OSMOSIS_TEST_DEADLINE_S": bad})
        assert "above 1" in str(caught.value) and "default is 5" in str(caught.value)


def test_the_cli_reports_a_stall_with_its_stage_deadline_and_setting():
    from osmosis_ai.cli.errors import to_cli_error
    from osmosis_ai.controller.rollout_process import EnvironmentBuildTimeoutError

    stall = ENVIRONMENT_BUILD.error(EnvironmentBuildTimeoutError, "uv sync did not finish", 2.0)
    error = to_cli_error(stall)
    assert error.details == {
        "exception_type": "EnvironmentBuildTimeoutError",
        "stage": "environment build",
        "deadline_s": 2.0,
        "setting": ENVIRONMENT_BUILD.setting,
    }
    assert str(stall) == (
        "uv sync did not finish: the environment build deadline is 2s "
        f"(set {ENVIRONMENT_BUILD.setting} to change it)"
    )


# -- model call -----------------------------------------------------------------------------


def test_a_model_endpoint_that_never_answers_ends_the_eval_with_upstream_timeout(
    ws: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    deadline = 1.5
    with silent_server() as url:
        monkeypatch.setenv("OPENAI_BASE_URL", url)
        monkeypatch.setenv(MODEL_CALL.setting, str(deadline))
        started = time.monotonic()
        outcome = eval_run(capsys, "configs/eval/multiply.toml", "--name", "silent")
        elapsed = time.monotonic() - started
    logs = (ws / ".osmosis" / "evals" / "silent" / "logs.txt").read_text()
    checking = _logged_at(logs, "checking model")
    report(
        "model call (eval preflight)", deadline, _logged_at(logs, "UpstreamTimeoutError") - checking
    )
    print(f"[deadline] whole eval run, start-up and teardown included: {elapsed:.2f}s")
    assert outcome.code == 1, (outcome.out, outcome.err)
    error = outcome.error()["error"]
    assert error["code"] == "NETWORK", error
    assert error["details"]["exception_type"] == "UpstreamTimeoutError"
    assert f"the model call deadline is {deadline:g}s" in error["message"]
    assert MODEL_CALL.setting in error["message"]


async def test_the_policy_proxy_answers_a_silent_upstream_with_the_named_timeout():
    from osmosis_ai.controller.errors import UpstreamTimeoutError
    from osmosis_ai.controller.upstreams import upstream_from_model_path

    deadline = 0.5
    with silent_server() as url:
        env = {"OPENAI_BASE_URL": url, MODEL_CALL.setting: str(deadline)}
        upstream = upstream_from_model_path("openai/silent", env)
        started = time.monotonic()
        try:
            with pytest.raises(UpstreamTimeoutError) as caught:
                await upstream.complete({"messages": [{"role": "user", "content": "hi"}]})
        finally:
            await upstream.aclose()
        elapsed = time.monotonic() - started
    report("model call (one completion)", deadline, elapsed)
    error = caught.value
    assert isinstance(error, DeadlineError)
    assert (error.stage, error.deadline_s, error.setting) == ("model call", 0.5, MODEL_CALL.setting)


# -- rollout dispatch and result -------------------------------------------------------------

STUCK_SERVER = '''
"""Admits every rollout, then its workflow blocks the server's event loop: no result, no
poll answered, its own deadlines never fire."""
import time

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


class Stuck(AgentWorkflow):
    async def run(self, ctx):
        time.sleep(120)
        return AgentWorkflowOutput(messages=list(ctx.prompt))


class One(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


app = create_rollout_server(backend=LocalBackend(workflow=Stuck, grader=One))

if __name__ == "__main__":
    run_rollout_server(app, log_level="warning")
'''


def test_a_rollout_server_that_admits_and_never_completes_halts_the_eval_at_its_deadline(
    ws: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    config = add_rollout(
        ws, "stuck", STUCK_SERVER, "agent_workflow_timeout_s = 1\ngrader_timeout_s = 1"
    )
    deadline = 1 + 1 + 1  # agent + grader + a grace of half their sum
    with ScriptedModelServer() as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        started = time.monotonic()
        outcome = eval_run(capsys, config, "--name", "stuck", "--max-in-flight", "1")
        elapsed = time.monotonic() - started
    logs = (ws / ".osmosis" / "evals" / "stuck" / "logs.txt").read_text()
    dispatched = _logged_at(logs, "first rollout dispatched")
    halted = _logged_at(logs, "dispatch halted")
    report("rollout dispatch and result (eval)", deadline, halted - dispatched)
    print(f"[deadline] whole eval run, start-up and teardown included: {elapsed:.2f}s")
    assert outcome.code == 1, (outcome.out, outcome.err)
    result = outcome.json()
    resource = result["resource"]
    assert result["status"] == "partial" and "dispatch halted" in result["message"]
    assert (resource["dispatched"], resource["succeeded"], resource["failed"]) == (1, 0, 0)
    warning = outcome.stderr_lines()[0]["warning"]
    assert warning["code"] == "DISPATCH_HALTED"
    assert f"did not finish within its {deadline}s deadline" in warning["message"]
    assert "agent_workflow_timeout_s" in warning["message"]
    assert "did not finish within its" in logs


def _logged_at(logs: str, message: str) -> float:
    """When ``logs.txt`` says ``message`` (seconds since the epoch, from its timestamp)."""
    from datetime import datetime

    for line in logs.splitlines():
        if message in line:
            stamp = line.split(" ", 1)[0]
            return datetime.fromisoformat(stamp.replace("Z", "+00:00")).timestamp()
    raise AssertionError(f"{message!r} not in logs.txt:\n{logs}")


# -- grader ---------------------------------------------------------------------------------

HANGING_GRADER = '''
"""The workflow returns at once; the grader never returns."""
import asyncio

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


class Echo(AgentWorkflow):
    async def run(self, ctx):
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "6"}])


class Forever(Grader):
    async def grade(self, ctx):
        await asyncio.Event().wait()


app = create_rollout_server(backend=LocalBackend(workflow=Echo, grader=Forever))

if __name__ == "__main__":
    run_rollout_server(app, log_level="warning")
'''


def test_a_grader_that_never_returns_fails_each_item_with_a_timeout(
    ws: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch
):
    deadline = 1.0
    config = add_rollout(
        ws, "hang", HANGING_GRADER, f"agent_workflow_timeout_s = 5\ngrader_timeout_s = {deadline}"
    )
    with ScriptedModelServer() as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        outcome = eval_run(capsys, config, "--name", "hang")
    run_dir = ws / ".osmosis" / "evals" / "hang"
    records = [_json(line) for line in (run_dir / "events.jsonl").read_text().splitlines()]
    for record in records:
        report("grader", deadline, record["duration_ms"] / 1000)
    assert outcome.code == 0, (outcome.out, outcome.err)
    resource = outcome.json()["resource"]
    assert (resource["failed"], resource["succeeded"], resource["total_work_items"]) == (4, 0, 4)
    assert [r["status"] for r in records] == ["failed"] * 4
    assert {r["error_type"] for r in records} == {"timeout"}
    logs = (run_dir / "logs.txt").read_text()
    assert logs.count('"error_type":"timeout"') == 4  # the run's log names it per item


def _json(line: str) -> dict[str, Any]:
    import json

    return json.loads(line)


# -- environment build ----------------------------------------------------------------------


def test_an_environment_build_that_never_finishes_ends_as_environment_build_timeout(
    ws: Path, capsys: Any, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    folder = ws / "rollouts" / "needy"
    folder.mkdir()
    (folder / "main.py").write_text("print('never started')\n")
    (folder / "pyproject.toml").write_text(
        '[project]\nname = "needy"\nversion = "0"\ndependencies = ["osmosis-absent-dep==1"]\n'
    )
    (ws / "configs" / "eval" / "needy.toml").write_text(
        CONFIG.format(rollout="needy", evaluation="")
    )
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    uv = bin_dir / "uv"  # a build that never finishes
    uv.write_text("#!/bin/sh\necho resolving\nexec sleep 300\n")
    uv.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    deadline = 1.5
    monkeypatch.setenv(ENVIRONMENT_BUILD.setting, str(deadline))
    with ScriptedModelServer() as model:
        monkeypatch.setenv("OPENAI_BASE_URL", model.base_url)
        started = time.monotonic()
        outcome = eval_run(capsys, "configs/eval/needy.toml", "--name", "needy")
        elapsed = time.monotonic() - started
    logs = (ws / ".osmosis" / "evals" / "needy" / "logs.txt").read_text()
    syncing = _logged_at(logs, "syncing rollout dependencies")
    report(
        "environment build (eval)",
        deadline,
        _logged_at(logs, "EnvironmentBuildTimeoutError") - syncing,
    )
    print(f"[deadline] whole eval run, start-up and teardown included: {elapsed:.2f}s")
    assert outcome.code == 1, (outcome.out, outcome.err)
    error = outcome.error()["error"]
    assert error["details"]["exception_type"] == "EnvironmentBuildTimeoutError"
    assert "uv sync of rollouts/needy did not finish" in error["message"]
    assert f"the environment build deadline is {deadline:g}s" in error["message"]
    assert ENVIRONMENT_BUILD.setting in error["message"]


# -- trainer step: the rollout I/O process ---------------------------------------------------

QUICK_ROLLOUT = """
import asyncio

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


class Quick(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep(0.2)
        return AgentWorkflowOutput(messages=[*ctx.prompt, {"role": "assistant", "content": "ok"}])


class One(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


app = create_rollout_server(
    backend=LocalBackend(workflow=Quick, grader=One), configure_logging=False,
    save_trajectories=False,
)

if __name__ == "__main__":
    run_rollout_server(app, log_level="warning")
"""


def test_a_rollout_io_process_that_stops_answering_ends_the_step_with_a_named_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    from osmosis_ai.controller.dispatch import DispatchRequest
    from osmosis_ai.rollout.status import RolloutStatus
    from osmosis_ai.train.bridge import RolloutBridge, RolloutIOStalledError, TrainingUpstream

    deadline = 2.0
    monkeypatch.setenv(ROLLOUT_IO.setting, str(deadline))
    rollout = tmp_path / "rollouts" / "quick"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(textwrap.dedent(QUICK_ROLLOUT))
    bridge = RolloutBridge(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "artifacts",
        upstream=TrainingUpstream(temperature=1.0, top_p=1.0, max_tokens=8),
    ).start()
    request = DispatchRequest(
        [{"role": "user", "content": "hi"}], label="ok", agent_timeout_sec=30, grader_timeout_sec=30
    )
    try:
        (healthy,) = bridge.run([request])
        assert healthy.status == RolloutStatus.SUCCESS, healthy
        pid = bridge.io_pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # the I/O process stops mid-run, holding its socket open
        batch = bridge.launch([request])
        started = time.monotonic()
        with pytest.raises(RolloutIOStalledError) as caught:
            bridge.finish(batch)
        elapsed = time.monotonic() - started
        report("trainer step (rollout I/O process stopped)", deadline, elapsed)
        error = caught.value
        assert (error.deadline_s, error.setting) == (deadline, ROLLOUT_IO.setting)
        assert f"(pid {pid}) sent nothing" in str(error) and ROLLOUT_IO.setting in str(error)
        with pytest.raises(RolloutIOStalledError):  # the bridge stays failed, at once
            bridge.run([request])
    finally:
        bridge.close()
    assert not bridge.alive()


# -- platform run heartbeat ------------------------------------------------------------------


@pytest.fixture
def platform(tmp_path: Path) -> Generator[Any]:
    from platform_support import git, write_files
    from test_platform_worker import Platform

    origin = tmp_path / "origin"
    origin.mkdir()
    git(origin, "init", "-q", "-b", "main")
    write_files(origin, {"rollouts/alpha/main.py": "print('alpha')\n"})
    git(origin, "add", "-A")
    git(origin, "commit", "-q", "-m", "rollouts")
    made = Platform(tmp_path, f"sqlite:///{tmp_path / 'data' / 'platform.db'}", origin)
    yield made
    made.close()


async def test_a_platform_run_process_that_stops_is_killed_and_its_run_fails_run_stalled(
    platform: Any, monkeypatch: pytest.MonkeyPatch
):
    from osmosis_ai.procs import wait_group_gone
    from platform_support import Harness

    deadline = 3.0
    monkeypatch.setenv(RUN_HEARTBEAT.setting, str(deadline))  # the worker reads it at start
    platform.start_worker(heartbeat_s=0.5)
    run_id = platform.submit("wait")
    pids = platform.pids(run_id)  # the job is waiting: its process beats every second
    await asyncio.sleep(deadline + 1)
    assert platform.run(run_id).status == "running"  # a live process is never taken for stalled
    os.kill(pids["job"], signal.SIGSTOP)
    started = time.monotonic()
    run = platform.wait_status(run_id, "failed")
    elapsed = time.monotonic() - started
    report("platform run heartbeat (run process SIGSTOPped)", deadline, elapsed)
    assert run.error is not None and run.error.startswith("RunStalledError: "), run.error
    assert f"(pid {pids['job']}) gave no heartbeat" in run.error
    assert f"the run heartbeat deadline is {deadline:g}s" in run.error
    assert wait_group_gone(pids["group"], 20) and wait_group_gone(pids["grandchild"], 20)
    harness = Harness(platform.settings.data_dir, platform.settings.database_url)
    try:
        account = harness.account("alice@example.com")
        async with harness.client() as client:
            answer = await client.get(
                f"/api/cli/eval-runs/{run.name}/logs", headers=account.headers("acme/team")
            )
    finally:
        harness.close()
    assert answer.status_code == 200, answer.text
    messages = [entry["message"] for entry in answer.json()["logs"]]
    assert any(m.startswith("RunStalledError: ") for m in messages), messages


# -- dataset processing ----------------------------------------------------------------------


def test_dataset_processing_past_its_deadline_ends_the_dataset_in_error_with_the_named_timeout(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    import json

    import httpx

    from osmosis_ai.platform.objects import ObjectStore
    from osmosis_ai.platform.services import datasets as service
    from osmosis_ai.platform.store.orm import Dataset, utcnow
    from platform_world import running_world

    row = json.dumps({"system_prompt": "s", "user_prompt": "u", "ground_truth": "1"}) + "\n"
    body = (row * 4).encode()
    deadline = 0.1
    monkeypatch.setenv(DATASET_PROCESSING.setting, str(deadline))
    with running_world(tmp_path / "data") as world, world.client("alice") as alice:
        created = alice.post(
            "/api/cli/datasets",
            json={"file_name": "math", "file_size": len(body), "extension": "jsonl"},
        ).json()
        upload = created["upload"]
        put = httpx.put(upload["presigned_url"], content=body, headers=upload["upload_headers"])
        assert put.status_code == 200
        done = alice.post(
            f"/api/cli/datasets/{created['id']}/complete", json={"file_extension": "jsonl"}
        )
        assert done.json()["status"] == "uploaded", done.text
        # Processed again, its stored file now 200 000 rows: about 0.8 s of reading on an
        # idle machine (100 000 take 0.4 s, close enough to 0.3 s to finish in time once).
        with world.database.transaction() as session:
            dataset = session.get(Dataset, created["id"])
            assert dataset is not None
            dataset.status = "processing"
            key = dataset.object_key or service.object_key(dataset)
        store = ObjectStore(world.settings.objects_dir)
        store.path(key).write_text(row * 200_000)
        started = time.monotonic()
        status = service.process_dataset(world.database, store, created["id"], clock=utcnow)
        elapsed = time.monotonic() - started
        report("dataset processing", deadline, elapsed)
        found = alice.get(f"/api/cli/datasets/{created['id']}").json()
        logs = alice.get(f"/api/cli/datasets/{created['id']}/logs").json()["logs"]
    assert status == "error" and found["status"] == "error"
    failed = [entry["message"] for entry in logs if entry["level"] == "error"]
    assert len(failed) == 1 and "DatasetProcessingTimeoutError: " in failed[0], logs
    assert f"the dataset processing deadline is {deadline:g}s" in failed[0]
    assert DATASET_PROCESSING.setting in failed[0]


if sys.platform != "linux":  # pragma: no cover
    pytestmark = pytest.mark.skip(reason="the stall tests use Linux process signals")
