"""The local Git clone of a workspace repository: where it is, who it is, what is unpushed.

A platform workspace claims a repository by ``owner/repo``; the clone's ``origin`` names
it as the last two path components of the remote URL (``.git`` stripped, lower-cased),
whatever the transport: https, ssh (``git@host:owner/repo.git``), ``file://`` or a local
path. Everything here runs ``git`` and never raises for Git's own failures: a missing
answer is ``None``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import unquote, urlsplit, urlunsplit

from osmosis_ai.platform.client.errors import NotAWorkspaceError, PlatformClientError

_SCP_LIKE = re.compile(r"^(?:(?P<user>[^@/\s]+)@)?(?P<host>[^:/\s]+):(?P<path>[^/].*)$")
_NAME = re.compile(r"^[a-z0-9._-]+$")
SCAFFOLD_DIRS = ("rollouts", "configs/training", "configs/eval", "data")


@dataclass(frozen=True)
class RepoIdentity:
    """``owner/repo`` as sent in ``X-Osmosis-Git``, and the remote URL without credentials."""

    identity: str
    remote_url: str


@dataclass(frozen=True)
class LocalState:
    """What the platform will not see: uncommitted edits and commits not pushed."""

    branch: str | None  # None: detached HEAD
    head_sha: str | None
    dirty: bool
    has_upstream: bool
    ahead: int


def _git(root: Path, *args: str) -> str | None:
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(root), *args],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def worktree_root(start: Path) -> Path | None:
    """The top level of the Git worktree holding ``start``."""
    start = start.resolve()
    top = _git(start if start.is_dir() else start.parent, "rev-parse", "--show-toplevel")
    return Path(top).resolve() if top else None


def origin_url(root: Path) -> str | None:
    return _git(root, "remote", "get-url", "origin") or None


def identity_of(url: str) -> RepoIdentity:
    """The ``owner/repo`` a remote URL names; raises ``WORKSPACE_REQUIRED`` when none."""
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise _bad_origin(url, "it contains whitespace or control characters")
    scp = _SCP_LIKE.match(url)
    if scp is not None and "://" not in url and not Path(url).exists():
        path = scp.group("path")
        user = scp.group("user")
        display = f"{user + '@' if user else ''}{scp.group('host')}:{path}"
    elif "://" in url:
        parts = urlsplit(url)
        path = unquote(parts.path)
        display = urlunsplit((parts.scheme, parts.netloc.rsplit("@", 1)[-1], parts.path, "", ""))
        if parts.scheme == "ssh" and parts.username:
            display = display.replace("ssh://", f"ssh://{parts.username}@", 1)
    else:
        path = url
        display = url
    segments = [s for s in path.replace("\\", "/").split("/") if s and s != "."]
    if len(segments) < 2:
        raise _bad_origin(url, "it does not end in <owner>/<repo>")
    owner, repo = segments[-2].lower(), segments[-1].lower().removesuffix(".git")
    if not (_NAME.match(owner) and _NAME.match(repo)) or repo in ("", ".", ".."):
        raise _bad_origin(url, f"{owner}/{repo} is not a valid owner/repo")
    return RepoIdentity(f"{owner}/{repo}", display)


def _bad_origin(url: str, why: str) -> PlatformClientError:
    shown = urlsplit(url)._replace(netloc=urlsplit(url).netloc.rsplit("@", 1)[-1]).geturl()
    return PlatformClientError(
        "WORKSPACE_REQUIRED",
        f"The Git remote 'origin' ({shown}) does not name a repository: {why}. Point origin "
        "at the repository your platform workspace is connected to.",
        details={"remote_url": shown},
    )


def local_state(root: Path) -> LocalState | None:
    head = _git(root, "rev-parse", "HEAD")
    if head is None:
        return None
    branch = _git(root, "rev-parse", "--abbrev-ref", "HEAD")
    upstream = _git(root, "rev-parse", "--abbrev-ref", "--symbolic-full-name", "@{u}")
    ahead = _git(root, "rev-list", "--count", "@{u}..HEAD") if upstream else None
    porcelain = _git(root, "status", "--porcelain")
    return LocalState(
        branch=None if branch in (None, "HEAD") else branch,
        head_sha=head,
        dirty=bool(porcelain),
        has_upstream=bool(upstream),
        ahead=int(ahead) if ahead and ahead.isdigit() else 0,
    )


def commit_exists(repo: Path | str, sha: str) -> bool | None:
    """Whether ``sha`` names a commit in the repository at ``repo`` (``None``: cannot tell)."""
    if shutil.which("git") is None:
        return None
    try:
        done = subprocess.run(
            ["git", "-C", str(repo), "cat-file", "-e", f"{sha}^{{commit}}"],
            capture_output=True,
            check=False,
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if done.returncode == 0:
        return True
    if _git(Path(repo), "rev-parse", "--git-dir") is None:
        return None  # not a repository we can read
    return False


def local_remote_path(url: str, root: Path) -> Path | None:
    """The directory of a remote on this machine (a path or ``file://``), else ``None``.

    A relative path is relative to the clone at ``root``, as Git reads it.
    """
    if url.startswith("file://"):
        path = Path(unquote(urlsplit(url).path))
    elif "://" in url or (_SCP_LIKE.match(url) and not (root / url).exists()):
        return None
    else:
        path = root / Path(url).expanduser()
    return path.resolve() if path.exists() else None


# --- the workspace directory ----------------------------------------------------------------


@dataclass(frozen=True)
class WorkspaceDirectory:
    """A local clone of a workspace repository and the identity its ``origin`` names."""

    root: Path
    identity: str
    remote_url: str

    def result_context(self) -> dict[str, object]:
        return {
            "git": {"identity": self.identity, "remote_url": self.remote_url},
            "workspace_directory": str(self.root),
        }


def find_workspace_directory(start: Path | None = None) -> WorkspaceDirectory | None:
    """The workspace directory at ``start`` (default: cwd), or ``None`` when there is none."""
    try:
        return require_workspace_directory(start)
    except NotAWorkspaceError:
        return None


def require_workspace_directory(start: Path | None = None) -> WorkspaceDirectory:
    here = (start or Path.cwd()).resolve()
    root = worktree_root(here)
    if root is None:
        raise NotAWorkspaceError(
            f"{here} is not inside a workspace directory: run this command in a Git clone of "
            "the repository your platform workspace is connected to.",
            {"start": str(here)},
        )
    missing = [d for d in SCAFFOLD_DIRS if not (root / d).is_dir()]
    if missing:
        raise NotAWorkspaceError(
            f"The workspace directory {root} is missing {', '.join(d + '/' for d in missing)}. "
            "Run `osmosis doctor --fix` to restore the scaffold.",
            {"workspace_directory": str(root), "missing": missing},
            code="VALIDATION",
        )
    url = origin_url(root)
    if url is None:
        raise NotAWorkspaceError(
            f"The Git repository at {root} has no 'origin' remote. Set it to the repository "
            "your platform workspace is connected to (git remote add origin URL).",
            {"workspace_directory": str(root)},
        )
    repo = identity_of(url)
    return WorkspaceDirectory(root, repo.identity, repo.remote_url)
