"""The workspace directory: finding it, naming its parts, checking and fixing its scaffold.

A workspace is any directory holding ``rollouts/`` or ``configs/``; no Git remote is needed.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from osmosis_ai.errors import UsageError
from osmosis_ai.workspace.agent_files import CLAUDE_MD, CONFIGS_AGENTS_MD, ROOT_AGENTS_MD
from osmosis_ai.workspace.names import InvalidNameError

ROLLOUT_NAME_PATTERN = re.compile(r"^[a-z][a-z0-9-]*$")

# (relative path, kind, text written by fix_scaffold for files), in creation order.
_SCAFFOLD: tuple[tuple[str, Literal["dir", "file"], str], ...] = (
    ("rollouts", "dir", ""),
    ("configs/training", "dir", ""),
    ("configs/eval", "dir", ""),
    ("data", "dir", ""),
    ("data/.gitkeep", "file", ""),
    ("AGENTS.md", "file", ROOT_AGENTS_MD),
    ("CLAUDE.md", "file", CLAUDE_MD),
    ("configs/AGENTS.md", "file", CONFIGS_AGENTS_MD),
)


class WorkspaceNotFoundError(UsageError):
    """No directory at or above the start directory looks like a workspace."""

    def __init__(self, start: Path) -> None:
        self.start = start
        super().__init__(
            f"No Osmosis workspace found at or above {start} (no ancestor holds rollouts/ "
            "or configs/). Run `osmosis doctor --fix` in your project root to create one."
        )


class ScaffoldConflictError(UsageError):
    """A scaffold path exists with the wrong kind (a file where a directory belongs)."""

    def __init__(self, path: Path, expected: str) -> None:
        self.path = path
        super().__init__(
            f"{path} exists but is not a {expected}; move it aside and run the fix again"
        )


@dataclass(frozen=True)
class Workspace:
    """A workspace directory and the well-known paths inside it."""

    root: Path

    @property
    def rollouts_dir(self) -> Path:
        return self.root / "rollouts"

    @property
    def configs_dir(self) -> Path:
        return self.root / "configs"

    @property
    def eval_configs_dir(self) -> Path:
        return self.root / "configs" / "eval"

    @property
    def training_configs_dir(self) -> Path:
        return self.root / "configs" / "training"

    @property
    def data_dir(self) -> Path:
        return self.root / "data"

    @property
    def output_dir(self) -> Path:
        """``.osmosis/``: where commands write their outputs."""
        return self.root / ".osmosis"


def find_workspace(start: Path | None = None) -> Workspace:
    """The nearest directory at or above ``start`` (default: cwd) holding rollouts/ or configs/."""
    origin = (start if start is not None else Path.cwd()).expanduser().resolve()
    here = origin if origin.is_dir() or not origin.exists() else origin.parent
    for candidate in (here, *here.parents):
        if (candidate / "rollouts").is_dir() or (candidate / "configs").is_dir():
            return Workspace(candidate)
    raise WorkspaceNotFoundError(origin)


@dataclass(frozen=True)
class ScaffoldEntry:
    """One required scaffold path (relative, POSIX style) and whether it is in place."""

    path: str
    kind: Literal["dir", "file"]
    present: bool


@dataclass(frozen=True)
class ScaffoldReport:
    """What ``osmosis doctor`` found: every required path, present or missing."""

    root: Path
    entries: tuple[ScaffoldEntry, ...]

    @property
    def ok(self) -> bool:
        return all(entry.present for entry in self.entries)

    @property
    def present(self) -> list[str]:
        return [entry.path for entry in self.entries if entry.present]

    @property
    def missing(self) -> list[str]:
        return [entry.path for entry in self.entries if not entry.present]

    def to_dict(self) -> dict[str, object]:
        return {
            "root": str(self.root),
            "ok": self.ok,
            "present": self.present,
            "missing": self.missing,
        }


def check_scaffold(root: Path) -> ScaffoldReport:
    """Report which required directories and agent files exist under ``root``."""
    entries = tuple(
        ScaffoldEntry(rel, kind, _is_kind(root / rel, kind)) for rel, kind, _ in _SCAFFOLD
    )
    return ScaffoldReport(root, entries)


def fix_scaffold(root: Path) -> list[Path]:
    """Create the missing scaffold paths under ``root``; never overwrite. Returns what was created.

    Raises :class:`ScaffoldConflictError` when a path exists with the wrong kind.
    """
    created: list[Path] = []
    for rel, kind, text in _SCAFFOLD:
        path = root / rel
        if _is_kind(path, kind):
            continue
        if path.exists() or path.is_symlink():
            raise ScaffoldConflictError(path, "directory" if kind == "dir" else "file")
        for parent in reversed(path.parents if kind == "file" else (path, *path.parents)):
            if parent.exists() and not parent.is_dir():
                raise ScaffoldConflictError(parent, "directory")
            if not parent.exists():
                parent.mkdir()
                created.append(parent)
        if kind == "file":
            with path.open("x", encoding="utf-8") as handle:  # "x": never clobber
                handle.write(text)
            created.append(path)
    return created


def _is_kind(path: Path, kind: Literal["dir", "file"]) -> bool:
    return path.is_dir() if kind == "dir" else path.is_file()


def validate_rollout_name(name: str) -> str:
    """Return ``name`` if it is a valid rollout name (``^[a-z][a-z0-9-]*$``, not ``default``)."""
    if name == "default":
        raise InvalidNameError("rollout", name, "'default' is reserved; choose another name")
    if not ROLLOUT_NAME_PATTERN.match(name):
        raise InvalidNameError(
            "rollout",
            name,
            "use lowercase letters, digits and '-', starting with a letter (e.g. 'my-agent')",
        )
    return name
