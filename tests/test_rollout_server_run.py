"""``run_rollout_server``: the entrypoint convention, run as a user runs it (a real process)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import httpx
import pytest

from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server
from osmosis_ai.rollout.server.app import ServerOptionError
from osmosis_ai.rollout.server.run import YOUNG_GC_THRESHOLD, resolve_port
from osmosis_ai.testing.serving import free_port
from rollouts import ScriptedBehaviour

pytest.importorskip("uvicorn", reason="run_rollout_server needs the server extra (uvicorn)")

ENTRYPOINT = textwrap.dedent(
    """
    import gc
    import sys

    from osmosis_ai.rollout import AgentWorkflow, LocalBackend
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server


    class Idle(AgentWorkflow):
        async def run(self, ctx):
            return None


    options = {"access_log": True} if "--access-log" in sys.argv else {}
    if "--gc-threshold" in sys.argv:
        gc.set_threshold(int(sys.argv[sys.argv.index("--gc-threshold") + 1]), 10, 10)
    run_rollout_server(create_rollout_server(backend=LocalBackend(workflow=Idle)), **options)
    print(f"frozen objects: {gc.get_freeze_count()}")
    print(f"young threshold: {gc.get_threshold()[0]}")
    """
)


def serve_and_poll(tmp_path: Path, *args: str) -> str:
    """Start the entrypoint on a free port, GET /health a few times, stop it; its output."""
    script = tmp_path / "main.py"
    script.write_text(ENTRYPOINT)
    port = free_port()
    env = {**os.environ, "_OSMOSIS_ROLLOUT_PORT": str(port)}
    proc = subprocess.Popen(
        [sys.executable, str(script), *args],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 30
        answered = 0
        with httpx.Client(timeout=2) as client:
            while answered < 3 and time.monotonic() < deadline:
                assert proc.poll() is None, proc.communicate()[0]
                try:
                    answered += client.get(f"http://127.0.0.1:{port}/health").status_code == 200
                except httpx.TransportError:
                    time.sleep(0.05)
        assert answered == 3, "the rollout server never answered /health"
    finally:
        proc.send_signal(signal.SIGINT)
        output, _ = proc.communicate(timeout=30)
    return output


def test_serves_on_the_port_env_with_startup_logs_and_no_access_log(tmp_path: Path):
    output = serve_and_poll(tmp_path)
    assert "Uvicorn running on http://127.0.0.1:" in output
    assert "GET /health" not in output
    # what existed at start-up (the app, its libraries) sat out full garbage collections
    frozen = re.search(r"frozen objects: (\d+)", output)
    assert frozen is not None and int(frozen.group(1)) > 10_000, output
    # and the young generation is collected less often than the interpreter's default
    assert f"young threshold: {YOUNG_GC_THRESHOLD}" in output, output


def test_keeps_a_garbage_collector_threshold_the_program_set(tmp_path: Path):
    output = serve_and_poll(tmp_path, "--gc-threshold", "1234")
    assert "young threshold: 1234" in output, output


def test_access_log_comes_back_on_request(tmp_path: Path):
    output = serve_and_poll(tmp_path, "--access-log")
    assert output.count("GET /health") == 3


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"port": 70000}, "port=70000 is not a port number: use 0-65535"),
        ({"port": True}, "port=True is not a port number"),
        ({"root_path": "api"}, "root_path='api' is not a root path: use '' or an ASCII path"),
        ({"root_path": "/api/"}, "root_path='/api/' is not a root path"),
        ({"root_path": "/ä"}, "root_path='/ä' is not a root path"),
        ({"log_levle": "info"}, "got 'log_levle', which uvicorn does not take"),
        ({"workers": 2, "reload": True}, "reload=True cannot be served by workers=2"),
    ],
)
def test_bad_options_are_refused_before_serving(monkeypatch, options, message):
    monkeypatch.delenv("OSMOSIS_ROLLOUT_WORKERS", raising=False)
    backend = LocalBackend(workflow=ScriptedBehaviour)
    app = create_rollout_server(backend=backend, configure_logging=False)
    with pytest.raises(ServerOptionError) as raised:
        run_rollout_server(app, **options)
    assert message in str(raised.value)


@pytest.mark.parametrize(
    ("raw", "message"),
    [("eighty", "_OSMOSIS_ROLLOUT_PORT='eighty' is not a port number"), ("-1", "outside 0-65535")],
)
def test_a_bad_port_in_the_environment_names_it(monkeypatch, raw, message):
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_PORT", raw)
    with pytest.raises(ServerOptionError, match=message) as raised:
        resolve_port()
    assert isinstance(raised.value, ValueError)  # what it raised before it had a name
