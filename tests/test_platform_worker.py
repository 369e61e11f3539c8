"""The worker runtime with real processes, a real Git repository and a real database: claims
and their fencing, wake-ups, one process per run, stop, a worker killed with -9 or stopped
with SIGTERM, a run process that dies, and a rollout whose entrypoint does not import.

Runs are inserted as a submit stores them; the job is ``worker_jobs:execute`` (its
``JOB_MODE`` comes from the run's ``[env]``), the worker ``worker_launch.py``.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from sqlalchemy import select

from osmosis_ai.platform.crypto import SecretBox, secret_key
from osmosis_ai.platform.services import runs as run_service
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.accounts import add_member, create_user, create_workspace
from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.store.database import Database, open_database
from osmosis_ai.platform.store.orm import Run, RunLog, RunMetric, Worker, Workspace, utcnow
from osmosis_ai.platform.worker.checkout import checkout_run
from osmosis_ai.platform.worker.report import RunReporter
from osmosis_ai.procs import wait_group_gone
from platform_support import git, write_files

TESTS = Path(__file__).resolve().parent
SECRET = "sk-worker-secret-93f1c2"
WAIT_S = 90.0


@pytest.fixture
def origin(tmp_path) -> Path:
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(
        repo,
        {
            "rollouts/alpha/main.py": "print('alpha')\n",
            "rollouts/broken/main.py": "import osmosis_no_such_module\n",
        },
    )
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "rollouts")
    return repo


class Platform:
    """A data dir and database with one workspace (``origin`` is its repository)."""

    def __init__(self, root: Path, database_url: str, origin: Path) -> None:
        self.settings = load_settings(
            data_dir=root / "data", database_url=database_url, public_url="http://127.0.0.1:9"
        )
        self.database: Database = open_database(self.settings)
        self.origin = origin
        self.commit = git(origin, "rev-parse", "HEAD")
        self.box = SecretBox(secret_key(self.settings.data_dir))
        self.workers: list[subprocess.Popen[bytes]] = []
        self.root = root
        with self.database.transaction() as session:
            user = create_user(session, "alice@example.com", name="Alice")
            workspace = create_workspace(session, "team", repo="acme/team", clone_url=str(origin))
            add_member(session, workspace, user, role="owner")
            self.user_id, self.workspace_id = user.id, workspace.id

    def submit(
        self,
        mode: str,
        *,
        kind: str = "eval",
        rollout: str = "alpha",
        secret: str | None = None,
        wake: bool = True,
        **fields: object,
    ) -> str:
        run_id = os.urandom(8).hex()
        now = utcnow()
        sealed = None
        if secret is not None:
            sealed = self.box.encrypt(
                json.dumps({"API_KEY": secret}), bound_to=run_service._bound(run_id)
            )
        with self.database.transaction() as session:
            session.add(
                Run(
                    id=run_id,
                    workspace_id=self.workspace_id,
                    kind=kind,
                    name=f"run-{run_id}",
                    status="pending",
                    creator_id=self.user_id,
                    rollout_name=rollout,
                    entrypoint="main.py",
                    commit_sha=self.commit,
                    model_path="openai/gpt-5-mini",
                    dataset_name="math",
                    experiment_config={
                        "rollout": rollout,
                        "entrypoint": "main.py",
                        "model_path": "openai/gpt-5-mini",
                        "dataset": "sums",
                    },
                    env_config={"JOB_MODE": mode},
                    required_secrets=["API_KEY"] if secret is not None else [],
                    secret_scopes={"API_KEY": "run"} if secret is not None else {},
                    provided_secrets=sealed,
                    created_at=now,
                    updated_at=now,
                    **fields,
                )
            )
        if wake:
            work.wake_workers(self.database, now=utcnow())
        return run_id

    def run(self, run_id: str) -> Run:
        with self.database.read() as session:
            found = session.get(Run, run_id)
            assert found is not None
            return found

    def logs(self, run_id: str) -> list[RunLog]:
        with self.database.read() as session:
            query = select(RunLog).where(RunLog.run_id == run_id).order_by(RunLog.id)
            return list(session.scalars(query))

    def log_text(self, run_id: str) -> str:
        return "\n".join(f"[{e.step}] {e.message}" for e in self.logs(run_id))

    def wait_for(self, run_id: str, check: Callable[[Run], bool], what: str) -> Run:
        deadline = time.monotonic() + WAIT_S
        while True:
            run = self.run(run_id)
            if check(run):
                return run
            assert time.monotonic() < deadline, (
                f"run never {what}: {run.status}\n{self.log_text(run_id)}\n{self.worker_output()}"
            )
            time.sleep(0.05)

    def wait_status(self, run_id: str, *statuses: str) -> Run:
        return self.wait_for(run_id, lambda r: r.status in statuses, f"reached {statuses}")

    def start_worker(
        self, *, poll_s: float = 600, slots: int = 1, lease_s: float = 15, heartbeat_s: float = 3
    ) -> subprocess.Popen[bytes]:
        with self.database.read() as session:
            before = len(session.scalars(select(Worker.id)).all())
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(TESTS), *sys.path])}
        log = (self.root / f"worker-{len(self.workers)}.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                str(TESTS / "worker_launch.py"),
                str(self.settings.data_dir),
                self.settings.database_url,
                str(poll_s),
                str(slots),
                str(lease_s),
                str(heartbeat_s),
            ],
            env=env,
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        self.workers.append(process)
        deadline = time.monotonic() + WAIT_S
        while True:  # registered: it receives wake-ups from now on
            with self.database.read() as session:
                if len(session.scalars(select(Worker.id)).all()) > before:
                    return process
            assert process.poll() is None, self.worker_output()
            assert time.monotonic() < deadline, self.worker_output()
            time.sleep(0.05)

    def worker_output(self) -> str:
        return "\n".join(p.read_text() for p in sorted(self.root.glob("worker-*.log")))

    def pids(self, run_id: str, attempt: int = 1) -> dict[str, int]:
        path = self.settings.data_dir / "work" / "runs" / run_id / f"attempt-{attempt}.pids"
        deadline = time.monotonic() + WAIT_S
        while not path.is_file() or not path.read_text():
            assert time.monotonic() < deadline, self.log_text(run_id) + self.worker_output()
            time.sleep(0.05)
        return json.loads(path.read_text())

    def close(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.kill()
                process.wait()
        self.database.dispose()


@pytest.fixture
def platform(tmp_path, origin) -> Iterator[Platform]:
    made = Platform(tmp_path, f"sqlite:///{tmp_path / 'data' / 'platform.db'}", origin)
    yield made
    made.close()


def stop_worker(process: subprocess.Popen[bytes]) -> int:
    process.send_signal(signal.SIGTERM)
    return process.wait(timeout=WAIT_S)


def assert_gone(pids: dict[str, int]) -> None:
    """The job's process group and the grandchild's own session are gone."""
    assert wait_group_gone(pids["group"], 20), "the run's process group outlived the run"
    assert wait_group_gone(pids["grandchild"], 20), "a process the run started outlived it"


def claim_details(platform: Platform, run_id: str) -> dict[str, object]:
    found = [e for e in platform.logs(run_id) if e.message.startswith("Claimed")]
    assert found, platform.log_text(run_id)
    return found[-1].details or {}


# --- claims, fencing, attempts ---------------------------------------------------------------


def test_claims_take_the_oldest_run_and_a_stale_attempt_cannot_write(platform):
    first = platform.submit("finish", wake=False)
    second = platform.submit("finish", wake=False)
    now = utcnow()
    with platform.database.transaction() as session:
        session.get(Run, first).created_at = now - timedelta(seconds=5)  # type: ignore[union-attr]
        a = work.register_worker(session, name="a", slots=1, wake_address=None, now=now).id
        b = work.register_worker(session, name="b", slots=1, wake_address=None, now=now).id
    with platform.database.transaction() as session:
        claim = work.claim_run(session, a, now=now)
    assert claim is not None and (claim.run_id, claim.attempt, claim.resumed) == (first, 1, False)
    later = now + timedelta(seconds=work.DEFAULT_LEASE_S + 1)  # a's lease ran out
    with platform.database.transaction() as session:
        again = work.claim_run(session, b, now=later)
    assert again is not None and (again.run_id, again.attempt, again.resumed) == (first, 2, True)
    stale = RunReporter(
        platform.database,
        None,
        run_id=first,
        worker_id=a,
        attempt=1,  # type: ignore[arg-type]
    )
    with pytest.raises(work.LeaseLostError):
        stale.log("late write")
    with pytest.raises(work.LeaseLostError):
        stale.end("finished")
    with platform.database.transaction() as session:
        assert work.heartbeat(session, first, a, 1, now=later) == "lost"
        assert work.heartbeat(session, first, b, 2, now=later) == "ok"
        following = work.claim_run(session, a, now=later)
    assert following is not None and following.run_id == second
    assert platform.run(first).attempt == 2


def test_a_run_whose_workers_keep_dying_gives_up_after_max_attempts(platform):
    eval_run = platform.submit("finish", wake=False)
    training = platform.submit("finish", kind="training", wake=False)
    now = utcnow()
    with platform.database.transaction() as session:
        for run_id in (eval_run, training):
            run = session.get(Run, run_id)
            assert run is not None
            run.status, run.attempt = "running", work.MAX_ATTEMPTS
            run.lease_expires_at = now - timedelta(seconds=1)
        worker = work.register_worker(session, name="w", slots=1, wake_address=None, now=now)
    with platform.database.transaction() as session:
        assert work.claim_run(session, worker.id, now=now) is None
    assert platform.run(eval_run).status == "failed"
    assert platform.run(training).status == "crashed"
    assert f"Gave up after {work.MAX_ATTEMPTS} attempts" in (platform.run(eval_run).error or "")


@pytest.mark.postgres
def test_two_workers_claim_concurrently_on_postgresql_without_waiting(
    tmp_path, origin, postgres_server
):
    made = Platform(tmp_path, postgres_server.create_database(), origin)
    try:
        runs = [made.submit("finish", wake=False) for _ in range(2)]
        now = utcnow()
        with made.database.transaction() as session:
            a = work.register_worker(session, name="a", slots=1, wake_address=None, now=now).id
            b = work.register_worker(session, name="b", slots=1, wake_address=None, now=now).id
        # a's claim holds its row lock (transaction open) while b claims: SKIP LOCKED hands b
        # the next run at once instead of queueing b behind a.
        with made.database.transaction() as first:
            claim_a = work.claim_run(first, a, now=now)
            with made.database.transaction() as second:
                claim_b = work.claim_run(second, b, now=now)
        assert claim_a is not None and claim_b is not None
        assert {claim_a.run_id, claim_b.run_id} == set(runs)
        # and two worker processes share the queue, woken by NOTIFY and datagrams
        workers = [made.start_worker(), made.start_worker()]
        more = [made.submit("finish") for _ in range(4)]
        for run_id in more:
            made.wait_status(run_id, "finished")
        assert {made.run(r).worker_id for r in more} <= set(_worker_ids(made)) - {a, b}
        for process in workers:
            assert stop_worker(process) == 0
    finally:
        made.close()


def _worker_ids(platform: Platform) -> list[str]:
    with platform.database.read() as session:
        return list(session.scalars(select(Worker.id)))


# --- checkout ----------------------------------------------------------------------------------


def test_checkout_fetches_a_missing_commit_reuses_a_checkout_and_keeps_no_credentials(
    platform, tmp_path
):
    work_dir = tmp_path / "work"
    first = checkout_run(
        platform.database,
        platform.settings,
        workspace_id=platform.workspace_id,
        commit_sha=platform.commit,
        work_dir=work_dir,
    )
    assert first.fetched and not first.reused
    assert (first.path / "rollouts" / "alpha" / "main.py").read_text() == "print('alpha')\n"
    (first.path / "rollouts" / "alpha" / "main.py").write_text("tampered\n")
    again = checkout_run(
        platform.database,
        platform.settings,
        workspace_id=platform.workspace_id,
        commit_sha=platform.commit,
        work_dir=work_dir,
    )
    assert again.reused and not again.fetched
    assert (again.path / "rollouts" / "alpha" / "main.py").read_text() == "print('alpha')\n"
    # a new commit: the mirror lacks it and is fetched; a clone URL's credentials stay out
    write_files(platform.origin, {"rollouts/alpha/main.py": "print('v2')\n"})
    git(platform.origin, "commit", "-q", "-am", "v2")
    newer = git(platform.origin, "rev-parse", "HEAD")
    with platform.database.transaction() as session:
        workspace = session.get(Workspace, platform.workspace_id)
        assert workspace is not None
        workspace.clone_url = f"file://{platform.origin}"
    moved = checkout_run(
        platform.database,
        platform.settings,
        workspace_id=platform.workspace_id,
        commit_sha=newer,
        work_dir=work_dir,
    )
    assert moved.fetched and not moved.reused
    assert git(moved.path, "rev-parse", "HEAD") == newer
    with platform.database.transaction() as session:
        workspace = session.get(Workspace, platform.workspace_id)
        assert workspace is not None
        workspace.clone_url = "https://oauth2:tok-8e1f@git.example.invalid/acme/team.git"
    same = checkout_run(
        platform.database,
        platform.settings,
        workspace_id=platform.workspace_id,
        commit_sha=platform.commit,  # in the mirror: no fetch, so the bad URL is not used
        work_dir=work_dir,
    )
    assert not same.fetched
    assert "tok-8e1f" not in (same.path / ".git" / "config").read_text()


# --- the worker process --------------------------------------------------------------------------


def test_a_worker_claims_on_a_wake_up_runs_the_job_and_stops_cleanly(platform):
    worker = platform.start_worker(poll_s=600)  # no poll during the test: only a wake-up
    run_id = platform.submit("finish")
    run = platform.wait_status(run_id, "finished")
    details = claim_details(platform, run_id)
    assert details["trigger"] == "udp"
    assert isinstance(details["queued_ms"], float | int)
    assert run.attempt == 1 and run.lease_expires_at is None and run.error is None
    steps = [e.step for e in platform.logs(run_id)]
    assert {"setup", "checkout", "environment"} <= set(steps)
    with platform.database.read() as session:
        metric = session.get(RunMetric, (run_id, "reward", 1))
        assert metric is not None and metric.value == 0.5
    assert stop_worker(worker) == 0
    with platform.database.read() as session:
        assert all(w.stopped_at is not None for w in session.scalars(select(Worker)))


def test_a_slot_freed_by_a_run_that_exits_after_closing_its_output_takes_the_next_run(
    platform,
):
    # The run process's output ends (the worker hears of it) a second before the process
    # exits: the slot it frees must still take the queued run, with no poll to fall back on.
    worker = platform.start_worker(poll_s=600)
    first = platform.submit("linger")
    platform.wait_for(first, lambda r: r.status == "finished", "finished")
    queued = platform.submit("finish", wake=False)  # no wake-up: only the freed slot
    run = platform.wait_status(queued, "finished")
    assert claim_details(platform, queued)["trigger"] == "slot"
    assert run.attempt == 1
    assert stop_worker(worker) == 0


def _standby_pids(parent) -> list[int]:
    """Live ``--standby`` processes below ``parent`` (one that exits while listed is not)."""
    import psutil

    pids = []
    for child in parent.children(recursive=True):
        try:
            if child.status() != psutil.STATUS_ZOMBIE and "--standby" in child.cmdline():
                pids.append(child.pid)
        except psutil.Error:  # gone, or a zombie, between the listing and the read
            continue
    return pids


def test_a_claimed_run_goes_to_the_standby_process_started_ahead_of_it(platform):
    import psutil

    worker = platform.start_worker()
    deadline = time.monotonic() + WAIT_S
    standby: list[int] = []
    while not standby:
        standby = _standby_pids(psutil.Process(worker.pid))
        assert time.monotonic() < deadline, "the worker started no standby process"
        time.sleep(0.05)
    run_id = platform.submit("finish")
    platform.wait_status(run_id, "finished")
    assert f"(pid {standby[0]}, new)" in platform.log_text(run_id)
    # the next claim finds a new standby waiting
    second = platform.submit("finish")
    platform.wait_status(second, "finished")
    assert f"(pid {standby[0]}," not in platform.log_text(second)
    assert stop_worker(worker) == 0
    assert not _standby_pids(psutil.Process())


def test_stopping_a_run_ends_it_stopped_and_leaves_no_process(platform):
    platform.start_worker(heartbeat_s=0.5)
    run_id = platform.submit("wait")
    pids = platform.pids(run_id)
    with platform.database.transaction() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run_service.finish(run, "stopped", now=utcnow())
    assert_gone(pids)
    run = platform.wait_for(run_id, lambda r: r.lease_expires_at is None, "let go")
    assert run.status == "stopped"
    assert "test job stopped" in platform.log_text(run_id)


def test_a_worker_killed_with_9_leaves_no_process_and_another_resumes_its_run(platform):
    first = platform.start_worker(lease_s=3, heartbeat_s=0.5)
    run_id = platform.submit("wait")
    pids = platform.pids(run_id)
    first.kill()
    first.wait()
    assert_gone(pids)  # the run's process saw its stdin close
    assert platform.run(run_id).status == "running"
    platform.start_worker(poll_s=0.5, lease_s=3, heartbeat_s=0.5)
    run = platform.wait_status(run_id, "finished")
    assert run.attempt == 2
    text = platform.log_text(run_id)
    assert "previous worker's lease expired" in text and "resumed on attempt 2" in text


def test_sigterm_of_the_worker_releases_its_runs_for_another_worker(platform):
    first = platform.start_worker(heartbeat_s=0.5)
    run_id = platform.submit("wait")
    pids = platform.pids(run_id)
    assert stop_worker(first) == 0
    assert_gone(pids)
    run = platform.run(run_id)
    assert run.status == "running" and run.lease_expires_at is not None
    assert run.lease_expires_at <= utcnow()
    assert "Released by a worker shutting down" in platform.log_text(run_id)
    platform.start_worker(poll_s=600)  # claims it at start, without waiting for the lease
    run = platform.wait_status(run_id, "finished")
    assert run.attempt == 2


def test_a_run_process_that_dies_fails_the_run_with_its_redacted_output(platform):
    platform.start_worker()
    eval_run = platform.submit("exit", secret=SECRET)
    run = platform.wait_status(eval_run, "failed")
    assert run.error == "The run's process exited with code 7 without ending the run"
    text = platform.log_text(eval_run)
    assert "about to die holding [REDACTED]" in text
    assert SECRET not in text and SECRET not in (run.error or "")


def test_a_job_error_crashes_a_training_run_with_a_redacted_traceback(platform):
    platform.start_worker()
    run_id = platform.submit("raise", kind="training", secret=SECRET)
    run = platform.wait_status(run_id, "crashed")
    assert run.error == "RuntimeError: the job broke with [REDACTED]"
    text = platform.log_text(run_id)
    assert "Traceback" in text and "[REDACTED]" in text and SECRET not in text


def test_a_rollout_whose_entrypoint_fails_to_import_fails_the_run_with_the_error(platform):
    platform.start_worker()
    run_id = platform.submit("rollout", rollout="broken")
    run = platform.wait_status(run_id, "failed")
    text = platform.log_text(run_id)
    assert "osmosis_no_such_module" in (run.error or "")
    assert "ModuleNotFoundError: No module named 'osmosis_no_such_module'" in text


# --- osmosis platform serve --workers ----------------------------------------------------------


def test_serve_starts_a_worker_that_runs_the_eval_job_and_stops_with_the_server(platform, tmp_path):
    """The real eval job on a rollout whose entrypoint does not import: the run fails with
    the import error in its logs, executed by the worker ``serve`` started beside itself."""
    from osmosis_ai.platform.objects import ObjectStore
    from osmosis_ai.platform.store.orm import Dataset
    from osmosis_ai.testing.serving import free_port

    rows = "".join(
        json.dumps({"user_prompt": f"{i}+1", "ground_truth": str(i + 1)}) + "\n" for i in range(6)
    )
    with platform.database.transaction() as session:
        dataset = Dataset(
            workspace_id=platform.workspace_id,
            file_name="sums",
            extension="jsonl",
            file_size=len(rows),
            status="uploaded",
            row_count=6,
            object_key="datasets/sums.jsonl",
        )
        session.add(dataset)
        session.flush()
        dataset_id = dataset.id
    ObjectStore(platform.settings.objects_dir).put("datasets/sums.jsonl", rows.encode())
    port = free_port()
    log = (tmp_path / "serve.log").open("wb")
    serve = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "osmosis_ai.cli.main",
            "platform",
            "serve",
            "--data-dir",
            str(platform.settings.data_dir),
            "--port",
            str(port),
            "--workers",
            "1",
            "--single-tenant",  # not about isolation: runs where bubblewrap is missing
        ],
        env={**os.environ, "OPENAI_API_KEY": "sk-test-unused"},
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    try:
        deadline = time.monotonic() + WAIT_S
        while not _worker_ids(platform):
            assert serve.poll() is None, (tmp_path / "serve.log").read_text()
            assert time.monotonic() < deadline, (tmp_path / "serve.log").read_text()
            time.sleep(0.05)
        run_id = platform.submit(
            "unused",
            rollout="broken",
            dataset_id=dataset_id,
            evaluation_config={"limit": 2},
        )
        run = platform.wait_status(run_id, "failed", "finished", "stopped")
        text = platform.log_text(run_id)
        assert run.status == "failed", text
        assert "No module named 'osmosis_no_such_module'" in text
    finally:
        serve.send_signal(signal.SIGTERM)
        code = serve.wait(timeout=WAIT_S)
    # uvicorn re-raises the SIGTERM it handled; the workers are stopped before it ends serve
    assert code in (0, 128 + signal.SIGTERM), (tmp_path / "serve.log").read_text()
    with platform.database.read() as session:
        assert all(w.stopped_at is not None for w in session.scalars(select(Worker)))


# --- shared uv environments ----------------------------------------------------------------------

FAKE_UV = """#!/bin/sh
# uv stand-in: records each sync's environment folder and how long it took
echo "start $UV_PROJECT_ENVIRONMENT $(date +%s.%N)" >> "$UV_RECORD"
sleep 0.3
echo "end $UV_PROJECT_ENVIRONMENT $(date +%s.%N)" >> "$UV_RECORD"
"""


def test_isolated_rollouts_share_one_uv_environment_per_lock_hash_built_one_at_a_time(
    tmp_path, monkeypatch
):
    import threading

    from osmosis_ai.controller.rollout_process import (
        ENV_CACHE_ENV,
        RolloutServerProcess,
        environment_key,
    )

    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "uv").write_text(FAKE_UV)
    (bin_dir / "uv").chmod(0o755)
    record = tmp_path / "record.txt"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("UV_RECORD", str(record))
    cache = tmp_path / "envs"
    pyproject = '[project]\nname = "r"\nversion = "0"\ndependencies = ["osmosis-absent-pkg"]\n'
    rollouts = []
    for name in ("one", "two"):  # two checkouts of the same rollout: one environment
        folder = tmp_path / name
        write_files(folder, {"pyproject.toml": pyproject, "uv.lock": "lock v1\n", "main.py": ""})
        rollouts.append(folder)
    servers = [
        RolloutServerProcess(
            rollout_dir=folder,
            entrypoint=folder / "main.py",
            artifact_root=tmp_path / "artifacts",
            env={ENV_CACHE_ENV: str(cache)},
        )
        for folder in rollouts
    ]
    threads = [threading.Thread(target=server.sync) for server in servers]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    expected = cache / environment_key(rollouts[0])
    assert all(server.isolated and server.uv_environment == expected for server in servers)
    events = [line.split() for line in record.read_text().splitlines()]
    assert [e[0] for e in events] == ["start", "end", "start", "end"]  # never overlapping
    assert {e[1] for e in events} == {str(expected)}
    (rollouts[1] / "uv.lock").write_text("lock v2\n")
    assert environment_key(rollouts[1]) != environment_key(rollouts[0])
    # without the cache setting (osmosis eval run), uv keeps its own default
    plain = RolloutServerProcess(
        rollout_dir=rollouts[0], entrypoint=rollouts[0] / "main.py", artifact_root=tmp_path
    )
    plain.command()
    assert plain.isolated and plain.uv_environment is None


def test_the_run_process_reports_a_wrong_command_line_on_stderr_as_it_was():
    """The run process logs through ``logging``; its lines reach the attempt log unchanged."""
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_ai.platform.worker.execute", "a", "b"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "usage: python -m osmosis_ai.platform.worker.execute SPEC.json | --standby\n"
    )
