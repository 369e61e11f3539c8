"""End to end: a real ``osmosis platform serve`` (child process, SQLite data dir), set up with
the admin commands, driven by our CLI's platform commands from a workspace clone. The
connected repository is a bare Git repository on disk that the clone pushes to and the
platform's Git sync reads."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("sqlalchemy")

import platform_cli_support as support
from cli_support import invoke
from osmosis_ai.testing.serving import free_port
from platform_cli_support import git
from platform_support import wait_until_healthy

home = support.home
ROWS = [{"user_prompt": f"{i} + {i} = ?", "ground_truth": str(2 * i)} for i in range(5)]
SECRET = "sk-e2e-value-5f1d"


class Platform:
    """``osmosis platform serve`` on a free loopback port, with admin commands on its store."""

    def __init__(self, capsys, data_dir: Path) -> None:
        self.capsys = capsys
        self.data_dir = data_dir
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.process: subprocess.Popen[str] | None = None

    def admin(self, *args: str) -> dict:
        outcome = invoke(self.capsys, "--json", "platform", *args, "--data-dir", str(self.data_dir))
        assert outcome.code == 0, outcome.err
        return outcome.json()

    def serve(self) -> None:
        command = [
            sys.executable, "-m", "osmosis_ai.cli.main", "--json", "platform", "serve",
            "--data-dir", str(self.data_dir), "--port", str(self.port), "--log-level", "warning",
            "--single-tenant",  # not about isolation: runs where bubblewrap is missing
        ]  # fmt: skip
        self.process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        wait_until_healthy(self.process, self.url, self.process.communicate)

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            self.process.communicate(timeout=30)


def connected_repository(root: Path) -> tuple[Path, Path]:
    """A bare repository ``<root>/git/acme/demo.git`` holding a rollout, and a clone of it."""
    bare = root / "git" / "acme" / "demo.git"
    bare.parent.mkdir(parents=True)
    git(root, "init", "-q", "--bare", "-b", "main", str(bare))
    clone = support.make_workspace(root / "clone", origin=str(bare))
    rollout = clone / "rollouts" / "multiply"
    rollout.mkdir()
    (rollout / "main.py").write_text("VALUE = 2\n")
    (rollout / "README.md").write_text("Multiply two numbers.\n")
    (clone / "configs" / "eval" / "multiply.toml").write_text(
        '[experiment]\nrollout = "multiply"\nentrypoint = "main.py"\n'
        'model_path = "openai/gpt-5-mini"\ndataset = "sums"\n\n[secrets]\nrequired = []\n'
    )
    (clone / "data" / "sums.jsonl").write_text("".join(json.dumps(r) + "\n" for r in ROWS))
    git(clone, "add", "-A")
    git(clone, "commit", "-q", "-m", "multiply rollout")
    git(clone, "push", "-q", "-u", "origin", "main")
    return bare, clone


@pytest.fixture
def platform(capsys, tmp_path, home, monkeypatch):
    bare, clone = connected_repository(tmp_path)
    served = Platform(capsys, tmp_path / "platform")
    served.admin("user", "create", "alice@example.com", "--name", "Alice")
    served.admin("workspace", "create", "Demo", "--repo", "acme/demo", "--clone-url", str(bare))
    served.admin("workspace", "add-member", "Demo", "alice@example.com", "--role", "owner")
    model = tmp_path / "tiny-model"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"_name_or_path": "Qwen/Qwen3-0.6B"}))
    served.admin("model", "add", "acme/tiny", "--path", str(model))
    created = served.admin(
        "token", "create", "--email", "alice@example.com", "--platform-url", served.url
    )
    served.token = created["token"]  # type: ignore[attr-defined]
    served.clone = clone  # type: ignore[attr-defined]
    served.serve()
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", served.url)
    monkeypatch.chdir(clone)
    yield served
    served.stop()


def ok(capsys, *args: str) -> dict:
    outcome = invoke(capsys, *args, "--json")
    assert outcome.code == 0, (args, outcome.err)
    assert SECRET not in outcome.out + outcome.err
    return outcome.json()


@pytest.mark.timeout(300)
def test_our_cli_against_the_real_platform(capsys, platform, tmp_path, monkeypatch):
    login = ok(capsys, "auth", "login", "--token", platform.token)
    assert login["resource"]["email"] == "alice@example.com"
    me = ok(capsys, "auth", "whoami")["data"]
    assert me["workspace"]["name"] == "Demo" and me["workspace"]["role"] == "owner"
    assert me["effective_source"] == "file"

    uploaded = ok(capsys, "dataset", "upload", "data/sums.jsonl", "-y")["resource"]
    assert uploaded["file_name"] == "sums" and uploaded["git"]["identity"] == "acme/demo"
    deadline = time.monotonic() + 60
    info = ok(capsys, "dataset", "info", "sums")["data"]
    while info["status"] != "uploaded" and time.monotonic() < deadline:
        time.sleep(0.1)
        info = ok(capsys, "dataset", "info", "sums")["data"]
    assert info["status"] == "uploaded" and info["row_count"] == 5
    listed = ok(capsys, "dataset", "list")
    assert [d["file_name"] for d in listed["items"]] == ["sums"]
    preview = ok(capsys, "dataset", "preview", "sums", "--rows", "2")["data"]
    assert preview["available"] is True and [r["ground_truth"] for r in preview["rows"]] == [
        "0",
        "2",
    ]
    logs = ok(capsys, "dataset", "logs", "sums")
    assert logs["items"] and all(set(entry) >= {"timestamp", "message"} for entry in logs["items"])
    target = tmp_path / "back.jsonl"
    ok(capsys, "dataset", "download", "sums", "-o", str(target))
    assert target.read_bytes() == (platform.clone / "data" / "sums.jsonl").read_bytes()
    conflict = invoke(capsys, "dataset", "upload", "data/sums.jsonl", "-y", "--json")
    assert conflict.error()["error"]["code"] == "CONFLICT"
    replaced = ok(capsys, "dataset", "upload", "data/sums.jsonl", "-y", "--overwrite")
    assert replaced["resource"]["id"] != uploaded["id"]

    monkeypatch.setenv("E2E_SECRET", SECRET)
    saved = ok(capsys, "secret", "set", "OPENAI_API_KEY", "--env", "E2E_SECRET")
    assert saved["resource"]["scope"] == "personal"
    secrets = ok(capsys, "secret", "list")["items"]
    assert [(s["name"], s["scope"]) for s in secrets] == [("OPENAI_API_KEY", "personal")]
    ok(capsys, "secret", "delete", "OPENAI_API_KEY", "-y")
    assert ok(capsys, "secret", "list")["items"] == []

    models = ok(capsys, "model", "list")
    assert [m["model_name"] for m in models["base_models"]["items"]] == ["acme/tiny"]
    assert models["lora_models"]["items"] == []
    base = ok(capsys, "model", "info", "acme/tiny")["data"]["base_model"]
    assert base["base_model"] == "Qwen/Qwen3-0.6B"

    rollouts = ok(capsys, "rollout", "list")
    assert [r["name"] for r in rollouts["items"]] == ["multiply"]
    assert rollouts["items"][0]["last_synced_commit_sha"] == git(
        platform.clone, "rev-parse", "HEAD"
    )

    submitted = invoke(capsys, "eval", "submit", "configs/eval/multiply.toml", "-y", "--json")
    if submitted.code == 0:
        assert submitted.json()["operation"] == "eval.submit"
    else:  # a platform that does not run evaluations yet refuses by name
        error = submitted.error()["error"]
        assert error["code"] == "NOT_FOUND" and "/api/cli/eval-runs" in error["message"], error

    logout = ok(capsys, "auth", "logout", "-y")
    assert logout["resource"]["revoked"] is True
    gone = httpx.get(
        f"{platform.url}/api/cli/verify", headers={"Authorization": f"Bearer {platform.token}"}
    )
    assert gone.status_code == 401


# --- the original 0.3.8 CLI ---------------------------------------------------------------------

COMPAT_PYTHON = os.environ.get("OSMOSIS_COMPAT_PYTHON", "")


def original(platform: Platform, *args: str, env: dict[str, str]) -> dict:
    script = Path(COMPAT_PYTHON).parent / "osmosis"
    done = subprocess.run(
        [str(script), "--json", *args],
        cwd=platform.clone,  # type: ignore[attr-defined]
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    stream = done.stdout if done.returncode == 0 else done.stderr
    lines = [line for line in stream.splitlines() if line.strip() and '"warning"' not in line]
    return {"rc": done.returncode, **json.loads(lines[-1])}


@pytest.mark.compat
@pytest.mark.skipif(
    not COMPAT_PYTHON,
    reason="compat tier: set OSMOSIS_COMPAT_PYTHON to an interpreter with the original "
    "osmosis-ai 0.3.8 installed",
)
@pytest.mark.timeout(300)
def test_the_original_cli_and_ours_share_logins_and_see_the_same_platform(
    capsys, platform, home, monkeypatch
):
    # The original reads a workspace's identity only from a github.com origin; the platform
    # still fetches from the bare repository it was given.
    git(platform.clone, "remote", "set-url", "origin", "https://github.com/Acme/Demo.git")
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS_")}
    env |= {"OSMOSIS_PLATFORM_URL": platform.url, "HOME": str(home), "NO_COLOR": "1"}
    # The original saves a login; ours reads it (same v2 file, same platform key).
    login = original(platform, "auth", "login", "--token", platform.token, env=env)
    assert login["rc"] == 0, login
    me = ok(capsys, "auth", "whoami")["data"]
    assert me["email"] == "alice@example.com" and me["workspace"]["name"] == "Demo"
    # Ours logs out (revoking the token); the original then sees no login.
    ok(capsys, "auth", "logout", "-y")
    gone = original(platform, "auth", "whoami", env=env)
    assert gone["rc"] == 1 and gone["error"]["code"] == "AUTH_REQUIRED"
    # Ours saves a login; the original reads it.
    fresh = platform.admin(
        "token", "create", "--email", "alice@example.com", "--platform-url", platform.url
    )["token"]
    ok(capsys, "auth", "login", "--token", fresh)
    theirs = original(platform, "auth", "whoami", env=env)
    assert theirs["rc"] == 0, theirs
    assert theirs["data"]["email"] == "alice@example.com"
    assert theirs["data"]["workspace"]["name"] == "Demo"
    # With an environment token bound to our platform, the workspace-scoped listing works too.
    env |= {"OSMOSIS_TOKEN": fresh, "OSMOSIS_TOKEN_PLATFORM_URL": platform.url}
    rollouts = original(platform, "rollout", "list", env=env)
    assert rollouts["rc"] == 0, rollouts
    assert [r["name"] for r in rollouts["items"]] == ["multiply"]
    branch = original(platform, "rollout", "list", "--branch", "main", env=env)
    assert branch["rc"] == 0 and branch["items"][0]["name"] == "multiply"
    whoami = original(platform, "auth", "whoami", env=env)
    assert whoami["rc"] == 0 and whoami["data"]["source"] == "environment"
    # A dataset the original uploads reads the same through both CLIs.
    uploaded = original(platform, "dataset", "upload", "data/sums.jsonl", "-y", env=env)
    assert uploaded["rc"] == 0, uploaded
    theirs = original(platform, "dataset", "info", "sums", env=env)
    ours = ok(capsys, "dataset", "info", "sums")
    assert theirs["rc"] == 0, theirs
    assert theirs["data"] == ours["data"]
