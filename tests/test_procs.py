"""Stopping the process groups we start: whatever the group's leader leaves behind goes with
it, for every starter (rollout servers, model servers, Ray nodes all stop through
``osmosis_ai.procs``)."""

from __future__ import annotations

import asyncio
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from osmosis_ai.controller.rollout_process import RolloutServerProcess
from osmosis_ai.procs import free_port, pid_alive, stop_process, stop_process_async

# A group leader that starts a child in its own group which ignores SIGTERM, writes the
# child's pid, then exits on SIGTERM itself.
LEADER = """
import os, signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, "-c",
    "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN); time.sleep(600)"])
with open(os.environ["CHILD_PID_FILE"], "w") as out:
    out.write(str(child.pid))
"""


def _child_pid(path: Path) -> int:
    deadline = time.monotonic() + 30
    while not path.exists() or not path.read_text():
        assert time.monotonic() < deadline, "the leader never started its child"
        time.sleep(0.05)
    return int(path.read_text())


def _gone(pid: int, within: float = 5.0) -> bool:
    deadline = time.monotonic() + within
    while pid_alive(pid):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def _leader(tmp_path: Path, tail: str) -> tuple[list[str], dict[str, str], Path]:
    pid_file = tmp_path / "child.pid"
    code = textwrap.dedent(LEADER) + textwrap.dedent(tail)
    return [sys.executable, "-c", code], {"CHILD_PID_FILE": str(pid_file)}, pid_file


def test_stop_process_sweeps_what_the_leader_left_in_its_group(tmp_path):
    argv, env, pid_file = _leader(tmp_path, "time.sleep(600)\n")
    process = subprocess.Popen(argv, env=env, start_new_session=True)
    child = _child_pid(pid_file)
    stop_process(process, grace_s=2.0)
    assert process.returncode is not None
    assert _gone(child)


def test_stop_process_async_sweeps_the_group_of_a_leader_that_already_exited(tmp_path):
    argv, env, pid_file = _leader(tmp_path, "")  # the leader exits at once

    async def main() -> int:
        process = await asyncio.create_subprocess_exec(*argv, env=env, start_new_session=True)
        child = _child_pid(pid_file)
        await process.wait()
        await stop_process_async(process, grace_s=2.0)
        return child

    assert _gone(asyncio.run(main()))


def test_a_stopped_rollout_server_leaves_no_process_of_its_group_behind(tmp_path):
    """The server exits on SIGTERM; a process it started that ignores SIGTERM used to
    outlive ``RolloutServerProcess.stop``."""
    rollout = tmp_path / "rollouts" / "r"
    rollout.mkdir(parents=True)
    server_code = """
    import uvicorn

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"{}"})

    uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
                log_level="warning", lifespan="off")
    """
    (rollout / "main.py").write_text(textwrap.dedent(LEADER) + textwrap.dedent(server_code))
    pid_file = tmp_path / "child.pid"
    server = RolloutServerProcess(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "t",
        env={"CHILD_PID_FILE": str(pid_file)},
    )
    try:
        server.start()
        child = _child_pid(pid_file)
    finally:
        server.stop()
    assert not server.alive()
    assert _gone(child)


def test_free_port_is_bindable():
    port = free_port()
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", port))
