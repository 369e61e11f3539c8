"""Compatibility tier: the original osmosis-ai CLI (0.3.8), unmodified, drives managed runs
on a real ``osmosis platform serve --workers 1`` (child process, SQLite data dir, set up
with the admin commands), and the runs really run:

* ``eval submit`` of both bundled multiply templates (``OPENAI_API_KEY`` given with the
  original's ``--secrets-file``, ``OPENAI_BASE_URL`` in ``[env]`` pointing at the scripted
  calculator model): the runs finish, the original's ``eval info`` shows pass rate 1.0,
  ``eval download`` brings back every trajectory, ``eval list`` and ``eval logs`` answer;
* ``train submit`` of the copy-digit template on the tiny model (registered with ``osmosis
  platform model add``), the trainer's own settings under ``[advanced]`` so the original
  accepts the config: the run finishes, the original's ``train info`` shows a rising
  training reward and the checkpoints, ``train logs`` answers; the original's ``model
  list`` / ``info`` / ``deploy`` / ``undeploy`` work on the trained checkpoint, and while
  it is deployed our ``osmosis eval run`` reaches it as ``openai/<name>`` through the
  platform's ``/v1``.

As in tests/test_platform_compat_runs.py, the workspace clone keeps
``https://github.com/acme/team.git`` as its origin (the original takes a workspace's
identity only from github.com) and pushes to the bare repository the platform fetches.

Needs ``OSMOSIS_COMPAT_PYTHON``: an interpreter with the original build installed (its
``osmosis`` script next to it).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text
from osmosis_ai.testing.serving import free_port
from platform_support import git, run_original, wait_until_healthy

COMPAT_PYTHON = os.environ.get("OSMOSIS_COMPAT_PYTHON", "")
OURS = [sys.executable, "-m", "osmosis_ai.cli.main"]
ORIGIN = "https://github.com/acme/team.git"
SECRET = "sk-compat-managed-5e81a0"
TEMPLATES = {"multiply-local-openai": "agents", "multiply-local-strands": "strands"}
EVAL_ROWS = 6
OPERANDS = re.compile(r"val1 = (-?[\d.]+)\s+val2 = (-?[\d.]+)")
TERMINAL = ("finished", "failed", "stopped", "crashed")
LEARNING_WINDOW = 10
LEARNING_MARGIN = 0.15

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not COMPAT_PYTHON,
        reason="compat tier: set OSMOSIS_COMPAT_PYTHON to an interpreter with the original "
        "osmosis-ai 0.3.8 installed",
    ),
]

# The tiny model's learning run of tests/test_platform_training_runs.py, as a TOML config the
# original accepts: its sections take only their own keys, [advanced] takes anything.
LEARNING_CONFIG = """\
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

[sampling]
rollout_temperature = 1.0
rollout_top_p = 1.0

[checkpoints]
eval_interval = 40
checkpoint_save_freq = 20

[advanced]
loss_type = "dapo"
kl_coef = 0.0
seed = 0

[advanced.warmup]
sft_steps = 100
lr = 1e-3
batch_size = 8

[advanced.lora]
enabled = false
"""


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


class Platform:
    """``osmosis platform serve --workers 1`` on a free loopback port, a workspace ``team``
    whose clone pushes to a bare repository by path, and the original CLI in that clone."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.original = Path(COMPAT_PYTHON).parent / "osmosis"
        assert self.original.exists(), f"no osmosis script next to {COMPAT_PYTHON}"
        self.data_dir = root / "platform"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None
        self.log = root / "serve.log"
        self.bare = root / "team.git"
        git(root, "init", "-q", "--bare", "-b", "main", str(self.bare))
        self.clone = root / "ws"
        self.clone.mkdir()
        git(self.clone, "init", "-q", "-b", "main")
        git(self.clone, "remote", "add", "origin", ORIGIN)
        self.base_env = {
            k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS", "OPENAI"))
        }
        self.base_env |= {"HOME": str(root / "home"), "NO_COLOR": "1"}
        self.admin("user", "create", "alice@example.com", "--name", "Alice")
        self.admin(
            "workspace", "create", "team", "--repo", "acme/team", "--clone-url", str(self.bare)
        )
        self.admin("workspace", "add-member", "team", "alice@example.com", "--role", "owner")
        self.token: str = self.admin(
            "token", "create", "--email", "alice@example.com", "--platform-url", self.url
        )["token"]
        self.env = self.base_env | {
            "OSMOSIS_PLATFORM_URL": self.url,
            "OSMOSIS_TOKEN": self.token,
            "OSMOSIS_TOKEN_PLATFORM_URL": self.url,
            "OSMOSIS_ALLOW_INSECURE_PLATFORM_URL": "1",
        }

    def admin(self, *args: str) -> dict[str, Any]:
        done = subprocess.run(
            [*OURS, "--json", "platform", *args, "--data-dir", str(self.data_dir)],
            env=self.base_env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def push(self) -> None:
        git(self.clone, "add", "-A")
        git(self.clone, "commit", "-q", "-m", "workspace")
        git(self.clone, "push", "-q", str(self.bare), "main")

    def serve(self) -> None:
        command = [*OURS, "platform", "serve", "--data-dir", str(self.data_dir)]
        command += ["--port", str(self.port), "--workers", "1", "--log-level", "warning"]
        command += ["--single-tenant"]  # not about isolation: runs where bubblewrap is missing
        with self.log.open("w") as sink:
            self.process = subprocess.Popen(
                command, env=self.base_env, stdout=sink, stderr=subprocess.STDOUT, text=True
            )
        wait_until_healthy(self.process, self.url, self.log.read_text)

    def run(self, *args: str) -> dict[str, Any]:
        """The original CLI's ``--json`` answer, with its exit code as ``rc``."""
        return run_original(self.original, self.clone, self.env, SECRET, *args)

    def ok(self, *args: str) -> dict[str, Any]:
        answer = self.run(*args)
        assert answer["rc"] == 0, (args, answer, self.log.read_text()[-4000:])
        return answer

    def wait(self, kind: str, name: str, *, timeout: float) -> dict[str, Any]:
        """The original's ``<kind> info`` once the run has ended."""
        key = "eval_run" if kind == "eval" else "training_run"
        deadline = time.monotonic() + timeout
        while True:
            data = self.ok(kind, "info", name)["data"]
            if data[key]["status"] in TERMINAL:
                return data
            assert time.monotonic() < deadline, f"{kind} run {name} still {data[key]['status']}"
            time.sleep(1.0)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture
def platform(tmp_path: Path) -> Iterator[Platform]:
    made = Platform(tmp_path)
    yield made
    made.stop()


def ours(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*OURS, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600, check=False
    )


def mean(values: list[float]) -> float:
    return sum(values) / len(values)


@pytest.mark.timeout(900)
@pytest.mark.skipif(
    any(importlib.util.find_spec(module) is None for module in TEMPLATES.values()),
    reason="the templates' agent frameworks (openai-agents, strands) are not installed",
)
def test_the_original_cli_runs_managed_evals_of_both_multiply_templates(platform: Platform):
    from osmosis_ai.workspace.templates import apply_template

    with ScriptedModelServer(responder=Calculator(), latency_ms=20) as model:
        clone = platform.clone
        for template in TEMPLATES:
            apply_template(template, clone)
            config = clone / "configs" / "eval" / f"{template}.toml"
            text = config.read_text().replace('dataset = "multiply"', 'dataset = "calc"')
            text = text.replace("[evaluation]\n", f"[evaluation]\nlimit = {EVAL_ROWS}\n", 1)
            text = text.replace(
                "[secrets]", f'[env]\nOPENAI_BASE_URL = "{model.base_url}"\n\n[secrets]'
            )
            config.write_text(text)
        source = (clone / "data" / "multiply.jsonl").read_text().splitlines()
        (clone / "data" / "calc.jsonl").write_text(
            "".join(source[i % len(source)] + "\n" for i in range(EVAL_ROWS))
        )
        platform.push()
        secrets = platform.root / "run.env"
        secrets.write_text(f"OPENAI_API_KEY={SECRET}\n")
        platform.serve()

        platform.ok("dataset", "upload", "data/calc.jsonl", "-y")
        names: dict[str, str] = {}
        for template in TEMPLATES:
            submitted = platform.ok(
                "eval", "submit", f"configs/eval/{template}.toml", "-y",
                "--secrets-file", str(secrets),
            )  # fmt: skip
            names[template] = submitted["resource"]["name"]

        for template, name in names.items():
            data = platform.wait("eval", name, timeout=600)
            assert data["eval_run"]["status"] == "finished", (template, data)
            assert data["summary"]["pass_rate"] == 1.0, data["summary"]
            assert data["results"]["pass_rate"] == 1.0
            assert data["summary"]["passed"] == EVAL_ROWS and data["summary"]["failed"] == 0
            # what the original shows beside the pass rate: reward, progress and tokens
            assert data["summary"]["avg_reward"] == 1.0
            assert data["summary"]["progress"] == {
                "completed": EVAL_ROWS,
                "total": EVAL_ROWS,
                "unit": "samples",
            }
            assert data["summary"]["total_tokens"] > 0
            assert data["metrics_available"], data["metrics_error"]
            assert data["env_config"] == {"OPENAI_BASE_URL": model.base_url}

    listed = platform.ok("eval", "list")["items"]
    assert sorted((r["name"], r["status"]) for r in listed) == sorted(
        (name, "finished") for name in names.values()
    )
    assert all(r["summary"]["pass_rate"] == r["summary"]["avg_reward"] == 1.0 for r in listed)

    for template, name in names.items():
        logs = platform.ok("eval", "logs", name, "--limit", "200")["items"]
        messages = [entry["message"] for entry in logs]
        assert messages[0].startswith(f"Submitted: rollout {template}"), messages
        assert len(messages) > 1, messages

        target = platform.root / "downloads" / name
        got = platform.ok("eval", "download", name, "-o", str(target), "-y")
        resource = got["resource"]
        assert got["status"] == "success" and resource["files_failed"] == []
        trajectories = sorted(Path(resource["output_path"]).rglob("row_*_run_*.json"))
        assert len(trajectories) == EVAL_ROWS, resource
        for path in trajectories:
            assert json.loads(path.read_text())["steps"], path
        metrics = next(Path(resource["output_path"]).rglob("metrics.json"))
        assert json.loads(metrics.read_text())["summary"]["pass_rate"] == 1.0

    stored = b"".join(p.read_bytes() for p in platform.data_dir.rglob("*") if p.is_file())
    assert SECRET.encode() not in stored + platform.log.read_bytes()


@pytest.mark.timeout(1500)  # 60 warm-up and 40 GRPO steps, then a CPU model server
def test_the_original_cli_trains_deploys_and_undeploys_a_model(platform: Platform):
    pytest.importorskip("torch", reason="needs the 'train' extra")
    pytest.importorskip("trl", reason="needs the 'train' extra")
    from osmosis_ai.train.demo import setup_workspace
    from osmosis_ai.train.tiny_model import build_tiny_model

    tiny = build_tiny_model(platform.root / "models" / "tiny")
    platform.admin("model", "add", "tiny", "--path", str(tiny))
    clone = platform.clone
    setup_workspace(clone)
    (clone / "configs" / "training" / "copy-digit.toml").write_text(LEARNING_CONFIG)
    platform.push()
    platform.serve()

    platform.ok("dataset", "upload", "data/copy-digit.jsonl", "-y")
    submitted = platform.ok("train", "submit", "configs/training/copy-digit.toml", "-y")
    name = submitted["resource"]["name"]
    data = platform.wait("train", name, timeout=1200)
    run = data["training_run"]
    if run["status"] != "finished":
        logs = platform.ok("train", "logs", name, "--limit", "200")["items"]
        pytest.fail(f"run {run['status']}: {[entry['message'] for entry in logs][-12:]}")
    assert run["model_name"] == "tiny" and run["examples_processed_count"] == 320

    assert data["metrics_available"], data["metrics_error"]
    series = {m["key"]: m for m in data["metrics"]["metrics"]}
    rewards = [point["value"] for point in series["training_reward"]["data"]]
    assert len(rewards) == 40
    first, last = mean(rewards[:LEARNING_WINDOW]), mean(rewards[-LEARNING_WINDOW:])
    assert last >= first + LEARNING_MARGIN, f"no learning: {first:.3f} -> {last:.3f}"
    assert data["metrics"]["summary"]["training_reward"]["latest"] == rewards[-1]
    checkpoints = data["checkpoints"]
    assert [c["checkpoint_step"] for c in checkpoints] == [20, 40], checkpoints
    model_name = f"{name}-step-40"
    assert [c["checkpoint_name"] for c in checkpoints] == [f"{name}-step-20", model_name]

    messages = [item["message"] for item in platform.ok("train", "logs", name)["items"]]
    assert any(m.startswith("Finished: 40 of 40 steps") for m in messages), messages

    listed = platform.ok("model", "list")
    assert [m["model_name"] for m in listed["base_models"]["items"]] == ["tiny"]
    loras = {m["model_name"]: m for m in listed["lora_models"]["items"]}
    assert set(loras) == {f"{name}-step-20", model_name}
    assert loras[model_name]["base_model"] == "tiny"
    assert loras[model_name]["reward"] == pytest.approx(rewards[-1])
    assert listed["active_deployments"] == 0
    info = platform.ok("model", "info", model_name)["data"]["lora_model"]
    assert info["training_run_name"] == name and info["checkpoint_step"] == 40
    assert info["deployment_status"] != "active"

    deployed = platform.ok("model", "deploy", model_name)
    assert deployed["resource"]["status"] == "active", deployed
    serving = platform.ok("model", "info", model_name)["data"]["lora_model"]
    assert serving["deployment_status"] == "active" and serving["deployed_by"]
    assert serving["inference_model"] == model_name

    config = clone / "configs" / "eval" / "copy-digit-served.toml"
    config.write_text(
        f'[experiment]\nrollout = "copy-digit"\nentrypoint = "main.py"\n'
        f'model_path = "openai/{model_name}"\ndataset = "copy-digit"\n\n'
        "[evaluation]\nlimit = 4\nn = 1\nbatch_size = 4\nagent_workflow_timeout_s = 300\n"
        "grader_timeout_s = 30\n\n[secrets]\nrequired = []\n"
    )
    env = platform.base_env | {
        "OPENAI_BASE_URL": f"{platform.url}/v1",
        "OPENAI_API_KEY": platform.token,
    }
    done = ours(clone, env, "eval", "run", str(config.relative_to(clone)), "--json", "-y")
    assert platform.token not in done.stdout + done.stderr
    assert done.stdout.strip(), done.stderr[-4000:]
    envelope = json.loads(done.stdout.strip().splitlines()[-1])
    assert envelope["status"] in ("success", "partial"), envelope
    assert envelope["resource"]["metrics"]["total_samples"] == 4, envelope

    undeployed = platform.ok("model", "undeploy", model_name)
    assert undeployed["resource"]["status"] == "inactive", undeployed
    after = platform.ok("model", "info", model_name)["data"]["lora_model"]
    assert after["deployment_status"] == "inactive"
