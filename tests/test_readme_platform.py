"""The README's self-hosted platform section, run as written.

The first ``bash`` block under "## The self-hosted platform" runs in ``bash -e -o pipefail``
from an empty home (so an empty data dir, ``~/.osmosis/platform``), with only its ports
changed: 8480 (the platform) and 8000 (the scripted model) become free ones. It must end
with an eval that passes every row, a finished training, a deployed checkpoint answering on
``/v1`` and the dashboard's sign-in page; the eval's download must have a local run's layout.
A README edit that breaks any step fails here.

Needs bubblewrap (the platform refuses to run workspace code without it), the openai-agents
framework of the multiply template, the train extra, git and curl; skips naming what is missing.
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from osmosis_ai.testing.serving import free_port

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
SECTION = "## The self-hosted platform"
LOCAL_RUN_FILES = (
    "manifest.json",
    "events.jsonl",
    "logs.txt",
    "index.jsonl",
    "summary.jsonl",
    "progress.json",
    "metrics.json",
)


def readme_script() -> str:
    """The first ``bash`` block of the platform section."""
    text = README.read_text(encoding="utf-8")
    section = text[text.index(SECTION) :]
    found = re.search(r"```bash\n(.*?)```", section, re.S)
    assert found is not None, f"no bash block under {SECTION!r} in README.md"
    return found.group(1)


def with_ports(script: str, platform: int, model: int) -> str:
    assert "--port 8480" in script and "--port 8000" in script, "the ports to substitute moved"
    return (
        script.replace("127.0.0.1:8480", f"127.0.0.1:{platform}")
        .replace("--port 8480", f"--port {platform}")
        .replace("127.0.0.1:8000", f"127.0.0.1:{model}")
        .replace("--port 8000", f"--port {model}")
    )


def _missing() -> str | None:
    for tool in ("bwrap", "git", "curl"):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (.ci/run installs bubblewrap)"
    for module, extra in (
        ("agents", "openai-agents"),
        ("trl", "train"),
        ("sqlalchemy", "platform"),
    ):
        if importlib.util.find_spec(module) is None:
            return f"the {extra} extra is not installed ({module} is missing)"
    from osmosis_ai.controller.containment import Containment, ContainmentError, check

    try:
        home = os.path.expanduser("~")
        check(Containment(home="/tmp/osmosis-readme-probe", hidden=(home,), uid=65534))
    except ContainmentError as exc:
        return f"bubblewrap cannot contain a process here (user namespaces?): {exc}"
    return None


def test_the_bash_block_is_found_and_its_ports_substitute():
    script = with_ports(readme_script(), 41001, 41002)
    assert "8480" not in script and "8000" not in script
    assert "osmosis eval submit" in script and "osmosis model deploy" in script


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_readme_platform_section_runs_offline_from_an_empty_data_dir(tmp_path: Path):
    missing = _missing()
    if missing is not None:
        pytest.skip(missing)
    home = tmp_path / "home"
    home.mkdir()
    script = with_ports(readme_script(), free_port(), free_port())
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS", "OPENAI"))}
    env |= {
        "HOME": str(home),
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}",
        "NO_COLOR": "1",
        "COLUMNS": "100",
        "GIT_AUTHOR_NAME": "Ada",
        "GIT_AUTHOR_EMAIL": "ada@example.com",
        "GIT_COMMITTER_NAME": "Ada",
        "GIT_COMMITTER_EMAIL": "ada@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
    }
    log = tmp_path / "readme.log"
    started = time.monotonic()
    with log.open("w") as out:
        process = subprocess.Popen(
            ["bash", "-e", "-o", "pipefail", "-c", script],
            cwd=tmp_path,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        try:
            rc = process.wait(timeout=2100)
        finally:
            _end_group(process)
    wall = time.monotonic() - started
    text = log.read_text()
    print(f"README platform section: {wall:.0f} s wall from an empty data dir")
    assert rc == 0, text[-6000:]

    agents = home / "osmosis-demo" / "agents"
    [run_dir] = [p for p in (agents / ".osmosis" / "evals").iterdir() if p.is_dir()]
    for name in LOCAL_RUN_FILES:
        assert (run_dir / name).is_file(), f"{name} missing from the download: {text[-3000:]}"
    metrics = json.loads((run_dir / "metrics.json").read_text())
    assert metrics["summary"]["pass_rate"] == 1.0, metrics
    assert metrics["summary"]["total_samples"] == len(list((run_dir / "trajectories").iterdir()))
    assert (run_dir / "index.jsonl").read_bytes() == (run_dir / "summary.jsonl").read_bytes()
    assert "\n.osmosis/\n" in (agents / ".gitignore").read_text()
    completions = [json.loads(line) for line in text.splitlines() if '"choices"' in line]
    assert completions, text[-3000:]
    assert completions[0]["choices"][0]["message"]["role"] == "assistant"
    assert "<title>Sign in" in text


def _end_group(process: subprocess.Popen[bytes]) -> None:
    """SIGTERM the script's process group (the platform and the scripted model if still up),
    then SIGKILL what is left after 30 s."""
    for sig, grace in ((signal.SIGTERM, 30.0), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(process.pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + grace
        while time.monotonic() < deadline:
            try:
                os.killpg(process.pid, 0)
            except ProcessLookupError:
                return
            time.sleep(0.2)
        if process.poll() is None:
            process.wait(timeout=5)
