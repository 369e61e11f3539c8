"""The Harbor multiply templates end to end, unmodified: ``osmosis template apply`` into a fresh
directory, then ``osmosis eval run`` (both as subprocesses) against a scripted model that
calls the ``multiply`` tool and answers ``#### <product>``. The workflow runs in the
no-network sandbox, the grader as the task's verifier; every row must pass."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from osmosis_ai.testing import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

FRAMEWORKS = {"multiply-harbor-openai": "agents", "multiply-harbor-strands": "strands"}
OPERANDS = re.compile(r"val1 = (-?[\d.]+)\s+val2 = (-?[\d.]+)")


class Calculator:
    """Calls ``multiply(a, b)`` on a row's prompt, then answers ``#### <tool result>``."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tool_calls = 0

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if results:
            product = float(content_text(results[-1].get("content")))
            return ScriptedTurn(content=f"The product is\n#### {product:.4f}")
        user = next((m for m in request.messages if m.get("role") == "user"), {})
        operands = OPERANDS.search(content_text(user.get("content")))
        if operands is None:
            return ScriptedTurn(content="ok")
        with self.lock:
            self.tool_calls += 1
        a, b = float(operands.group(1)), float(operands.group(2))
        return ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": a, "b": b})])


def osmosis(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_ai.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )


@pytest.mark.timeout(480)
@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_harbor_template_scores_full_marks(tmp_path: Path, name: str):
    if importlib.util.find_spec(FRAMEWORKS[name]) is None:
        pytest.skip(
            f"{FRAMEWORKS[name]!r} (the template's framework) is not installed here: Harbor "
            "0.26 needs mcp >= 2.3 and every strands-agents release mcp < 2.2, so the newest "
            "Harbor's tier leaves it out (`make test-harbor-oldest` runs this template)"
        )
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_"))
    }
    env["NO_COLOR"] = "1"
    applied = osmosis(workspace, "template", "apply", name, "--json", env=env)
    assert applied.returncode == 0, applied.stderr
    assert (workspace / f"rollouts/{name}/multiply_harbor_task/task.toml").is_file()
    model = Calculator()
    with ScriptedModelServer(responder=model) as server:
        env |= {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-template-secret-77"}
        done = osmosis(
            workspace,
            "eval",
            "run",
            f"configs/eval/{name}.toml",
            "--json",
            "-y",
            "--rows",
            "0-7",
            env=env,
        )
    assert done.stdout.strip(), done.stderr
    envelope = json.loads(done.stdout)
    resource = envelope["resource"]
    assert envelope["status"] == "success", resource.get("failed_rows")
    metrics = resource["metrics"]
    assert (metrics["total_samples"], metrics["passed"], metrics["failed"]) == (8, 8, 0)
    assert metrics["pass_rate"] == 1.0
    assert model.tool_calls == 8  # the tool ran inside the sandbox in every rollout
    # Every rollout kept its Harbor trial logs in the run folder, with the key redacted.
    trials = Path(resource["output_path"]) / "rollout_trials"
    kept = sorted(trials.glob("*/harbor/verifier/reward.json"))
    assert len(kept) == 8
    leaked = [
        p for p in trials.rglob("*") if p.is_file() and b"sk-template-secret-77" in p.read_bytes()
    ]
    assert leaked == []
