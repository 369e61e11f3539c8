"""Reliability of managed runs with real processes: ``osmosis platform serve`` and standalone
``osmosis platform worker`` processes on a SQLite data dir, runs submitted with our CLI from a
workspace clone, the real eval and training jobs, and the scripted model on 127.0.0.1.

* A stop during each phase of a run (checkout, building the rollout's uv environment,
  rollouts, grading, a training step) ends the run ``stopped`` and leaves none of its
  process groups behind, the rollout server's included; the seconds from the stop request
  until the last group is gone are measured and printed (the aim is at most 10 s). A
  stopped training run keeps its last checkpoint.
* ``kill -9`` of a worker mid-training: a second worker resumes the run from the state the
  first one left, and the run finishes.
* A rollout whose entrypoint does not import fails the run, eval and training alike, with
  the import error in the run's logs.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import signal
import sqlite3
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest

from osmosis_ai.platform.objects import ObjectStore
from osmosis_ai.procs import group_alive
from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn
from osmosis_ai.testing.scripted_reply import content_text
from osmosis_ai.workspace.templates import apply_template
from platform_support import git
from test_platform_managed_e2e import Deployment

REPO = "acme/calc"
WAIT_S = 120.0
STOP_DEADLINE_S = 30.0  # generous, for a busy machine; the aim is 10 s (printed)
STOP_TIMES: dict[str, float] = {}

# A stand-in uv: a sync marks that it started, then takes "forever" (a slow download).
SLOW_UV = """#!/bin/sh
echo $$ > "{marks}/uv-$1"
exec sleep 600
"""
# A stand-in git ahead of the real one on the worker's PATH: a slow checkout (hooks, which
# would be the other way, never run: the platform's git calls turn them off).
SLOW_GIT = """#!/bin/sh
for arg in "$@"; do
    if [ "$arg" = checkout ]; then
        echo $$ > "{marks}/checkout"
        exec sleep 600
    fi
done
exec {git} "$@"
"""
SLOW_GRADE = """
        (Path({marks!r}) / f"grading-{{os.getpid()}}").write_text("")
        await asyncio.sleep(600)
"""


class Model:
    """Copy-digit answers (the digit of ``Copy: N``). While ``hold`` names them, requests
    get a reply that never comes (until the test ends): ``rollouts`` (a row's prompt) or
    ``all`` (the model check before the rollouts too)."""

    def __init__(self) -> None:
        self.hold: str | None = None
        self.held = threading.Event()
        self.release = threading.Event()
        self.url = ""

    async def __call__(self, request: ChatRequest) -> ScriptedTurn:
        user = next((m for m in request.messages if m.get("role") == "user"), {})
        found = re.search(r"Copy: (\d)", content_text(user.get("content")))
        if self.hold == "all" or (self.hold == "rollouts" and found):
            self.held.set()
            await asyncio.to_thread(self.release.wait, 600)
        return ScriptedTurn(content=found.group(1) if found else "0")


class Lab(Deployment):
    """A deployment whose workspace holds the copy-digit rollout and variants of it: one
    whose grader sleeps, one that needs a uv environment, and one that does not import."""

    def __init__(self, root: Path, model_url: str) -> None:
        self.marks = root / "marks"
        self.marks.mkdir(parents=True)
        super().__init__(root, model_url, rows=4)
        self.model_dir: Path | None = None

    def _workspace(self, model_url: str, rows: int) -> Path:
        clone = self.root / "ws"
        clone.mkdir()
        git(clone, "init", "-q", "-b", "main")
        git(clone, "remote", "add", "origin", str(self.bare))
        apply_template("copy-digit", clone)
        source = (clone / "rollouts" / "copy-digit" / "main.py").read_text()
        grade = "        ctx.set_reward(1.0 if answer"
        assert grade in source
        slow = source.replace(
            "import os\n", "import asyncio\nimport os\nfrom pathlib import Path\n"
        )
        slow = slow.replace(
            grade, SLOW_GRADE.format(marks=str(self.marks)).rstrip("\n") + "\n" + grade
        )
        files = {
            "rollouts/slow-grade/main.py": slow,
            "rollouts/isolated/main.py": source,
            "rollouts/isolated/pyproject.toml": (
                '[project]\nname = "isolated"\nversion = "0"\n'
                'dependencies = ["osmosis-absent-package-3f9a"]\n'
            ),
            "rollouts/isolated/uv.lock": "version = 1\n",
            "rollouts/broken/main.py": "import osmosis_no_such_module\n",
        }
        for rollout in ("copy-digit", "slow-grade", "isolated", "broken"):
            files[f"configs/eval/{rollout}.toml"] = eval_config(rollout, model_url)
        for path, text in files.items():
            (clone / path).parent.mkdir(parents=True, exist_ok=True)
            (clone / path).write_text(text)
        git(clone, "add", "-A")
        git(clone, "commit", "-q", "-m", "copy-digit and variants")
        git(clone, "push", "-q", "-u", "origin", "main")
        return clone

    # -- workers -----------------------------------------------------------------------

    def worker(self, **env: str) -> subprocess.Popen[str]:
        saved = self.env
        self.env = {**saved, **env}
        try:
            return self.start_worker()
        finally:
            self.env = saved

    def slow_uv_worker(self) -> subprocess.Popen[str]:
        bin_dir = self.root / "slow-uv"
        bin_dir.mkdir(exist_ok=True)
        (bin_dir / "uv").write_text(SLOW_UV.format(marks=self.marks))
        (bin_dir / "uv").chmod(0o755)
        return self.worker(PATH=f"{bin_dir}{os.pathsep}{self.env['PATH']}")

    def slow_checkout_worker(self) -> subprocess.Popen[str]:
        bin_dir = self.root / "slow-git"
        bin_dir.mkdir(exist_ok=True)
        real = shutil.which("git")
        assert real is not None
        (bin_dir / "git").write_text(SLOW_GIT.format(marks=self.marks, git=real))
        (bin_dir / "git").chmod(0o755)
        return self.worker(PATH=f"{bin_dir}{os.pathsep}{self.env['PATH']}")

    def stop_workers(self) -> None:
        for process in self.workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in self.workers:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()

    # -- runs --------------------------------------------------------------------------

    def submit(self, kind: str, config: str) -> str:
        command = "eval" if kind == "eval" else "train"
        args = [command, "submit", config, "-y"]
        if kind == "eval":
            args += ["--secrets-file", str(self.secrets)]
        name = self.cli(*args)["resource"]["name"]
        return self.row(name=name)["id"]

    def row(self, *, name: str | None = None, run_id: str | None = None) -> dict[str, Any]:
        with sqlite3.connect(self.data_dir / "platform.db") as db:
            db.row_factory = sqlite3.Row
            query = "SELECT * FROM runs WHERE " + ("name = ?" if name else "id = ?")
            found = db.execute(query, (name or run_id,)).fetchone()
        assert found is not None, (name, run_id)
        return dict(found)

    def logs(self, run_id: str) -> str:
        with sqlite3.connect(self.data_dir / "platform.db") as db:
            query = "SELECT step, message FROM run_logs WHERE run_id = ? ORDER BY id"
            return "\n".join(f"[{s}] {m}" for s, m in db.execute(query, (run_id,)))

    def wait(
        self, run_id: str, what: str, check, timeout: float = WAIT_S, *, live: bool = True
    ) -> dict[str, Any]:
        """Poll the run until ``check(row)``; with ``live``, it must not end before that."""
        deadline = time.monotonic() + timeout
        while True:
            row = self.row(run_id=run_id)
            if check(row):
                return row
            assert not live or row["status"] in ("pending", "queued", "running"), (
                f"run ended before it {what}: {row['status']}\n{self.logs(run_id)}"
            )
            assert time.monotonic() < deadline, (
                f"run never {what}: {row['status']}\n{self.logs(run_id)}\n{self.output()}"
            )
            time.sleep(0.1)

    def wait_ended(self, run_id: str, timeout: float = WAIT_S) -> dict[str, Any]:
        ended = ("finished", "failed", "stopped", "crashed")
        return self.wait(run_id, "ended", lambda r: r["status"] in ended, timeout, live=False)

    def wait_file(self, path: Path, run_id: str, timeout: float = WAIT_S) -> None:
        deadline = time.monotonic() + timeout
        while not path.exists():
            row = self.row(run_id=run_id)
            assert row["status"] in ("pending", "queued", "running"), (
                f"{path.name} never appeared: {row['status']}\n{self.logs(run_id)}"
            )
            assert time.monotonic() < deadline, f"{path.name} never appeared\n{self.logs(run_id)}"
            time.sleep(0.05)

    def api(self, method: str, path: str) -> Any:
        headers = {"Authorization": f"Bearer {self.env['OSMOSIS_TOKEN']}", "X-Osmosis-Git": REPO}
        answer = httpx.request(method, f"{self.url}{path}", headers=headers, timeout=60)
        assert answer.is_success, answer.text
        return answer.json()

    def work_dir(self, run_id: str) -> Path:
        return self.data_dir / "work" / "runs" / run_id

    def output(self) -> str:
        return "\n".join(p.read_text()[-3000:] for p in sorted(self.root.glob("worker-*.log")))

    def stop_and_measure(
        self,
        phase: str,
        kind: str,
        run_id: str,
        worker: subprocess.Popen[str],
        *,
        server: bool = False,
    ) -> dict[str, Any]:
        """Stop the run through the API; every process group of the run (each group beneath
        the worker, the rollout server's too) must be gone. Records the seconds taken."""
        groups = run_groups(worker, self.work_dir(run_id))
        if server:  # the rollout server runs in a session (process group) of its own
            assert len(groups) >= 2, members(groups)
        route = "eval-runs" if kind == "eval" else "training-runs"
        began = time.monotonic()
        self.api("POST", f"/api/cli/{route}/{run_id}/stop")
        deadline = began + STOP_DEADLINE_S
        left = set(groups)
        while left:
            left = {g for g in left if group_alive(g)}
            assert time.monotonic() < deadline, (
                f"{phase}: process groups {sorted(left)} outlived the stop by "
                f"{STOP_DEADLINE_S:.0f} s: {members(left)}\n{self.output()}"
            )
            time.sleep(0.05)
        seconds = time.monotonic() - began
        STOP_TIMES[phase] = seconds
        print(f"\nstop during {phase}: every process of the run gone in {seconds:.2f} s")
        row = self.wait(run_id, "let go", lambda r: r["lease_expires_at"] is None, 30, live=False)
        assert row["status"] == "stopped", self.logs(run_id)
        assert worker.poll() is None, "the worker itself ended with the run"
        # the run's process ended the run itself (it was not killed after the grace)
        after = self.logs(run_id).rsplit("[stop] Stopped by", 1)[-1]
        assert "] Stopped" in after, self.logs(run_id)
        assert "did not stop within" not in self.output()
        return row


def run_groups(worker: subprocess.Popen[str], work_dir: Path) -> set[int]:
    """The process groups of the run whose work dir is ``work_dir``: its process (the
    worker's child working there; an idle standby process works elsewhere) and every
    process beneath it."""
    runs = []
    for child in psutil.Process(worker.pid).children():
        try:
            if Path(child.cwd()).resolve() == work_dir.resolve():
                runs.append(child)
        except psutil.Error:
            continue
    assert len(runs) == 1, f"not one run process beneath the worker in {work_dir}: {runs}"
    groups: set[int] = set()
    for process in [runs[0], *runs[0].children(recursive=True)]:
        try:
            groups.add(os.getpgid(process.pid))
        except ProcessLookupError:
            continue
    return groups


def members(groups: set[int]) -> list[str]:
    """The live processes of ``groups``: pid, status and command line."""
    found = []
    for process in psutil.process_iter(["pid", "status", "cmdline"]):
        try:
            if os.getpgid(process.info["pid"]) in groups:
                found.append(
                    f"{process.info['pid']} {process.info['status']} {process.info['cmdline']}"
                )
        except (ProcessLookupError, psutil.Error):
            continue
    return found


def commands_beneath(worker: subprocess.Popen[str]) -> list[str]:
    found = []
    for child in psutil.Process(worker.pid).children(recursive=True):
        try:
            found.append(" ".join(child.cmdline()))
        except psutil.Error:
            continue
    return found


def eval_config(rollout: str, model_url: str) -> str:
    return (
        "[experiment]\n"
        f'rollout = "{rollout}"\n'
        'entrypoint = "main.py"\n'
        'model_path = "openai/gpt-5-mini"\n'
        'dataset = "copy-digit"\n\n'
        "[evaluation]\n"
        "limit = 2\nn = 1\nbatch_size = 2\n"
        "agent_workflow_timeout_s = 300\ngrader_timeout_s = 300\n\n"
        f'[env]\nOPENAI_BASE_URL = "{model_url}"\n\n'
        '[secrets]\nrequired = ["OPENAI_API_KEY"]\n'
    )


def training_config(rollout: str, *, epochs: int, save_every: int) -> str:
    return (
        "[experiment]\n"
        f'rollout = "{rollout}"\n'
        'entrypoint = "main.py"\n'
        'model_path = "tiny"\n'
        'dataset = "copy-digit"\n\n'
        "[training]\n"
        f"lr = 3e-4\ntotal_epochs = {epochs}\nn_samples_per_prompt = 4\n"
        "rollout_batch_size = 4\nmax_prompt_length = 64\nmax_response_length = 4\n"
        "agent_workflow_timeout_s = 60\ngrader_timeout_s = 30\nseed = 0\n"
        "no_signal_patience = 0\n\n"  # few steps from 2 warm-up steps: reliability is tested
        f"[checkpoints]\neval_interval = 1000\ncheckpoint_save_freq = {save_every}\n\n"
        "[warmup]\nsft_steps = 2\nbatch_size = 8\n\n"
        "[secrets]\nrequired = []\n"
    )


@pytest.fixture(scope="module")
def model() -> Iterator[Model]:
    responder = Model()
    with ScriptedModelServer(responder=responder) as server:
        responder.url = server.base_url
        yield responder
        responder.release.set()


@pytest.fixture(scope="module")
def lab(tmp_path_factory: pytest.TempPathFactory, model: Model) -> Iterator[Lab]:
    made = Lab(tmp_path_factory.mktemp("reliability"), model.url)
    try:
        made.serve(workers=0)
        made.cli("dataset", "upload", "data/copy-digit.jsonl", "-y")
        yield made
    finally:
        made.close()
        if STOP_TIMES:
            shown = ", ".join(f"{k} {v:.2f} s" for k, v in STOP_TIMES.items())
            print(f"\nstop times: {shown}")


@pytest.fixture
def fresh(lab: Lab, model: Model) -> Iterator[Lab]:
    """The lab with no worker and the model answering; workers stopped afterwards."""
    model.hold = None
    model.held.clear()
    yield lab
    lab.stop_workers()


@pytest.fixture(scope="module")
def tiny_lab(lab: Lab, tmp_path_factory: pytest.TempPathFactory) -> Lab:
    """The lab with the tiny model registered as the base model ``tiny``."""
    pytest.importorskip("torch", reason="needs the 'train' extra")
    pytest.importorskip("trl", reason="needs the 'train' extra")
    if lab.model_dir is None:
        from osmosis_ai.train.tiny_model import build_tiny_model

        lab.model_dir = build_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")
        lab.admin("model", "add", "tiny", "--path", str(lab.model_dir))
    return lab


def add_config(lab: Lab, name: str, text: str) -> str:
    """Commit and push ``configs/<name>`` (a config the submit reads from the clone)."""
    path = lab.clone / "configs" / name
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
        git(lab.clone, "add", "-A")
        git(lab.clone, "commit", "-q", "-m", f"config {name}")
        git(lab.clone, "push", "-q", "origin", "main")
    return f"configs/{name}"


# --- stop during each phase ----------------------------------------------------------------


@pytest.mark.timeout(300)
def test_stop_during_checkout(fresh: Lab):
    lab = fresh
    worker = lab.slow_checkout_worker()
    run_id = lab.submit("eval", "configs/eval/copy-digit.toml")
    lab.wait_file(lab.marks / "checkout", run_id)
    assert any("sleep 600" in c for c in commands_beneath(worker))
    lab.stop_and_measure("checkout", "eval", run_id, worker)
    (lab.marks / "checkout").unlink()


@pytest.mark.timeout(300)
def test_stop_during_the_environment_build(fresh: Lab):
    lab = fresh
    worker = lab.slow_uv_worker()
    run_id = lab.submit("eval", "configs/eval/isolated.toml")
    lab.wait_file(lab.marks / "uv-sync", run_id)
    lab.stop_and_measure("environment build (uv sync)", "eval", run_id, worker)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("hold", ["all", "rollouts"], ids=["model-check", "rollouts"])
def test_stop_while_the_model_does_not_answer(fresh: Lab, model: Model, hold: str):
    """``all``: the model check before any rollout hangs; ``rollouts``: every rollout waits
    on the model."""
    lab = fresh
    model.hold = hold
    worker = lab.worker()
    run_id = lab.submit("eval", "configs/eval/copy-digit.toml")
    deadline = time.monotonic() + WAIT_S
    while not model.held.is_set():
        assert time.monotonic() < deadline, lab.logs(run_id) + lab.output()
        time.sleep(0.05)
    assert any("main.py" in c for c in commands_beneath(worker))  # the rollout server
    phase = "model check" if hold == "all" else "rollouts"
    lab.stop_and_measure(phase, "eval", run_id, worker, server=True)


@pytest.mark.timeout(300)
def test_stop_during_grading(fresh: Lab):
    lab = fresh
    worker = lab.worker()
    run_id = lab.submit("eval", "configs/eval/slow-grade.toml")
    deadline = time.monotonic() + WAIT_S
    while not list(lab.marks.glob("grading-*")):
        assert time.monotonic() < deadline, lab.logs(run_id) + lab.output()
        assert lab.row(run_id=run_id)["status"] in ("pending", "running"), lab.logs(run_id)
        time.sleep(0.05)
    lab.stop_and_measure("grading", "eval", run_id, worker, server=True)


@pytest.mark.timeout(600)
def test_stop_during_a_training_step_keeps_the_last_checkpoint(fresh: Lab, tiny_lab: Lab):
    lab = tiny_lab
    config = add_config(
        lab, "training/stop.toml", training_config("copy-digit", epochs=40, save_every=1000)
    )
    worker = lab.worker()
    run_id = lab.submit("training", config)
    lab.wait(run_id, "reached step 2", lambda r: (r["current_step"] or 0) >= 2, 300)
    row = lab.stop_and_measure("training step", "training", run_id, worker, server=True)
    step = row["current_step"]
    listed = lab.api("GET", f"/api/cli/training-runs/{run_id}/checkpoints")["checkpoints"]
    assert [c["checkpoint_step"] for c in listed] == [step], lab.logs(run_id)
    assert f"Stopped after step {step}; checkpoint step-{step} kept" in lab.logs(run_id)


# --- a worker killed mid-training ---------------------------------------------------------


@pytest.mark.slow  # the dead worker's lease (15 s) runs out before the resume
@pytest.mark.timeout(600)
def test_kill_9_of_a_worker_mid_training_resumes_on_another_worker(fresh: Lab, tiny_lab: Lab):
    lab = tiny_lab
    config = add_config(
        lab, "training/resume.toml", training_config("copy-digit", epochs=4, save_every=1)
    )
    first = lab.worker()
    run_id = lab.submit("training", config)
    objects = ObjectStore(lab.data_dir / "objects")

    def saved(row: dict[str, Any]) -> bool:
        stored = objects.exists(f"runs/{run_id}/files/state.json")
        return (row["current_step"] or 0) >= 2 and stored

    lab.wait(run_id, "saved its state at step 2", saved, 300)
    groups = run_groups(first, lab.work_dir(run_id))
    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + STOP_DEADLINE_S
    while any(group_alive(g) for g in groups):  # the run's process saw its stdin close
        assert time.monotonic() < deadline, "the killed worker's run outlived it"
        time.sleep(0.05)
    assert lab.row(run_id=run_id)["status"] == "running"
    lab.worker()  # claims it once the dead worker's lease runs out
    row = lab.wait_ended(run_id, 400)
    logs = lab.logs(run_id)
    assert row["status"] == "finished", logs
    assert row["attempt"] == 2
    resumed = [line for line in logs.splitlines() if "Resuming from" in line]
    assert resumed, logs
    print(f"\nkill -9 mid-training: attempt 2 {resumed[0]}")
    assert row["current_step"] == row["total_steps"]


# --- a rollout that does not import ---------------------------------------------------------


@pytest.mark.timeout(300)
def test_a_submitted_eval_whose_rollout_does_not_import_fails_with_the_error(fresh: Lab):
    lab = fresh
    lab.worker()
    run_id = lab.submit("eval", "configs/eval/broken.toml")
    row = lab.wait_ended(run_id)
    logs = lab.logs(run_id)
    assert row["status"] == "failed", logs
    assert "No module named 'osmosis_no_such_module'" in logs
    shown = lab.cli("eval", "logs", row["name"], "--limit", "200")["items"]
    assert any("osmosis_no_such_module" in entry["message"] for entry in shown)


@pytest.mark.timeout(300)
def test_a_submitted_training_whose_rollout_does_not_import_fails_with_the_error(
    fresh: Lab, tiny_lab: Lab
):
    lab = tiny_lab
    config = add_config(
        lab, "training/broken.toml", training_config("broken", epochs=1, save_every=1)
    )
    lab.worker()
    run_id = lab.submit("training", config)
    row = lab.wait_ended(run_id, 300)
    logs = lab.logs(run_id)
    assert row["status"] in ("failed", "crashed"), logs
    assert "No module named 'osmosis_no_such_module'" in logs
    shown = lab.cli("train", "logs", row["name"], "--limit", "200")["items"]
    assert any("osmosis_no_such_module" in entry["message"] for entry in shown)
