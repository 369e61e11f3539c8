"""Compatibility tier: the original osmosis-ai CLI (0.3.8), unmodified, submits, lists,
shows, reads the logs of and stops eval and training runs on a real ``osmosis platform
serve`` (child process, SQLite data dir, set up with the admin commands). It runs no worker
(``--workers 0``): the runs stay queued, which is what the listing and stopping check;
tests/test_platform_compat_managed.py runs them.

The original takes a workspace's identity only from an ``origin`` on github.com (``git
remote get-url origin``, which applies ``insteadOf``, so a rewrite to a local path does not
pass either). The workspace clone therefore keeps ``https://github.com/acme/team.git`` as
its origin and pushes to the bare repository the platform fetches by its path; the
original then only warns that the branch has no upstream.

Needs ``OSMOSIS_COMPAT_PYTHON``: an interpreter with the original build installed (its
``osmosis`` script next to it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from osmosis_ai.testing.serving import free_port
from platform_support import git, run_original, wait_until_healthy, write_files

COMPAT_PYTHON = os.environ.get("OSMOSIS_COMPAT_PYTHON", "")
OURS = Path(sys.executable).with_name("osmosis")
SECRET_VALUE = "sk-compat-run-3b9e0f"
ROWS = [{"user_prompt": f"{i} * 2 = ?", "ground_truth": str(2 * i)} for i in range(6)]

pytestmark = [
    pytest.mark.compat,
    pytest.mark.skipif(
        not COMPAT_PYTHON,
        reason="compat tier: set OSMOSIS_COMPAT_PYTHON to an interpreter with the original "
        "osmosis-ai 0.3.8 installed",
    ),
]


def workspace_clone(root: Path, bare: Path) -> Path:
    clone = root / "ws"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    git(clone, "remote", "add", "origin", "https://github.com/acme/team.git")
    files = {
        "rollouts/calc/main.py": "def main() -> None:\n    print('calc')\n\n\n"
        "if __name__ == '__main__':\n    main()\n",
        "data/.gitkeep": "",
        "data/math.jsonl": "".join(json.dumps(row) + "\n" for row in ROWS),
        "configs/eval/calc.toml": '[experiment]\nrollout = "calc"\nentrypoint = "main.py"\n'
        'model_path = "openai/gpt-5-mini"\ndataset = "math"\n\n[evaluation]\nlimit = 3\n'
        'n = 2\n\n[env]\nMODE = "fast"\n\n[secrets]\nrequired = []\n',
        "configs/training/calc.toml": '[experiment]\nrollout = "calc"\nentrypoint = "main.py"\n'
        'model_path = "qwen-small"\ndataset = "math"\n\n[training]\nlr = 1e-6\n'
        "total_epochs = 1\n\n[sampling]\nrollout_temperature = 1.0\n\n[checkpoints]\n"
        'checkpoint_save_freq = 20\n\n[advanced]\nkl_coef = 0.1\n\n[secrets]\nrequired = ["RUN_KEY"]\n',
    }
    write_files(clone, files)
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "calc rollout")
    git(clone, "push", "-q", str(bare), "main")
    return clone


class Served:
    """``osmosis platform serve`` on a free loopback port; admin commands on its data dir."""

    def __init__(self, data_dir: Path) -> None:
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None

    def admin(self, *args: str) -> dict:
        done = subprocess.run(
            [str(OURS), "--json", "platform", *args, "--data-dir", str(self.data_dir)],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    def serve(self, log: Path) -> None:
        command = [
            str(OURS), "platform", "serve", "--data-dir", str(self.data_dir),
            "--port", str(self.port), "--log-level", "info", "--workers", "0",
        ]  # fmt: skip
        with log.open("w") as sink:
            self.process = subprocess.Popen(command, stdout=sink, stderr=subprocess.STDOUT)
        wait_until_healthy(self.process, self.url, log.read_text)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.mark.timeout(300)
def test_the_original_cli_submits_lists_shows_and_stops_runs(tmp_path):
    original = Path(COMPAT_PYTHON).parent / "osmosis"
    assert original.exists(), f"no osmosis script next to {COMPAT_PYTHON}"
    bare = tmp_path / "team.git"
    git(tmp_path, "init", "-q", "--bare", "-b", "main", str(bare))
    clone = workspace_clone(tmp_path, bare)
    served = Served(tmp_path / "platform")
    served.admin("user", "create", "alice@example.com", "--name", "Alice")
    served.admin("workspace", "create", "team", "--repo", "acme/team", "--clone-url", str(bare))
    served.admin("workspace", "add-member", "team", "alice@example.com", "--role", "owner")
    model = tmp_path / "qwen"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen3-0.6B"}))
    served.admin("model", "add", "qwen-small", "--path", str(model))
    token = served.admin(
        "token", "create", "--email", "alice@example.com", "--platform-url", served.url
    )["token"]
    log = tmp_path / "serve.log"
    served.serve(log)
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env |= {
        "OSMOSIS_PLATFORM_URL": served.url,
        "OSMOSIS_TOKEN": token,
        "OSMOSIS_TOKEN_PLATFORM_URL": served.url,
        "OSMOSIS_ALLOW_INSECURE_PLATFORM_URL": "1",
        "HOME": str(tmp_path / "home"),
        "NO_COLOR": "1",
        "RUN_KEY": SECRET_VALUE,
    }

    def run(*args: str) -> dict:
        return run_original(original, clone, env, SECRET_VALUE, *args)

    try:
        assert run("dataset", "upload", "data/math.jsonl", "-y")["rc"] == 0

        submitted = run("eval", "submit", "configs/eval/calc.toml", "-y")
        assert submitted["rc"] == 0, submitted
        resource = submitted["resource"]
        name = resource["name"]
        assert resource["status"] == "pending" and resource["dataset_name"] == "math"
        listed = run("eval", "list")
        assert [(r["name"], r["status"], r["rollout"]) for r in listed["items"]] == [
            (name, "pending", "calc")
        ]
        info = run("eval", "info", name)["data"]
        assert info["branch"] == "main" and info["commit_sha"] == git(clone, "rev-parse", "HEAD")
        assert info["config"] == {"model_path": "openai/gpt-5-mini", "limit": 3, "n": 2}
        assert info["env_config"] == {"MODE": "fast"}
        logs = run("eval", "logs", name)
        assert logs["items"][0]["message"].startswith("Submitted: rollout calc")
        stopped = run("eval", "stop", name, "-y")
        assert stopped["rc"] == 0, stopped
        assert run("eval", "info", name)["data"]["eval_run"]["status"] == "stopped"

        # RUN_KEY is stored nowhere: the original sends it with the run, sealed on arrival
        trained = run("train", "submit", "configs/training/calc.toml", "-y")
        assert trained["rc"] == 0, trained
        run_name = trained["resource"]["name"]
        training = run("train", "list")["items"]
        assert [(r["name"], r["model_name"], r["rollout_name"]) for r in training] == [
            (run_name, "qwen-small", "calc")
        ]
        detail = run("train", "info", run_name)["data"]["training_run"]
        assert detail["status"] == "pending" and detail["dataset_name"] == "math"
        assert run("train", "stop", run_name, "-y")["rc"] == 0
        assert run("train", "info", run_name)["data"]["training_run"]["status"] == "stopped"
        again = run("train", "stop", run_name, "-y")
        assert again["rc"] == 0  # stopping a stopped run answers it as it is

        missing = run("eval", "info", "no-such-run")
        assert missing["rc"] == 1 and missing["error"]["code"] == "NOT_FOUND"
    finally:
        served.stop()
    stored = b"".join(p.read_bytes() for p in served.data_dir.rglob("*") if p.is_file())
    assert SECRET_VALUE.encode() not in stored + log.read_bytes()
