"""A run process's heartbeat, as its worker sees it: while it lives, the process touches a
file in the run's work dir every second (:func:`start_beating`); the worker reads how long
the file has been still (:func:`silence`). A process that is stopped (SIGSTOP), hung in the
interpreter or swapped out for longer than the run heartbeat deadline
(``OSMOSIS_RUN_STALL_S``) is killed by its worker and its run fails with a
``RunStalledError`` (:mod:`osmosis_ai.platform.worker.runner`). Before its first beat (a cold
interpreter importing), the worker allows at least :data:`FIRST_BEAT_S`.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from pathlib import Path

BEAT_S = 1.0
FIRST_BEAT_S = 60.0


def beat_path(work_dir: Path, attempt: int) -> Path:
    """The file attempt ``attempt``'s process beats on."""
    return Path(work_dir) / f"attempt-{attempt}.alive"


def start_beating(path: Path) -> threading.Thread:
    """Touch ``path`` now and every :data:`BEAT_S` seconds from a daemon thread."""

    def beat() -> None:
        while True:
            with contextlib.suppress(OSError):
                path.touch()
            time.sleep(BEAT_S)

    path.touch()
    thread = threading.Thread(target=beat, name="run-heartbeat", daemon=True)
    thread.start()
    return thread


def last_beat(path: Path, started: float) -> float | None:
    """When the last beat on ``path`` came (wall clock), or ``None`` when none came since
    ``started`` (a ``time.time()``): the process may still be starting up."""
    try:
        mtime = os.stat(path).st_mtime
    except OSError:
        return None
    return mtime if mtime >= started else None
