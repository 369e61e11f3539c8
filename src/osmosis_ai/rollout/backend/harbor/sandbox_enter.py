"""The privileged steps of the local Harbor sandbox, as a small program of their own.

``sandbox.py`` runs this file as root with ``python -I -S sandbox_enter.py MODE``. Specs
travel as marshalled mappings in anonymous files passed by descriptor, never in argv or the
environment (which other users of the host could read, or which would steer this very
process). Standard library only, no import of the package, and nothing imported after
start-up (a lazy import inside a trial would read the trial's files).

``launcher CONTROL_FD``
    One per host process: forks a helper per trial (:func:`run_launcher`), so a trial costs
    a fork, not an interpreter start.

The helper (:func:`run_holder`) sets one trial up. A child creates the trial's user
namespace, whose ids ``0..count-1`` the helper maps to the unprivileged host ids
``base..base+count-1`` (and which forbids further user namespaces inside); in a private
mount namespace the host root is cloned as an idmapped mount (host uid ``n`` shows as ``n``
inside) under an overlay with the trial's upper folder; the child then becomes root of that
namespace and executes bubblewrap, which builds the trial's root from the overlay and
starts the holder process with no capabilities and ``no_new_privs``. Once the holder says
ready, the helper joins the trial's namespaces (all but its network: a command joins that
itself, or stays in the host's for a ``public`` phase) and root and serves commands
(:func:`serve`): for each, a forked child (in the trial's PID namespace) drops every
capability (bounding, ambient, inheritable, permitted, effective), locks the securebits so
that root inside regains none on exec, switches to the named user with that user's groups
(``/etc/passwd`` and ``/etc/group`` read as data), sets ``no_new_privs`` and only then
executes the command.

``probe``
    Checks that this host can do the above (:func:`run_probe`); exit status 0 when it can.
"""

from __future__ import annotations

import _signal  # pyright: ignore[reportMissingImports]
import _socket
import ctypes
import marshal
import os
import select
import stat
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:  # typing is not imported at run time: this program must start fast
    from typing import Any

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 1 << 18
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4
MOUNT_ATTR_IDMAP = 0x100000
# The mount API's system calls have one number on every architecture Linux added them to.
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
PR_CAPBSET_DROP = 24
PR_SET_SECUREBITS = 28
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
# SECBIT_NOROOT | _LOCKED, SECBIT_KEEP_CAPS_LOCKED, SECBIT_NO_CAP_AMBIENT_RAISE | _LOCKED
SECUREBITS = 0x01 | 0x02 | 0x20 | 0x40 | 0x80
LINUX_CAPABILITY_VERSION_3 = 0x20080522
MAX_ACCOUNT_FILE = 8 << 20

_libc = ctypes.CDLL(None, use_errno=True)
_syscall = _libc.syscall
_syscall.restype = ctypes.c_long
_prctl = _libc.prctl
_prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
_capset = _libc.capset
_setns = _libc.setns
_unshare = _libc.unshare
_mount = _libc.mount
_mount.argtypes = [
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_char_p,
    ctypes.c_ulong,
    ctypes.c_char_p,
]
_chroot = _libc.chroot


class SetupError(Exception):
    """A step failed; the message names it and the system's reason."""


def _check(result: int, what: str) -> int:
    if result < 0:
        code = ctypes.get_errno()
        raise SetupError(f"{what}: {os.strerror(code)}")
    return result


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [
        ("effective", ctypes.c_uint32),
        ("permitted", ctypes.c_uint32),
        ("inheritable", ctypes.c_uint32),
    ]


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


def _read_spec(fd: int) -> dict[str, Any]:
    chunks: list[bytes] = []
    offset = 0
    while chunk := os.pread(fd, 1 << 20, offset):
        chunks.append(chunk)
        offset += len(chunk)
    os.close(fd)
    spec = marshal.loads(b"".join(chunks))
    if not isinstance(spec, dict):
        raise SetupError("the spec is not a mapping")
    return spec


# -- holder ----------------------------------------------------------------------------------


def _idmapped_clone(source: str, target: str, userns_fd: int) -> None:
    """Mount a read-only clone of ``source`` at ``target`` seen through ``userns_fd``'s map."""
    tree = _check(
        _syscall(SYS_OPEN_TREE, AT_FDCWD, source.encode(), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC),
        f"open_tree({source})",
    )
    try:
        attr = _MountAttr(
            MOUNT_ATTR_IDMAP | MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV,
            0,
            0,
            userns_fd,
        )
        _check(
            _syscall(
                SYS_MOUNT_SETATTR,
                tree,
                b"",
                AT_EMPTY_PATH,
                ctypes.byref(attr),
                ctypes.c_size_t(ctypes.sizeof(attr)),
            ),
            f"idmapping {source} (mount_setattr)",
        )
        _check(
            _syscall(SYS_MOVE_MOUNT, tree, b"", AT_FDCWD, target.encode(), MOVE_MOUNT_F_EMPTY_PATH),
            f"move_mount to {target}",
        )
    finally:
        os.close(tree)


def _write_maps(pid: int, base: int, count: int) -> int:
    """Map ``pid``'s fresh user namespace (``0..count-1`` to ``base..``); returns its fd."""
    for name, text in (
        ("uid_map", f"0 {base} {count}\n"),
        ("setgroups", "allow\n"),
        ("gid_map", f"0 {base} {count}\n"),
    ):
        with open(f"/proc/{pid}/{name}", "w") as handle:
            handle.write(text)
    return os.open(f"/proc/{pid}/ns/user", os.O_RDONLY | os.O_CLOEXEC)


def _become_bwrap(ready: int, go: int, stdio: tuple[int, int], argv: list[str], path: str) -> None:
    """The child that becomes bubblewrap: it creates the trial's user namespace (so what
    bubblewrap creates there, mount, PID, network... namespaces, belongs to it, not to the
    host's), waits for its maps and the trial's mounts, forbids further user namespaces
    inside, becomes its root and executes bubblewrap with the holder's stdin and stdout
    and this process's stderr only."""
    _check(_unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
    os.write(ready, b"1")
    if os.read(go, 1) != b"1":
        raise SetupError("the trial's setup failed")
    with open("/proc/sys/user/max_user_namespaces", "w") as limit:
        limit.write("0\n")
    os.setgroups([])
    os.setresgid(0, 0, 0)
    os.setresuid(0, 0, 0)
    os.dup2(stdio[0], 0)
    os.dup2(stdio[1], 1)
    os.closerange(3, 1 << 20)
    # execve, not execvpe: a PATH search imports, and this user may not read the host's
    # Python (under a 0700 home, say)
    os.execve(argv[0], argv, {"PATH": path})


def _first_child(pid: int) -> int:
    children = _read_small(f"/proc/{pid}/task/{pid}/children").split()
    if not children:
        raise SetupError(f"process {pid} has no child (bubblewrap ended?)")
    return int(children[0])


def _read_small(path: str) -> str:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        return os.read(fd, 4096).decode()
    finally:
        os.close(fd)


def _wait_ready(fd: int, timeout_ms: int) -> None:
    """Wait for the holder's ``ready`` line (it runs inside the finished sandbox)."""
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    data = b""
    while b"\n" not in data:
        if not poller.poll(timeout_ms):
            raise SetupError(f"the sandbox was not ready within {timeout_ms // 1000} s")
        chunk = os.read(fd, 64)
        if not chunk:
            raise SetupError("bubblewrap ended before the sandbox was ready")
        data += chunk
    if data.strip() != b"ready":
        raise SetupError(f"the holder said {data!r}, not ready")


def _stage(sources: list[str]) -> None:
    """Bind each source at ``/tmp/INDEX``, on a tmpfs over /tmp (this mount namespace only)."""
    opened = [os.open(source, os.O_PATH | os.O_CLOEXEC) for source in sources]
    _check(_mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"), "staging")
    for index, fd in enumerate(opened):
        staged = f"/tmp/{index}"
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            os.mkdir(staged, 0o755)
        else:
            os.close(os.open(staged, os.O_CREAT | os.O_WRONLY | os.O_CLOEXEC, 0o644))
        source = f"/proc/self/fd/{fd}".encode()
        _check(
            _mount(source, staged.encode(), None, MS_BIND | MS_REC, None),
            f"staging {sources[index]}",
        )
        os.close(fd)


def run_holder(spec: dict[str, Any]) -> None:
    """Set the trial up, start bubblewrap as a child, join the trial, answer ``ok INIT
    HOLDER`` (host pids of bubblewrap's init and of the holder) on the control socket, then
    serve commands (see :func:`serve`)."""
    control_fd = int(spec["control_fd"])
    _check(_unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    lower, upper, work, merged = (str(spec[k]) for k in ("lower", "upper", "work", "merged"))
    # bubblewrap opens its sources as root of the trial's user namespace, which may not
    # traverse the host folders above them (a 0700 temporary folder, say): each source is
    # bound under a tmpfs that shadows /tmp in this private mount namespace only.
    sources = [(merged, "/", False), *spec["binds"]]
    argv = [str(spec["bwrap"][0])]
    for index, (_, target, read_only) in enumerate(sources):
        argv += ["--ro-bind" if read_only else "--bind", f"/tmp/{index}", str(target)]
    argv += [str(word) for word in spec["bwrap"][1:]]
    argv += ["--", *(str(word) for word in spec["command"])]
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    # the holder reads its stdin until this process ends, and says ready on its stdout
    hold_r, _hold_w = os.pipe()  # the write end stays open as long as this process
    said_r, said_w = os.pipe()
    bwrap_pid = os.fork()
    if bwrap_pid == 0:
        try:
            _become_bwrap(ready_w, go_r, (hold_r, said_w), argv, str(spec["path"]))
        except BaseException as exc:
            os.write(2, f"sandbox: starting bwrap: {exc}\n".encode(errors="replace"))
        os._exit(127)
    for fd in (ready_w, go_r, hold_r, said_w):
        os.close(fd)
    try:
        if os.read(ready_r, 1) != b"1":
            raise SetupError("bubblewrap's user namespace could not be created")
        userns = _write_maps(bwrap_pid, int(spec["uid_base"]), int(spec["id_count"]))
        _idmapped_clone("/", lower, userns)
        os.close(userns)
        options = f"lowerdir={lower},upperdir={upper},workdir={work}"
        _check(_mount(b"overlay", merged.encode(), b"overlay", 0, options.encode()), "overlay")
        _stage([str(source) for source, _, _ in sources])
        os.write(go_w, b"1")
        _wait_ready(said_r, int(spec["ready_timeout_ms"]))
        init = _first_child(bwrap_pid)
        holder = _first_child(init)
        net = _enter(holder)
    except BaseException as exc:
        os.kill(bwrap_pid, _signal.SIGKILL)
        _send(control_fd, f"error {exc}")
        raise
    finally:
        for fd in (ready_r, go_w, said_r):
            os.close(fd)
    _send(control_fd, f"ok {init} {holder}")
    serve(control_fd, bwrap_pid, int(spec["last_cap"]), net)


# -- commands ------------------------------------------------------------------------------------


def _read_account_file(path: str) -> list[list[str]]:
    """The colon-separated lines of ``/etc/passwd`` or ``/etc/group`` inside, read as data."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return []
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_ACCOUNT_FILE:
            return []
        data = os.read(fd, MAX_ACCOUNT_FILE)
    finally:
        os.close(fd)
    return [line.split(":") for line in data.decode("utf-8", "replace").splitlines()]


def _account(user: str) -> tuple[int, int, list[int], str, str]:
    """(uid, gid, groups, home, name) of ``user`` (a name or a number) inside the trial."""
    passwd = [row for row in _read_account_file("/etc/passwd") if len(row) >= 7]
    entry = next((row for row in passwd if row[0] == user), None)
    if entry is None and user.isdigit():
        entry = next((row for row in passwd if row[2] == user), None)
        if entry is None:
            number = int(user)
            return number, number, [number], "/", user
    if entry is None:
        raise SetupError(f"no user {user!r} in the sandbox's /etc/passwd")
    name, uid, gid, home = entry[0], int(entry[2]), int(entry[3]), entry[5] or "/"
    groups = [gid]
    for row in _read_account_file("/etc/group"):
        member = len(row) >= 4 and name in row[3].split(",") and row[2].isdigit()
        if member and int(row[2]) not in groups:
            groups.append(int(row[2]))
    return uid, gid, groups, home, name


def _drop_privileges(uid: int, gid: int, groups: list[int], last_cap: int) -> None:
    """Leave this process with no capability of any kind, for good, running as uid/gid."""
    for cap in range(last_cap + 1):
        _check(_prctl(PR_CAPBSET_DROP, cap, 0, 0, 0), f"dropping capability {cap}")
    _check(_prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0), "clearing ambient caps")
    _check(_prctl(PR_SET_SECUREBITS, SECUREBITS, 0, 0, 0), "locking securebits")
    os.setgroups(groups)
    os.setresgid(gid, gid, gid)
    os.setresuid(uid, uid, uid)
    header = _CapHeader(LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    _check(_capset(ctypes.byref(header), data), "clearing capabilities")
    _check(_prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0), "setting no_new_privs")


def _enter(pid: int) -> int | None:
    """Join the namespaces and the root of the trial process ``pid`` (this process only),
    all but its network: returns a descriptor of the trial's own network namespace (None when
    the trial shares the host's), which each command's child joins when its spec says
    ``private_net``. This process stays in the host's network, so that a trial whose policy
    changes between phases can start a ``public`` phase's commands there."""
    net_fd = os.open(f"/proc/{pid}/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    theirs, ours = os.fstat(net_fd), os.stat("/proc/self/ns/net")
    net: int | None = net_fd
    if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
        os.close(net_fd)
        net = None
    namespaces: list[tuple[int, int, str]] = []
    for name, flag in (
        ("user", CLONE_NEWUSER),
        ("mnt", CLONE_NEWNS),
        ("uts", CLONE_NEWUTS),
        ("ipc", CLONE_NEWIPC),
        ("pid", CLONE_NEWPID),
    ):
        fd = os.open(f"/proc/{pid}/ns/{name}", os.O_RDONLY | os.O_CLOEXEC)
        theirs, ours = os.fstat(fd), os.stat(f"/proc/self/ns/{name}")
        if (theirs.st_dev, theirs.st_ino) == (ours.st_dev, ours.st_ino):
            os.close(fd)  # shared with the host
            continue
        namespaces.append((fd, flag, name))
    root = os.open(f"/proc/{pid}/root", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    for fd, flag, name in namespaces:
        _check(_setns(fd, flag), f"entering the sandbox's {name} namespace")
        os.close(fd)
    os.fchdir(root)
    _check(_chroot(b"."), "entering the sandbox's root")
    os.close(root)
    os.chdir("/")
    return net


def _start_command(spec: dict[str, Any], stdio: list[int], last_cap: int, net: int | None) -> int:
    """Fork the child that runs one command unprivileged; returns its pid. With
    ``private_net`` the child joins the trial's own network namespace (``net``) first."""
    private_net = bool(spec.get("private_net"))
    if private_net and net is None:
        raise SetupError("this sandbox has no network of its own (it started public only)")
    user = spec.get("user")
    env = {str(k): str(v) for k, v in spec["env"].items()}
    if user is None:
        uid, gid, groups = 0, 0, [0]
    else:
        uid, gid, groups, home, name = _account(str(user))
        env["HOME"], env["USER"] = home, name
    argv = [str(word) for word in spec["argv"]]
    cwd = str(spec["cwd"])
    folders = [str(path) for path in spec.get("mkdirs") or ()]
    child = os.fork()
    if child == 0:
        try:
            os.setsid()
            if net is not None and private_net:
                _check(_setns(net, CLONE_NEWNET), "entering the sandbox's network namespace")
            for target, fd in enumerate(stdio):
                os.dup2(fd, target)
            os.closerange(3, 1 << 20)
            _drop_privileges(uid, gid, groups, last_cap)
            try:
                os.chdir(cwd)
            except OSError as exc:
                os.write(2, f"sandbox-exec: cd {cwd}: {exc.strerror}\n".encode())
                os._exit(1)
            if folders:  # ``mkdir -p`` without starting a program, unprivileged like one
                for folder in folders:
                    try:
                        os.makedirs(folder, exist_ok=True)
                    except OSError as exc:
                        os.write(2, f"mkdir {folder}: {exc.strerror}\n".encode())
                        os._exit(1)
                os._exit(0)
            os.execve(argv[0], argv, env)
        except BaseException as exc:
            os.write(2, f"sandbox-exec: {exc}\n".encode(errors="replace"))
        os._exit(126)
    return child


def _send(fd: int, message: str) -> None:
    try:  # noqa: SIM105 - contextlib is not imported here (start-up time)
        os.write(fd, message.encode(errors="replace"))
    except OSError:
        pass  # the host stopped waiting for this answer


def _exit_code(status: int) -> int:
    if os.WIFSIGNALED(status):
        return 128 + os.WTERMSIG(status)
    return os.WEXITSTATUS(status)


def _receive_fds(control: Any) -> tuple[bytes, list[int]]:
    data, ancillary, _, _ = control.recvmsg(64, _socket.CMSG_SPACE(8 * 4))
    fds: list[int] = []
    for level, kind, payload in ancillary:
        if level == _socket.SOL_SOCKET and kind == _socket.SCM_RIGHTS:
            fds += [
                int.from_bytes(payload[i : i + 4], sys.byteorder, signed=True)
                for i in range(0, len(payload) - 3, 4)
            ]
    return data, fds


def serve(control_fd: int, bwrap_pid: int, last_cap: int, net: int | None) -> None:
    """Run commands in the trial (already joined) on request until the host hangs up or the
    trial ends.

    Every message on the control socket (SOCK_SEQPACKET) carries five descriptors: the
    command's spec (a marshalled mapping of ``user``, ``cwd``, ``argv``, ``env``,
    ``mkdirs``, folders to create instead of running ``argv``, and ``private_net``, whether
    it runs in the trial's own network namespace rather than the host's), its stdin,
    stdout and stderr, and a reply socket that gets ``pid N`` once the command runs (its pid
    on the host, a session of its own) and ``exit CODE`` when it ends (128 + signal when
    killed), or ``error TEXT`` if it could not start.
    """
    control = _socket.socket(fileno=control_fd)
    poller = select.poll()
    poller.register(control_fd, select.POLLIN)
    trial_end = os.pidfd_open(bwrap_pid)
    poller.register(trial_end, select.POLLIN)
    running: dict[int, tuple[int, int]] = {}
    while True:
        for fd, _ in poller.poll():
            if fd == trial_end:
                return
            if fd in running:
                child, reply = running.pop(fd)
                poller.unregister(fd)
                os.close(fd)
                _, status = os.waitpid(child, 0)
                _send(reply, f"exit {_exit_code(status)}")
                os.close(reply)
                continue
            data, fds = _receive_fds(control)
            if not data:
                return  # the host hung up: the sandbox is being stopped
            if len(fds) != 5:
                for extra in fds:
                    os.close(extra)
                continue
            spec_fd, stdio, reply = fds[0], fds[1:4], fds[4]
            try:
                child = _start_command(_read_spec(spec_fd), stdio, last_cap, net)
            except (SetupError, OSError, KeyError, ValueError, EOFError, TypeError) as exc:
                _send(reply, f"error {exc}")
                os.close(reply)
                continue
            finally:
                for used in stdio:
                    os.close(used)
            pidfd = os.pidfd_open(child)
            running[pidfd] = (child, reply)
            poller.register(pidfd, select.POLLIN)
            _send(reply, f"pid {child}")


# -- launcher --------------------------------------------------------------------------------


def run_launcher(control_fd: int) -> None:
    """Start trials on request, forking this already running process (no interpreter start
    per trial). Each message carries three descriptors: the spec, the trial's stderr and its
    control socket; the answer is ``pid N`` (the trial's helper, a session of its own) or
    ``error TEXT``. Ends when the host process hangs up or ends (its socket closes; no
    parent-death signal, which would follow the host thread that happened to start this).
    """
    _signal.signal(_signal.SIGCHLD, _signal.SIG_IGN)  # trials are reaped by the kernel
    control = _socket.socket(fileno=control_fd)
    while True:
        data, fds = _receive_fds(control)
        if not data:
            return
        try:
            if len(fds) != 3:
                raise SetupError(f"expected 3 descriptors, got {len(fds)}")
            spec = _read_spec(fds[0])
            spec["control_fd"] = fds[2]
            pid = os.fork()
        except (SetupError, OSError, ValueError, EOFError, TypeError) as exc:
            for fd in fds:
                try:  # noqa: SIM105 - contextlib is not imported here (start-up time)
                    os.close(fd)
                except OSError:
                    pass
            _send(control_fd, f"error {exc}")
            continue
        if pid == 0:
            code = 0
            try:
                _signal.signal(_signal.SIGCHLD, _signal.SIG_DFL)
                os.close(control_fd)
                os.setsid()
                null = os.open(os.devnull, os.O_RDWR)
                for target, fd in enumerate((null, null, fds[1])):
                    os.dup2(fd, target)
                os.close(null)
                os.close(fds[1])
                run_holder(spec)
            except BaseException as exc:
                os.write(2, f"sandbox: {exc}\n".encode(errors="replace"))
                code = 125
            os._exit(code)
        for fd in fds[1:]:
            os.close(fd)
        _send(control_fd, f"pid {pid}")


# -- probe -----------------------------------------------------------------------------------


def run_probe() -> None:
    """Check that this host can run trials: a mapped user namespace, an idmapped clone of
    ``/`` and an overlay over it, all in a throwaway mount namespace (gone on exit)."""
    _check(_unshare(CLONE_NEWNS), "unshare(CLONE_NEWNS)")
    _check(_mount(None, b"/", None, MS_REC | MS_PRIVATE, None), "making / private")
    _check(_mount(b"tmpfs", b"/tmp", b"tmpfs", MS_NOSUID | MS_NODEV, b"mode=0755"), "tmpfs")
    for name in ("lower", "upper", "work", "merged"):
        os.mkdir(f"/tmp/{name}")
    ready_r, ready_w = os.pipe()
    go_r, go_w = os.pipe()
    child = os.fork()
    if child == 0:
        try:
            _check(_unshare(CLONE_NEWUSER), "unshare(CLONE_NEWUSER)")
            os.write(ready_w, b"1")
            os.read(go_r, 1)
        finally:
            os._exit(0)
    try:
        if os.read(ready_r, 1) != b"1":
            raise SetupError("a user namespace could not be created")
        userns = _write_maps(child, 0x40000000, 65536)
        _idmapped_clone("/", "/tmp/lower", userns)
        options = b"lowerdir=/tmp/lower,upperdir=/tmp/upper,workdir=/tmp/work"
        _check(_mount(b"overlay", b"/tmp/merged", b"overlay", 0, options), "overlay of /")
    finally:
        os.write(go_w, b"1")
        os.waitpid(child, 0)


def main(argv: list[str]) -> int:
    if argv[1:2] == ["launcher"] and len(argv) == 3:
        mode = "launcher"
    elif argv[1:] == ["probe"]:
        mode = "probe"
    else:
        os.write(2, b"usage: sandbox_enter.py launcher CONTROL_FD | probe\n")
        return 2
    code = 0
    try:
        if mode == "launcher":
            run_launcher(int(argv[2]))
        else:
            run_probe()
    except BaseException as exc:
        os.write(2, f"{exc}\n".encode(errors="replace"))
        code = 125
    # os._exit: no interpreter shutdown (which may import) inside the trial's files
    os._exit(code)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
