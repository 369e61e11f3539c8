"""The multiply templates end to end, unmodified: ``osmosis template apply`` into a fresh
directory, then ``osmosis eval run`` (both as subprocesses) against a scripted model that
calls the ``multiply`` tool and answers ``#### <product>``; every row must pass."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.cli import registry
from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import content_text

FRAMEWORKS = {"multiply-local-openai": "agents", "multiply-local-strands": "strands"}
OPERANDS = re.compile(r"val1 = (-?[\d.]+)\s+val2 = (-?[\d.]+)")

EVAL_RUN = registry.command(("eval", "run"))
pytestmark = pytest.mark.skipif(
    EVAL_RUN is None or EVAL_RUN.module == registry.PENDING,
    reason="`osmosis eval run` is still a placeholder in the command table",
)


class Calculator:
    """The scripted model: on a row's prompt it calls ``multiply(a, b)``; once the tool has
    answered it replies ``#### <tool result>``. Anything else (the preflight) gets "ok"."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.tool_calls = 0
        self.answers = 0

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        results = [m for m in request.messages if m.get("role") == "tool"]
        if results:
            product = float(content_text(results[-1].get("content")))
            with self.lock:
                self.answers += 1
            return ScriptedTurn(content=f"The product is\n#### {product:.4f}")
        user = next((m for m in request.messages if m.get("role") == "user"), {})
        operands = OPERANDS.search(content_text(user.get("content")))
        if operands is None:
            return ScriptedTurn(content="ok")
        with self.lock:
            self.tool_calls += 1
        a, b = float(operands.group(1)), float(operands.group(2))
        return ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": a, "b": b})])


def eval_against_calculator(
    workspace: Path, name: str, env: dict[str, str]
) -> tuple[dict[str, Any], Calculator]:
    """``osmosis eval run configs/eval/<name>.toml --json`` against a scripted calculator
    model; the JSON envelope and the model (which counts its tool calls and answers)."""
    model = Calculator()
    with ScriptedModelServer(responder=model) as server:
        env = env | {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "test"}
        done = osmosis(
            workspace, "eval", "run", f"configs/eval/{name}.toml", "--json", "-y", env=env
        )
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout), model


def osmosis(cwd: Path, *args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_ai.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.timeout(360)
@pytest.mark.parametrize(
    ("name", "workers"),
    # the template's server also as a user may run it: in two worker processes
    [*((name, 1) for name in sorted(FRAMEWORKS)), ("multiply-local-openai", 2)],
)
def test_template_scores_full_marks(tmp_path, name, workers):
    if importlib.util.find_spec(FRAMEWORKS[name]) is None:
        pytest.skip(f"{FRAMEWORKS[name]!r} is not installed (the template's framework)")
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_"))
    }
    env["NO_COLOR"] = "1"
    if workers > 1:
        env["OSMOSIS_ROLLOUT_WORKERS"] = str(workers)

    applied = osmosis(workspace, "template", "apply", name, "--json", env=env)
    assert applied.returncode == 0, applied.stderr
    assert json.loads(applied.stdout)["resource"]["workspace"] == str(workspace)

    envelope, model = eval_against_calculator(workspace, name, env)
    resource = envelope["resource"]
    assert envelope["status"] == "success", resource.get("failed_rows")
    metrics = resource["metrics"]
    assert (metrics["total_samples"], metrics["passed"], metrics["failed"]) == (20, 20, 0)
    assert metrics["pass_rate"] == 1.0
    assert (model.tool_calls, model.answers) == (20, 20)  # the tool ran in every rollout
    run_dir = Path(resource["output_path"])
    trajectories = sorted((run_dir / "rollout_trials").glob("*/trajectory.json"))
    assert len(trajectories) == 20
    if workers > 1:  # the run's log keeps the rollout server's own lines
        assert f"with {workers} workers" in (run_dir / "logs.txt").read_text()
