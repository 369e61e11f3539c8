"""The resolved-input lock of a run and its manifest: what a resume must find unchanged.

``manifest.json`` pins the inputs a run started with; a later invocation of the same run name
resumes only when its own lock is identical. The SDK version, the run name, the output path,
concurrency and display flags are deliberately not part of the lock.
"""

from __future__ import annotations

import hashlib
import os
import stat
from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, field_validator

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.rundir.durable import canonical_json

if TYPE_CHECKING:
    from osmosis_ai.rollout.protocol import Generation

MANIFEST_SCHEMA_VERSION = 1
RolloutProtocolVersion = Literal["0.3", "0.4"]
PROTOCOL_VERSIONS: dict[Generation, RolloutProtocolVersion] = {"callback": "0.3", "polling": "0.4"}
"""The protocol version each generation pins (``rollout.protocol``'s constants, which a test
compares), written out so that planning a run does not import the wire models."""

_EXCLUDED_DIR_NAMES = frozenset({".venv", "__pycache__"})
_EXCLUDED_FILE_NAMES = frozenset({"uv.lock"})


class _Lock(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class DatasetLock(_Lock):
    """The dataset file by content, and which of its rows the run selected."""

    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    selected_source_rows: tuple[int, ...]

    @field_validator("selected_source_rows")
    @classmethod
    def _rows(cls, rows: tuple[int, ...]) -> tuple[int, ...]:
        if any(row < 0 for row in rows) or len(set(rows)) != len(rows):
            raise ValueError("selected_source_rows must be distinct non-negative offsets")
        return rows


class RolloutLock(_Lock):
    """The rollout by name, entrypoint and a digest of its sources."""

    name: str
    entrypoint: str
    source_digest: str = Field(pattern=r"^[0-9a-f]{64}$")


class TimeoutsLock(_Lock):
    """Per-rollout timeouts handed to the server; ``None`` means unbounded."""

    agent_timeout_sec: float | None = Field(default=None, gt=0, allow_inf_nan=False)
    grader_timeout_sec: float | None = Field(default=None, gt=0, allow_inf_nan=False)


class VersionsLock(_Lock):
    """Versions of everything that shapes the stored state."""

    rollout_protocol: RolloutProtocolVersion
    dataset_normalization: int = 1
    state_schema: int = 1

    @classmethod
    def for_generation(cls, generation: Generation) -> VersionsLock:
        """``"0.3"`` for the callback generation, ``"0.4"`` for the polling one."""
        return cls(rollout_protocol=PROTOCOL_VERSIONS[generation])


class RunInputs(_Lock):
    """The resolved-input lock stored as ``manifest.inputs``."""

    model_path: str
    dataset: DatasetLock
    n: int = Field(ge=1)
    rollout: RolloutLock
    env: dict[str, str] = Field(default_factory=dict[str, str])
    secret_names: tuple[str, ...] = ()
    timeouts: TimeoutsLock = TimeoutsLock()
    versions: VersionsLock

    @field_validator("secret_names")
    @classmethod
    def _sorted_names(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        # Order carries no meaning; sorting keeps a reordered config from blocking a resume.
        return tuple(sorted(set(names)))

    def to_json(self) -> dict[str, JsonValue]:
        return self.model_dump(mode="json")

    def digest(self) -> str:
        """SHA-256 (hex) of the canonical lock, e.g. for a generated run name."""
        return hashlib.sha256(canonical_json(self.to_json()).encode("utf-8")).hexdigest()


class Provenance(BaseModel):
    """Where the run came from; recorded, never compared on resume."""

    model_config = ConfigDict(frozen=True, extra="allow")

    sdk_version: str = PACKAGE_VERSION
    git_head: str | None = None
    git_branch: str | None = None
    git_dirty: bool | None = None
    config_branch: str | None = None
    config_commit_sha: str | None = None
    advanced: JsonValue = None


class Manifest(BaseModel):
    """``manifest.json``. ``inputs`` stays a plain document so any stored lock can be compared."""

    model_config = ConfigDict(extra="allow")

    schema_version: int = MANIFEST_SCHEMA_VERSION
    local_run_id: str = Field(pattern=r"^[0-9a-f]{32}$")
    run_name: str
    created_at: str
    inputs: dict[str, JsonValue]
    provenance: dict[str, JsonValue] = Field(default_factory=dict[str, JsonValue])

    def changed_keys(self, inputs: RunInputs) -> tuple[str, ...]:
        """Top-level lock keys whose values differ from ``inputs`` (lock order, then sorted)."""
        new = inputs.to_json()
        keys = list(new) + sorted(set(self.inputs) - set(new))
        missing = object()
        return tuple(k for k in keys if self.inputs.get(k, missing) != new.get(k, missing))


def rollout_source_digest(
    rollout_dir: str | os.PathLike[str], exclude_dirs: Iterable[str | os.PathLike[str]] = ()
) -> str:
    """SHA-256 (hex) over the rollout's sources: sorted relative paths and their bytes.

    Left out: ``.venv/``, ``__pycache__/``, ``*.egg-info/``, ``uv.lock`` and every folder in
    ``exclude_dirs`` (a nested output dir). Symlinks are hashed by their target text and never
    followed; special files are skipped.
    """
    root = Path(rollout_dir)
    excluded = {Path(os.path.realpath(d)) for d in exclude_dirs}
    digest = hashlib.sha256()
    for relative, path in _source_files(root, excluded):
        info = os.lstat(path)
        if stat.S_ISLNK(info.st_mode):
            kind, payload = b"L", os.readlink(path).encode("utf-8", "surrogateescape")
        else:
            kind, payload = b"F", path.read_bytes()
        name = relative.encode("utf-8", "surrogateescape")
        digest.update(kind + len(name).to_bytes(8, "big") + name)
        digest.update(len(payload).to_bytes(8, "big") + payload)
    return digest.hexdigest()


def _source_files(root: Path, excluded: set[Path]) -> list[tuple[str, Path]]:
    found: list[tuple[str, Path]] = []
    stack = [root]
    while stack:
        folder = stack.pop()
        with os.scandir(folder) as entries:
            for entry in entries:
                path = Path(entry.path)
                if entry.is_dir(follow_symlinks=False):
                    skip = entry.name in _EXCLUDED_DIR_NAMES or entry.name.endswith(".egg-info")
                    if not skip and Path(os.path.realpath(path)) not in excluded:
                        stack.append(path)
                elif entry.name not in _EXCLUDED_FILE_NAMES and (
                    entry.is_symlink() or entry.is_file(follow_symlinks=False)
                ):
                    found.append((path.relative_to(root).as_posix(), path))
    found.sort()
    return found
