"""``osmosis eval run`` end to end: the CLI as a subprocess, the quickstart multiply rollout and
the scripted model in this process, answering some rows right, some wrong, some with an error."""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path
from typing import Any

import psutil
import pytest

from cli_support import check_golden
from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "rollouts" / "multiply"
CONFIG = """\
[experiment]
rollout = "{rollout}"
entrypoint = "main.py"
model_path = "openai/scripted"
dataset = "multiply"

[evaluation]
{evaluation}

[secrets]
required = []
"""


class Model:
    """The scripted model: ``plan[a]`` says how to answer the row whose first factor is ``a``:
    ``right``, ``wrong``, ``error`` (HTTP 500: the workflow fails), or an int ``p`` (the first
    ``p`` calls for that row are right, later ones wrong). With ``answer_only=n`` the calls
    after the first ``n`` wait until :attr:`release` is set."""

    def __init__(
        self, plan: dict[int, Any], latency_ms: float = 0.0, answer_only: int | None = None
    ) -> None:
        self.plan = plan
        self.latency_ms = latency_ms
        self.answer_only = answer_only
        self.release = threading.Event()
        self.calls: Counter[int] = Counter()
        self.lock = threading.Lock()
        self.server = ScriptedModelServer(responder=self.reply)

    async def reply(self, request: ChatRequest) -> ScriptedTurn:
        text = next((m["content"] for m in request.messages if m.get("role") == "user"), "")
        found = re.findall(r"= (-?\d+)", str(text))
        if len(found) < 2:
            return ScriptedTurn(content="hello")  # the preflight
        a, b = int(found[0]), int(found[1])
        with self.lock:
            seen = self.calls[a]
            self.calls[a] += 1
            answered = self.calls.total()
        if self.answer_only is not None and answered > self.answer_only:
            # A thread's event, polled so the server can still stop meanwhile.
            while not self.release.is_set():  # noqa: ASYNC110
                await asyncio.sleep(0.01)
        how = self.plan.get(a, "right")
        if how == "error":
            return ScriptedTurn(status_code=500, error="scripted outage")
        right = how == "right" or (isinstance(how, int) and seen < how)
        return ScriptedTurn(
            content=f"#### {a * b if right else a * b + 1}", latency_ms=self.latency_ms
        )


def make_workspace(root: Path, rows: int = 6, evaluation: str = "") -> Path:
    """rollouts/multiply (the quickstart rollout), configs/eval/multiply.toml and
    data/multiply.jsonl whose row ``i`` asks for ``(i + 2) * (i + 3)``."""
    shutil.copytree(
        EXAMPLE, root / "rollouts" / "multiply", ignore=shutil.ignore_patterns("__pycache__")
    )
    (root / "configs" / "eval").mkdir(parents=True)
    (root / "data").mkdir()
    (root / "configs" / "eval" / "multiply.toml").write_text(
        CONFIG.format(rollout="multiply", evaluation=evaluation)
    )
    write_rows(root / "data" / "multiply.jsonl", rows)
    return root


def enter_workspace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, rows: int = 6) -> Path:
    """:func:`make_workspace` at ``tmp_path/ws``, made the current directory for a run in this
    process, with no OpenAI variables and an empty env file: only what a test sets reaches it."""
    root = make_workspace(tmp_path / "ws", rows=rows)
    monkeypatch.chdir(root)
    for name in ("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_API_BASE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OSMOSIS_ENV_FILE", str(tmp_path / "none.env"))
    (tmp_path / "none.env").write_text("")
    return root


def write_rows(path: Path, count: int) -> None:
    lines = [
        json.dumps(
            {
                "system_prompt": "Multiply.",
                "user_prompt": f"val1 = {i + 2}\nval2 = {i + 3}",
                "ground_truth": str((i + 2) * (i + 3)),
            }
        )
        for i in range(count)
    ]
    path.write_text("\n".join(lines) + "\n")


def cli(workspace: Path, model: Model, *args: str, wait: bool = True, **env: str) -> Any:
    environment = {k: v for k, v in os.environ.items() if not k.startswith("OPENAI_")}
    environment |= {"OPENAI_BASE_URL": model.server.base_url, "NO_COLOR": "1", **env}
    command = [sys.executable, "-m", "osmosis_ai.cli.main", "eval", "run", *args]
    if not wait:
        return subprocess.Popen(command, cwd=workspace, env=environment, stdout=subprocess.PIPE)
    return subprocess.run(
        command,
        cwd=workspace,
        env=environment,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def envelope(done: Any) -> dict[str, Any]:
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout)


def lines(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


@pytest.fixture
def workspace(tmp_path: Path) -> Path:
    return make_workspace(tmp_path / "ws")


def test_run_retry_failed_fresh_and_rows(workspace: Path, tmp_path: Path):
    # rows 0..5 ask a = 2..7: right, wrong, right, wrong, error, right
    model = Model({2: "right", 3: "wrong", 4: "right", 5: "wrong", 6: "error", 7: "right"})
    with model.server:
        done = cli(workspace, model, "configs/eval/multiply.toml", "-y", "--name", "demo")
        assert done.returncode == 0, done.stderr
        out = done.stdout
        assert "→ demo: 6 of 6 work items pending" in out
        assert "→ running 6 work items, up to 6 in flight (polling generation" in out
        assert re.search(
            r"row 4 \(source 4\) run 0: failed error_type=\S+ -> .+/rollout_trials/", out
        )
        assert "row 0 (source 0) run 0: success reward=1" in out
        assert "Pass Rate" in out and "50.0% (3/6, threshold 1)" in out

        run = workspace / ".osmosis" / "evals" / "demo"
        summary = json.loads((run / "metrics.json").read_text())["summary"]
        assert summary | {"reward_stats": None} == {
            "total_samples": 6,
            "completed_samples": 6,
            "graded": 5,
            "passed": 3,
            "failed": 1,
            "skipped": 0,
            "pass_rate": 0.5,
            "pass_threshold": 1.0,
            "tokens_used": summary["tokens_used"],
            "reward_stats": None,
        }
        assert summary["tokens_used"] > 0
        assert summary["reward_stats"] == {
            "mean": 0.6,
            "median": 1.0,
            "std": pytest.approx(0.4899, abs=1e-4),
            "min": 0.0,
            "max": 1.0,
        }
        index = lines(run / "index.jsonl")
        assert [(e["row_index"], e["status"]) for e in index] == [
            (0, "success"),
            (1, "success"),
            (2, "success"),
            (3, "success"),
            (4, "failed"),
            (5, "success"),
        ]
        assert (run / "summary.jsonl").read_bytes() == (run / "index.jsonl").read_bytes()
        assert index[0]["trajectory_filename"] == "trajectory.json"
        assert (
            json.loads((run / "trajectories" / "row_0_run_0.json").read_text())["session_id"]
            == index[0]["rollout_id"]
        )
        assert json.loads((run / "progress.json").read_text()) == {
            "total_runs": 6,
            "sampled_rows": 6,
            "total_dataset_rows": 6,
        }
        assert (run / "logs.txt").stat().st_mode & 0o777 == 0o600
        assert not (run / "server.json").exists()
        assert model.calls[6] == 1

        # --retry-failed re-runs only the failed item (row 4), which now succeeds.
        model.plan[6] = "right"
        done = cli(
            workspace,
            model,
            "configs/eval/multiply.toml",
            "-y",
            "--name",
            "demo",
            "--retry-failed",
            "--json",
        )
        result = envelope(done)["resource"]
        assert (result["dispatched"], result["resumed"], result["failed"]) == (1, 5, 0)
        assert result["metrics"]["passed"] == 4
        assert model.calls[6] == 2 and sum(model.calls.values()) == 7
        assert len(lines(run / "events.jsonl")) == 7 and len(lines(run / "index.jsonl")) == 6

        # Other rows under the same name: the input lock refuses a resume...
        rows = ("configs/eval/multiply.toml", "-y", "--name", "demo", "--rows", "1,3-4", "--json")
        done = cli(workspace, model, *rows)
        error = json.loads(done.stderr.splitlines()[-1])["error"]
        assert (done.returncode, error["code"]) == (1, "CONFLICT")
        assert error["details"]["changed_keys"] == ["dataset"] and "--fresh" in error["message"]
        # ...--fresh archives the run (nothing deleted) and starts over; --rows picks source
        # rows, and row_index is the position in the selection.
        done = cli(workspace, model, *rows, "--fresh")
        assert done.returncode == 0, done.stderr
        archives = [p for p in run.parent.iterdir() if p.name.startswith("demo.archive-")]
        assert len(archives) == 1 and len(lines(archives[0] / "events.jsonl")) == 7
        journal = lines(run / "events.jsonl")
        assert sorted((r["row_index"], r["source_row_index"]) for r in journal) == [
            (0, 1),
            (1, 3),
            (2, 4),
        ]
        check_golden("eval_run_rows", normalise_run(done, tmp_path))


def normalise_run(done: Any, tmp_path: Path) -> dict[str, Any]:
    data = envelope(done)
    resource = data["resource"]
    resource["local_run_id"] = "<RUN_ID>"
    resource["duration_ms"] = "<DURATION>"
    text = json.dumps(data).replace(str(tmp_path), "<TMP>")
    return {
        "exit_code": done.returncode,
        "stdout": json.loads(text),
        "stderr": [json.loads(line) for line in done.stderr.splitlines() if line.strip()],
    }


def test_pass_at_k_in_the_callback_generation(workspace: Path):
    """n = 4 runs per row; rows pass 4, 2, 1 and 0 times (rows ask a = 2, 3, 4, 5)."""
    (workspace / "configs" / "eval" / "passk.toml").write_text(
        CONFIG.format(rollout="multiply", evaluation="n = 4")
    )
    write_rows(workspace / "data" / "four.jsonl", 4)
    model = Model({2: 4, 3: 2, 4: 1, 5: 0})
    with model.server:
        done = cli(
            workspace,
            model,
            "configs/eval/passk.toml",
            "-y",
            "--json",
            "--name",
            "pk",
            "--dataset-file",
            "data/four.jsonl",
            "--generation",
            "callback",
            "--max-in-flight",
            "8",
        )
    resource = envelope(done)["resource"]
    assert done.returncode == 0 and resource["dataset_source"] == "explicit"
    metrics = resource["metrics"]
    assert (metrics["total_samples"], metrics["passed"], metrics["n_runs"]) == (16, 7, 4)
    assert metrics["pass_at_k"] == [
        {"k": 1, "value": pytest.approx(0.4375)},
        {"k": 2, "value": pytest.approx((1 + 5 / 6 + 0.5 + 0) / 4)},
        {"k": 4, "value": pytest.approx(0.75)},
    ]
    manifest = json.loads((workspace / ".osmosis" / "evals" / "pk" / "manifest.json").read_text())
    assert manifest["inputs"]["versions"]["rollout_protocol"] == "0.3"
    assert sorted(model.calls.values()) == [4, 4, 4, 4]


def test_kill_9_then_resume_reaps_the_orphan_and_loses_nothing(tmp_path: Path):
    workspace = make_workspace(tmp_path / "ws", rows=8)
    model = Model({}, answer_only=3)  # the run cannot get past its third row before the kill
    run = workspace / ".osmosis" / "evals" / "k9"
    with model.server:
        process = cli(
            workspace,
            model,
            "configs/eval/multiply.toml",
            "-y",
            "--json",
            "--name",
            "k9",
            "--max-in-flight",
            "2",
            wait=False,
        )
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not (run / "events.jsonl").exists() or len(lines(run / "events.jsonl")) < 2
        ):
            time.sleep(0.05)
        process.send_signal(signal.SIGKILL)
        process.wait()
        recorded = len(lines(run / "events.jsonl"))
        assert 2 <= recorded <= 3
        orphan = json.loads((run / "server.json").read_text())
        assert psutil.pid_exists(orphan["pid"])

        model.release.set()
        done = cli(
            workspace,
            model,
            "configs/eval/multiply.toml",
            "-y",
            "--json",
            "--name",
            "k9",
            "--max-in-flight",
            "4",
        )
    resource = envelope(done)["resource"]
    assert resource["resumed"] == recorded and resource["dispatched"] == 8 - recorded
    assert resource["succeeded"] == 8
    journal = lines(run / "events.jsonl")
    assert len(journal) == 8
    assert sorted((r["row_index"], r["run_index"]) for r in journal) == [(i, 0) for i in range(8)]
    assert [e["row_index"] for e in lines(run / "index.jsonl")] == list(range(8))
    assert "stopped the rollout server" in (run / "logs.txt").read_text()
    gone = (
        not psutil.pid_exists(orphan["pid"])
        or psutil.Process(orphan["pid"]).status() == psutil.STATUS_ZOMBIE
    )
    assert gone and not (run / "server.json").exists()
