"""Checking out a run's code: the workspace repository at the run's commit, from the mirror.

The platform keeps a bare mirror of each workspace repository under the data dir
(:mod:`osmosis_ai.platform.gitsync`). A run's checkout is a clone of that mirror (a local
clone: objects are hard-linked, nothing crosses the network) at ``<work_dir>/checkout``,
with the commit checked out detached. A checkout already at the commit is reused (its
tracked files reset); one at another commit is replaced. The mirror is fetched first only
when it lacks the commit. The checkout's ``origin`` is the mirror's path, so the clone URL
and any credentials in it are never written into the checkout.

The checkout is the workspace's: a committed symbolic link must never send a write of this
trusted process elsewhere, so the run's config goes in through :func:`write_in_checkout`.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.errors import ConfigError
from osmosis_ai.platform import gitsync
from osmosis_ai.platform.errors import NotFoundError
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Workspace

CHECKOUT_DIR = "checkout"


def write_in_checkout(checkout: Path, relative: Path, text: str) -> Path:
    """Write ``text`` to ``checkout / relative``, following no symbolic link on the way."""
    folder = checkout
    for part in relative.parent.parts:
        folder = folder / part
        if folder.is_symlink():
            raise ConfigError(
                f"{relative.parent} is a symbolic link in the repository: the platform writes "
                "the run's config there; make it a plain folder"
            )
        folder.mkdir(exist_ok=True)
    path = checkout / relative
    flags = os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the run's config at {relative} in the checkout ({exc.strerror}): "
            "it must not be a symbolic link in the repository"
        ) from exc
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)
    return path


class CommitNotFoundError(NotFoundError):
    """The run's commit is in neither the mirror nor the repository it mirrors."""

    default_code = "COMMIT_NOT_FOUND"


@dataclass(frozen=True)
class Checkout:
    path: Path
    commit_sha: str
    reused: bool  # an earlier attempt's checkout at the same commit
    fetched: bool  # the mirror lacked the commit and was fetched


def checkout_run(
    database: Database,
    settings: PlatformSettings,
    *,
    workspace_id: str,
    commit_sha: str,
    work_dir: Path,
    timeout: float = gitsync.GIT_TIMEOUT_S,
) -> Checkout:
    """``<work_dir>/checkout`` at ``commit_sha`` of the workspace repository."""
    target = work_dir / CHECKOUT_DIR
    if _head(target) == commit_sha:
        _git(target, "reset", "--hard", "--quiet", timeout=timeout)
        return Checkout(target, commit_sha, reused=True, fetched=False)
    mirror = gitsync.mirror_path(settings.mirrors_dir, workspace_id)
    fetched = False
    with gitsync.mirror_lock(mirror):
        if not _has_commit(mirror, commit_sha):
            gitsync.fetch(_clone_url(database, workspace_id), mirror, timeout=timeout)
            fetched = True
            if not _has_commit(mirror, commit_sha):
                raise CommitNotFoundError(
                    f"The commit {commit_sha} is no longer in the workspace repository (was it "
                    "force-pushed away?): submit the run again at a commit that exists.",
                    details={"commit_sha": commit_sha},
                )
        partial = target.with_name(CHECKOUT_DIR + ".partial")
        shutil.rmtree(partial, ignore_errors=True)
        work_dir.mkdir(parents=True, exist_ok=True)
        # A local clone copies the mirror's objects (hard links), so even a commit no branch
        # points at any more is there to check out.
        _git(
            None,
            "clone",
            "--no-checkout",
            "--quiet",
            "--",
            str(mirror),
            str(partial),
            timeout=timeout,
        )
    try:
        _git(partial, "checkout", "--quiet", "--detach", commit_sha, timeout=timeout)
        shutil.rmtree(target, ignore_errors=True)
        partial.rename(target)
    finally:
        shutil.rmtree(partial, ignore_errors=True)
    return Checkout(target, commit_sha, reused=False, fetched=fetched)


def _clone_url(database: Database, workspace_id: str) -> str:
    with database.read() as session:
        workspace = session.get(Workspace, workspace_id)
        if workspace is None:
            raise NotFoundError(
                f"No workspace with id {workspace_id!r}: it was deleted while the run waited.",
                code="WORKSPACE_NOT_FOUND",
            )
        return workspace.clone_url


def _head(checkout: Path) -> str | None:
    if not (checkout / ".git").is_dir():
        return None
    done = _git(checkout, "rev-parse", "--verify", "--quiet", "HEAD", timeout=30.0, check=False)
    return (done.stdout.strip() or None) if done.returncode == 0 else None


def _has_commit(mirror: Path, commit_sha: str) -> bool:
    if not (mirror / "HEAD").exists():
        return False
    return gitsync.object_type(mirror, commit_sha) == "commit"


def _git(
    cwd: Path | None, *args: str, timeout: float = gitsync.GIT_TIMEOUT_S, check: bool = True
) -> subprocess.CompletedProcess[str]:
    return gitsync.run_git(
        *args,
        repo=() if cwd is None else ("-C", str(cwd)),
        timeout=timeout,
        check=check,
        during=" while checking out the run's code",
        machine="the worker's machine",
    )
