"""``die_with_parent``: a rollout server whose starter is killed with -9 (a fleet's Ray actor,
or its node) is killed with it instead of serving on, orphaned."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from osmosis_ai.controller import parent_guard

pytestmark = pytest.mark.skipif(
    not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux only"
)


def state(pid: int) -> str:
    """The process's state letter, or ``gone``."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return "gone"


def wait_for(pid: int, states: set[str], timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while (now := state(pid)) not in states and time.monotonic() < deadline:
        time.sleep(0.05)
    return now


@pytest.mark.parametrize("guarded", [True, False])
def test_a_guarded_child_dies_with_its_killed_parent(tmp_path: Path, guarded: bool):
    (tmp_path / "serve.py").write_text("import time\nprint('up', flush=True)\ntime.sleep(120)\n")
    starter = textwrap.dedent(
        f"""
        import sys
        from pathlib import Path
        from osmosis_ai.controller.rollout_process import RolloutServerProcess

        server = RolloutServerProcess(
            rollout_dir=Path({str(tmp_path)!r}),
            entrypoint=Path({str(tmp_path / "serve.py")!r}),
            artifact_root=Path({str(tmp_path / "artifacts")!r}),
            env={{"OSMOSIS_ROLLOUT_PYTHON": sys.executable}},
            die_with_parent={guarded!r},
            on_output=lambda line: print(line, flush=True),
        )
        server._spawn()
        print(server.process.pid, flush=True)
        server.process.wait()
        """
    )
    parent = subprocess.Popen([sys.executable, "-c", starter], stdout=subprocess.PIPE, text=True)
    assert parent.stdout is not None
    child = int(parent.stdout.readline())
    try:
        assert parent.stdout.readline().strip() == "up"  # (started: it writes nothing more)
        parent.kill()
        parent.wait()
        if guarded:
            assert wait_for(child, {"Z", "gone"}) in {"Z", "gone"}
        else:
            time.sleep(0.5)
            assert state(child) in {"S", "R"}  # orphaned: what the guard prevents
    finally:
        if state(child) not in {"Z", "gone"}:
            os.kill(child, 9)


def test_the_guard_refuses_a_parent_that_already_died():
    guard = [sys.executable, "-I", parent_guard.__file__]
    # pid 1 is not its parent: as if the parent had died before the guard was set
    assert subprocess.run([*guard, "1", "true"], check=False).returncode == 1
    assert subprocess.run([*guard, "x"], check=False, capture_output=True).returncode == 2
    assert subprocess.run([*guard, str(os.getpid()), "true"], check=False).returncode == 0
