"""HarborBackend's scratch copies of ``code_dir`` do not outlive it: shutdown removes them, so
does the process's exit, and copies left by a process killed with -9 are removed by the next
backend that stages code for the same tasks."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
import sys
import textwrap
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.rollout.execution import ExecutionRequest
from osmosis_ai.rollout.status import RolloutStatus

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

WORKFLOW = textwrap.dedent(
    """
    from pathlib import Path

    from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput


    class WriteAnswer(AgentWorkflow):
        async def run(self, ctx):
            Path("/app").mkdir(exist_ok=True)
            Path("/app/answer.txt").write_text("42")
            return AgentWorkflowOutput(
                messages=[*ctx.prompt, {"role": "assistant", "content": "42"}]
            )
    """
)

# Runs one trial in a process of its own and exits without shutting the backend down.
CHILD = textwrap.dedent(
    """
    import asyncio
    import sys
    import warnings

    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend
    from osmosis_ai.rollout.execution import ExecutionRequest

    task, code, trials = sys.argv[1:4]
    sys.path.insert(0, code)


    async def main():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            backend = HarborBackend(
                orchestrator=TrialQueue(n_concurrent=1),
                tasks_dir=task,
                agent="cleanup_flow:WriteAnswer",
                code_dir=code,
                trials_dir=trials,
                artifact_root=trials + "-artifacts",
            )
        request = ExecutionRequest(id="child-1", prompt=[{"role": "user", "content": "go"}])
        outcome = await backend.execute(request)
        print(outcome.result.status.value, backend._code_stage, flush=True)


    asyncio.run(main())
    """
)


@pytest.fixture
def code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "cleanup_flow.py").write_text(WORKFLOW)
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("cleanup_flow", None)
    return folder


def make_backend(tmp_path: Path, task: Path, code_dir: Path) -> Any:
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=task,
            agent="cleanup_flow:WriteAnswer",
            code_dir=code_dir,
            trials_dir=tmp_path / "trials",
            artifact_root=tmp_path / "artifacts",
        )


async def solve(backend: Any, rollout_id: str) -> None:
    request = ExecutionRequest(id=rollout_id, prompt=[{"role": "user", "content": "go"}])
    outcome = await backend.execute(request)
    assert outcome.result.status == RolloutStatus.SUCCESS, outcome.result.err_message
    assert outcome.result.sample is not None and outcome.result.sample.reward == 1.0


def dead_pid() -> int:
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    return child.pid


async def test_shutdown_removes_the_staged_code_and_empty_scratch_folders(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    backend = make_backend(tmp_path, task_builder(), code_dir)
    stages = backend.scratch_root / "code"
    # A copy left by a process that is gone goes when this backend stages its own; a copy
    # of a live process (this one's parent) stays.
    orphan = stages / f"{dead_pid()}-0badc0de"
    alive = stages / "1-0000feed"
    for folder in (orphan, alive):
        (folder / "sub").mkdir(parents=True)
        (folder / "sub" / "file.py").write_text("x = 1\n")

    try:
        # Trials planned at once share one copy (each plan runs in a thread of its own).
        await asyncio.gather(*(solve(backend, f"clean-{n}") for n in range(3)))
        await solve(backend, "clean-3")
        staged = list(stages.iterdir())
        assert not orphan.exists() and alive.is_dir()
        mine = [p for p in staged if p != alive]
        assert len(mine) == 1  # one copy serves every trial
        assert (mine[0] / "cleanup_flow.py").is_file()

        await backend.shutdown()
        assert not mine[0].exists()
        assert sorted(p.name for p in stages.iterdir()) == [alive.name]
    finally:
        shutil.rmtree(alive, ignore_errors=True)
    await backend.shutdown()  # a second shutdown is harmless; now every folder is empty
    assert not backend.scratch_root.exists()


@pytest.mark.timeout(180)
def test_process_exit_removes_the_staged_code(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    task = task_builder()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, str(task), str(code_dir), str(tmp_path / "trials")],
        capture_output=True,
        text=True,
        timeout=150,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    status, stage = done.stdout.split()
    assert status == "success"
    assert Path(stage).name.split("-")[0].isdigit()
    assert not Path(stage).exists()
    assert not Path(stage).parent.parent.exists()  # the scratch root, left empty, went too


async def test_a_rollout_cancelled_while_its_task_is_copied_leaves_no_copy(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    backend = make_backend(tmp_path, task_builder(), code_dir)
    request = ExecutionRequest(id="cancel-1", prompt=[{"role": "user", "content": "go"}])
    job = asyncio.create_task(backend.execute(request))
    await asyncio.sleep(0)  # the plan (the task's copy) is being made in a thread
    backend.cancel_rollouts(all=True)
    with pytest.raises(asyncio.CancelledError):
        await job
    # The planning thread goes on (it makes the folder of copies, then the copy, which goes);
    # shutdown waits for it before it removes the scratch folders.
    await backend.shutdown()
    assert not backend.scratch_root.exists()
