"""Stock Harbor runs the shipped example dataset in the bubblewrap sandbox through its own
CLI (``harbor run --env module:Class``), with the oracle agent, and scores 1.0."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

DATASET = Path(__file__).parents[2] / "examples" / "harbor-dataset" / "tasks"


@pytest.mark.timeout(900)
def test_harbor_run_scores_the_example_dataset_with_the_oracle_in_the_sandbox(tmp_path: Path):
    # Imported here: the module needs Harbor, and the default suite collects this file without it.
    from osmosis_ai.rollout.backend.harbor.sandbox import SANDBOX_IMPORT_PATH

    harbor = Path(sys.executable).with_name("harbor")
    assert harbor.exists(), f"{harbor}: the harbor extra installs Harbor's CLI beside python"
    jobs = tmp_path / "jobs"
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}

    command = [str(harbor), "run", "--path", str(DATASET), "--agent", "oracle"]
    command += ["--env", SANDBOX_IMPORT_PATH, "--jobs-dir", str(jobs), "--n-concurrent", "3"]
    done = subprocess.run(
        [*command, "--yes", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=800,
        check=False,
    )

    output = (done.stdout + done.stderr)[-4000:]
    assert done.returncode == 0, output
    trials = {
        path.parent.name.rpartition("__")[0]: json.loads(path.read_text())
        for path in jobs.glob("*/*/result.json")
    }
    assert sorted(trials) == sorted(p.name for p in DATASET.iterdir()), output
    for name, result in trials.items():
        assert result.get("exception_info") is None, (name, result["exception_info"])
        assert result["verifier_result"]["rewards"] == {"reward": 1.0}, (name, output)
