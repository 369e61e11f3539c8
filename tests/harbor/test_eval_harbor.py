"""``osmosis eval run``, unchanged, over the shipped Harbor dataset (examples/harbor-dataset):
the oracle solves every task (pass rate 1.0), and so does the example workflow when a scripted
model answers each task with the right shell script."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.testing import ChatRequest, ScriptedModelServer, ScriptedTurn

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset"
SOLUTIONS = {
    "/app/greeting.txt": "printf 'hello from harbor\\n' > /app/greeting.txt",
    "/app/stats.py": "sed -i 's|(len(values) + 1)|len(values)|' /app/stats.py",
    "/app/words.txt": "grep '^a' /app/words.txt | sort -u | wc -l > /app/count.txt",
}


def solver(request: ChatRequest) -> ScriptedTurn:
    """Answers a task's instruction with its script, and the script's output with DONE."""
    last = request.messages[-1]
    if last.get("role") == "user" and str(last.get("content", "")).startswith("exit code"):
        return ScriptedTurn(content="DONE")
    text = " ".join(str(m.get("content", "")) for m in request.messages if m.get("role") == "user")
    for marker, script in SOLUTIONS.items():
        if marker in text:
            return ScriptedTurn(content=f"```bash\n{script}\n```")
    return ScriptedTurn(content="ok")  # eval run's model preflight


def eval_run(workspace: Path, config: str, base_url: str) -> dict[str, Any]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_"))
    }
    env |= {"OPENAI_BASE_URL": base_url, "OPENAI_API_KEY": "test", "NO_COLOR": "1"}
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_ai.cli.main", "eval", "run", config, "--json", "-y"],
        cwd=workspace,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.stdout.strip(), done.stderr
    return json.loads(done.stdout)


@pytest.mark.timeout(360)
@pytest.mark.parametrize("rollout", ["harbor-oracle", "harbor-workflow"])
def test_eval_run_over_the_shipped_dataset_passes_every_row(tmp_path: Path, rollout: str):
    workspace = tmp_path / "workspace"
    shutil.copytree(EXAMPLE, workspace)
    with ScriptedModelServer(responder=solver, record_requests=True) as model:
        envelope = eval_run(workspace, f"configs/eval/{rollout}.toml", model.base_url)
        scripts_asked = sum(
            1 for r in model.requests if any(m.get("role") == "system" for m in r.body["messages"])
        )
    resource = envelope["resource"]
    assert envelope["status"] == "success", resource.get("failed_rows")
    metrics = resource["metrics"]
    assert (metrics["total_samples"], metrics["passed"], metrics["failed"]) == (6, 6, 0)
    assert metrics["pass_rate"] == 1.0
    # The oracle calls no model; the workflow asks twice per row (the script, then DONE).
    assert scripts_asked == (0 if rollout == "harbor-oracle" else 12)
