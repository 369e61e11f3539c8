"""Starting workspace rollout servers as child processes."""

from __future__ import annotations

import shutil
import socket
import sys
import textwrap
from pathlib import Path

import httpx
import pytest

from osmosis_ai.controller.rollout_process import (
    RolloutServerError,
    RolloutServerProcess,
    check_dependencies,
)
from osmosis_ai.testing.serving import free_port

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "quickstart" / "rollouts" / "multiply"


def make_rollout(tmp_path: Path, body: str, pyproject: str | None = None) -> Path:
    rollout = tmp_path / "rollouts" / "r"
    rollout.mkdir(parents=True)
    (rollout / "main.py").write_text(textwrap.dedent(body))
    if pyproject is not None:
        (rollout / "pyproject.toml").write_text(textwrap.dedent(pyproject))
    return rollout


def test_serves_the_example_and_passes_the_contract_env(tmp_path):
    lines: list[str] = []
    server = RolloutServerProcess(
        rollout_dir=EXAMPLE,
        entrypoint=EXAMPLE / "main.py",
        artifact_root=tmp_path / "trials",
        on_output=lines.append,
    )
    try:
        server.start()
        assert server.alive() and not server.isolated
        health = httpx.get(f"{server.url}/health")
        assert health.json()["instance_id"] == server.instance_id
        assert health.headers["x-osmosis-rollout-instance-id"] == server.instance_id
    finally:
        server.stop()
    assert not server.alive()


def test_spawn_returns_at_once_and_wait_ready_waits_for_health(tmp_path):
    server = RolloutServerProcess(
        rollout_dir=EXAMPLE, entrypoint=EXAMPLE / "main.py", artifact_root=tmp_path / "trials"
    )
    try:
        server.spawn()  # the caller's own start-up goes on while the child boots
        assert server.process is not None and server.port is not None
        server.wait_ready()
        assert httpx.get(f"{server.url}/health").status_code == 200
    finally:
        server.stop()
    assert not server.alive()


def test_import_error_is_reported_with_the_traceback(tmp_path):
    rollout = make_rollout(tmp_path, "raise RuntimeError('config is broken: missing API_URL')\n")
    server = RolloutServerProcess(
        rollout_dir=rollout, entrypoint=rollout / "main.py", artifact_root=tmp_path / "t"
    )
    with pytest.raises(RolloutServerError, match="exited with code 1") as info:
        server.start()
    assert "config is broken: missing API_URL" in str(info.value)


def test_busy_port_is_refused(tmp_path):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        port = sock.getsockname()[1]
        server = RolloutServerProcess(
            rollout_dir=EXAMPLE, entrypoint=EXAMPLE / "main.py", artifact_root=tmp_path, port=port
        )
        with pytest.raises(RolloutServerError, match=f"port {port} is already in use"):
            server.start()


def test_dependency_check(tmp_path):
    ok = make_rollout(
        tmp_path,
        "",
        """
        [project]
        name = "r"
        version = "0"
        dependencies = ["httpx>=0.1", "pydantic", "nothing-here; python_version < '3'"]
        """,
    )
    assert check_dependencies(ok).satisfied
    (ok / "pyproject.toml").write_text(
        '[project]\nname = "r"\nversion = "0"\ndependencies = ["definitely-not-installed>=1", "httpx>=999"]\n'
    )
    check = check_dependencies(ok)
    assert not check.satisfied
    assert check.missing == ("definitely-not-installed>=1", "httpx>=999")
    if shutil.which("uv") is None:
        server = RolloutServerProcess(
            rollout_dir=ok, entrypoint=ok / "main.py", artifact_root=tmp_path
        )
        with pytest.raises(
            RolloutServerError, match=r"definitely-not-installed>=1.*pip install uv"
        ):
            server.command()


HEALTH_SERVER = """
import json
import os

import uvicorn

BODY = json.dumps({"status": "ok", **json.loads(os.environ.get("HEALTH_EXTRA", "{}"))})


async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": BODY.encode()})


uvicorn.run(app, host="127.0.0.1", port=int(os.environ["_OSMOSIS_ROLLOUT_PORT"]),
            log_level="warning", lifespan="off")
"""


def test_a_server_without_instance_ids_is_taken_as_ours(tmp_path):
    # Servers of the original 0.3.0 report no instance id on /health.
    rollout = make_rollout(tmp_path, HEALTH_SERVER)
    server = RolloutServerProcess(
        rollout_dir=rollout, entrypoint=rollout / "main.py", artifact_root=tmp_path / "t"
    )
    try:
        server.start()
        assert server.alive()
    finally:
        server.stop()


def test_a_foreign_instance_id_is_another_process(tmp_path):
    rollout = make_rollout(tmp_path, HEALTH_SERVER)
    server = RolloutServerProcess(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "t",
        env={"HEALTH_EXTRA": '{"instance_id": "someone-else"}'},
    )
    with pytest.raises(RolloutServerError, match="taken by another process"):
        server.start()
    assert not server.alive()


BIND_RACE_SERVER = (
    """
import os, pathlib, sys
marker = pathlib.Path(os.environ["BIND_MARKER"])
if not marker.exists():  # the first start loses the port it was given to someone else
    marker.write_text(os.environ["_OSMOSIS_ROLLOUT_PORT"])
    print("ERROR:    [Errno 98] error while attempting to bind on address "
          "('127.0.0.1', 1): address already in use", flush=True)
    sys.exit(3)
"""
    + HEALTH_SERVER
)


def test_a_port_lost_before_the_child_binds_it_is_replaced(tmp_path):
    rollout = make_rollout(tmp_path, BIND_RACE_SERVER)
    marker = tmp_path / "first-port"
    server = RolloutServerProcess(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "t",
        env={"BIND_MARKER": str(marker)},
    )
    try:
        server.start()
        assert server.alive()
        assert server.port != int(marker.read_text())  # started again on another port
    finally:
        server.stop()


def test_a_chosen_port_that_fails_to_bind_is_not_replaced(tmp_path):
    rollout = make_rollout(tmp_path, BIND_RACE_SERVER)
    server = RolloutServerProcess(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "t",
        port=free_port(),
        env={"BIND_MARKER": str(tmp_path / "first-port")},
    )
    with pytest.raises(RolloutServerError, match="exited with code 3"):
        server.start()


def test_requires_python_that_excludes_this_interpreter_is_a_missing_dependency(tmp_path):
    rollout = make_rollout(
        tmp_path,
        "",
        '[project]\nname = "r"\nversion = "0"\nrequires-python = ">=99"\ndependencies = []\n',
    )
    check = check_dependencies(rollout)
    assert not check.satisfied
    here = ".".join(map(str, sys.version_info[:3]))
    assert check.missing == (f"python>=99 (this is {here})",)
    (rollout / "pyproject.toml").write_text(
        '[project]\nname = "r"\nversion = "0"\nrequires-python = "not a version"\n'
    )
    with pytest.raises(RolloutServerError, match="invalid requires-python 'not a version'"):
        check_dependencies(rollout)


def test_a_chosen_interpreter_runs_the_server_without_the_dependency_check(tmp_path, monkeypatch):
    # Dependencies this interpreter lacks would send it to uv; the chosen Python runs it as is.
    rollout = make_rollout(
        tmp_path,
        "import os\nprint('venv:', os.environ.get('VIRTUAL_ENV'), flush=True)\n" + HEALTH_SERVER,
        '[project]\nname = "r"\nversion = "0"\ndependencies = ["definitely-not-installed>=1"]\n',
    )
    monkeypatch.setenv("VIRTUAL_ENV", str(tmp_path / "elsewhere"))
    lines: list[str] = []
    server = RolloutServerProcess(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "t",
        env={"OSMOSIS_ROLLOUT_PYTHON": sys.executable},
        on_output=lines.append,
    )
    try:
        server.start()
        assert server.command() == [sys.executable, str(rollout / "main.py")]
        assert not server.isolated
    finally:
        server.stop()
    # The controller's virtualenv is not passed on to another interpreter.
    assert "venv: None" in lines
    missing = RolloutServerProcess(
        rollout_dir=rollout,
        entrypoint=rollout / "main.py",
        artifact_root=tmp_path / "t",
        env={"OSMOSIS_ROLLOUT_PYTHON": str(tmp_path / "no-such-python")},
    )
    with pytest.raises(RolloutServerError, match=r"OSMOSIS_ROLLOUT_PYTHON=.*no-such-python"):
        missing.command()
