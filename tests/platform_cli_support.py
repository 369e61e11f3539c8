"""Fixtures for the CLI's platform commands: a stand-in platform served on 127.0.0.1, a
private HOME for saved logins, and a workspace directory (a Git clone with the scaffold
and an ``origin`` naming ``acme/demo``)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from osmosis_ai.testing.serving import ServerThread
from platform_standin import StandIn

IDENTITY = "acme/demo"
ORIGIN = "git@github.com:Acme/Demo.git"
SCAFFOLD = ("rollouts", "configs/training", "configs/eval", "data")
GIT_ENV = {
    "GIT_AUTHOR_NAME": "Test",
    "GIT_AUTHOR_EMAIL": "test@example.com",
    "GIT_COMMITTER_NAME": "Test",
    "GIT_COMMITTER_EMAIL": "test@example.com",
}


def git(root: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(root), *args],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, **GIT_ENV},
    )
    return done.stdout.strip()


def make_workspace(root: Path, origin: str | None = ORIGIN) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    git(root, "init", "-q", "-b", "main")
    for directory in SCAFFOLD:
        (root / directory).mkdir(parents=True, exist_ok=True)
        (root / directory / ".gitkeep").write_text("")
    if origin is not None:
        git(root, "remote", "add", "origin", origin)
    git(root, "add", "-A")
    git(root, "commit", "-q", "-m", "scaffold")
    return root


@pytest.fixture
def standin():
    platform = StandIn()
    with ServerThread(platform.app()) as server:
        platform.url = server.url
        yield platform


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A private HOME (saved logins) and a clean platform environment."""
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    for name in list(os.environ):
        if name.startswith("OSMOSIS_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("OSMOSIS_TOKEN_STORE", "file")  # never the developer's keyring
    return home


@pytest.fixture
def workspace(tmp_path, monkeypatch):
    root = make_workspace(tmp_path / "demo")
    monkeypatch.chdir(root)
    return root


@pytest.fixture
def platform_env(standin, home, workspace, monkeypatch):
    """Inside the workspace, logged in to the stand-in through OSMOSIS_TOKEN."""
    standin.add_workspace(IDENTITY)
    token = standin.add_token()
    monkeypatch.setenv("OSMOSIS_PLATFORM_URL", standin.url)
    monkeypatch.setenv("OSMOSIS_TOKEN", token)
    monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", standin.url)
    return standin
