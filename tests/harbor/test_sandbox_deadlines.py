"""The Harbor sandbox's deadlines stalled for real (real bwrap, as root): a holder that
never signals ready ends ``start`` with ``SandboxStartTimeoutError``, and a copy out of the
sandbox that stops ends with ``SandboxTransferTimeoutError``, each within twice its
deadline (``pytest -s`` prints the times).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from harbor_support import harbor_missing_reason

if _reason := harbor_missing_reason():
    pytest.skip(_reason, allow_module_level=True)

from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_ai.deadlines import SANDBOX_READY, SANDBOX_TRANSFER
from osmosis_ai.errors import DeadlineError
from osmosis_ai.rollout.backend.harbor.sandbox import (
    LocalSandboxEnvironment,
    SandboxStartTimeoutError,
    SandboxTransferTimeoutError,
)

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]


def report(stage: str, deadline_s: float, elapsed_s: float) -> None:
    print(f"\n[deadline] {stage}: deadline {deadline_s:g}s, named error after {elapsed_s:.2f}s")


class SilentHolder(LocalSandboxEnvironment):
    """A sandbox whose holder keeps the namespaces but never says it is ready."""

    holder_command = ("/bin/sh", "-c", "read _")


@pytest.fixture
async def make(
    tmp_path: Path, task_builder: Callable[..., Path]
) -> AsyncIterator[Callable[..., LocalSandboxEnvironment]]:
    made: list[LocalSandboxEnvironment] = []

    def build(kind: type[LocalSandboxEnvironment] = LocalSandboxEnvironment) -> Any:
        task = Task(task_builder("task"))
        paths = TrialPaths(tmp_path / "trials" / uuid.uuid4().hex[:6])
        paths.mkdir()
        env = kind(
            environment_dir=task.paths.environment_dir,
            environment_name="task",
            session_id=f"task__{uuid.uuid4().hex[:6]}__env",
            trial_paths=paths,
            task_env_config=task.config.environment,
            state_dir=tmp_path / "state",
        )
        made.append(env)
        return env

    yield build
    for env in made:
        await env.stop(delete=True)


async def test_a_holder_that_never_signals_ready_ends_start_with_the_named_timeout(
    make: Callable[..., LocalSandboxEnvironment], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    deadline = 1.5
    monkeypatch.setenv(SANDBOX_READY.setting, str(deadline))
    env = make(SilentHolder)
    started = time.monotonic()
    with pytest.raises(SandboxStartTimeoutError) as caught:
        await env.start(force_build=False)
    report(
        "sandbox start (a holder that never signals ready)", deadline, time.monotonic() - started
    )
    error = caught.value
    assert isinstance(error, DeadlineError)
    assert (error.stage, error.deadline_s, error.setting) == (
        "sandbox start",
        deadline,
        SANDBOX_READY.setting,
    )
    assert "its holder did not signal ready" in str(error)
    assert f"the sandbox start deadline is {deadline:g}s" in str(error)


async def test_a_copy_out_of_the_sandbox_that_stops_ends_with_the_transfer_timeout(
    make: Callable[..., LocalSandboxEnvironment], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
):
    env = make()
    await env.start(force_build=False)
    marker = f"stall-{uuid.uuid4().hex[:8]}"
    path = f"/srv/{marker}"
    made = await env.exec(f"mkdir -p /srv && truncate -s 4G {path}")
    assert made.return_code == 0, made
    deadline = 1.5
    monkeypatch.setenv(SANDBOX_TRANSFER.setting, str(deadline))
    stopper = asyncio.create_task(_stop_all_with(marker))  # the copy's processes stop
    started = time.monotonic()
    try:
        with pytest.raises(SandboxTransferTimeoutError) as caught:
            await env.download_file(path, tmp_path / "big")
    finally:
        stopper.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await stopper
    report("sandbox transfer (a download that stops)", deadline, time.monotonic() - started)
    error = caught.value
    assert (error.stage, error.deadline_s, error.setting) == (
        "sandbox transfer",
        deadline,
        SANDBOX_TRANSFER.setting,
    )
    assert f"download of {path} from sandbox {env.session_id} did not finish" in str(error)
    assert not (tmp_path / "big").exists()
    alive = await env.exec("echo alive")  # the sandbox itself goes on
    assert alive.stdout == "alive\n"


async def _stop_all_with(marker: str) -> None:
    """SIGSTOP every process whose command line names ``marker``, as they appear."""
    while True:
        for pid in _processes_with(marker):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        await asyncio.sleep(0.001)


def _processes_with(marker: str) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if marker.encode() in (entry / "cmdline").read_bytes():
                found.append(int(entry.name))
        except OSError:
            continue
    return found
