"""Shared helpers for the Harbor tier (tests/harbor): skip reasons and a task builder.

The Harbor tier runs under Python 3.12+ with the ``harbor`` extra (``make test-harbor``
builds ``.venv-harbor``). Under the 3.11 ``.venv`` its tests skip and say what is missing.
Nothing here imports Harbor at module level.
"""

from __future__ import annotations

import functools
import importlib.util
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

DEFAULT_DOCKERFILE = "FROM ubuntu:24.04\nWORKDIR /app\n"
DEFAULT_TEST_SH = """\
#!/bin/bash
mkdir -p /logs/verifier
if [ -f /app/answer.txt ] && [ "$(cat /app/answer.txt)" = "42" ]; then
  echo 1 > /logs/verifier/reward.txt
else
  echo 0 > /logs/verifier/reward.txt
fi
"""
DEFAULT_SOLVE_SH = "#!/bin/bash\necho 42 > /app/answer.txt\n"


@functools.cache
def harbor_missing_reason() -> str | None:
    """Why Harbor cannot run here, or None when it can."""
    if sys.version_info < (3, 12):
        version = ".".join(map(str, sys.version_info[:3]))
        return (
            f"Harbor needs Python >= 3.12 (this is {version}); "
            "`make test-harbor` runs this tier in .venv-harbor"
        )
    if importlib.util.find_spec("harbor") is None:
        return "the harbor package is not installed: pip install -e '.[harbor]' (or `make test-harbor`)"
    return None


@functools.cache
def sandbox_missing_reason() -> str | None:
    """Why the bubblewrap sandbox cannot run here, or None when it can."""
    if harbor := harbor_missing_reason():
        return harbor
    if not sys.platform.startswith("linux"):
        return f"the local sandbox needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the local sandbox needs root (it mounts an overlay per trial)"
    for tool, package in (("bwrap", "bubblewrap"), ("nsenter", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    helper = (
        Path(__file__).resolve().parents[2]
        / "src/osmosis_ai/rollout/backend/harbor/sandbox_enter.py"
    )
    # a user namespace mapped to unprivileged ids, an idmapped clone of / and an overlay of
    # it, in a throwaway mount namespace
    result = subprocess.run(
        [sys.executable, "-I", "-S", str(helper), "probe"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if result.returncode != 0:
        detail = (result.stderr or result.stdout).strip()
        return f"this host cannot run the sandbox's namespaces and mounts: {detail}"
    return None


def make_task(
    parent: Path,
    name: str = "task",
    *,
    instruction: str = "Write 42 to /app/answer.txt.\n",
    dockerfile: str | None = DEFAULT_DOCKERFILE,
    test_sh: str | None = DEFAULT_TEST_SH,
    solve_sh: str | None = DEFAULT_SOLVE_SH,
    task_toml: str | None = None,
    network_mode: str | None = None,
    allowed_hosts: list[str] | None = None,
    agent_network_mode: str | None = None,
    environment_files: dict[str, str] | None = None,
    agent_timeout_sec: float = 60.0,
    verifier_timeout_sec: float = 60.0,
) -> Path:
    """Write a Harbor task folder ``parent/name`` and return its path.

    ``task_toml`` replaces the generated task.toml whole; otherwise one is written with
    the timeouts and, when given, ``[environment] network_mode`` / ``allowed_hosts`` and the
    agent phase's own ``[agent] network_mode``.
    ``environment_files`` are extra files under ``environment/`` (for COPY/ADD).
    Passing None for ``dockerfile``, ``test_sh`` or ``solve_sh`` leaves that file out.
    """
    task = parent / name
    (task / "environment").mkdir(parents=True, exist_ok=True)
    if task_toml is None:
        environment = ""
        if network_mode is not None:
            environment += f'network_mode = "{network_mode}"\n'
        if allowed_hosts is not None:
            hosts = ", ".join(f'"{host}"' for host in allowed_hosts)
            environment += f"allowed_hosts = [{hosts}]\n"
        agent = f'network_mode = "{agent_network_mode}"' if agent_network_mode else ""
        task_toml = (
            textwrap.dedent(
                f"""\
            version = "1.0"

            [metadata]
            difficulty = "easy"

            [agent]
            timeout_sec = {agent_timeout_sec}
            {agent}

            [verifier]
            timeout_sec = {verifier_timeout_sec}

            [environment]
            """
            )
            + environment
        )
    (task / "task.toml").write_text(task_toml)
    (task / "instruction.md").write_text(instruction)
    if dockerfile is not None:
        (task / "environment" / "Dockerfile").write_text(dockerfile)
    for relative, content in (environment_files or {}).items():
        path = task / "environment" / relative
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
    for folder, filename, content in (
        ("tests", "test.sh", test_sh),
        ("solution", "solve.sh", solve_sh),
    ):
        if content is None:
            continue
        path = task / folder / filename
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(content)
        path.chmod(0o755)
    return task
