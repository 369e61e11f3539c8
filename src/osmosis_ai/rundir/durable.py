"""Durable files of a run directory: canonical JSON, atomic replace, folder fsync.

One policy for every file a run writes whole: :func:`atomic_write_bytes` writes a temp file
in the same folder, fsyncs it, renames it into place and fsyncs the folder, so neither a
reader nor a crash sees half a file; the file is owner-only (0600), since results and logs
may hold private data.
"""

from __future__ import annotations

import contextlib
import json
import os
import stat
import tempfile
import threading
from pathlib import Path
from types import TracebackType
from typing import Self

OWNER_ONLY = 0o600
"""Mode of every file the run writes: results and logs may hold private data."""


def canonical_json(value: object) -> str:
    """One-line JSON with sorted keys and compact separators; NaN and infinities are refused."""
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    )


def pretty_json(value: object) -> str:
    """Indented JSON with sorted keys and a final newline, for files people read."""
    return json.dumps(value, sort_keys=True, indent=2, ensure_ascii=False, allow_nan=False) + "\n"


def fsync_dir(folder: Path) -> None:
    """Make renames and new entries in ``folder`` durable (best effort where unsupported)."""
    try:
        fd = os.open(folder, os.O_RDONLY | os.O_CLOEXEC)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def ensure_dir(folder: Path) -> None:
    """Create ``folder`` and its missing parents, fsyncing each parent that gained an entry."""
    missing: list[Path] = []
    current = folder
    while not current.exists():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for path in reversed(missing):
        with contextlib.suppress(FileExistsError):
            path.mkdir()
        fsync_dir(path.parent)
    if not folder.is_dir():
        raise NotADirectoryError(f"{folder} exists and is not a directory")


def atomic_write_bytes(path: Path, data: bytes) -> None:
    """Replace ``path`` with ``data`` atomically and durably; the file is owner-only."""
    ensure_dir(path.parent)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    fsync_dir(path.parent)


def atomic_write_json(path: Path, data: object) -> None:
    """Write ``data`` as indented, sorted JSON through :func:`atomic_write_bytes`."""
    atomic_write_bytes(path, pretty_json(data).encode("utf-8"))


def open_owner_only(path: Path, flags: int) -> int:
    """Open (creating if needed) ``path`` with mode 0o600 and narrow an existing wider mode.

    Returns a raw descriptor that is not inherited by child processes. The folder is fsynced
    when the file is new, so the entry itself survives a crash.
    """
    ensure_dir(path.parent)
    existed = path.exists()
    fd = os.open(path, flags | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, OWNER_ONLY)
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(f"{path} is not a regular file")
        if stat.S_IMODE(info.st_mode) != OWNER_ONLY:
            os.fchmod(fd, OWNER_ONLY)
    except BaseException:
        os.close(fd)
        raise
    if not existed:
        fsync_dir(path.parent)
    return fd


def write_all(fd: int, data: bytes) -> None:
    """Write all of ``data`` to ``fd`` (``os.write`` may take only part of it)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]


class Closing:
    """``close()`` as a context manager: ``with`` closes the object on the way out."""

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


class HeldFile(Closing):
    """A descriptor an object holds open on ``path``: used under ``_lock``, closed once."""

    def __init__(self, path: Path, fd: int) -> None:
        self.path = path
        self._fd = fd
        self._lock = threading.Lock()

    def close(self) -> None:
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1


def read_regular_file(path: Path) -> bytes | None:
    """The bytes of ``path`` if it is a regular file reached without following a symlink.

    ``None`` when it is missing, a symlink, a folder or a special file (a FIFO never blocks).
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError:
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        chunks: list[bytes] = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return b"".join(chunks)
    finally:
        os.close(fd)
