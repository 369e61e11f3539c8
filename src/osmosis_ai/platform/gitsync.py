"""Git sync: keep a bare mirror of a workspace repository and read its rollouts.

The mirror lives under the data dir (``git/<workspace id>.git``), made with
``git clone --mirror`` and refreshed with ``git fetch --prune``; work on one mirror is
serialized by a file lock. Every git call of the platform (here and in the workers'
checkouts) goes through :func:`run_git`: a timeout, no prompt, no hooks, no system or global
git configuration, only the allowed transports. A rollout is a folder ``rollouts/<name>/``
holding ``main.py``; its description is its ``pyproject.toml``'s ``project.description``,
else the first line of its README. Error text never carries the credentials a clone URL may
hold.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tomllib
from collections.abc import Generator
from dataclasses import dataclass
from pathlib import Path

from osmosis_ai.platform.errors import PlatformError

GIT_TIMEOUT_S = 120.0
ROLLOUTS_DIR = "rollouts"
_URL_CREDENTIALS = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*://)[^/@\s]+@")


class GitSyncError(PlatformError):
    """Git could not fetch or read the workspace repository."""

    status_code = 502
    default_code = "GIT_SYNC_FAILED"


@dataclass(frozen=True)
class FoundRollout:
    name: str
    description: str | None


@dataclass(frozen=True)
class BranchHead:
    name: str
    commit_sha: str
    author: str | None


def redact(text: str) -> str:
    """``text`` with any ``scheme://user:password@`` credentials replaced by ``***``."""
    return _URL_CREDENTIALS.sub(r"\g<scheme>***@", text)


def mirror_path(mirrors_dir: Path, workspace_id: str) -> Path:
    return mirrors_dir / f"{workspace_id}.git"


@contextlib.contextmanager
def mirror_lock(mirror: Path) -> Generator[None]:
    """Serialize git work on one mirror across threads and processes."""
    mirror.parent.mkdir(parents=True, exist_ok=True)
    with (mirror.parent / f"{mirror.name}.lock").open("a") as handle:
        fcntl.flock(handle.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle.fileno(), fcntl.LOCK_UN)


def fetch(clone_url: str, mirror: Path, *, timeout: float = GIT_TIMEOUT_S) -> None:
    """Bring the mirror of ``clone_url`` up to date (clone it the first time)."""
    if (mirror / "HEAD").exists():
        current = _git(mirror, "config", "--get", "remote.origin.url", timeout=timeout, check=False)
        if current.strip() != clone_url:
            _git(mirror, "remote", "set-url", "origin", clone_url, timeout=timeout)
        _git(mirror, "fetch", "--prune", "--quiet", "origin", timeout=timeout)
        _refresh_head(mirror, timeout=timeout)
        return
    partial = mirror.with_name(mirror.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    try:
        _git(None, "clone", "--mirror", "--quiet", "--", clone_url, str(partial), timeout=timeout)
        partial.rename(mirror)
    finally:
        shutil.rmtree(partial, ignore_errors=True)


def default_branch(mirror: Path, heads: list[BranchHead] | None = None) -> str | None:
    """The remote's default branch. A bare repository made with ``git init --bare`` keeps
    ``HEAD`` on a branch nobody pushed (``master`` while work went to ``main``): then the
    only branch, or ``main``, or ``master``, whichever exists. ``heads``, when given, are
    the mirror's :func:`branches` (read once by a caller that has them)."""
    ref = _git(mirror, "symbolic-ref", "--quiet", "HEAD", check=False).strip()
    named = ref.removeprefix("refs/heads/") if ref.startswith("refs/heads/") else None
    existing = [head.name for head in (branches(mirror) if heads is None else heads)]
    if named in existing or not existing:
        return named
    if len(existing) == 1:
        return existing[0]
    return next((name for name in ("main", "master") if name in existing), None)


def branches(mirror: Path) -> list[BranchHead]:
    """Every branch of the mirror with its head commit and that commit's author."""
    listing = _git(
        mirror,
        "for-each-ref",
        "--format=%(refname:strip=2)%00%(objectname)%00%(authorname)",
        "refs/heads/",
    )
    heads: list[BranchHead] = []
    for line in listing.splitlines():
        name, sha, author = [*line.split("\0"), "", ""][:3]
        if name and sha:
            heads.append(BranchHead(name=name, commit_sha=sha, author=author or None))
    return heads


def rollouts_at(mirror: Path, commit: str) -> list[FoundRollout]:
    """The rollouts (``rollouts/<name>/main.py``) in ``commit``, by name."""
    listing = _git(mirror, "ls-tree", "-r", "--name-only", "-z", commit, "--", f"{ROLLOUTS_DIR}/")
    files: dict[str, set[str]] = {}
    for path in listing.split("\0"):
        parts = path.split("/")
        if len(parts) == 3 and parts[0] == ROLLOUTS_DIR:
            files.setdefault(parts[1], set()).add(parts[2])
    found: list[FoundRollout] = []
    for name in sorted(files):
        if "main.py" not in files[name]:
            continue
        found.append(
            FoundRollout(name=name, description=_description(mirror, commit, name, files[name]))
        )
    return found


def branch_head(mirror: Path, branch: str) -> str | None:
    """The commit ``branch`` points at in the mirror (``None`` if there is no such branch)."""
    found = _git(
        mirror, "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}^{{commit}}", check=False
    )
    return found.strip() or None


def commits_matching(mirror: Path, prefix: str) -> list[str]:
    """The full SHAs of the commits whose id starts with the hex ``prefix`` (4 to 40 chars)."""
    if not 4 <= len(prefix) <= 40 or any(c not in "0123456789abcdef" for c in prefix.lower()):
        raise ValueError(f"not a hex commit prefix: {prefix!r}")
    listing = _git(mirror, "rev-parse", f"--disambiguate={prefix.lower()}", check=False)
    candidates = [line.strip() for line in listing.splitlines() if line.strip()]
    return [sha for sha in candidates if object_type(mirror, sha) == "commit"]


def object_type(mirror: Path, revision: str) -> str | None:
    """``commit``, ``tree``, ``blob`` or ``tag`` for ``revision`` (e.g. ``SHA:path``); or None."""
    found = _git(mirror, "cat-file", "-t", revision, check=False).strip()
    return found or None


def _description(mirror: Path, commit: str, name: str, present: set[str]) -> str | None:
    if "pyproject.toml" in present:
        text = _show(mirror, commit, f"{ROLLOUTS_DIR}/{name}/pyproject.toml")
        try:
            project = tomllib.loads(text).get("project", {})
        except tomllib.TOMLDecodeError:
            project = {}
        described = project.get("description") if isinstance(project, dict) else None
        if isinstance(described, str) and described.strip():
            return described.strip()
    readme = next((f for f in sorted(present) if f.lower().startswith("readme")), None)
    if readme is not None:
        for line in _show(mirror, commit, f"{ROLLOUTS_DIR}/{name}/{readme}").splitlines():
            stripped = line.strip().lstrip("#").strip()
            if stripped:
                return stripped[:500]
    return None


def _show(mirror: Path, commit: str, path: str) -> str:
    return _git(mirror, "cat-file", "blob", f"{commit}:{path}", check=False)


def _refresh_head(mirror: Path, *, timeout: float) -> None:
    """Point the mirror's HEAD at the remote's default branch (a clone does this itself)."""
    remote = _git(mirror, "ls-remote", "--symref", "origin", "HEAD", timeout=timeout, check=False)
    for line in remote.splitlines():
        if line.startswith("ref: ") and line.endswith("\tHEAD"):
            ref = line.removeprefix("ref: ").removesuffix("\tHEAD").strip()
            _git(mirror, "symbolic-ref", "HEAD", ref, timeout=timeout, check=False)
            return


def _git(cwd: Path | None, *args: str, timeout: float = GIT_TIMEOUT_S, check: bool = True) -> str:
    repo = () if cwd is None else ("--git-dir", str(cwd))
    return run_git(*args, repo=repo, timeout=timeout, check=check).stdout


# --- the one way the platform runs git ---------------------------------------------------------

# Transports a workspace's clone URL may use (``ext::`` and the rest are refused).
ALLOWED_PROTOCOLS = "file:git:http:https:ssh"
# Inherited variables that would point git elsewhere or inject configuration.
_DROPPED = ("GIT_CONFIG", "GIT_DIR", "GIT_WORK_TREE", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY")


def git_env() -> dict[str, str]:
    """The environment of every git call: no system or global configuration (so no hook,
    filter, credential helper, URL rewrite or protocol allowance of the machine's user
    applies), no prompt for a password, ssh in batch mode, and only
    :data:`ALLOWED_PROTOCOLS`."""
    env = {k: v for k, v in os.environ.items() if not k.startswith(_DROPPED)}
    env.update(
        {
            "GIT_CONFIG_NOSYSTEM": "1",
            "GIT_CONFIG_GLOBAL": os.devnull,
            "GIT_TERMINAL_PROMPT": "0",
            "GIT_ASKPASS": "echo",
            "SSH_ASKPASS": "echo",
            "GCM_INTERACTIVE": "never",
            "GIT_ALLOW_PROTOCOL": ALLOWED_PROTOCOLS,
            "LC_ALL": "C",
        }
    )
    env.setdefault("GIT_SSH_COMMAND", "ssh -o BatchMode=yes")
    return env


def run_git(
    *args: str,
    repo: tuple[str, ...] = (),
    timeout: float = GIT_TIMEOUT_S,
    check: bool = True,
    during: str = "",
    machine: str = "the platform's machine",
) -> subprocess.CompletedProcess[str]:
    """``git [repo] ARGS`` under :func:`git_env` with hooks off, within ``timeout``; a failure
    (``check``), a timeout or a missing git is a :class:`GitSyncError` whose text carries no
    credentials. ``repo`` selects the repository (``("--git-dir", path)`` or ``("-C",
    path)``); ``during`` (" while ...") says what the call was for."""
    command = ["git", "-c", f"core.hooksPath={os.devnull}", *repo, *args]
    try:
        done = subprocess.run(
            command,
            capture_output=True,
            text=True,
            timeout=timeout,
            env=git_env(),
            stdin=subprocess.DEVNULL,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise GitSyncError(
            f"git {args[0]} took longer than {timeout:.0f} s{during} and was stopped.",
            details={"command": args[0]},
        ) from None
    except FileNotFoundError:
        raise GitSyncError(
            f"git is not installed on {machine}: install git.", code="GIT_NOT_INSTALLED"
        ) from None
    if check and done.returncode != 0:
        output = redact((done.stderr or done.stdout).strip())[-1000:]
        raise GitSyncError(
            f"git {args[0]} failed{during} (exit {done.returncode}): {output}",
            details={"command": args[0], "exit_code": done.returncode},
        )
    return done
