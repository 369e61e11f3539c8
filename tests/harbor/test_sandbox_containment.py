"""Escape probes against the bubblewrap sandbox, from Dockerfile RUN steps and from exec.

Each probe runs a small Python program inside a trial and reports what it could do: its
capabilities, ``no_new_privs``, ``open_by_handle_at`` (the call that opened the host's real
root), hidden host folders, ``/proc/sys`` opened for writing (opened only, never written),
a host loopback listener under ``no-network``, host processes in ``/proc`` and as signal
targets, and a nested user namespace. A control checks that ordinary work still succeeds.
"""

from __future__ import annotations

import asyncio
import json
import os
import shlex
import shutil
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from harbor_support import harbor_missing_reason

if _reason := harbor_missing_reason():
    pytest.skip(_reason, allow_module_level=True)

from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.task.task import Task
from harbor.models.trial.paths import TrialPaths

from osmosis_ai.rollout.backend.harbor.sandbox import TRIAL_ID_BASE, LocalSandboxEnvironment

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

# Runs inside the trial with the host's python3. argv: JSON {"hidden": [...], "host_pid": n,
# "host_marker": str, "port": n | None}. Prints one JSON object.
PROBE = r"""
import ctypes, errno, json, os, socket, struct, sys

args = json.loads(sys.argv[1])
libc = ctypes.CDLL(None, use_errno=True)
report = {}

status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
for key in ("CapEff", "CapPrm", "CapBnd", "CapInh", "CapAmb", "NoNewPrivs"):
    report[key] = status[key].strip()
report["uid"] = os.getuid()
report["uid_map"] = open("/proc/self/uid_map").read().split()


class FileHandle(ctypes.Structure):
    _fields_ = [("handle_bytes", ctypes.c_uint), ("handle_type", ctypes.c_int),
                ("f_handle", ctypes.c_ubyte * 128)]


# The known escape: a handle for the host filesystem's root inode, opened through any
# descriptor on that filesystem (the trial's /tmp is a host folder). Needs
# CAP_DAC_READ_SEARCH in the host's user namespace.
handle = FileHandle(128, 0)
mount_id = ctypes.c_int()
base = os.open("/tmp", os.O_RDONLY | os.O_DIRECTORY)
if libc.name_to_handle_at(base, b"", ctypes.byref(handle), ctypes.byref(mount_id), 0x1000) != 0:
    report["open_by_handle_at"] = "no handle: " + errno.errorcode[ctypes.get_errno()]
else:
    if handle.handle_type == 1:  # FILEID_INO32_GEN (ext4...): the root is inode 2, gen 0
        struct.pack_into("<II", handle.f_handle, 0, 2, 0)
        handle.handle_bytes = 8
    fd = libc.open_by_handle_at(base, ctypes.byref(handle), os.O_RDONLY)
    if fd >= 0:
        report["open_by_handle_at"] = "opened"
        os.close(fd)
    else:
        report["open_by_handle_at"] = errno.errorcode[ctypes.get_errno()]

report["hidden_present"] = [p for p in args["hidden"] if os.path.lexists(p)]
mounts = open("/proc/self/mountinfo").read()
report["hidden_mounted"] = [p for p in args["hidden"] if f" {p} " in mounts]

for name in ("proc_sys", "core_pattern"):
    path = "/proc/sys/kernel/core_pattern" if name == "core_pattern" else "/proc/sys/vm/overcommit_memory"
    try:
        fd = os.open(path, os.O_WRONLY)  # opened for writing only, never written
    except OSError as exc:
        report[name] = errno.errorcode[exc.errno]
    else:
        os.close(fd)
        report[name] = "writable"

pids = [int(p) for p in os.listdir("/proc") if p.isdigit()]
# passed reversed, so that this probe's own command line does not hold it
marker = args["host_marker"][::-1].encode()
report["pids"] = len(pids)
seen = []
for pid in pids:
    try:
        if marker in open(f"/proc/{pid}/cmdline", "rb").read():
            seen.append(pid)
    except OSError:
        pass
report["host_marker_seen"] = seen
try:
    os.kill(args["host_pid"], 0)
    report["signal_host"] = "delivered"
except OSError as exc:
    report["signal_host"] = errno.errorcode[exc.errno]

if libc.unshare(0x10000000) == 0:
    report["nested_userns"] = "created"
else:
    report["nested_userns"] = errno.errorcode[ctypes.get_errno()]

if args.get("port"):
    try:
        socket.create_connection(("127.0.0.1", args["port"]), timeout=3).close()
        report["host_loopback"] = "connected"
    except OSError as exc:
        report["host_loopback"] = type(exc).__name__
print(json.dumps(report))
"""


@pytest.fixture
def hidden_home() -> Iterator[Path]:
    """A fake home with credential folders on the host's root filesystem (the trial's /tmp
    is its own, so a folder under it would be out of view whatever the sandbox did)."""
    home = Path("/var/tmp") / f"osmosis-probe-home-{uuid.uuid4().hex[:8]}"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY\n")
    (home / ".osmosis" / "platform").mkdir(parents=True)
    (home / ".osmosis" / "platform" / "key").write_text("platform key\n")
    (home / "notes.txt").write_text("visible\n")
    home.chmod(0o750)
    try:
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.fixture
def host_marker() -> Iterator[tuple[int, str]]:
    """A host process the trial must neither see nor signal: (pid, marker in its argv)."""
    marker = f"osmosis-host-marker-{uuid.uuid4().hex}"
    # one process (no shell child left behind when it is killed), the marker in its argv
    process = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)", marker])
    try:
        yield process.pid, marker
    finally:
        process.kill()
        process.wait()


class Trials:
    def __init__(self, tmp_path: Path, task_builder: Callable[..., Path]) -> None:
        self.tmp_path = tmp_path
        self.task_builder = task_builder
        self.started: list[LocalSandboxEnvironment] = []

    def make(self, name: str = "task", *, env_kwargs: dict[str, Any] | None = None, **task: Any):
        made = Task(self.task_builder(name, **task))
        paths = TrialPaths(self.tmp_path / "trials" / f"{name}-{uuid.uuid4().hex[:6]}")
        paths.mkdir()
        kwargs: dict[str, Any] = {"state_dir": self.tmp_path / "state", **(env_kwargs or {})}
        env = LocalSandboxEnvironment(
            environment_dir=made.paths.environment_dir,
            environment_name=name,
            session_id=f"{name}__{uuid.uuid4().hex[:6]}__env",
            trial_paths=paths,
            task_env_config=made.config.environment,
            **kwargs,
        )
        self.started.append(env)
        return env, paths


@pytest.fixture
async def trials(tmp_path: Path, task_builder: Callable[..., Path]) -> AsyncIterator[Trials]:
    made = Trials(tmp_path, task_builder)
    yield made
    for env in made.started:
        await env.stop(delete=True)


def probe_args(hidden: list[str], marker: tuple[int, str], port: int | None = None) -> str:
    return json.dumps(
        {"hidden": hidden, "host_pid": marker[0], "host_marker": marker[1][::-1], "port": port}
    )


def assert_contained(report: dict[str, Any]) -> None:
    assert int(report["CapEff"], 16) == 0, report
    assert int(report["CapPrm"], 16) == 0, report
    assert int(report["CapBnd"], 16) == 0, report
    assert int(report["CapAmb"], 16) == 0, report
    assert report["NoNewPrivs"] == "1", report
    # the trial's root is an unprivileged host uid
    assert report["uid_map"][:2] == ["0", str(TRIAL_ID_BASE)], report
    assert report["open_by_handle_at"] in ("EPERM", "EACCES"), report
    assert report["hidden_present"] == [], report
    assert report["hidden_mounted"] == [], report  # not covered by a mount: simply absent
    assert report["proc_sys"] in ("EROFS", "EACCES"), report
    assert report["core_pattern"] in ("EROFS", "EACCES"), report
    assert report["host_marker_seen"] == [], report
    assert report["signal_host"] in ("ESRCH", "EPERM"), report
    assert report["nested_userns"] in ("ENOSPC", "EPERM", "EUSERS"), report


async def test_exec_commands_run_without_privileges_and_see_no_host_secrets(
    trials: Trials, hidden_home: Path, host_marker: tuple[int, str]
):
    hidden = [str(hidden_home / ".ssh"), str(hidden_home / ".osmosis")]
    env, _ = trials.make(env_kwargs={"hidden_paths": hidden})
    await env.start(force_build=False)

    as_root = await env.exec(
        f"python3 -c {shlex.quote(PROBE)} {shlex.quote(probe_args(hidden, host_marker))}"
    )
    as_user = await env.exec(
        f"python3 -c {shlex.quote(PROBE)} {shlex.quote(probe_args(hidden, host_marker))}",
        user="nobody",
    )
    beside = await env.exec(f"cat {hidden_home}/notes.txt; stat -c %a {hidden_home}")

    for result in (as_root, as_user):
        assert result.return_code == 0, result
        assert_contained(json.loads(result.stdout or "{}"))
    assert json.loads(as_root.stdout or "{}")["uid"] == 0
    assert json.loads(as_user.stdout or "{}")["uid"] == 65534
    # the hidden folders' parent is still there, as the host has it
    assert beside.stdout == "visible\n750\n"


async def test_dockerfile_run_steps_run_without_privileges(
    trials: Trials, hidden_home: Path, host_marker: tuple[int, str]
):
    hidden = [str(hidden_home / ".ssh"), str(hidden_home / ".osmosis")]
    args = probe_args(hidden, host_marker)
    dockerfile = (
        "FROM ubuntu:24.04\n"
        "COPY probe.py /opt/probe.py\n"
        f"RUN python3 /opt/probe.py {shlex.quote(args)} > /opt/run-as-root.json\n"
        "USER nobody\n"
        f"RUN python3 /opt/probe.py {shlex.quote(args)} > /tmp/run-as-nobody.json\n"
    )
    env, _ = trials.make(
        dockerfile=dockerfile,
        environment_files={"probe.py": PROBE},
        env_kwargs={"hidden_paths": hidden},
    )
    await env.start(force_build=False)

    reports = await env.exec("cat /opt/run-as-root.json /tmp/run-as-nobody.json", user="root")

    lines = (reports.stdout or "").splitlines()
    assert len(lines) == 2, reports
    for line in lines:
        assert_contained(json.loads(line))
    assert [json.loads(line)["uid"] for line in lines] == [0, 65534]


async def test_no_network_trial_cannot_reach_a_host_loopback_listener(
    trials: Trials, host_marker: tuple[int, str]
):
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        env, _ = trials.make(
            network_mode="no-network",
            env_kwargs={"network_policy": NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)},
        )
        await env.start(force_build=False)
        result = await env.exec(
            f"python3 -c {shlex.quote(PROBE)} {shlex.quote(probe_args([], host_marker, port))}"
        )
    finally:
        server.close()

    report = json.loads(result.stdout or "{}")
    assert_contained(report)
    assert report["host_loopback"] in ("ConnectionRefusedError", "TimeoutError", "OSError")


async def test_normal_work_still_succeeds_and_host_files_stay_unprivileged(
    trials: Trials, tmp_path: Path
):
    source = tmp_path / "upload"
    source.mkdir()
    (source / "in.txt").write_text("uploaded\n")
    env, paths = trials.make()
    await env.start(force_build=False)

    await env.upload_dir(source, "/srv/work")
    work = await env.exec(
        "set -e; cd /srv/work; cat in.txt > out.txt; echo made >> out.txt;"
        " mkdir -p /opt/tool && echo ok > /opt/tool/state; chmod 600 /opt/tool/state;"
        " (sleep 300 &) ; echo 1 > /logs/verifier/reward.txt; cat /opt/tool/state"
    )
    background = await env.exec("pgrep -c -x sleep")
    await env.download_dir("/srv/work", tmp_path / "back")

    assert work.return_code == 0, work
    assert work.stdout == "ok\n"
    assert background.stdout == "1\n", "a background process outlives its exec"
    assert (tmp_path / "back" / "out.txt").read_text() == "uploaded\nmade\n"
    reward = paths.verifier_dir / "reward.txt"
    assert reward.read_text() == "1\n"
    # what the trial wrote to a host folder belongs to an unprivileged host uid, not root
    assert os.stat(reward).st_uid == TRIAL_ID_BASE


def test_the_probe_reports_privileges_where_they_exist():
    """The probe itself can fail: run on the host as root it sees capabilities."""
    if os.geteuid() != 0:
        pytest.skip("needs root on the host to see capabilities")
    result = subprocess.run(
        [sys.executable, "-c", PROBE, probe_args(["/"], (os.getpid(), "pytest"))],
        capture_output=True,
        text=True,
        check=True,
    )
    report = json.loads(result.stdout)

    assert int(report["CapEff"], 16) != 0
    assert report["open_by_handle_at"] == "opened"
    assert report["hidden_present"] == ["/"]
    assert report["signal_host"] == "delivered"
    with pytest.raises(AssertionError):
        assert_contained(report)


async def test_default_hidden_paths_hide_system_secrets(trials: Trials):
    if not os.path.exists("/etc/shadow"):  # noqa: ASYNC240 - one stat before the trial
        pytest.skip("this host has no /etc/shadow to hide")
    env, _ = trials.make()
    await env.start(force_build=False)

    seen = await env.exec(
        "for p in /etc/shadow /etc/passwd; do test -e $p && echo present $p || echo absent $p;"
        " done; grep -c ' /etc/shadow ' /proc/self/mountinfo || true"
    )

    assert seen.stdout == "absent /etc/shadow\npresent /etc/passwd\n0\n"
