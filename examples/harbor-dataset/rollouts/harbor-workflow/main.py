"""harbor-workflow: your own AgentWorkflow solves each task inside its environment.

A small terminal agent: it shows the model the task's instruction, runs the bash script the
model answers with (in the task environment, where the task's files are), shows it the
output, and stops when the model says DONE or after ``MAX_TURNS``. The task's own
``tests/test.sh`` gives the reward. HarborBackend copies this folder into the environment
and runs the workflow there with the SDK core; model calls go to the rollout's endpoint.
"""

from __future__ import annotations

import asyncio
import os
import re
from pathlib import Path
from typing import Any

import httpx

from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, get_rollout_context

MAX_TURNS = 6
SCRIPT = re.compile(r"```(?:bash|sh)?\n(.*?)```", re.DOTALL)
SYSTEM = (
    "You operate a Linux shell to finish a task. Answer with one bash script in a ```bash "
    "block; you will see its output. When the task is done, answer DONE."
)
TASKS_DIR = Path(
    os.environ.get("HARBOR_TASKS_DIR") or Path(__file__).resolve().parents[2] / "tasks"
)


async def shell(script: str) -> str:
    process = await asyncio.create_subprocess_exec(
        "bash", "-c", script, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    output, _ = await process.communicate()
    return f"exit code {process.returncode}\n{output.decode(errors='replace')[-4000:]}"


class TerminalWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list[dict[str, Any]]:
        rctx = get_rollout_context()
        if rctx is None or not rctx.chat_completions_url:
            raise ValueError("no model endpoint: run this workflow through a rollout server")
        messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}, *ctx.prompt]
        headers = {"Authorization": f"Bearer {rctx.api_key}"} if rctx.api_key else {}
        async with httpx.AsyncClient(timeout=120) as client:
            for _ in range(MAX_TURNS):
                answer = await client.post(
                    rctx.chat_completions_url + "/chat/completions",
                    headers=headers,
                    json={"model": "osmosis-rollout", "messages": messages},
                )
                answer.raise_for_status()
                text = answer.json()["choices"][0]["message"]["content"] or ""
                messages.append({"role": "assistant", "content": text})
                found = SCRIPT.search(text)
                if found is None:
                    break
                messages.append({"role": "user", "content": await shell(found.group(1))})
        return messages


def main() -> None:
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    backend = HarborBackend(
        orchestrator=TrialQueue(n_concurrent=3),
        tasks_dir=TASKS_DIR,
        agent=TerminalWorkflow,
        task_mode="dataset",
    )
    run_rollout_server(create_rollout_server(backend=backend))


if __name__ == "__main__":
    main()
