"""The run directory ``<output>/<run-name>/``: create it, resume it under its input lock, or
archive it for ``--fresh`` (never delete).

A run is held through ``<output>/.locks/<run>.lock`` with ``flock``; the lock lives outside the
run dir so that ``--fresh`` can rename the dir while holding it.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import uuid
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path

from pydantic import ValidationError

from osmosis_ai.errors import ConfigError, OsmosisError, UsageError
from osmosis_ai.eval.inputs import MANIFEST_SCHEMA_VERSION, Manifest, Provenance, RunInputs
from osmosis_ai.eval.journal import Journal
from osmosis_ai.rollout.ids import validate_rollout_id
from osmosis_ai.rundir.durable import (
    Closing,
    HeldFile,
    atomic_write_json,
    ensure_dir,
    fsync_dir,
    open_owner_only,
    read_regular_file,
)
from osmosis_ai.rundir.logs import LOGS_FILE
from osmosis_ai.rundir.timestamps import iso_utc

LOCKS_DIR = ".locks"
MANIFEST_FILE = "manifest.json"
JOURNAL_FILE = "events.jsonl"
TRIALS_DIR = "rollout_trials"


class RunLockedError(OsmosisError):
    """Another process holds the run lock."""

    def __init__(self, run_name: str, lock_path: Path, holder_pid: int | None) -> None:
        self.run_name = run_name
        self.lock_path = lock_path
        self.holder_pid = holder_pid
        who = f" (pid {holder_pid})" if holder_pid is not None else ""
        super().__init__(
            f"run {run_name!r} is in use by another `osmosis eval run`{who}; wait for it to "
            f"finish or stop it, then rerun (lock file: {lock_path})"
        )


class ResumeMismatchError(ConfigError):
    """The run exists but was started with different resolved inputs."""

    def __init__(self, run_name: str, run_dir: Path, changed_keys: tuple[str, ...]) -> None:
        self.run_name = run_name
        self.run_dir = run_dir
        self.changed_keys = changed_keys
        super().__init__(
            f"run {run_name!r} cannot be resumed: its inputs changed since it started "
            f"(changed: {', '.join(changed_keys)}). Resuming only recovers an interrupted run "
            f"with identical inputs; rerun with --fresh to archive {run_dir} and start over, "
            "or pick another --name"
        )


class RunLock(HeldFile):
    """An exclusive, non-blocking ``flock`` on ``<output>/.locks/<run>.lock``."""

    @classmethod
    def acquire(cls, output_dir: str | os.PathLike[str], run_name: str) -> RunLock:
        """Take the lock or raise :class:`RunLockedError` at once (never waits)."""
        _check_run_name(run_name)
        path = Path(output_dir) / LOCKS_DIR / f"{run_name}.lock"
        fd = open_owner_only(path, os.O_RDWR)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_pid(fd)
            os.close(fd)
            raise RunLockedError(run_name, path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        with contextlib.suppress(OSError):  # the holder note is for messages only
            os.ftruncate(fd, 0)
            note = json.dumps({"pid": os.getpid(), "since": iso_utc()}) + "\n"
            os.pwrite(fd, note.encode("utf-8"), 0)
        return cls(path, fd)

    @property
    def held(self) -> bool:
        return self._fd >= 0

    def release(self) -> None:
        self.close()  # closing the descriptor drops the flock


@dataclass
class RunDir(Closing):
    """An open run: its folder, manifest and the lock held for it."""

    path: Path
    manifest: Manifest
    lock: RunLock
    resumed: bool
    """True when an existing run was reopened, False when it was created now."""
    archived_to: Path | None = None
    """Where ``--fresh`` moved the previous run of this name, if there was one."""

    @property
    def run_name(self) -> str:
        return self.manifest.run_name

    @property
    def local_run_id(self) -> str:
        return self.manifest.local_run_id

    @property
    def journal_path(self) -> Path:
        return self.path / JOURNAL_FILE

    @property
    def logs_path(self) -> Path:
        return self.path / LOGS_FILE

    @property
    def trials_dir(self) -> Path:
        """``rollout_trials/``: the artifact root handed to the rollout server."""
        return self.path / TRIALS_DIR

    def trial_dir(self, rollout_id: str) -> Path:
        return self.trials_dir / validate_rollout_id(rollout_id)

    def open_journal(self) -> Journal:
        return Journal.open(self.journal_path)

    def close(self) -> None:
        self.lock.release()


def open_run(
    output_dir: str | os.PathLike[str],
    run_name: str,
    inputs: RunInputs,
    provenance: Provenance,
    *,
    fresh: bool,
    now: datetime | None = None,
) -> RunDir:
    """Lock the run, then create it, resume it, or (``fresh``) archive it and start anew.

    Resuming requires the stored input lock to equal ``inputs``; otherwise
    :class:`ResumeMismatchError` names the changed top-level keys. The lock stays held by the
    returned :class:`RunDir` until :meth:`RunDir.close`.
    """
    moment = datetime.now(UTC) if now is None else now
    output = Path(output_dir)
    ensure_dir(output)
    lock = RunLock.acquire(output, run_name)
    try:
        path = output / run_name
        archived = archive_run_dir(path, moment) if fresh and os.path.lexists(path) else None
        manifest = _read_manifest(path, run_name) if os.path.lexists(path) else None
        if manifest is not None:
            _check_resumable(manifest, path, run_name, inputs)
            return RunDir(path, manifest, lock, resumed=True, archived_to=archived)
        manifest = Manifest(
            local_run_id=uuid.uuid4().hex,
            run_name=run_name,
            created_at=iso_utc(moment),
            inputs=inputs.to_json(),
            provenance=provenance.model_dump(mode="json"),
        )
        ensure_dir(path)
        atomic_write_json(path / MANIFEST_FILE, manifest.model_dump(mode="json"))
        return RunDir(path, manifest, lock, resumed=False, archived_to=archived)
    except BaseException:
        lock.release()
        raise


def archive_run_dir(path: Path, now: datetime | None = None) -> Path:
    """Rename ``path`` to ``<name>.archive-<UTC stamp>[-k]`` beside it and return the new path."""
    moment = (datetime.now(UTC) if now is None else now).astimezone(UTC)
    base = f"{path.name}.archive-{moment:%Y%m%dT%H%M%SZ}"
    target = path.with_name(base)
    k = 1
    while os.path.lexists(target):
        target = path.with_name(f"{base}-{k}")
        k += 1
    os.rename(path, target)
    fsync_dir(path.parent)
    return target


def _check_run_name(run_name: str) -> None:
    # Full naming rules belong to the CLI; here only what keeps the name one safe segment.
    if (
        not run_name
        or run_name.startswith(".")
        or any(ch in run_name for ch in ("/", "\\", "\x00"))
    ):
        raise UsageError(
            f"run name {run_name!r} must be a single path segment that does not start with '.'"
        )


def _holder_pid(fd: int) -> int | None:
    try:
        note = json.loads(os.pread(fd, 4096, 0) or b"null")
    except (OSError, ValueError):
        return None
    pid = note.get("pid") if isinstance(note, dict) else None
    return pid if isinstance(pid, int) else None


def _read_manifest(path: Path, run_name: str) -> Manifest | None:
    if not path.is_dir() or path.is_symlink():
        raise ConfigError(
            f"{path} exists and is not a run directory; move it away, or rerun with --fresh to "
            "archive it"
        )
    raw = read_regular_file(path / MANIFEST_FILE)
    if raw is None:
        if any(path.iterdir()):
            raise ConfigError(
                f"{path} has no {MANIFEST_FILE}, so it is not a run that can be resumed; rerun "
                "with --fresh to archive it, or pick another --name"
            )
        return None  # an empty folder left by a crash before the manifest was written
    try:
        manifest = Manifest.model_validate_json(raw)
    except ValidationError as exc:
        raise ConfigError(
            f"{path / MANIFEST_FILE} is not a valid run manifest ({exc.error_count()} problems); "
            "rerun with --fresh to archive the run and start over"
        ) from None
    if manifest.run_name != run_name:
        raise ConfigError(
            f"{path / MANIFEST_FILE} belongs to run {manifest.run_name!r}, not {run_name!r}; "
            "rerun with --fresh to archive it, or pick another --name"
        )
    return manifest


def _check_resumable(manifest: Manifest, path: Path, run_name: str, inputs: RunInputs) -> None:
    changed = manifest.changed_keys(inputs)
    if manifest.schema_version != MANIFEST_SCHEMA_VERSION:
        changed = ("schema_version", *changed)
    if changed:
        raise ResumeMismatchError(run_name, path, changed)
