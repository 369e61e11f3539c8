"""Signalling a run's processes: its process group and every group started beneath it.

A run's process runs in its own session (process group). What it starts may open groups of
their own (a rollout server does, so that a terminal's Ctrl-C does not reach it before its
controller): signalling the run's group alone would leave those behind. The tree is read
from the live parent links (psutil) while the run's process still stands, so every
descendant is found before anything is killed.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time


def descendant_groups(pid: int) -> list[int]:
    """The process groups of ``pid``'s descendants other than ``pid``'s own, deepest last."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        return []
    own = _group_of(pid)
    groups: list[int] = []
    for child in children:
        group = _group_of(child.pid)
        if group is not None and group != own and group not in groups:
            groups.append(group)
    return groups


def signal_tree(pid: int, sig: int, *, own_group: bool = True) -> None:
    """Send ``sig`` to every group beneath ``pid``, then (``own_group``) to ``pid``'s group.

    Never signals the caller's own group unless ``pid`` is the caller.
    """
    mine = os.getpgrp()
    groups = descendant_groups(pid)
    if own_group:
        group = _group_of(pid)
        if group is not None:
            groups.append(group)
    for group in groups:
        if group == mine and pid != os.getpid():
            continue
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s group and every group beneath it."""
    signal_tree(pid, signal.SIGKILL)


def kill_descendants() -> None:
    """SIGKILL every process this one started, directly or not, and their groups (this
    process and the rest of its own group are left alone)."""
    import psutil

    me = os.getpid()
    own = os.getpgrp()
    try:
        children = psutil.Process(me).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        group = _group_of(child.pid)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            if group is not None and group != own:
                os.killpg(group, signal.SIGKILL)
            os.kill(child.pid, signal.SIGKILL)


def group_alive(group: int) -> bool:
    """Whether any process of ``group`` still runs (zombies count as gone)."""
    import psutil

    for process in psutil.process_iter(["pid", "status"]):
        with contextlib.suppress(psutil.Error, OSError):
            if process.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getpgid(process.info["pid"]) == group:
                return True
    return False


def wait_group_gone(group: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``group`` to have no live process; whether it did."""
    deadline = time.monotonic() + timeout
    while group_alive(group):
        if time.monotonic() >= deadline:
            return False
        time.sleep(0.05)
    return True


def _group_of(pid: int) -> int | None:
    try:
        return os.getpgid(pid)
    except (ProcessLookupError, PermissionError):
        return None
