"""Every git call of the platform, the server's mirror sync and a worker's checkout alike,
runs under one hardened environment: the machine's global git configuration is not read (its
hooks, protocol allowances and the rest do not apply), hooks never run, and only the allowed
transports are used."""

from __future__ import annotations

from pathlib import Path

import pytest

from osmosis_ai.platform import gitsync
from osmosis_ai.platform.worker.checkout import checkout_run
from platform_support import Harness, git, write_files

HOOKS = ("post-checkout", "reference-transaction", "post-merge", "pre-auto-gc")


@pytest.fixture
def hostile_global_config(tmp_path, monkeypatch) -> Path:
    """A global git config that runs hooks (each touches a mark) and allows ``ext::``."""
    hooks = tmp_path / "hooks"
    hooks.mkdir()
    marks = tmp_path / "marks"
    marks.mkdir()
    for name in HOOKS:
        hook = hooks / name
        hook.write_text(f'#!/bin/sh\ntouch "{marks}/{name}"\n')
        hook.chmod(0o755)
    config = tmp_path / "global.gitconfig"
    config.write_text(f'[core]\n\thooksPath = {hooks}\n[protocol "ext"]\n\tallow = always\n')
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(config))
    return marks


@pytest.fixture
def origin(tmp_path) -> tuple[Path, str]:
    repo = tmp_path / "origin"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    write_files(repo, {"rollouts/alpha/main.py": "print('alpha')\n"})
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "first")
    return repo, git(repo, "rev-parse", "HEAD")


def test_the_mirror_sync_and_the_checkout_run_no_hook_of_the_global_config(
    tmp_path, origin, hostile_global_config
):
    repo, commit = origin
    harness = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'p.db'}")
    try:
        workspace_id = harness.workspace("Team", "acme/agents", clone_url=str(repo))
        mirror = gitsync.mirror_path(harness.settings.mirrors_dir, workspace_id)
        gitsync.fetch(str(repo), mirror)
        gitsync.fetch(str(repo), mirror)  # the second time a fetch into the existing mirror
        assert not list(hostile_global_config.iterdir()), "the mirror sync ran a hook"
        done = checkout_run(
            harness.platform.database,
            harness.settings,
            workspace_id=workspace_id,
            commit_sha=commit,
            work_dir=tmp_path / "work",
        )
        assert (done.path / "rollouts" / "alpha" / "main.py").is_file()
        assert not list(hostile_global_config.iterdir()), "the checkout ran a hook"
    finally:
        harness.close()


def test_a_transport_outside_the_allowed_ones_is_refused(tmp_path, hostile_global_config):
    """``ext::`` runs a command: refused by the mirror sync and by a worker's checkout, which
    fetches through it, even where the global configuration allows it."""
    pwned = tmp_path / "pwned"
    url = f"ext::sh -c touch% {pwned}"
    with pytest.raises(gitsync.GitSyncError, match="failed"):
        gitsync.fetch(url, tmp_path / "mirror.git")
    harness = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'p.db'}")
    try:
        workspace_id = harness.workspace("Team", "acme/agents", clone_url=url)
        with pytest.raises(gitsync.GitSyncError, match="failed"):
            checkout_run(
                harness.platform.database,
                harness.settings,
                workspace_id=workspace_id,
                commit_sha="0" * 40,
                work_dir=tmp_path / "work",
            )
    finally:
        harness.close()
    assert not pwned.exists()
