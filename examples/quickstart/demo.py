"""End-to-end demo: serve a rollout and drive it through both protocol generations.

1. Start the shipped scripted model (an OpenAI-compatible server on 127.0.0.1) scripted to
   call the ``multiply`` tool and then answer ``#### <product>``.
2. Start ``rollouts/multiply/main.py`` the way a controller does: a separate process
   serving on ``$_OSMOSIS_ROLLOUT_PORT``.
3. Drive one rollout per dataset row through the polling generation (0.3.8) and the
   callback generation (0.3.0), and print each result and where its trajectory went.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx

from osmosis_ai.testing import ProtocolController, ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.model_server import ChatRequest
from osmosis_ai.testing.serving import free_port

HERE = Path(__file__).resolve().parent
ROW = "{:>3}  {:<10}  {:<9}  {:<8}  {:>6}  {:>5}  {}"
ROWS = [(6, 7), (12, 12), (3, 14), (25, 4), (9, 9), (17, 3)]


def scripted_model(request: ChatRequest) -> ScriptedTurn:
    """Turn 0: call multiply with the two numbers of the prompt; then answer from the tool."""
    if request.turn == 0:
        text = str(request.messages[-1]["content"])
        a, b = (int(n) for n in re.findall(r"val\d+ = (-?\d+)", text))
        return ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": a, "b": b})])
    tool_result = next(m for m in reversed(request.messages) if m.get("role") == "tool")
    product = f"{float(tool_result['content']):g}"
    return ScriptedTurn(content=f"The product is {product}.\n#### {product}")


def start_rollout_server(artifacts: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    env = {
        **os.environ,
        "_OSMOSIS_ROLLOUT_PORT": str(port),
        "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(artifacts),
        "PYTHONUNBUFFERED": "1",
    }
    process = subprocess.Popen(
        [sys.executable, str(HERE / "rollouts" / "multiply" / "main.py")], env=env
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise SystemExit(f"the rollout server exited with code {process.returncode}")
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return process, url
        except httpx.TransportError:
            time.sleep(0.1)
    process.terminate()
    raise SystemExit("the rollout server did not become healthy within 30 s")


async def drive(url: str, model: ScriptedModelServer, artifacts: Path) -> int:
    print(ROW.format("row", "generation", "question", "status", "reward", "ms", "trajectory"))
    failures = 0
    for generation in ("polling", "callback"):
        async with ProtocolController(url, generation=generation) as controller:
            for index, (a, b) in enumerate(ROWS):
                prompt = [
                    {
                        "role": "system",
                        "content": "Use the multiply tool, then answer as '#### <n>'.",
                    },
                    {"role": "user", "content": f"val1 = {a}\nval2 = {b}"},
                ]
                rollout_id = f"{generation}-row{index}"
                started = time.perf_counter()
                outcome = await controller.run(
                    prompt,
                    f"{model.base_url}/rollouts/{rollout_id}",
                    label=str(a * b),
                    llm_api_key="demo-key",
                    rollout_id=rollout_id,
                    agent_timeout_sec=30,
                    grader_timeout_sec=10,
                    extra_fields={"row_index": index},
                )
                elapsed = (time.perf_counter() - started) * 1000
                trajectory = artifacts / rollout_id / "trajectory.json"
                for _ in range(100):  # the callback generation saves after its last callback
                    if trajectory.exists():
                        break
                    await asyncio.sleep(0.01)
                reward = "-" if outcome.reward is None else f"{outcome.reward:.1f}"
                failures += outcome.reward != 1.0
                question = f"{a} * {b}"
                shown = (
                    trajectory.relative_to(artifacts.parent) if trajectory.exists() else "(none)"
                )
                status = outcome.status.value
                print(
                    ROW.format(index, generation, question, status, reward, f"{elapsed:.0f}", shown)
                )
    steps = json.loads((artifacts / "polling-row0" / "trajectory.json").read_text())["steps"]
    print(
        f"\nthe first trajectory has {len(steps)} ATIF steps: "
        + ", ".join(s["source"] for s in steps)
    )
    return failures


def main() -> int:
    workdir = Path(tempfile.mkdtemp(prefix="osmosis-demo-"))
    artifacts = workdir / "rollouts"
    with ScriptedModelServer(responder=scripted_model, record_requests=True) as model:
        print(f"scripted model:  {model.base_url}")
        process, url = start_rollout_server(artifacts)
        print(f"rollout server:  {url} (pid {process.pid}, python rollouts/multiply/main.py)\n")
        try:
            failures = asyncio.run(drive(url, model, artifacts))
        finally:
            process.terminate()
            process.wait(timeout=30)
        print(f"model calls served: {model.request_count}; artifacts under {workdir}")
    total = 2 * len(ROWS)
    print(f"\n{total - failures}/{total} rollouts earned reward 1.0")
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
