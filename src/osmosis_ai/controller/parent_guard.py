"""``python -I parent_guard.py PID COMMAND...``: become ``COMMAND`` (exec), marked to be
killed when the process that started it (``PID``) dies. Run as a file, it imports nothing
but the standard library.

A rollout server started by a Ray actor runs in a session of its own (so signals meant for
the actor's group do not reach it); when the actor is killed with SIGKILL or its node goes
away, nothing would stop the server, which would go on serving with nobody reading its
output. On Linux ``PR_SET_PDEATHSIG`` has the kernel send SIGKILL as the parent exits; it
survives ``exec``. Elsewhere the command runs without the guard.
"""

from __future__ import annotations

import os
import signal
import sys

_PR_SET_PDEATHSIG = 1


def guard() -> None:
    """Ask for SIGKILL when this process's parent exits (Linux; a no-op elsewhere)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        sys.stderr.write("usage: python -I parent_guard.py PID COMMAND...\n")
        return 2
    parent, command = int(argv[0]), argv[1:]
    guard()
    if os.getppid() != parent:  # it died before the guard was set
        return 1
    os.execvp(command[0], command)
    return 1  # (not reached)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
