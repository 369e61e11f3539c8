"""Compatibility tier: our ``osmosis eval run`` drives the original osmosis-ai's rollout
server. The bundled multiply templates run unmodified under the original SDK (its own
LocalBackend, server and LiteLLM-based integrations), started through
``bench/serve_template.py``; every row must pass through our dispatcher and policy proxy.
The protocol generation is whatever that build serves (0.3.8: polling; 0.3.0: callbacks).

Needs ``OSMOSIS_COMPAT_PYTHON``: an interpreter with the original build and its framework
extras, e.g. ``python3.12 -m venv /tmp/orig && /tmp/orig/bin/pip install
"osmosis-ai[server,openai-agents,strands]==0.3.8"`` (or ``==0.3.0``).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from test_templates_eval import FRAMEWORKS, eval_against_calculator, osmosis

COMPAT_PYTHON = os.environ.get("OSMOSIS_COMPAT_PYTHON", "")
SERVE = Path(__file__).resolve().parents[1] / "bench" / "serve_template.py"

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not COMPAT_PYTHON,
        reason="compat tier: set OSMOSIS_COMPAT_PYTHON to an interpreter with the original "
        "osmosis-ai (0.3.8 or 0.3.0, extras server, openai-agents, strands) installed",
    ),
]

SHIM = """import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
os.execv({python!r}, [{python!r}, {serve!r}, os.path.join(here, "template_main.py")])
"""


@pytest.mark.timeout(600)
@pytest.mark.parametrize("name", sorted(FRAMEWORKS))
def test_eval_run_drives_the_original_server(tmp_path: Path, name: str):
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_"))
    }
    env |= {"NO_COLOR": "1", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}  # offline LiteLLM
    applied = osmosis(workspace, "template", "apply", name, "--json", env=env)
    assert applied.returncode == 0, applied.stderr
    entrypoint = workspace / "rollouts" / name / "main.py"
    entrypoint.rename(entrypoint.with_name("template_main.py"))
    entrypoint.write_text(SHIM.format(python=COMPAT_PYTHON, serve=str(SERVE)))

    envelope, model = eval_against_calculator(workspace, name, env)
    assert envelope["status"] == "success", envelope
    metrics = envelope["resource"]["metrics"]
    assert (metrics["total_samples"], metrics["passed"], metrics["failed"]) == (20, 20, 0)
    assert (model.tool_calls, model.answers) == (20, 20)
