"""The host side of the sandbox's privileged helper (``sandbox_enter.py``): the launcher that
forks a helper per trial, a running trial's holder (commands start through its control
socket), and its teardown."""

from __future__ import annotations

import asyncio
import contextlib
import marshal
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.deadlines import SANDBOX_TEARDOWN
from osmosis_ai.rollout.backend.harbor.errors import SandboxError

__all__ = [
    "ATTACH_TIMEOUT_SEC",
    "BASE_PATH",
    "Holder",
    "end_holder",
    "kill_group",
    "kill_in_host_network",
    "last_capability",
    "launcher",
]

BASE_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
ATTACH_TIMEOUT_SEC = 30.0
_ENTER_SCRIPT = str(Path(__file__).with_name("sandbox_enter.py"))


@dataclass
class Holder:
    """A running trial: its privileged helper (a session of its own, ``pidfd`` to wait on
    it), the helper's control socket (commands start through it), bubblewrap's init in the
    trial's PID namespace and the holder process inside (host pids)."""

    helper_pid: int
    pidfd: int
    control: socket.socket
    init_pid: int = 0
    pid: int = 0

    async def start_command(self, spec: dict[str, Any], stdio: Sequence[Any]) -> socket.socket:
        """Ask the helper to start a command; returns the socket its pid and status come on."""
        reply, reply_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        spec_fd = _spec_file(spec)
        try:
            fds = [spec_fd, *(_fileno(f) for f in stdio), reply_child.fileno()]
            deadline = time.monotonic() + ATTACH_TIMEOUT_SEC
            while True:
                try:
                    socket.send_fds(self.control, [b"run"], fds)
                    break
                except BlockingIOError:
                    if time.monotonic() > deadline:
                        reply.close()
                        raise SandboxError(
                            f"the sandbox helper (pid {self.helper_pid}) took no command "
                            f"for {ATTACH_TIMEOUT_SEC:.0f} s"
                        ) from None
                    await asyncio.sleep(0.005)
                except OSError as exc:
                    reply.close()
                    raise SandboxError(f"the sandbox is not running any more ({exc})") from None
        finally:
            os.close(spec_fd)
            reply_child.close()
        reply.setblocking(False)
        return reply


def kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _fileno(file: Any) -> int:
    return file if isinstance(file, int) else file.fileno()


def _spec_file(spec: dict[str, Any]) -> int:
    """An anonymous file holding ``spec`` (marshal: the helper reads it without importing
    anything), passed to the helper by descriptor, never in its argv or environment."""
    fd = os.memfd_create("osmosis-sandbox-spec", 0)
    data = marshal.dumps(spec)
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view) :]
    return fd


def last_capability() -> int:
    try:
        return int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    except (OSError, ValueError):
        return 63


def end_holder(holder: Holder) -> None:
    """End the sandbox: killing the PID namespace's init kills every process in it, and the
    helper ends with it (or when its control socket closes)."""
    holder.control.close()
    if holder.init_pid:
        with contextlib.suppress(ProcessLookupError):
            os.kill(holder.init_pid, signal.SIGKILL)
    grace = SANDBOX_TEARDOWN.seconds()
    try:
        if not select.select([holder.pidfd], [], [], grace)[0]:
            kill_group(holder.helper_pid)
            if not select.select([holder.pidfd], [], [], grace)[0]:
                raise SandboxError(
                    f"the sandbox helper (pid {holder.helper_pid}) did not end after SIGKILL "
                    f"within {grace:g} s ({SANDBOX_TEARDOWN.setting})"
                )
    finally:
        os.close(holder.pidfd)


class _Launcher:
    """The one process (per host process) that starts trials: ``sandbox_enter.py launcher``,
    run as root; it forks a helper per trial, which saves an interpreter start per trial.
    Started on first use, again if it has ended; it ends when this process does."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._process: subprocess.Popen[bytes] | None = None
        self._socket: socket.socket | None = None
        self._owner = os.getpid()

    def launch(self, spec: dict[str, Any], fds: Sequence[int]) -> int:
        """Start one trial's helper with ``spec``, its stderr and its control socket;
        returns the helper's pid."""
        spec_fd = _spec_file(spec)
        try:
            with self._lock:
                sock = self._running()
                try:
                    socket.send_fds(sock, [b"holder"], [spec_fd, *fds])
                    answer = sock.recv(65536).decode(errors="replace")
                except OSError as exc:
                    self._stop()
                    raise SandboxError(f"the sandbox launcher did not answer: {exc}") from None
        finally:
            os.close(spec_fd)
        word, _, value = answer.partition(" ")
        if word != "pid":
            if not answer:
                self._stop()
            raise SandboxError(f"the sandbox launcher could not start a trial: {value or 'ended'}")
        return int(value)

    def _running(self) -> socket.socket:
        if self._owner != os.getpid():
            # a forked copy of this process: the launcher and its socket are the parent's
            if self._socket is not None:
                self._socket.close()
            self._process, self._socket, self._owner = None, None, os.getpid()
        if self._process is not None and self._process.poll() is None and self._socket:
            return self._socket
        self._stop()
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-I", "-S", _ENTER_SCRIPT, "launcher", str(theirs.fileno())],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                pass_fds=(theirs.fileno(),),
                start_new_session=True,
                env={"PATH": os.environ.get("PATH", BASE_PATH)},
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        ours.settimeout(ATTACH_TIMEOUT_SEC)
        self._socket = ours
        return ours

    def _stop(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None
        if self._process is not None:
            with contextlib.suppress(ProcessLookupError):
                self._process.kill()
            self._process.wait()
            self._process = None


launcher = _Launcher()


def kill_in_host_network(holder: Holder) -> int:
    """SIGKILL every process of the trial (its PID namespace) that runs in this process's
    network namespace, the host's: what a ``public`` phase left running must not carry the
    host's network into a restricted one. Returns how many were killed."""
    trial_pids = _namespace(f"/proc/{holder.pid}/ns/pid")
    host_net = _namespace("/proc/self/ns/net")
    killed: set[int] = set()
    for _ in range(10):  # again while a process forks beside the kills
        found = 0
        for entry in os.scandir("/proc"):
            if not entry.name.isdigit() or int(entry.name) in killed:
                continue
            try:
                if _namespace(f"/proc/{entry.name}/ns/pid") != trial_pids:
                    continue
                if _namespace(f"/proc/{entry.name}/ns/net") != host_net:
                    continue
                os.kill(int(entry.name), signal.SIGKILL)
            except OSError:
                continue
            killed.add(int(entry.name))
            found += 1
        if not found:
            return len(killed)
    raise SandboxError(
        f"processes of the sandbox (holder pid {holder.pid}) kept starting in the host's "
        "network while its policy was being restricted"
    )


def _namespace(path: str) -> tuple[int, int]:
    info = os.stat(path)
    return info.st_dev, info.st_ino
