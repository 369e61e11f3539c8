"""Containing workspace code: the policy a trusted process starts it under, in bubblewrap.

A trusted process that runs code a workspace wrote (a platform run's execute process) puts a
:class:`Containment` in its own environment as JSON (:data:`CONTAINMENT_ENV`);
:class:`~osmosis_ai.controller.rollout_process.RolloutServerProcess` reads it from there
(never from the run's ``[env]``) and starts the rollout server, and the ``uv sync`` that
builds its environment, through :meth:`Containment.popen`. The contained process gets:

* its own user namespace, uid/gid :data:`SANDBOX_ID` inside, mapped to an unprivileged uid
  outside (:attr:`Containment.uid`, when the starter is root; otherwise the starter's own);
  no capabilities (bounding set cleared), ``no_new_privs``; its own PID and IPC namespaces,
  so no ancestor shows in ``/proc`` and none can be signalled; the network is shared (the
  server must reach the policy proxy on loopback);
* the system read-only, with :attr:`~Containment.hidden` folders (the data dir, the
  operator's home) replaced by empty ones and :attr:`~Containment.hidden_files` (keys, a
  database file kept elsewhere) by ``/dev/null``; then, read-only, what it needs from inside
  those (the interpreter, the checkout), and read-write only the folders it writes (its
  ``HOME``, the artifacts folder, the environment it builds) and a private ``/tmp``;
* an environment from :data:`ALLOWED_ENV` of the starter's, then what the caller adds (the
  run's ``[env]`` and secrets, the rollout variables), nothing else.

When the starter is root, bwrap is told to wait (``--userns-block-fd``) until this module has
written the namespace's id maps: the sandbox's id is mapped to :attr:`~Containment.uid`, and
root to root only for bwrap's own mount set-up; ``setpriv`` then drops to the sandbox id,
clearing every capability, before the workspace's command runs.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.controller.errors import ControllerError

CONTAINMENT_ENV = "OSMOSIS_ROLLOUT_CONTAINMENT"
SANDBOX_ID = 1000  # the uid and gid inside
DEFAULT_UID = 65534  # outside, when started by root: nobody
ALLOWED_ENV = ("PATH", "LANG", "LANGUAGE", "TZ", "TERM")
ALLOWED_ENV_PREFIXES = ("LC_",)
READY_TIMEOUT_S = 10.0  # bwrap reports its namespaces within milliseconds


class ContainmentError(ControllerError):
    """Workspace code cannot be contained here (the message names the fix)."""


@dataclass(frozen=True)
class Containment:
    """What a contained process may see and write (paths are absolute)."""

    home: str
    hidden: tuple[str, ...] = ()
    hidden_files: tuple[str, ...] = ()
    read_only: tuple[str, ...] = ()
    writable: tuple[str, ...] = ()
    uid: int | None = None  # outside uid when the starter is root; None: the starter's
    bwrap: str = "bwrap"
    setpriv: str = "setpriv"
    extra: dict[str, Any] = field(default_factory=lambda: {})

    def to_json(self) -> str:
        return json.dumps(asdict(self), separators=(",", ":"))

    @classmethod
    def from_json(cls, text: str) -> Containment:
        data: dict[str, Any] = json.loads(text)
        for name in ("hidden", "hidden_files", "read_only", "writable"):
            data[name] = tuple(data.get(name) or ())
        return cls(**data)

    # --- the environment -------------------------------------------------------------------

    def environment(self, outer: Mapping[str, str], given: Mapping[str, str]) -> dict[str, str]:
        """The allowlisted part of ``outer``, then ``HOME``/``TMPDIR``, then ``given``."""
        env = {
            k: v for k, v in outer.items() if k in ALLOWED_ENV or k.startswith(ALLOWED_ENV_PREFIXES)
        }
        env.setdefault("PATH", "/usr/local/bin:/usr/bin:/bin")
        env["HOME"] = self.home
        env["TMPDIR"] = "/tmp"
        env.update(given)
        return env

    # --- starting ------------------------------------------------------------------------------

    def arguments(
        self,
        command: Sequence[str],
        *,
        cwd: str | Path,
        read_only: Iterable[str | Path] = (),
        writable: Iterable[str | Path] = (),
    ) -> list[str]:
        """The bwrap command line around ``command`` (without the user-namespace options)."""
        # /tmp is private already: what lies beneath it needs no hiding of its own, nor
        # what lies beneath another hidden folder.
        hidden: list[str] = []
        for path in sorted({_clean(p) for p in self.hidden}, key=len):
            if not _under(path, [*hidden, "/tmp"]):
                hidden.append(path)
        hidden.append("/tmp")
        args = ["--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc", "--tmpfs", "/tmp"]
        for path in hidden[:-1]:
            if os.path.isdir(path):
                args += ["--tmpfs", path]
        for file in map(_clean, self.hidden_files):
            if os.path.isfile(file) and not _under(file, hidden):
                args += ["--ro-bind", "/dev/null", file]
        made: set[str] = set()
        binds = [("--ro-bind", _clean(p)) for p in (*self.read_only, *read_only)]
        binds += [("--bind", _clean(p)) for p in (*self.writable, *writable, self.home)]
        for how, path in binds:
            if not os.path.exists(path):
                continue
            for parent in _parents_below(path, hidden):
                if parent not in made:
                    made.add(parent)
                    args += ["--perms", "0755", "--dir", parent]
            args += [how, path, path]
            made.add(path)
        args += ["--chdir", str(cwd)]
        args += ["--unshare-pid", "--unshare-ipc", "--die-with-parent", "--cap-drop", "ALL"]
        return args

    def prepare(self, writable: Iterable[str | Path]) -> None:
        """Make the folders the contained uid writes, owned by it (when started by root)."""
        for path in (*self.writable, *writable, self.home):
            folder = Path(path)
            folder.mkdir(parents=True, exist_ok=True)
            if self.uid is not None and os.geteuid() == 0:
                os.chown(folder, self.uid, self.uid)

    def popen(
        self,
        command: Sequence[str],
        *,
        cwd: str | Path,
        env: Mapping[str, str],
        read_only: Iterable[str | Path] = (),
        writable: Iterable[str | Path] = (),
        **kwargs: Any,
    ) -> subprocess.Popen[Any]:
        """Start ``command`` contained, with exactly ``env`` (build it with :meth:`environment`).

        bwrap gets ``env`` too: its own ``/proc/<pid>/environ`` is visible from inside.
        """
        writable = list(writable)
        self.prepare(writable)
        inner = self.arguments(command, cwd=cwd, read_only=read_only, writable=writable)
        root = os.geteuid() == 0 and self.uid is not None
        if not root:
            argv = [self.bwrap, "--unshare-user", "--uid", str(SANDBOX_ID), "--gid",
                    str(SANDBOX_ID), *inner, "--", *command]  # fmt: skip
            return subprocess.Popen(argv, env=dict(env), **kwargs)
        info_r, info_w = os.pipe()
        block_r, block_w = os.pipe()
        drop = [self.setpriv, f"--reuid={SANDBOX_ID}", f"--regid={SANDBOX_ID}", "--clear-groups",
                "--inh-caps=-all", "--bounding-set=-all", "--"]  # fmt: skip
        argv = [self.bwrap, "--unshare-user", "--info-fd", str(info_w), "--userns-block-fd",
                str(block_r), *inner, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID",
                "--", *drop, *command]  # fmt: skip
        try:
            process = subprocess.Popen(
                argv, env=dict(env), pass_fds=(info_w, block_r), close_fds=True, **kwargs
            )
        finally:
            os.close(info_w)
            os.close(block_r)
        try:
            child = _child_pid(info_r, process)
            if child is not None:
                assert self.uid is not None
                _write_map(child, "uid_map", self.uid)
                _write_map(child, "gid_map", self.uid)
                os.write(block_w, b"1")
        except BaseException:
            with contextlib.suppress(OSError):
                process.kill()
            raise
        finally:
            os.close(info_r)
            os.close(block_w)
        return process

    def run(
        self,
        command: Sequence[str],
        *,
        cwd: str | Path,
        env: Mapping[str, str],
        read_only: Iterable[str | Path] = (),
        writable: Iterable[str | Path] = (),
        timeout: float | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``command`` contained to its end; its output captured as text."""
        process = self.popen(
            command,
            cwd=cwd,
            env=env,
            read_only=read_only,
            writable=writable,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            start_new_session=True,
        )
        try:
            out, err = process.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            out, err = process.communicate()
            raise
        return subprocess.CompletedProcess(process.args, process.returncode, out, err)


def from_environ(environ: Mapping[str, str] | None = None) -> Containment | None:
    """The policy the starting process was given, if any."""
    text = (os.environ if environ is None else environ).get(CONTAINMENT_ENV)
    return Containment.from_json(text) if text else None


def interpreter_paths() -> list[str]:
    """What this interpreter runs from: its prefixes and the folders on its path."""
    found = {sys.prefix, sys.base_prefix, os.path.dirname(os.path.realpath(sys.executable))}
    found.update(p for p in sys.path if p and os.path.isdir(p))
    found.update(os.path.realpath(p) for p in list(found))
    return sorted(_clean(p) for p in found)


def check(containment: Containment) -> None:
    """Start a trivial contained process; :class:`ContainmentError` naming the fix if it fails."""
    bwrap = shutil.which(containment.bwrap)
    if bwrap is None:
        raise ContainmentError(
            f"bubblewrap ({containment.bwrap}) is not installed, so workspace code cannot run "
            "contained: install it (apt-get install bubblewrap, or dnf install bubblewrap)"
        )
    if (
        os.geteuid() == 0
        and containment.uid is not None
        and shutil.which(containment.setpriv) is None
    ):
        raise ContainmentError(
            f"{containment.setpriv} (util-linux) is not installed: a worker running as root "
            "needs it to drop to the sandbox's user; install util-linux"
        )
    probe = (
        "import os; s = open('/proc/self/status').read(); "
        "print(os.getuid(), 'CapEff:\\t0000000000000000' in s, 'NoNewPrivs:\\t1' in s)"
    )
    try:
        done = containment.run(
            [sys.executable, "-I", "-S", "-c", probe],
            cwd="/",
            env=containment.environment(os.environ, {}),
            read_only=interpreter_paths(),
            timeout=30,
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ContainmentError(f"bubblewrap could not be started: {exc}") from exc
    expected = f"{SANDBOX_ID} True True"
    if done.returncode != 0 or done.stdout.strip() != expected:
        said = (done.stderr or done.stdout).strip()[-800:] or f"exit {done.returncode}"
        if "failed to execute" in said or "can't open file" in said:
            raise ContainmentError(
                f"the sandbox's user cannot run this interpreter ({said}): install the platform "
                "in a Python and virtualenv every user may read (not under a home folder "
                "only its owner can enter), or set OSMOSIS_PLATFORM_SANDBOX_UID"
            )
        raise ContainmentError(
            f"bubblewrap cannot make a user namespace here ({said}): enable unprivileged user "
            "namespaces (sysctl kernel.unprivileged_userns_clone=1; on Ubuntu 24.04 also "
            "kernel.apparmor_restrict_unprivileged_userns=0), or run the worker as root"
        )


def _child_pid(info: int, process: subprocess.Popen[Any]) -> int | None:
    """The sandbox's pid from bwrap's ``--info-fd`` (``None``: bwrap exited first)."""
    data = b""
    deadline = time.monotonic() + READY_TIMEOUT_S
    while True:
        with contextlib.suppress(ValueError):
            value: Any = json.loads(data)
            if isinstance(value, dict) and "child-pid" in value:
                return int(value["child-pid"])  # pyright: ignore[reportUnknownArgumentType]
        left = deadline - time.monotonic()
        if left <= 0:
            raise ContainmentError(
                f"bubblewrap did not report its sandbox within {READY_TIMEOUT_S:.0f} s"
            )
        ready, _, _ = select.select([info], [], [], left)
        if not ready:
            continue
        chunk = os.read(info, 4096)
        if not chunk:
            return None  # bwrap ended before its sandbox stood: its output says why
        data += chunk


def _write_map(pid: int, name: str, outside: int) -> None:
    with open(f"/proc/{pid}/{name}", "w") as handle:
        handle.write(f"0 0 1\n{SANDBOX_ID} {outside} 1\n")


def _clean(path: str | Path) -> str:
    return os.path.realpath(str(path))  # bwrap mounts on the resolved path


def _under(path: str, roots: Iterable[str]) -> bool:
    return any(path == r or path.startswith(r.rstrip("/") + "/") for r in roots)


def _parents_below(path: str, hidden: Sequence[str]) -> list[str]:
    """The folders between a hidden root and ``path`` (they exist only once made)."""
    roots = [r for r in hidden if path.startswith(r.rstrip("/") + "/")]
    if not roots:
        return []
    root = max(roots, key=len)
    parents: list[str] = []
    current = os.path.dirname(path)
    while current != root and current.startswith(root):
        parents.append(current)
        current = os.path.dirname(current)
    return list(reversed(parents))
