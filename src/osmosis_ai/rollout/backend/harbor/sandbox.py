"""A Harbor environment that runs a task in a bubblewrap sandbox, without Docker (Linux, root).

Each sandbox is a copy-on-write view of the host: an overlay of ``/`` whose upper layer is a
per-trial folder, so the task sees the host's programs (and its Python) and whatever it
writes lands in that folder, never on the host. Use it through Harbor by import path::

    EnvironmentConfig(import_path="osmosis_ai.rollout.backend.harbor.sandbox:LocalSandboxEnvironment")

or let :func:`default_environment_config` pick Harbor's ``docker`` environment where a Docker
engine answers and this sandbox otherwise.

How it runs:

* Containment. Every process of a trial (Dockerfile ``RUN`` steps, the agent, the verifier,
  every ``exec`` and transfer) runs in a user namespace whose ids ``0..65535`` are the
  unprivileged host ids from :data:`TRIAL_ID_BASE` on, with no capabilities at all
  (effective, permitted, inheritable, ambient, bounding), locked securebits and
  ``no_new_privs``, in its own PID, mount, IPC and UTS namespaces (and network namespace
  unless ``public``). So it cannot call what needs a host capability (``open_by_handle_at``,
  mounts, ``/proc/sys`` writes: ``/proc/sys`` is also bound read-only), cannot see, signal
  or trace a host process, and cannot make a further user namespace. Hidden paths are
  overlay whiteouts in the upper layer: absent from the trial's view, with nothing mounted
  over them to undo.
* ``start`` prepares ``upper``/``work``/``tmp`` folders for the trial (the upper folder's
  root and ``/tmp`` belong to the trial's root; the whiteouts) and asks the launcher (one
  ``sandbox_enter.py launcher`` process per host process, run as root) to fork the trial's
  helper, which, in a private mount namespace, mounts an idmapped clone of ``/`` (host uid
  ``n`` shows as ``n`` inside, so the trial's root still owns the system's files) under an
  overlay with the upper folder, and starts ``bwrap`` as root of the trial's user namespace:
  the overlay as ``/``, ``--dev``, ``--proc``, the trial's ``/tmp`` and log folders (made
  the trial root's on the host: what the trial writes there belongs to an unprivileged host
  uid), ``--unshare-pid --unshare-ipc --unshare-uts [--unshare-net] --cap-drop ALL
  --die-with-parent``, holding a ``sh`` that waits. The helper then joins the trial's
  namespaces and root and starts each command the host asks for: a forked child drops
  every privilege before executing anything from the trial's files, so background
  processes (a tmux server, say) outlive the command that started them, as in a container.
  See :mod:`osmosis_ai.rollout.backend.harbor.sandbox_enter`.
* ``stop`` ends the holder: its PID namespace goes with it, killing every process the trial
  started; the helper ends and the overlay mount goes with its mount namespace; the
  per-trial folders are deleted.
* The environment's Dockerfile is applied at start, from a subset: ``FROM`` is accepted and
  ignored (the host root is the base image), ``ARG``, ``ENV``, ``WORKDIR``, ``USER``, ``RUN``
  (run in the sandbox), and ``COPY``/``ADD`` of files from the environment folder.
  ``LABEL``, ``EXPOSE``, ``CMD``, ``MAINTAINER``, ``STOPSIGNAL`` and ``HEALTHCHECK`` change
  nothing Harbor relies on and are skipped. Anything else (``ENTRYPOINT``, ``SHELL``,
  ``VOLUME``, ``ONBUILD``, multi-stage builds, ``COPY --from``, ``ADD`` of a URL) is refused
  with :class:`UnsupportedDockerfileError` naming the instruction. Compose environments and
  prebuilt ``docker_image`` tasks are refused too. The parsing is :mod:`.dockerfile`'s.
* Network policy (task.toml ``network_mode`` per environment and per phase): ``public``
  shares the host's network; ``no-network`` runs commands in the sandbox's own network
  namespace (loopback only); ``allowlist`` does the same and forwards ports 80 and 443 of
  each allowed host name or IPv4 address (the name resolves inside through ``/etc/hosts``)
  and of every address of an allowed IPv4 CIDR range. In both restricted modes each endpoint
  in ``forward_endpoints`` (URLs, ``"host:port"`` or ``(host, port)``) stays reachable at its
  own address and port: this process listens inside the namespace (the socket is created by
  a short-lived thread that joins it) and relays each connection to the real endpoint. That
  is how an agent in a ``no-network`` trial still reaches the rollout's model endpoint on the
  host's loopback. The policy changes between phases (``capabilities.dynamic_network_policy``:
  a public set-up, an offline agent, a verifier as declared): each command runs in the
  network of the policy current when it starts, and restricting a public sandbox kills what
  the public phase left running, so nothing keeps the host's network into a restricted
  phase. Routes and relaying are :mod:`.network`'s; the host side of the privileged helper
  is :mod:`.launcher`'s.
* Files move in and out as tar streams through ``tar`` run inside the sandbox, so a symlink
  (in an upload, or left by the agent) resolves inside the sandbox, never on the host; tar
  archives brought out are unpacked with Python's ``data`` filter.

Limits: Linux only (5.19 or later: idmapped mounts under an overlay), as root; commands
run as the trial's root unless a user is named (``USER``, Harbor's agent user), and none has
a capability (a Dockerfile step that needs one, ``apt-get`` switching to its ``_apt`` user
say, fails as it would in a rootless container); no CPU, memory or GPU limits; the host's
root filesystem is readable inside as the host's users would read it (credential folders
such as ``~/.ssh`` and ``~/.osmosis``, ``/etc/shadow``, the SSH host keys, the sandbox's
state and the job's other trials are hidden, see ``hidden_paths``); only the root filesystem
is overlaid, so other host mounts show up empty.
"""

# Harbor needs Python 3.12+, so type checks on 3.11 run without it installed.
# pyright: reportMissingImports=false, reportUntypedBaseClass=false

from __future__ import annotations

import asyncio
import contextlib
import functools
import inspect
import os
import shlex
import shutil
import socket
import stat
import subprocess
import sys
import tarfile
import tempfile
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from glob import glob
from glob import has_magic as glob_magic
from pathlib import Path, PurePosixPath
from typing import Any, ClassVar

from harbor.environments.base import BaseEnvironment, ExecResult
from harbor.environments.capabilities import EnvironmentCapabilities
from harbor.models.task.config import NetworkMode, NetworkPolicy

from osmosis_ai.deadlines import SANDBOX_READY, SANDBOX_TRANSFER
from osmosis_ai.rollout.backend.harbor.compat import check_task
from osmosis_ai.rollout.backend.harbor.dockerfile import (
    SKIPPED,
    BuildState,
    Instruction,
    copy_sources,
    expand,
    parse_assignments,
    parse_dockerfile,
    split_words,
)
from osmosis_ai.rollout.backend.harbor.errors import (
    SandboxError,
    SandboxStartTimeoutError,
    SandboxTimeoutError,
    SandboxTransferTimeoutError,
    UnsupportedDockerfileError,
)
from osmosis_ai.rollout.backend.harbor.launcher import (
    ATTACH_TIMEOUT_SEC,
    BASE_PATH,
    Holder,
    end_holder,
    kill_group,
    kill_in_host_network,
    last_capability,
    launcher,
)
from osmosis_ai.rollout.backend.harbor.network import (
    Endpoint,
    Forwarder,
    Route,
    parse_endpoint,
    plan_routes,
)

__all__ = [
    "SANDBOX_IMPORT_PATH",
    "Endpoint",
    "LocalSandboxEnvironment",
    "SandboxError",
    "SandboxStartTimeoutError",
    "SandboxTimeoutError",
    "SandboxTransferTimeoutError",
    "UnsupportedDockerfileError",
    "default_environment_config",
    "docker_engine_answers",
    "parse_dockerfile",
    "parse_endpoint",
    "sandbox_missing_reason",
]

SANDBOX_IMPORT_PATH = "osmosis_ai.rollout.backend.harbor.sandbox:LocalSandboxEnvironment"
ENVIRONMENT_TYPE = "osmosis-sandbox"
# The trial's uids and gids 0..TRIAL_ID_COUNT-1 are these host ids from TRIAL_ID_BASE on: its
# root is no one on the host (files it leaves in host folders belong to TRIAL_ID_BASE + uid).
TRIAL_ID_BASE = 0x40000000
TRIAL_ID_COUNT = 65536
_DEFAULT_LOG_DIRS = ("/logs/agent", "/logs/verifier", "/logs/artifacts")
_DEFAULT_HIDDEN = (
    "~/.osmosis",
    "~/.config",
    "~/.ssh",
    "~/.aws",
    "~/.docker",
    "~/.netrc",
    "~/.git-credentials",
    "~/.pypirc",
    "~/.npmrc",
    "~/.gnupg",
    "~/.kube",
    "~/.cargo/credentials*",
    "/etc/shadow",
    "/etc/gshadow",
    "/etc/ssh/ssh_host_*_key",
    "/etc/ssl/private",
)


# -- host checks -----------------------------------------------------------------------------


def sandbox_missing_reason() -> str | None:
    """Why the sandbox cannot run on this machine, or None (cheap: no mount is tried)."""
    import sys

    if not sys.platform.startswith("linux"):
        return f"the local sandbox needs Linux (this is {sys.platform})"
    if os.geteuid() != 0:
        return "the local sandbox needs root (it mounts an overlay per trial)"
    for tool, package in (("bwrap", "bubblewrap"), ("nsenter", "util-linux"), ("ip", "iproute2")):
        if shutil.which(tool) is None:
            return f"{tool} is not installed (apt-get install {package})"
    release = os.uname().release
    try:
        major, minor = (int(part) for part in release.split("-")[0].split(".")[:2])
    except ValueError:
        major, minor = 0, 0
    if (major, minor) < (5, 19):
        return (
            f"the local sandbox needs Linux 5.19 or later (idmapped mounts under an overlay); "
            f"this kernel is {release}"
        )
    try:
        user_namespaces = int(Path("/proc/sys/user/max_user_namespaces").read_text())
    except (OSError, ValueError):
        user_namespaces = 0
    if user_namespaces <= 0:
        return (
            "user namespaces are disabled here (/proc/sys/user/max_user_namespaces is 0); "
            "the local sandbox runs every trial in one"
        )
    return None


_docker_checked: dict[str, tuple[float, bool]] = {}
_DOCKER_CHECK_TTL_SEC = 60.0


def docker_engine_answers(timeout_sec: float = 3.0) -> bool:
    """Whether Harbor's ``docker`` environment can run here: a Docker engine answers ``docker
    info`` and Compose V2 (``docker compose``, which Harbor drives it with) is installed. The
    answer is kept a minute."""
    now = time.monotonic()
    kept = _docker_checked.get("answer")
    if kept is not None and now - kept[0] < _DOCKER_CHECK_TTL_SEC:
        return kept[1]
    answer = _ask_docker(timeout_sec)
    _docker_checked["answer"] = (now, answer)
    return answer


def _ask_docker(timeout_sec: float) -> bool:
    if shutil.which("docker") is None:
        return False
    try:
        result = subprocess.run(
            ["docker", "info", "--format", "{{.ServerVersion}}"],
            capture_output=True,
            timeout=timeout_sec,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    if result.returncode != 0 or not result.stdout.strip():
        return False
    try:
        compose = subprocess.run(
            ["docker", "compose", "version"],
            capture_output=True,
            timeout=timeout_sec,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return compose.returncode == 0


def default_environment_config(**kwargs: Any) -> Any:
    """Harbor's ``docker`` environment where an engine answers (with Compose V2), else this
    sandbox.

    ``kwargs`` go to the sandbox's constructor (e.g. ``forward_endpoints``). Raises
    :class:`SandboxError` naming what is missing when neither can run.
    """
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.trial.config import EnvironmentConfig

    if docker_engine_answers():
        return EnvironmentConfig(type=EnvironmentType.DOCKER)
    if reason := sandbox_missing_reason():
        raise SandboxError(
            "no environment for Harbor trials: no Docker engine with Compose V2 answers "
            f"here, and {reason}"
        )
    return EnvironmentConfig(import_path=SANDBOX_IMPORT_PATH, kwargs=dict(kwargs))


# -- the environment -------------------------------------------------------------------------


def _base_init_accepts(name: str) -> bool:
    return name in inspect.signature(BaseEnvironment.__init__).parameters


class LocalSandboxEnvironment(BaseEnvironment):
    """Runs a Harbor task in a bubblewrap sandbox over a copy-on-write view of the host.

    Extra keyword arguments (Harbor's ``EnvironmentConfig.kwargs``):

    * ``forward_endpoints``: endpoints that stay reachable from inside under a restricted
      network policy (URLs, ``"host:port"`` or ``(host, port)``), at the same address.
    * ``state_dir``: where per-trial folders go (default: ``$TMPDIR/osmosis-sandbox``).
    * ``hidden_paths``: host paths (``~`` and globs expanded) absent inside (default:
      credential folders in ``$HOME``, ``/etc/shadow``, the SSH host keys); ``()`` hides
      only the sandbox's state and the job's other trials.
    * ``shared_paths``: host folders shown read-only at their own path (and at their real
      path, where named through a link), even where the trial would not see them (under
      ``/tmp``, which is the trial's own, or a hidden path): an agent's install prefix, say.
    """

    _setup_lock: ClassVar[threading.Lock] = threading.Lock()
    holder_command: ClassVar[tuple[str, ...]] = ("/bin/sh", "-c", "echo ready; read _")
    """The process that holds the trial's namespaces: it says ``ready`` on its stdout, then
    lives until the helper ends (reading its stdin)."""

    def __init__(
        self,
        *args: Any,
        forward_endpoints: Sequence[object] | None = None,
        state_dir: str | os.PathLike[str] | None = None,
        hidden_paths: Sequence[str] | None = None,
        shared_paths: Sequence[str | os.PathLike[str]] | None = None,
        **kwargs: Any,
    ) -> None:
        self._forward = [parse_endpoint(value) for value in forward_endpoints or ()]
        self._shared = [pair for value in shared_paths or () for pair in _shared_folder(value)]
        root = Path(state_dir) if state_dir else Path(tempfile.gettempdir()) / "osmosis-sandbox"
        self._state_root = root
        self._hidden = tuple(_DEFAULT_HIDDEN if hidden_paths is None else hidden_paths)
        self._holder: Holder | None = None
        self._trial_dir: Path | None = None
        self._forwarder: Forwarder | None = None
        self._build = BuildState()
        self._instructions: list[Instruction] = []
        self._private_net = False
        self._hosts_names: dict[str, str] = {}
        if _base_init_accepts("auto_mounting"):
            # Binding the trial's log folders is free here; Harbor then reads them in place.
            kwargs.setdefault("auto_mounting", True)
        super().__init__(*args, **kwargs)

    # -- Harbor's contract --

    @staticmethod
    def type() -> str:
        return ENVIRONMENT_TYPE

    @property
    def capabilities(self) -> EnvironmentCapabilities:
        return EnvironmentCapabilities(
            disable_internet=True,
            network_allowlist=True,
            network_allowlist_hostnames=True,
            network_allowlist_ipv4_addresses=True,
            mounted=True,
            **_supported_capabilities(
                dynamic_network_policy=True, network_allowlist_ipv4_cidrs=True
            ),
        )

    @classmethod
    def preflight(cls, kwargs: dict[str, Any] | None = None) -> None:
        """Harbor's check before a job queues trials (newer Harbor passes the job's
        environment kwargs; the sandbox declares no options model, so there is nothing to
        validate in them)."""
        if reason := sandbox_missing_reason():
            raise SandboxError(reason)

    def _validate_definition(self) -> None:
        env_dir = Path(self.environment_dir)
        check_task(env_dir.parent)
        if self.task_env_config.docker_image:
            raise UnsupportedDockerfileError(
                f"task environment {env_dir} names the prebuilt image "
                f"{self.task_env_config.docker_image!r}; the local sandbox builds only from a "
                "Dockerfile on the host root. Use Harbor's docker environment for it"
            )
        for name in ("docker-compose.yaml", "docker-compose.yml", "compose.yaml"):
            if (env_dir / name).exists():
                raise UnsupportedDockerfileError(
                    f"{env_dir / name}: compose environments need Harbor's docker environment; "
                    "the local sandbox runs a single Dockerfile"
                )
        dockerfile = env_dir / "Dockerfile"
        if dockerfile.is_file():
            self._instructions = parse_dockerfile(
                dockerfile.read_text(encoding="utf-8"), source=str(dockerfile)
            )
        elif env_dir.exists() and not env_dir.is_dir():
            raise FileNotFoundError(f"task environment {env_dir} is not a folder")

    async def start(self, force_build: bool) -> None:
        if self._holder is not None:
            raise SandboxError(f"sandbox {self.session_id} is already started")
        if reason := sandbox_missing_reason():
            raise SandboxError(reason)
        try:
            await asyncio.to_thread(self._start_holder)
            await self._start_forwarding()
            pending = await self._apply_dockerfile()
            await self._make_dirs([*pending, *self._unbound_mount_targets()])
        except BaseException:
            await self._teardown()
            raise

    async def stop(self, delete: bool) -> None:
        await self._teardown()

    async def exec(
        self,
        command: str,
        cwd: str | None = None,
        env: dict[str, str] | None = None,
        timeout_sec: int | None = None,
        user: str | int | None = None,
    ) -> ExecResult:
        chosen = self._resolve_user(user)
        if chosen is None:
            chosen = self._build.user
        return await self._run(
            command,
            cwd=cwd or self.task_env_config.workdir or self._build.workdir,
            env=self._command_env(self._merge_env(env)),
            timeout_sec=timeout_sec,
            user=chosen,
        )

    async def upload_file(self, source_path: Path | str, target_path: str) -> None:
        source = Path(source_path)
        if not await asyncio.to_thread(source.is_file):
            raise FileNotFoundError(f"upload_file: {source} is not a file")
        target = PurePosixPath(target_path)
        await self._upload_tar([(source, target.name)], str(target.parent))

    async def upload_dir(self, source_dir: Path | str, target_dir: str) -> None:
        entries = await asyncio.to_thread(_folder_entries, Path(source_dir), "upload_dir")
        await self._upload_tar(entries, target_dir)

    async def download_file(self, source_path: str, target_path: Path | str) -> None:
        quoted = shlex.quote(source_path)
        command = f"test -f {quoted} && cat -- {quoted}"
        await self._download(
            "download_file", source_path, "file", command, finish=_save, target=target_path
        )

    async def download_dir(self, source_dir: str, target_dir: Path | str) -> None:
        quoted = shlex.quote(source_dir)
        command = f"test -d {quoted} && tar -C {quoted} -cf - ."
        await self._download(
            "download_dir", source_dir, "folder", command, finish=_unpack, target=target_dir
        )

    async def _download(
        self,
        what: str,
        source: str,
        kind: str,
        command: str,
        *,
        finish: Callable[[Any, Path], None],
        target: Path | str,
    ) -> None:
        """Run ``command`` (which writes ``source`` to its stdout) within the transfer
        deadline, then hand its output to ``finish`` (save the file or unpack the folder)."""
        with tempfile.TemporaryFile() as content:
            result = await self._transfer(f"download of {source} from", command, stdout=content)
            if result.return_code != 0:
                raise FileNotFoundError(
                    f"{what}: {source} is not a {kind} in sandbox {self.session_id}"
                    + (f": {result.stderr.strip()}" if result.stderr else "")
                )
            await asyncio.to_thread(finish, content, Path(target))

    # -- setup --

    def _unbound_mount_targets(self) -> list[str]:
        """Harbor's output folders that are not bound to the host (bwrap makes the rest)."""
        mounts: list[dict[str, Any]] = list(getattr(self, "_mounts", None) or [])
        targets = [str(m["target"]) for m in mounts if not m.get("read_only")]
        bound = {str(m["target"]) for m in self._host_mount_list()}
        return [t for t in targets or _DEFAULT_LOG_DIRS if t not in bound]

    async def _make_dirs(self, dirs: Sequence[str]) -> None:
        """``mkdir -p`` as the trial's root, done by the helper's unprivileged child itself
        (no program started: this runs at every start)."""
        if not dirs:
            return
        result = await self._run(
            "", cwd="/", env={}, timeout_sec=60, user="root", mkdirs=list(dirs)
        )
        if result.return_code != 0:
            raise SandboxError(
                f"sandbox {self.session_id}: creating {', '.join(dirs)} failed: "
                f"{(result.stderr or '').strip()}"
            )

    def _host_mount_list(self) -> list[dict[str, Any]]:
        mounts = getattr(self, "_host_mounts", None)
        if mounts is not None:  # Harbor >= 0.25 lists exactly what to bind
            return [dict(m) for m in mounts]
        # Older Harbor passes the trial's log mounts in ``mounts`` when it creates a trial;
        # bind the trial's log folders by default so the environment is "mounted" either way.
        listed = [dict(m) for m in getattr(self, "_mounts", None) or []]
        targets = {str(m["target"]) for m in listed}
        paths = self.trial_paths
        artifacts = paths.artifacts_dir
        host_artifact_path = getattr(paths, "host_artifact_path", None)
        if host_artifact_path is not None:
            artifacts = host_artifact_path("main", "/logs/artifacts")
        defaults = (
            (paths.agent_dir, "/logs/agent"),
            (paths.verifier_dir, "/logs/verifier"),
            (artifacts, "/logs/artifacts"),
        )
        listed += [
            {"type": "bind", "source": str(source), "target": target}
            for source, target in defaults
            if target not in targets
        ]
        return listed

    def _network_mode(self) -> NetworkMode:
        return self.network_policy.network_mode

    def _start_holder(self) -> None:
        ready_s = SANDBOX_READY.seconds()
        self._state_root.mkdir(parents=True, exist_ok=True)
        trial_dir = Path(
            tempfile.mkdtemp(prefix=f"{_safe(self.session_id)}-", dir=self._state_root)
        )
        self._trial_dir = trial_dir
        binds = self._prepare_trial(trial_dir)
        spec = {
            "uid_base": TRIAL_ID_BASE,
            "id_count": TRIAL_ID_COUNT,
            **{name: str(trial_dir / name) for name in ("lower", "upper", "work", "merged")},
            "binds": binds,
            "bwrap": self._bwrap_command(),
            # the holder: keeps the namespaces alive until the helper ends
            "command": list(self.holder_command),
            "path": os.environ.get("PATH", BASE_PATH),
            "last_cap": last_capability(),
            "ready_timeout_ms": max(1, int(ready_s * 1000)),
        }
        errors = trial_dir / "io" / "holder.err"
        control, control_child = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            with errors.open("wb") as stderr:
                helper_pid = launcher.launch(spec, [stderr.fileno(), control_child.fileno()])
        except BaseException:
            control.close()
            raise
        finally:
            control_child.close()
        holder = Holder(helper_pid, os.pidfd_open(helper_pid), control)
        waited = time.monotonic()
        try:
            control.settimeout(ready_s + 5)
            answer = control.recv(65536).decode(errors="replace")
        except OSError as exc:
            answer = f"error {type(exc).__name__}: {exc}"
        word, _, value = answer.partition(" ")
        if word != "ok":
            end_holder(holder)
            detail = errors.read_text(errors="replace").strip()
            if "was not ready within" in value or time.monotonic() - waited >= ready_s:
                raise SANDBOX_READY.error(
                    SandboxStartTimeoutError,
                    f"sandbox {self.session_id}: its holder did not signal ready "
                    f"({value or detail or 'no answer'})",
                    ready_s,
                )
            raise SandboxError(
                f"the sandbox did not start: {value if word == 'error' else detail or 'no answer'}"
            )
        init_pid, holder_pid = value.split()
        holder.init_pid, holder.pid = int(init_pid), int(holder_pid)
        control.setblocking(False)
        self._holder = holder

    def _prepare_trial(self, trial_dir: Path) -> list[tuple[str, str, bool]]:
        """The trial's folders and upper layer; returns the binds (source, target, read-only)."""
        for name in ("lower", "upper", "work", "merged", "tmp", "io"):
            (trial_dir / name).mkdir()
        upper = trial_dir / "upper"
        # the upper folder's root is the trial's "/" (as the host's root shows inside), and
        # /tmp is the trial's own: both belong to the trial's root
        _mirror_owner("/", str(upper))
        os.chown(trial_dir / "tmp", TRIAL_ID_BASE, TRIAL_ID_BASE)
        (trial_dir / "tmp").chmod(0o1777)
        # a network namespace of its own whenever some phase is restricted: the commands of
        # a restricted phase run in it, those of a public one in the host's
        self._private_net = any(p.network_mode != NetworkMode.PUBLIC for p in self._policies())
        _, names, _ = self._plan(self.network_policy)
        if names:
            self._write_hosts_file(upper, names)
        root_dev = os.stat("/").st_dev
        for hidden in self._hidden_paths():
            _whiteout(str(upper), hidden, root_dev)
        binds: list[tuple[str, str, bool]] = [(str(trial_dir / "tmp"), "/tmp", False)]
        # /tmp is the trial's own: keep this Python visible
        binds += [(str(path), str(path), True) for path in _runtime_under_tmp()]
        binds += [(source, target, True) for source, target in self._shared]
        for mount in self._host_mount_list():
            if mount.get("type", "bind") != "bind":
                raise SandboxError(
                    f"mount {mount!r}: the local sandbox binds host folders only (type 'bind')"
                )
            source = Path(mount["source"])
            source.mkdir(parents=True, exist_ok=True)
            read_only = bool(mount.get("read_only"))
            if not read_only and _is_within(
                os.path.realpath(source), os.path.realpath(self.trial_paths.trial_dir)
            ):
                # the trial's own output folders; another host folder keeps its owners
                # (the trial's root writes there only where anyone may)
                _give_to_trial(source)
            binds.append((str(source), str(mount["target"]), read_only))
        return binds

    def _bwrap_command(self) -> list[str]:
        bwrap_path = shutil.which("bwrap")
        if bwrap_path is None:
            raise SandboxError("bwrap is not installed (apt-get install bubblewrap)")
        bwrap = [
            bwrap_path,
            "--dev", "/dev",
            "--proc", "/proc",
            "--ro-bind", "/proc/sys", "/proc/sys",
            "--unshare-pid", "--unshare-ipc", "--unshare-uts",
            "--hostname", _safe(self.session_id)[:63] or "sandbox",
            "--die-with-parent",
            "--cap-drop", "ALL",
            "--chdir", "/",
        ]  # fmt: skip
        if self._private_net:
            bwrap.append("--unshare-net")
        return bwrap

    def _hidden_paths(self) -> list[str]:
        """Host paths the trial must not see: the configured ones (``~`` expanded, globs
        matched), this machine's sandbox state (other trials' files) and the other trials
        of this job."""
        paths: list[str] = []
        for pattern in self._hidden:
            expanded = os.path.expanduser(pattern)
            paths += glob(expanded) if glob_magic(expanded) else [expanded]
        paths.append(os.path.abspath(self._state_root))
        trials = os.path.dirname(os.path.realpath(self.trial_paths.trial_dir))
        if trials != "/" and not any(_is_within(p, trials) for p in _runtime_paths()):
            paths.append(trials)
        return paths

    def _policies(self) -> list[NetworkPolicy]:
        """The policy the sandbox starts with and those of the phases Harbor announced."""
        phases = getattr(self, "_phase_network_policies", None) or []
        return [self.network_policy, *phases]

    def _plan(self, policy: NetworkPolicy) -> tuple[list[Route], dict[str, str], list[str]]:
        """What ``policy`` keeps reachable in the trial's own network: its forwarding routes,
        the ``/etc/hosts`` names of allowed hosts, the loopback addresses to add."""
        if policy.network_mode == NetworkMode.PUBLIC:
            if not self._private_net:
                return [], {}, []
            # what a restricted phase left running in the sandbox's own network keeps its
            # forwarded endpoints (the model); the names are the public phase's own
            routes, _, addresses = plan_routes(self._forward, ())
            return routes, {}, addresses
        allowed = list(policy.allowed_hosts) if policy.network_mode == NetworkMode.ALLOWLIST else []
        return plan_routes(self._forward, allowed)

    def _write_hosts_file(self, upper: Path, names: dict[str, str]) -> None:
        _mirror_parents(str(upper), "/etc/hosts")
        hosts = upper / "etc" / "hosts"
        hosts.write_text(_hosts_text(names))
        os.chown(hosts, TRIAL_ID_BASE, TRIAL_ID_BASE)
        self._hosts_names = dict(names)

    async def _start_forwarding(self) -> None:
        if not self._private_net or self._holder is None:
            return
        self._forwarder = Forwarder(f"/proc/{self._holder.pid}/ns/net")
        routes, _, addresses = self._plan(self.network_policy)
        await self._forwarder.apply(routes, addresses)

    async def _apply_network_policy(self, network_policy: NetworkPolicy) -> None:
        """Switch the running sandbox to ``network_policy`` (Harbor calls this between
        phases; not started yet, :meth:`start` applies whatever policy is current then).

        A restricted policy's commands run in the trial's own network namespace, a public
        one's in the host's. Restricting a public sandbox kills the processes its public
        phase left running (they would keep the host's network, a tmux server say); moving
        between ``no-network`` and ``allowlist`` opens or closes forwarded hosts and their
        connections, and rewrites ``/etc/hosts``.
        """
        holder = self._holder
        if holder is None:
            return
        restricted = network_policy.network_mode != NetworkMode.PUBLIC
        if restricted and (not self._private_net or self._forwarder is None):
            raise SandboxError(
                f"sandbox {self.session_id} started with only the host's network (Harbor "
                f"announced no restricted phase), so it cannot switch to "
                f"{network_policy.network_mode.value!r}"
            )
        if restricted and self._network_mode() == NetworkMode.PUBLIC:
            await asyncio.to_thread(kill_in_host_network, holder)
        routes, names, addresses = self._plan(network_policy)
        if self._forwarder is not None:
            await self._forwarder.apply(routes, addresses)
        if names != self._hosts_names:
            with tempfile.TemporaryFile() as content:
                content.write(_hosts_text(names).encode())
                content.seek(0)
                result = await self._run(
                    "cat > /etc/hosts",
                    cwd="/",
                    env=self._command_env(None),
                    timeout_sec=60,
                    user="root",
                    shell="/bin/sh",
                    stdin=content,
                    private_net=restricted,
                )
            if result.return_code != 0:
                raise SandboxError(
                    f"sandbox {self.session_id}: rewriting /etc/hosts for the "
                    f"{network_policy.network_mode.value!r} policy failed: "
                    f"{(result.stderr or '').strip()}"
                )
            self._hosts_names = dict(names)

    async def _apply_dockerfile(self) -> list[str]:
        """Apply the Dockerfile; returns WORKDIR folders still to create (one exec for all)."""
        state = self._build
        pending: list[str] = []
        context = await asyncio.to_thread(Path(self.environment_dir).resolve)
        for item in self._instructions:
            keyword = item.keyword
            if keyword in SKIPPED or keyword == "FROM":
                continue
            args = expand(item.args, {**state.variables, **state.env})
            if keyword == "ARG":
                for name, value in parse_assignments(item.args, keyword, item.line).items():
                    state.variables.setdefault(name, expand(value, state.variables))
            elif keyword == "ENV":
                for name, value in parse_assignments(item.args, keyword, item.line).items():
                    state.env[name] = expand(value, {**state.variables, **state.env})
            elif keyword == "WORKDIR":
                state.workdir = str(PurePosixPath(state.workdir) / args.strip())
                pending.append(state.workdir)
            elif keyword == "USER":
                name = args.strip().split(":")[0]
                state.user = None if name in ("root", "0") else name
            elif keyword == "RUN":
                await self._make_dirs(pending)
                pending = []
                words = split_words(item.args)
                command = shlex.join(words) if item.args.startswith("[") else item.args
                env = self._command_env({**state.variables, **state.env}, include_build=False)
                result = await self._run(
                    command,
                    cwd=state.workdir,
                    env=env,
                    timeout_sec=int(self.task_env_config.build_timeout_sec),
                    user=state.user,
                    shell="/bin/sh",
                )
                if result.return_code != 0:
                    output = (result.stderr or result.stdout or "").strip()[-2000:]
                    raise SandboxError(
                        f"Dockerfile line {item.line}: RUN {item.args!r} failed with exit code "
                        f"{result.return_code}: {output}"
                    )
            else:  # COPY / ADD
                await self._copy(item, args, context)
        return pending

    async def _copy(self, item: Instruction, args: str, context: Path) -> None:
        words = split_words(args)
        chmod = next((w.split("=", 1)[1] for w in words if w.startswith("--chmod=")), None)
        # --chown (everything runs as root), --link and --parents change nothing here
        paths = [word for word in words if not word.startswith("--")]
        if len(paths) < 2:
            raise UnsupportedDockerfileError(
                f"Dockerfile line {item.line}: {item.keyword} needs a source and a destination"
            )
        *sources, dest = paths
        destination = PurePosixPath(self._build.workdir) / dest
        entries, into_dir = await asyncio.to_thread(copy_sources, item, sources, context)
        into_dir = into_dir or dest.endswith("/")
        if into_dir:
            await self._upload_tar(entries, str(destination), mode=chmod)
        else:
            await self._upload_tar(
                [(entries[0][0], destination.name)], str(destination.parent), mode=chmod
            )

    # -- running commands --

    def _command_env(
        self, extra: dict[str, str] | None, *, include_build: bool = True
    ) -> dict[str, str]:
        env = {"PATH": BASE_PATH, "HOME": "/root", "LANG": "C.UTF-8", "TERM": "xterm"}
        if include_build:
            env.update(self._build.env)
        if extra:
            env.update(extra)
        return env

    async def _checked(self, command: str, user: str | None) -> None:
        result = await self._run(
            command,
            cwd="/",
            env=self._command_env(None),
            timeout_sec=60,
            user=user,
            shell="/bin/sh",
        )
        if result.return_code != 0:
            raise SandboxError(
                f"sandbox {self.session_id}: {command!r} failed: "
                f"{(result.stderr or result.stdout or '').strip()}"
            )

    async def _run(
        self,
        command: str,
        *,
        cwd: str,
        env: dict[str, str],
        timeout_sec: float | None,
        user: str | int | None,
        stdin: Any = None,
        stdout: Any = None,
        shell: str = "bash",
        mkdirs: list[str] | None = None,
        private_net: bool | None = None,
    ) -> ExecResult:
        holder = self._holder
        if holder is None or self._trial_dir is None:
            raise SandboxError(f"sandbox {self.session_id} is not running; call start() first")
        as_user = None if user in (None, "root", 0, "0") else str(user)
        shell_path = shell if shell.startswith("/") else f"/bin/{shell}"
        spec = {
            "user": as_user,
            "cwd": cwd,
            "argv": [shell_path, "-c", command],
            "env": env,
            "mkdirs": mkdirs or [],
            "private_net": (
                self._network_mode() != NetworkMode.PUBLIC if private_net is None else private_net
            ),
        }
        io_dir = self._trial_dir / "io"
        token = uuid.uuid4().hex
        out_path = io_dir / f"{token}.out"
        err_path = io_dir / f"{token}.err"
        with contextlib.ExitStack() as files:
            out_file = stdout if stdout is not None else files.enter_context(out_path.open("wb"))
            err_file = files.enter_context(err_path.open("wb"))
            if stdin is None:
                stdin = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
                files.callback(os.close, stdin)
            in_file = stdin
            reply = await holder.start_command(spec, [in_file, out_file, err_file])
            files.callback(reply.close)
            loop = asyncio.get_running_loop()
            try:
                started = await asyncio.wait_for(loop.sock_recv(reply, 65536), ATTACH_TIMEOUT_SEC)
            except TimeoutError:
                raise SandboxError(
                    f"sandbox {self.session_id}: the helper did not start the command within "
                    f"{ATTACH_TIMEOUT_SEC:.0f} s"
                ) from None
            word, _, value = started.decode().partition(" ")
            if word != "pid":
                raise SandboxError(
                    f"sandbox {self.session_id}: the command could not start: "
                    f"{value if word == 'error' else 'the sandbox ended'}"
                )
            pid = int(value)
            try:
                ended = loop.sock_recv(reply, 65536)
                answer = await (asyncio.wait_for(ended, timeout_sec) if timeout_sec else ended)
            except TimeoutError:
                kill_group(pid)
                raise SandboxTimeoutError(
                    f"Command timed out after {timeout_sec} seconds"
                ) from None
            except BaseException:
                kill_group(pid)
                raise
            word, _, value = answer.decode().partition(" ")
            if word != "exit":
                raise SandboxError(
                    f"sandbox {self.session_id} ended while running {command[:200]!r}"
                )
            code = int(value)
        try:
            out = None if stdout is not None else _read_text(out_path)
            err = _read_text(err_path)
        finally:
            out_path.unlink(missing_ok=True)
            err_path.unlink(missing_ok=True)
        return ExecResult(stdout=out, stderr=err, return_code=code)

    async def _transfer(
        self, what: str, command: str, *, stdin: Any = None, stdout: Any = None
    ) -> ExecResult:
        """``command`` (a copy in or out) as root under ``/bin/sh``, within the sandbox
        transfer deadline (``OSMOSIS_SANDBOX_TRANSFER_TIMEOUT_S``)."""
        deadline = SANDBOX_TRANSFER.seconds()
        try:
            return await self._run(
                command,
                cwd="/",
                env=self._command_env(None),
                timeout_sec=deadline,
                user="root",
                shell="/bin/sh",
                stdin=stdin,
                stdout=stdout,
            )
        except SandboxTimeoutError:
            raise SANDBOX_TRANSFER.error(
                SandboxTransferTimeoutError,
                f"{what} sandbox {self.session_id} did not finish (its copy was killed)",
                deadline,
            ) from None

    async def _upload_tar(
        self, entries: Sequence[tuple[Path, str]], target_dir: str, *, mode: str | None = None
    ) -> None:
        with tempfile.TemporaryFile() as archive:
            await asyncio.to_thread(_write_tar, archive, entries, mode)
            archive.seek(0)
            quoted = shlex.quote(target_dir)
            result = await self._transfer(
                f"upload to {target_dir} in",
                f"mkdir -p {quoted} && tar -C {quoted} -xf - --no-same-owner",
                stdin=archive,
            )
        if result.return_code != 0:
            raise SandboxError(
                f"upload to {target_dir} in sandbox {self.session_id} failed: "
                f"{(result.stderr or '').strip()}"
            )

    # -- teardown --

    async def _teardown(self) -> None:
        if self._forwarder is not None:
            await self._forwarder.close()
            self._forwarder = None
        holder, self._holder = self._holder, None
        if holder is not None:
            await asyncio.to_thread(end_holder, holder)
        trial_dir, self._trial_dir = self._trial_dir, None
        if trial_dir is not None:
            await asyncio.to_thread(shutil.rmtree, trial_dir, True)


# -- small helpers ---------------------------------------------------------------------------


def _hosts_text(names: dict[str, str]) -> str:
    """The host's ``/etc/hosts`` with the forwarded names of allowed hosts after it."""
    try:
        base = Path("/etc/hosts").read_text()
    except OSError:
        base = "127.0.0.1 localhost\n"
    if not names:
        return base
    lines = [base.rstrip("\n"), "# forwarded by the local sandbox"]
    lines += [f"{address} {name}" for name, address in names.items()]
    return "\n".join(lines) + "\n"


def _supported_capabilities(**wanted: bool) -> dict[str, bool]:
    """Those of ``wanted`` that the installed Harbor's ``EnvironmentCapabilities`` knows
    (older ones lack ``dynamic_network_policy``, for one)."""
    fields = getattr(EnvironmentCapabilities, "model_fields", {})
    return {name: value for name, value in wanted.items() if name in fields}


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in name)


def _trial_id(host_id: int) -> int:
    """The host id under which the trial sees (and owns) a file the host's ``host_id`` owns."""
    return TRIAL_ID_BASE + host_id if 0 <= host_id < TRIAL_ID_COUNT else TRIAL_ID_BASE + 65534


def _mirror_owner(source: str, target: str) -> None:
    """Give ``target`` (in the upper folder) ``source``'s mode, times and owner as the
    trial sees it: an upper folder's attributes are what the trial's view shows."""
    info = os.lstat(source)
    os.chown(target, _trial_id(info.st_uid), _trial_id(info.st_gid), follow_symlinks=False)
    os.chmod(target, stat.S_IMODE(info.st_mode))
    os.utime(target, ns=(info.st_atime_ns, info.st_mtime_ns), follow_symlinks=False)


def _mirror_parents(upper: str, path: str) -> None:
    """Create ``path``'s parent folders in the upper folder as the host has them."""
    parent = ""
    for part in os.path.dirname(path).split("/"):
        if not part:
            continue
        parent += "/" + part
        try:
            os.mkdir(upper + parent)
        except FileExistsError:
            continue
        _mirror_owner(parent, upper + parent)


def _whiteout(upper: str, path: str, root_dev: int) -> None:
    """Hide ``path`` (and, for a link, what it points to) from the trial: an overlay whiteout
    in the upper folder, so the trial's view has nothing there at all (nothing to unmount).
    Plain string paths: this runs for every hidden path of every trial."""
    parent = os.path.realpath(os.path.dirname(path))
    named = os.path.join(parent, os.path.basename(path))
    for hidden in {named, os.path.realpath(named)}:
        if hidden == "/":
            continue
        try:
            os.lstat(hidden)
            if os.stat(os.path.dirname(hidden)).st_dev != root_dev:
                continue  # only the root filesystem is overlaid; other mounts show up empty
        except OSError:
            continue
        _mirror_parents(upper, hidden)
        with contextlib.suppress(FileExistsError):
            os.mknod(upper + hidden, stat.S_IFCHR | 0o600, os.makedev(0, 0))


def _give_to_trial(folder: Path) -> None:
    """Make a host folder bound writable into the trial (its log folders) the trial root's:
    what the trial writes there belongs to the unprivileged TRIAL_ID_BASE range."""
    owner = TRIAL_ID_BASE
    os.chown(folder, owner, owner)
    for parent, dirs, files in os.walk(folder):
        for name in (*dirs, *files):
            os.chown(os.path.join(parent, name), owner, owner, follow_symlinks=False)


def _folder_entries(source: Path, what: str) -> list[tuple[Path, str]]:
    if not source.is_dir():
        raise FileNotFoundError(f"{what}: {source} is not a folder")
    return [(child, child.name) for child in sorted(source.iterdir())]


def _save(content: Any, target: Path) -> None:
    target.parent.mkdir(parents=True, exist_ok=True)
    content.seek(0)
    with target.open("wb") as out:
        shutil.copyfileobj(content, out)


def _unpack(archive: Any, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    archive.seek(0)
    with tarfile.open(fileobj=archive, mode="r:") as tar:
        tar.extractall(target, filter=_download_filter)


def _read_text(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except OSError:
        return None
    return data.decode(errors="replace") if data else None


def _write_tar(archive: Any, entries: Sequence[tuple[Path, str]], mode: str | None) -> None:
    """Pack host files for upload: symlinks stay symlinks, owners become root."""

    def owned_by_root(info: tarfile.TarInfo) -> tarfile.TarInfo:
        info.uid = info.gid = 0
        info.uname = info.gname = "root"
        if mode is not None and not info.issym():
            info.mode = int(mode, 8)
        return info

    with tarfile.open(fileobj=archive, mode="w:", dereference=False) as tar:
        for path, name in entries:
            if not (path.exists() or path.is_symlink()):
                raise FileNotFoundError(f"upload: {path} does not exist")
            tar.add(path, arcname=name, recursive=True, filter=owned_by_root)


def _download_filter(member: tarfile.TarInfo, dest_path: str) -> tarfile.TarInfo | None:
    """Python's ``data`` filter, skipping device nodes and FIFOs instead of failing."""
    if member.isdev():
        return None
    try:
        return tarfile.data_filter(member, dest_path)
    except tarfile.FilterError:
        return None  # a link that points out of the folder: dropped, never followed


def _shared_folder(value: str | os.PathLike[str]) -> list[tuple[str, str]]:
    """(source, target) pairs: the folder itself at the path it was named by and, where that
    goes through a link, at its real path too, which the folder's own files name (the
    shebangs of a virtual environment's scripts, say)."""
    path = os.path.abspath(os.path.expanduser(value))
    if not os.path.isdir(path):
        raise SandboxError(f"shared_paths: {str(value)!r} is not a folder on this machine")
    real = os.path.realpath(path)
    return [(real, path)] if real == path else [(real, path), (real, real)]


@functools.cache
def _runtime_paths() -> tuple[str, ...]:
    """This interpreter's environment and installation and the SDK's own folder."""
    package = Path(__file__).parents[4]  # src/osmosis_ai/rollout/backend/harbor/sandbox.py
    return tuple(os.path.realpath(p) for p in (sys.prefix, sys.base_prefix, package))


def _is_within(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


@functools.cache
def _runtime_under_tmp() -> list[Path]:
    """The runtime paths that lie under ``/tmp`` (a checkout or virtual environment there):
    the sandbox has a ``/tmp`` of its own, and the in-sandbox runner runs on this Python."""
    found = sorted({p for p in _runtime_paths() if _is_within(p, "/tmp")})
    # a folder inside another one is bound with it
    return [Path(p) for p in found if not any(p != q and _is_within(p, q) for q in found)]
