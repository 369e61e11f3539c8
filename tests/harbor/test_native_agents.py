"""Native Harbor agents running real trials in the sandbox against a scripted model.

``terminus-2`` drives a tmux session inside the sandbox: the scripted model answers in its
JSON format (``analysis``, ``plan``, ``commands`` of keystrokes, ``task_complete``), types
the shipped example task's solution, confirms completion, and the task's own verifier
scores the result.

``mini-swe-agent`` is not run here: Harbor installs it inside the task environment at every
trial (``uv python install`` of a standalone Python downloaded from GitHub, then ``uv tool
install mini-swe-agent`` from PyPI), which a ``no-network`` task forbids and which this
offline machine cannot download. Its wiring (endpoint and key through the environment) is
checked in test_backend.py.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.execution import ExecutionRequest
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.testing import ChatRequest, ScriptedModelServer, ScriptedTurn
from osmosis_ai.testing.scripted_reply import content_text

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

EXAMPLE_TASKS = Path(__file__).resolve().parents[2] / "examples" / "harbor-dataset" / "tasks"
SECRET = "sk-terminus-test-8d1e4b"
SOLUTION = "printf 'hello from harbor\\n' > /app/greeting.txt\n"
CONFIRM = "Are you sure you want to mark the task as complete?"


def terminus_reply(commands: list[dict[str, Any]], *, complete: bool) -> ScriptedTurn:
    return ScriptedTurn(
        content=json.dumps(
            {
                "analysis": "The terminal is at a shell prompt in /app.",
                "plan": "Write the greeting, then check it.",
                "commands": commands,
                "task_complete": complete,
            }
        )
    )


class TerminusPlayer:
    """Plays terminus-2's side: types the solution, reads the screen, confirms completion."""

    def __init__(self) -> None:
        self.prompts: list[str] = []
        self.screens: list[str] = []

    def __call__(self, request: ChatRequest) -> ScriptedTurn:
        last = content_text(request.messages[-1].get("content"))
        if request.turn == 0:
            self.prompts.append(last)
            return terminus_reply(
                [
                    {"keystrokes": SOLUTION, "duration": 0.2},
                    {"keystrokes": "cat /app/greeting.txt\n", "duration": 0.2},
                ],
                complete=False,
            )
        self.screens.append(last)
        return terminus_reply([], complete=True)


def make_backend(tmp_path: Path, tasks: Path, **kwargs: Any) -> Any:
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=tasks,
            task_mode="dataset",
            trials_dir=tmp_path / "trials",
            artifact_root=tmp_path / "artifacts",
            cleanup_successful_trials=False,
            **kwargs,
        )


@pytest.mark.timeout(300)
async def test_terminus_2_solves_a_shipped_task_in_the_sandbox(tmp_path: Path):
    if shutil.which("tmux") is None:
        pytest.skip("terminus-2 drives tmux, which is not installed (apt-get install tmux)")
    backend = make_backend(
        tmp_path,
        EXAMPLE_TASKS,
        agent="terminus-2",
        model_name="openai/osmosis-rollout",
        # No asciinema recording: it would be installed with pip inside a no-network task.
        native_agent_kwargs={"record_terminal_session": False, "max_turns": 6},
    )
    player = TerminusPlayer()
    request = ExecutionRequest(
        id="terminus-1",
        prompt=[{"role": "user", "content": "(the task's own instruction is used)"}],
        metadata={"harbor_task_id": "create-file"},
        agent_timeout_sec=120,
    )
    async with ScriptedModelServer(responder=player, api_key=SECRET, record_requests=True) as model:
        with RolloutContext(
            chat_completions_url=model.base_url, api_key=SECRET, rollout_id=request.id
        ):
            outcome = await backend.execute(request)
        requests = list(model.requests)
    assert outcome.workflow.status == RolloutStatus.SUCCESS, outcome.workflow.err_message
    grader = outcome.grader
    assert grader is not None and grader.status == RolloutStatus.SUCCESS, grader.err_message
    assert grader.sample is not None and grader.sample.reward == 1.0
    # terminus-2 asked with its own prompt around the task's instruction, with the key.
    assert "hello from harbor" in player.prompts[0] and "keystrokes" in player.prompts[0]
    assert all(r.headers["authorization"] == f"Bearer {SECRET}" for r in requests)
    # It showed the model the screen after the commands, then asked to confirm completion.
    assert "hello from harbor" in player.screens[0]
    assert CONFIRM in player.screens[-1]
    assert len(requests) == 3
    # Harbor wrote the key into the trial's config; it is scrubbed from everything kept.
    kept = tmp_path / "artifacts" / request.id
    assert (kept / "harbor" / "verifier" / "reward.txt").read_text().strip() == "1"
    leaked = [
        p
        for root in (tmp_path / "trials", kept)
        for p in root.rglob("*")
        if p.is_file() and SECRET.encode() in p.read_bytes()
    ]
    assert leaked == []
