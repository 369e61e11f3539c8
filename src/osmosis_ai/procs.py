"""Processes we start and the ports they listen on: a free loopback port, stopping a child's
process group (SIGTERM, then SIGKILL after a grace period, the group swept either way), and
signalling a whole tree of groups.

A child we stop runs in a process group of its own (``start_new_session=True``), so signals
go to its group: what it started stays in the group even after the child itself has exited
(a Ray node's daemons, a server's workers). What a process starts may open groups of its own
(a rollout server does, so that a terminal's Ctrl-C does not reach it before its controller):
the tree functions read those from the live parent links (psutil, the ``platform`` extra)
while the root still stands, so every descendant is found before anything is killed.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

LOOPBACK = "127.0.0.1"
KILL_WAIT_S = 5.0  # how long a SIGKILLed leader gets to be reaped


def free_port(host: str = LOOPBACK) -> int:
    """A TCP port on ``host`` that was free a moment ago."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def signal_group(pgid: int, sig: int) -> bool:
    """Send ``sig`` to process group ``pgid``; False when the group is gone or not ours."""
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie, dead but not yet reaped by its parent, does not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True  # no /proc (macOS): kill(0) is all we know
    return stat.rpartition(")")[2].split()[:1] != ["Z"]


def stop_process(process: subprocess.Popen[bytes], grace_s: float) -> None:
    """Stop the group ``process`` leads: SIGTERM while it runs, SIGKILL once it has exited
    or ``grace_s`` has passed (what is left of its group goes too); waits for the leader."""
    if process.poll() is None:
        signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(timeout=grace_s)
    signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=KILL_WAIT_S)


async def stop_process_async(process: asyncio.subprocess.Process, grace_s: float) -> None:
    """:func:`stop_process` for an asyncio child, without blocking the loop."""
    if process.returncode is None:
        signal_group(process.pid, signal.SIGTERM)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(process.wait(), grace_s)
    signal_group(process.pid, signal.SIGKILL)
    with contextlib.suppress(TimeoutError):
        await asyncio.wait_for(process.wait(), KILL_WAIT_S)


def stop_group(pgid: int, grace_s: float) -> None:
    """Stop a group whose leader is not our child (we cannot wait on it): SIGTERM, SIGKILL if
    the leader outlives ``grace_s``, then up to 2 s more for it to go."""
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 2.0)):
        if not signal_group(pgid, sig):
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pgid):
                return
            time.sleep(0.05)


# --- trees of process groups ---------------------------------------------------------------


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
        signal_group(group, sig)


def kill_tree(pid: int) -> None:
    """SIGKILL ``pid``'s group and every group beneath it."""
    signal_tree(pid, signal.SIGKILL)


def kill_descendants() -> None:
    """SIGKILL every process this one started, directly or not, and their groups (this
    process and the rest of its own group are left alone)."""
    import psutil

    own = os.getpgrp()
    try:
        children = psutil.Process(os.getpid()).children(recursive=True)
    except psutil.Error:
        return
    for child in children:
        group = _group_of(child.pid)
        if group is not None and group != own:
            signal_group(group, signal.SIGKILL)
        with contextlib.suppress(ProcessLookupError, PermissionError):
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
