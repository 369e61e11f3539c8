"""Managed runs end to end with real processes: ``osmosis platform serve`` (and standalone
``osmosis platform worker`` processes) on a SQLite data dir set up with the admin commands,
our CLI as a subprocess in a workspace clone whose ``origin`` is the bare repository the
platform fetches, and the scripted calculator model on 127.0.0.1.

* both bundled multiply templates, submitted with ``osmosis eval submit``, reach pass rate
  1.0, and ``osmosis eval download`` brings back their trajectories;
* ``kill -9`` of a worker mid-evaluation: the lease expires, a second worker resumes the run
  from its journal, and every work item ends with exactly one stored result;
* ``kill -9`` of the platform server mid-evaluation: the worker (which works on the
  database) carries on, and the restarted server shows every result, the earlier upload
  and the finished run.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text
from osmosis_ai.testing.serving import free_port
from osmosis_ai.workspace.templates import apply_template
from platform_support import git, wait_until_healthy

TEMPLATES = {"multiply-local-openai": "agents", "multiply-local-strands": "strands"}
OSMOSIS = [sys.executable, "-m", "osmosis_ai.cli.main"]
OPERANDS = re.compile(r"val1 = (-?[\d.]+)\s+val2 = (-?[\d.]+)")
SECRET = "sk-managed-e2e-7d41c2"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        any(importlib.util.find_spec(module) is None for module in TEMPLATES.values()),
        reason="the templates' agent frameworks (openai-agents, strands) are not installed",
    ),
]


class Calculator:
    """``multiply(val1, val2)`` on a row's prompt, then ``#### <product>``; "ok" otherwise."""

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if results:
            product = float(content_text(results[-1].get("content")))
            return ScriptedTurn(content=f"The product is\n#### {product:.4f}")
        user = next((m for m in request.messages if m.get("role") == "user"), {})
        found = OPERANDS.search(content_text(user.get("content")))
        if found is None:
            return ScriptedTurn(content="ok")
        a, b = float(found.group(1)), float(found.group(2))
        return ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": a, "b": b})])


@pytest.fixture
def model() -> Iterator[ScriptedModelServer]:
    with ScriptedModelServer(responder=Calculator(), latency_ms=30) as server:
        yield server


class Deployment:
    """A platform data dir, its server and workers as child processes, and a workspace clone."""

    def __init__(self, root: Path, model_url: str, *, rows: int) -> None:
        self.root = root
        self.data_dir = root / "platform"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen[str] | None = None
        self.workers: list[subprocess.Popen[str]] = []
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS", "OPENAI"))}
        self.env |= {"HOME": str(root / "home"), "NO_COLOR": "1"}
        self.bare = root / "git" / "acme" / "calc.git"
        self.bare.parent.mkdir(parents=True)
        git(root, "init", "-q", "--bare", "-b", "main", str(self.bare))
        self.clone = self._workspace(model_url, rows)
        self.secrets = root / "run.env"
        self.secrets.write_text(f"OPENAI_API_KEY={SECRET}\n")
        self.admin("user", "create", "alice@example.com", "--name", "Alice")
        self.admin(
            "workspace", "create", "Calc", "--repo", "acme/calc", "--clone-url", str(self.bare)
        )
        self.admin("workspace", "add-member", "Calc", "alice@example.com", "--role", "owner")
        token = self.admin(
            "token", "create", "--email", "alice@example.com", "--platform-url", self.url
        )["token"]
        self.env |= {
            "OSMOSIS_PLATFORM_URL": self.url,
            "OSMOSIS_TOKEN": token,
            "OSMOSIS_TOKEN_PLATFORM_URL": self.url,
        }

    def _workspace(self, model_url: str, rows: int) -> Path:
        clone = self.root / "ws"
        clone.mkdir()
        git(clone, "init", "-q", "-b", "main")
        git(clone, "remote", "add", "origin", str(self.bare))
        for name in TEMPLATES:
            apply_template(name, clone)
            config = clone / "configs" / "eval" / f"{name}.toml"
            text = config.read_text().replace('dataset = "multiply"', 'dataset = "calc"')
            text = text.replace("[evaluation]\n", f"[evaluation]\nlimit = {rows}\n", 1)
            text = text.replace("[secrets]", f'[env]\nOPENAI_BASE_URL = "{model_url}"\n\n[secrets]')
            config.write_text(text)
        source = (clone / "data" / "multiply.jsonl").read_text().splitlines()
        (clone / "data" / "calc.jsonl").write_text(
            "".join(source[i % len(source)] + "\n" for i in range(max(rows, 4)))
        )
        git(clone, "add", "-A")
        git(clone, "commit", "-q", "-m", "multiply templates")
        git(clone, "push", "-q", "-u", "origin", "main")
        return clone

    def admin(self, *args: str) -> dict[str, Any]:
        return self.cli("platform", *args, "--data-dir", str(self.data_dir), cwd=self.root)

    def cli(self, *args: str, cwd: Path | None = None, check: bool = True) -> dict[str, Any]:
        done = subprocess.run(
            [*OSMOSIS, "--json", *args],
            cwd=cwd or self.clone,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert SECRET not in done.stdout + done.stderr
        if check:
            assert done.returncode == 0, (args, done.stderr[-4000:])
        text = done.stdout if done.returncode == 0 else done.stderr
        return json.loads(text.strip().splitlines()[-1]) if text.strip() else {}

    def serve(self, *, workers: int) -> None:
        command = [
            *OSMOSIS,
            "platform",
            "serve",
            "--data-dir",
            str(self.data_dir),
            "--single-tenant",
        ]
        command += ["--port", str(self.port), "--workers", str(workers), "--log-level", "warning"]
        log = (self.root / "serve.log").open("a")
        self.server = subprocess.Popen(command, env=self.env, stdout=log, stderr=log, text=True)
        wait_until_healthy(self.server, self.url, (self.root / "serve.log").read_text)

    def start_worker(self) -> subprocess.Popen[str]:
        command = [
            *OSMOSIS,
            "platform",
            "worker",
            "--data-dir",
            str(self.data_dir),
            "--single-tenant",
        ]
        log = (self.root / f"worker-{len(self.workers)}.log").open("w")
        worker = subprocess.Popen(command, env=self.env, stdout=log, stderr=log, text=True)
        self.workers.append(worker)
        return worker

    def samples(self, run_id: str) -> list[tuple[int, int, str]]:
        with sqlite3.connect(self.data_dir / "platform.db") as db:
            query = "SELECT row_index, run_index, status FROM run_samples WHERE run_id = ?"
            return sorted(db.execute(query, (run_id,)).fetchall())

    def wait_run(self, name: str, *, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.cli("eval", "info", name)["data"]
            run = info.get("eval_run", info)
            if run["status"] in ("finished", "failed", "stopped"):
                return info
            assert time.monotonic() < deadline, f"run {name} still {run['status']}"
            time.sleep(0.5)

    def close(self) -> None:
        for process in [*self.workers, self.server]:
            if process is not None and process.poll() is None:
                process.send_signal(signal.SIGTERM)
        for process in [*self.workers, self.server]:
            if process is not None:
                try:
                    process.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    process.kill()
                    process.wait()


@pytest.fixture
def deployment(tmp_path, model, request) -> Iterator[Deployment]:
    rows = getattr(request, "param", 8)
    made = Deployment(tmp_path, model.base_url, rows=rows)
    yield made
    made.close()


def _status(info: dict[str, Any]) -> str:
    return info.get("eval_run", info)["status"]


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


@pytest.mark.timeout(600)
def test_submitted_evals_of_both_templates_pass_and_download(deployment: Deployment):
    deployment.serve(workers=1)
    deployment.cli("dataset", "upload", "data/calc.jsonl", "-y")
    names = []
    for template in TEMPLATES:
        submitted = deployment.cli(
            "eval", "submit", f"configs/eval/{template}.toml", "-y",
            "--secrets-file", str(deployment.secrets),
        )  # fmt: skip
        names.append(submitted["resource"]["name"])
    for name in names:
        info = deployment.wait_run(name)
        assert _status(info) == "finished", info
        results = info.get("results") or info.get("eval_run", {}).get("results") or {}
        assert results.get("pass_rate") == 1.0, info
    for name in names:
        target = deployment.root / "downloads" / name
        done = deployment.cli("eval", "download", name, "-o", str(target), "-y")
        run_dir = Path(done["resource"]["output_path"])
        assert run_dir == target
        trajectories = sorted((run_dir / "trajectories").glob("row_*_run_*.json"))
        assert len(trajectories) == 8
        for path in trajectories:
            assert json.loads(path.read_text())["steps"]
        assert json.loads((run_dir / "metrics.json").read_text())["summary"]["pass_rate"] == 1.0
    stored = b"".join(p.read_bytes() for p in deployment.data_dir.rglob("*") if p.is_file())
    assert SECRET.encode() not in stored


@pytest.mark.timeout(600)
@pytest.mark.parametrize("deployment", [40], indirect=True)
def test_kill_9_of_a_worker_mid_eval_resumes_with_exactly_one_result_per_item(
    deployment: Deployment, model: ScriptedModelServer
):
    model.latency_ms = 150  # type: ignore[attr-defined]
    deployment.serve(workers=0)
    deployment.cli("dataset", "upload", "data/calc.jsonl", "-y")
    first = deployment.start_worker()
    name = deployment.cli(
        "eval", "submit", "configs/eval/multiply-local-openai.toml", "-y",
        "--secrets-file", str(deployment.secrets),
    )["resource"]["name"]  # fmt: skip
    run_id = deployment.cli("eval", "info", name)["data"]
    run_id = run_id.get("eval_run", run_id)["id"]
    deadline = time.monotonic() + 180
    while len(deployment.samples(run_id)) < 3:
        assert time.monotonic() < deadline, "no sample stored in 180 s"
        assert first.poll() is None, (deployment.root / "worker-0.log").read_text()
        time.sleep(0.1)
    import psutil

    tree = [p.pid for p in psutil.Process(first.pid).children(recursive=True)]
    first.send_signal(signal.SIGKILL)
    first.wait()
    deadline = time.monotonic() + 20
    while any(_alive(pid) and psutil.Process(pid).status() != "zombie" for pid in tree):
        assert time.monotonic() < deadline, "the dead worker's processes outlived it"
        time.sleep(0.1)
    stored_before = deployment.samples(run_id)
    deployment.start_worker()
    info = deployment.wait_run(name)
    assert _status(info) == "finished", info
    samples = deployment.samples(run_id)
    keys = [(row, run) for row, run, _ in samples]
    assert len(keys) == len(set(keys)) == 40
    assert all(status == "success" for _, _, status in samples)
    assert set(stored_before) <= set(samples)
    logs = deployment.cli("eval", "logs", name, "--limit", "200")["items"]
    assert any("Resumed on worker" in entry["message"] for entry in logs)


@pytest.mark.timeout(600)
@pytest.mark.parametrize("deployment", [30], indirect=True)
def test_kill_9_of_the_server_loses_nothing_and_the_worker_carries_on(
    deployment: Deployment, model: ScriptedModelServer
):
    model.latency_ms = 150  # type: ignore[attr-defined]
    deployment.serve(workers=0)
    deployment.cli("dataset", "upload", "data/calc.jsonl", "-y")
    deployment.start_worker()
    name = deployment.cli(
        "eval", "submit", "configs/eval/multiply-local-openai.toml", "-y",
        "--secrets-file", str(deployment.secrets),
    )["resource"]["name"]  # fmt: skip
    info = deployment.cli("eval", "info", name)["data"]
    run_id = info.get("eval_run", info)["id"]
    deadline = time.monotonic() + 180
    while len(deployment.samples(run_id)) < 3:
        assert time.monotonic() < deadline, "no sample stored in 180 s"
        time.sleep(0.1)
    assert deployment.server is not None
    deployment.server.send_signal(signal.SIGKILL)
    deployment.server.wait()
    before = deployment.samples(run_id)
    deadline = time.monotonic() + 300
    while len(deployment.samples(run_id)) < 30:  # the worker needs no server
        assert time.monotonic() < deadline, "the worker stopped with the server"
        time.sleep(0.2)
    deployment.serve(workers=0)
    info = deployment.wait_run(name, timeout=120)
    assert _status(info) == "finished"
    assert set(before) <= set(deployment.samples(run_id))
    assert len(deployment.samples(run_id)) == 30
    listed = deployment.cli("dataset", "list")["items"]
    assert [d["file_name"] for d in listed] == ["calc"]
    back = deployment.root / "back.jsonl"
    deployment.cli("dataset", "download", "calc", "-o", str(back))
    assert back.read_bytes() == (deployment.clone / "data" / "calc.jsonl").read_bytes()


LEARNING_TRAINING = """\
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "tiny"
dataset = "copy-digit"

[training]
lr = 1e-3
total_epochs = 32
n_samples_per_prompt = 8
rollout_batch_size = 8
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
loss_type = "dapo"
kl_coef = 0.0
seed = 0

[checkpoints]
eval_interval = 40
checkpoint_save_freq = 20

[warmup]
sft_steps = 100
lr = 1e-3
batch_size = 8

[secrets]
required = []
"""


@pytest.mark.timeout(1200)
def test_a_submitted_training_learns_and_its_checkpoint_serves_an_eval_run(
    tmp_path, model: ScriptedModelServer
):
    pytest.importorskip("trl", reason="needs the 'train' extra")
    from osmosis_ai.train.demo import setup_workspace
    from osmosis_ai.train.tiny_model import build_tiny_model

    made = Deployment(tmp_path, model.base_url, rows=4)
    try:
        setup_workspace(made.clone)
        (made.clone / "configs" / "training" / "copy-digit.toml").write_text(LEARNING_TRAINING)
        git(made.clone, "add", "-A")
        git(made.clone, "commit", "-q", "-m", "copy-digit")
        git(made.clone, "push", "-q", "origin", "main")
        tiny = build_tiny_model(tmp_path / "tiny")
        made.admin("model", "add", "tiny", "--path", str(tiny))
        made.serve(workers=1)
        made.cli("dataset", "upload", "data/copy-digit.jsonl", "-y")
        # the template's own sections ([warmup], loss_type in [training]) submit as written
        name = made.cli("train", "submit", "configs/training/copy-digit.toml", "-y")["resource"][
            "name"
        ]
        deadline = time.monotonic() + 1000
        while True:
            info = made.cli("train", "info", name)
            run = info["data"].get("training_run", info["data"])
            if run["status"] not in ("pending", "queued", "running"):
                break
            assert time.monotonic() < deadline, f"training {name} still {run['status']}"
            time.sleep(1)
        assert run["status"] == "finished", made.cli("train", "logs", name, "--limit", "200")
        export = info["data"]["metrics"]
        rewards = next(m for m in export["metrics"] if m["key"] == "training_reward")["data"]
        values = [point["value"] for point in rewards]
        assert len(values) == 40
        first, last = sum(values[:10]) / 10, sum(values[-10:]) / 10
        print(f"managed training reward: first 10 steps {first:.3f}, last 10 {last:.3f}")
        assert last >= first + 0.15, (first, last)
        checkpoints = [c["checkpoint_step"] for c in info["data"]["checkpoints"]]
        assert checkpoints == [20, 40]

        lora = made.cli("model", "list", "--type", "lora")["items"]
        trained = next(m for m in lora if m["checkpoint_step"] == 40)
        assert trained["training_run_name"] == name
        deployed = made.cli("model", "deploy", trained["model_name"])
        assert deployed["resource"]["status"] == "active"
        again = made.cli("model", "deploy", trained["model_name"])  # idempotent
        assert again["resource"]["status"] == "active"

        config = made.clone / "configs" / "eval" / "copy-deployed.toml"
        config.write_text(
            '[experiment]\nrollout = "copy-digit"\nentrypoint = "main.py"\n'
            f'model_path = "openai/{trained["model_name"]}"\ndataset = "copy-digit"\n\n'
            "[evaluation]\nbatch_size = 4\n\n[secrets]\nrequired = []\n"
        )
        local = dict(made.env)
        local |= {"OPENAI_BASE_URL": f"{made.url}/v1", "OPENAI_API_KEY": made.env["OSMOSIS_TOKEN"]}
        done = subprocess.run(
            [*OSMOSIS, "--json", "eval", "run", str(config), "--dataset-file",
             "data/copy-digit.jsonl", "-y", "--name", "deployed"],
            cwd=made.clone, env=local, capture_output=True, text=True, timeout=600, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr[-4000:]
        result = json.loads(done.stdout)["resource"]
        assert result["succeeded"] == 10 and result["failed"] == 0
        print(f"eval of the deployed checkpoint: pass rate {result['metrics']['pass_rate']}")
        assert made.cli("model", "undeploy", trained["model_name"])["resource"]["status"] == (
            "inactive"
        )
    finally:
        made.close()
