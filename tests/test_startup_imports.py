"""What ``osmosis eval run`` imports before its first dispatch (target: <= 1.5 s from the
command's start, bench/eval_run.py): nothing heavy before the rollout server is spawned, and
nothing in the server's own start-up that only later requests need. Fresh interpreters."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from osmosis_ai.testing.serving import free_port


def loaded(code: str, names: tuple[str, ...]) -> list[str]:
    """Which of ``names`` (modules, or prefixes ending in '.') ``code`` leaves imported."""
    probe = textwrap.dedent(code) + textwrap.dedent(
        f"""
        import json, sys
        print(json.dumps(sorted(n for n in {names!r}
                                if any(m == n or m.startswith(n) for m in sys.modules))))
        """
    )
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_eval_run_spawns_the_server_before_anything_heavy_is_imported():
    # Everything `osmosis eval run --json` imports up to RunServer.launch().
    code = """
        import osmosis_ai.cli.dispatch, osmosis_ai.cli.commands.eval_run
        import osmosis_ai.eval.plan, osmosis_ai.eval.runner, osmosis_ai.eval.server
        import osmosis_ai.controller.rollout_process
    """
    heavy = (
        "httpx",
        "aiohttp",
        "fastapi",
        "uvicorn",
        "rich",
        "packaging",
        "osmosis_ai.rollout.protocol",
        "osmosis_ai.controller.dispatch",
        "osmosis_ai.controller.proxy",
        "osmosis_ai.eval.scheduler",
        "osmosis_ai.eval.projections",
        "osmosis_ai.eval.metrics",
    )
    assert loaded(code, heavy) == []


def test_the_controller_package_loads_its_names_on_first_access():
    names = ("httpx", "osmosis_ai.controller.dispatch")
    assert loaded("import osmosis_ai.controller.rollout_process", names) == []
    code = """
        import osmosis_ai.controller as controller
        from osmosis_ai.controller import PolicyProxy
        assert set(controller.__all__) <= set(vars(controller))  # all at once, as if eager
    """
    assert loaded(code, names) == list(names)


def test_eval_package_names_load_on_first_access():
    code = """
        import osmosis_ai.eval as ev
        assert ev.open_run.__module__ == "osmosis_ai.eval.rundir"
    """
    assert loaded(code, ("osmosis_ai.eval.projections", "osmosis_ai.eval.outcome")) == []


ENTRYPOINT = """
    import sys
    from contextlib import asynccontextmanager

    from osmosis_ai.rollout import AgentWorkflow, LocalBackend
    from osmosis_ai.rollout.server import create_rollout_server, run_rollout_server

    HEAVY = ("aiohttp", "pydantic.v1", "websockets", "uvicorn.protocols.websockets.")


    class Idle(AgentWorkflow):
        async def run(self, ctx):
            return None


    @asynccontextmanager
    async def report(app):
        found = sorted(n for n in HEAVY if any(m.startswith(n) for m in sys.modules))
        print("started with", found, flush=True)
        yield


    app = create_rollout_server(backend=LocalBackend(workflow=Idle), lifespan=report)
    run_rollout_server(app, log_level="warning")
"""


def test_rollout_server_start_up_leaves_out_what_only_later_requests_need(tmp_path: Path):
    pytest.importorskip("uvicorn")
    # aiohttp: the callback client is made on the first callback; pydantic.v1: no typed route
    # parameters; websockets: no websocket routes.
    script = tmp_path / "main.py"
    script.write_text(textwrap.dedent(ENTRYPOINT))
    env = {**os.environ, "_OSMOSIS_ROLLOUT_PORT": str(free_port())}
    with subprocess.Popen(
        [sys.executable, str(script)], env=env, stdout=subprocess.PIPE, text=True
    ) as server:
        try:
            assert server.stdout is not None
            line = server.stdout.readline()
        finally:
            server.terminate()
    assert line.strip() == "started with []"
