"""Starting a workspace rollout server as a child process, the way a controller does.

``python rollouts/<name>/<entrypoint>`` runs in its own process group with
``_OSMOSIS_ROLLOUT_PORT``, ``_OSMOSIS_ROLLOUT_ARTIFACT_ROOT`` and
``_OSMOSIS_ROLLOUT_INSTANCE_ID`` set. When the rollout's declared dependencies are
already installed here, the current interpreter runs it (fast path); otherwise uv builds
an isolated environment from ``rollouts/<name>/pyproject.toml``. The server counts as up
once ``/health`` answers with our instance id.

``OSMOSIS_ROLLOUT_PYTHON`` names the interpreter that runs the server instead (no check, no
uv): for a rollout that needs another Python than the controller's, say a Harbor rollout
(Python 3.12+) beside a training run on 3.11, with an environment you built yourself. A
rollout whose ``requires-python`` excludes the current interpreter never takes the fast path.

With ``OSMOSIS_ROLLOUT_ENV_CACHE`` set (a platform worker sets it), the uv environment lives
under that folder, named by a hash of the rollout's ``pyproject.toml``, ``uv.lock`` and
``.python-version``, so runs of the same rollout share one environment; it is built under a
file lock, so two runs never build it at once. Without it, uv keeps the environment in the
rollout folder as before.

With a containment policy in this process's environment
(:data:`~osmosis_ai.controller.containment.CONTAINMENT_ENV`, a platform run's execute process
sets it), the server and its ``uv sync`` run contained
(:mod:`~osmosis_ai.controller.containment`): an environment from the allowlist plus ``env``,
the checkout and the interpreter read-only, only the artifacts folder, a private home and
(while building) the uv environment writable. The interpreter and the environment cache are
then the starter's choice alone, never the run's ``env``.

:meth:`RolloutServerProcess.spawn` returns as soon as the child exists, so that a controller
can do its own start-up while the server boots, then :meth:`~RolloutServerProcess.wait_ready`;
:meth:`~RolloutServerProcess.start` is both. httpx and packaging load only when needed.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import tomllib
import uuid
from collections import deque
from collections.abc import Callable, Generator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any

from osmosis_ai.controller import containment
from osmosis_ai.controller.errors import ControllerError
from osmosis_ai.deadlines import ENVIRONMENT_BUILD
from osmosis_ai.errors import DeadlineError, OsmosisError
from osmosis_ai.procs import free_port, pid_alive, stop_group, stop_process

if TYPE_CHECKING:
    from packaging.requirements import Requirement

PORT_ENV = "_OSMOSIS_ROLLOUT_PORT"
ARTIFACT_ROOT_ENV = "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"
INSTANCE_ID_ENV = "_OSMOSIS_ROLLOUT_INSTANCE_ID"
INSTANCE_HEADER = "x-osmosis-rollout-instance-id"
RESERVED_ENV = (PORT_ENV, ARTIFACT_ROOT_ENV, INSTANCE_ID_ENV)
ENV_CACHE_ENV = "OSMOSIS_ROLLOUT_ENV_CACHE"
PYTHON_ENV = "OSMOSIS_ROLLOUT_PYTHON"
HOST_ENV = "OSMOSIS_ROLLOUT_HOST"  # the address the entrypoint binds (run_rollout_server reads it)
LOOPBACK = "127.0.0.1"
UV_ENV = "UV_PROJECT_ENVIRONMENT"
LOCK_FILES = ("pyproject.toml", "uv.lock", ".python-version")
_POLL_SEC = 0.02  # /health polling: the first dispatch waits on it
_LOCK_POLL_SEC = 0.2  # another build holds the shared environment


class RolloutServerError(ControllerError):
    """The rollout server could not be started or stopped being healthy."""


class EnvironmentBuildTimeoutError(RolloutServerError, DeadlineError):
    """The rollout's environment was not built within the environment build deadline."""


@dataclass(frozen=True)
class DependencyCheck:
    """Whether this interpreter already satisfies a rollout's declared dependencies."""

    satisfied: bool
    missing: tuple[str, ...] = ()


def check_dependencies(rollout_dir: Path) -> DependencyCheck:
    """Compare ``[project].dependencies`` of the rollout's pyproject.toml with what is
    installed here. A rollout without a pyproject.toml runs in this interpreter."""
    pyproject = rollout_dir / "pyproject.toml"
    if not pyproject.is_file():
        return DependencyCheck(True)
    from packaging.requirements import InvalidRequirement, Requirement

    try:
        data = tomllib.loads(pyproject.read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError) as exc:
        raise RolloutServerError(f"cannot read {pyproject}: {exc}") from exc
    missing: list[str] = []
    requires_python = data.get("project", {}).get("requires-python")
    if requires_python:
        from packaging.specifiers import InvalidSpecifier, SpecifierSet

        try:
            wanted = SpecifierSet(str(requires_python))
        except InvalidSpecifier as exc:
            raise RolloutServerError(
                f"{pyproject}: invalid requires-python {requires_python!r}: {exc}"
            ) from exc
        here = ".".join(map(str, sys.version_info[:3]))
        if not wanted.contains(here, prereleases=True):
            missing.append(f"python{wanted} (this is {here})")
    for spec in data.get("project", {}).get("dependencies", []):
        try:
            requirement = Requirement(str(spec))
        except InvalidRequirement as exc:
            raise RolloutServerError(f"{pyproject}: invalid dependency {spec!r}: {exc}") from exc
        if requirement.marker is not None and not requirement.marker.evaluate():
            continue
        if not _installed(requirement):
            missing.append(str(requirement))
    return DependencyCheck(not missing, tuple(missing))


def _installed(requirement: Requirement) -> bool:
    """Installed at a matching version, with the packages each requested extra adds."""
    from importlib import metadata

    from packaging.requirements import Requirement

    try:
        version = metadata.version(requirement.name)
    except metadata.PackageNotFoundError:
        return False
    if requirement.specifier and not requirement.specifier.contains(version, prereleases=True):
        return False
    for extra in requirement.extras:
        for spec in metadata.requires(requirement.name) or []:
            needed = Requirement(spec)
            marker = needed.marker
            only_for_extra = (
                marker is not None
                and marker.evaluate({"extra": extra})
                and not marker.evaluate({"extra": ""})
            )
            if only_for_extra and not _installed(needed):
                return False
    return True


def environment_key(rollout_dir: Path) -> str:
    """The SHA-256 of the rollout's dependency files: equal keys, equal environments."""
    digest = hashlib.sha256()
    for name in LOCK_FILES:
        path = rollout_dir / name
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes() if path.is_file() else b"-")
        digest.update(b"\0")
    return digest.hexdigest()


class OutputTail:
    """The last lines a child process wrote, for error messages."""

    def __init__(self, keep: int = 60) -> None:
        self._lines: deque[str] = deque(maxlen=keep)

    def pump(self, stream: IO[bytes], on_output: Callable[[str], None] | None) -> None:
        """Read ``stream`` to its end, keeping its last lines and passing each to
        ``on_output``."""
        for raw in stream:
            line = raw.decode("utf-8", "replace").rstrip("\n")
            self._lines.append(line)
            if on_output is not None:
                on_output(line)

    def text(self, lines: int = 25) -> str:
        return "\n".join(list(self._lines)[-lines:]) or "(no output)"


@dataclass
class RolloutServerProcess:
    """A rollout server child process: :meth:`start` (or :meth:`spawn`, then
    :meth:`wait_ready`), then :meth:`stop`."""

    rollout_dir: Path
    entrypoint: Path
    artifact_root: Path
    env: Mapping[str, str] = field(default_factory=dict)
    port: int | None = None
    on_output: Callable[[str], None] | None = None
    health_timeout_sec: float = 90.0
    host: str = LOOPBACK
    """The address the server binds and is reached on: 127.0.0.1, or a cluster node's own
    address when a fleet runs it on that node."""
    instance_id: str = field(default_factory=lambda: uuid.uuid4().hex)
    die_with_parent: bool = False
    """Have the server killed when this process dies, however it dies (Linux): for servers
    whose starter may be killed outright, such as a fleet's Ray actors."""
    process: subprocess.Popen[bytes] | None = None
    isolated: bool = False
    _reader: threading.Thread | None = None
    _tail: OutputTail = field(default_factory=OutputTail)
    _command: list[str] | None = field(default=None, init=False)
    _uv_environment: Path | None = field(default=None, init=False)
    _port_given: bool = field(default=False, init=False)
    _python_chosen: bool = field(default=False, init=False)
    _containment: containment.Containment | None = field(default=None, init=False)

    def __post_init__(self) -> None:
        self._containment = containment.from_environ()
        # The child runs with cwd=rollout_dir, so relative paths would resolve twice.
        self.rollout_dir = Path(self.rollout_dir).resolve()
        self.entrypoint = Path(self.entrypoint).resolve()
        self.artifact_root = Path(self.artifact_root).resolve()
        self._port_given = self.port is not None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def command(self) -> list[str]:
        """The command line: this interpreter, or ``uv run`` in the rollout's own env.

        Decided once (the dependency check reads package metadata), then reused.
        """
        if self._command is None:
            self._command = self._decide_command()
        return self._command

    def _setting(self, name: str) -> str | None:
        """A setting of the starter: contained, the run's ``env`` cannot choose it."""
        if self._containment is not None:
            return os.environ.get(name)
        return self.env.get(name) or os.environ.get(name)

    def _decide_command(self) -> list[str]:
        chosen = self._setting(PYTHON_ENV)
        if chosen:
            python = shutil.which(chosen)
            if python is None:
                raise RolloutServerError(
                    f"{PYTHON_ENV}={chosen!r} is not an executable Python: point it at the "
                    "interpreter of an environment that has the rollout's dependencies, or "
                    "unset it"
                )
            self.isolated = False
            self._python_chosen = True
            return [python, str(self.entrypoint)]
        deps = check_dependencies(self.rollout_dir)
        if deps.satisfied:
            self.isolated = False
            return [sys.executable, str(self.entrypoint)]
        uv = shutil.which("uv")
        if uv is None:
            raise RolloutServerError(
                f"rollout {self.rollout_dir.name!r} needs packages this environment lacks "
                f"({', '.join(deps.missing)}) and uv is not installed to build its own "
                "environment: pip install uv, or pip install the missing packages here"
            )
        self.isolated = True
        cache = self._setting(ENV_CACHE_ENV)
        if cache:
            self._uv_environment = Path(cache) / environment_key(self.rollout_dir)
        # Contained, the environment is read-only once built: run it as synced.
        frozen = ["--no-sync"] if self._containment is not None else []
        return [uv, "run", *frozen, "--project", str(self.rollout_dir), "python",
                str(self.entrypoint)]  # fmt: skip

    def sync(self) -> None:
        """Build the isolated environment (``uv sync``) when the fast path is not possible.

        The build, with any wait for another build of the same environment, ends within the
        environment build deadline (``OSMOSIS_ENV_BUILD_TIMEOUT_S``): past it, uv and what
        it started are killed and :class:`EnvironmentBuildTimeoutError` is raised."""
        command = self.command()
        if not self.isolated:
            return
        deadline_s = ENVIRONMENT_BUILD.seconds({**os.environ, **self.env})
        ends = time.monotonic() + deadline_s
        what = f"uv sync of rollouts/{self.rollout_dir.name}"
        with tempfile.TemporaryFile() as output:
            with self._environment_lock(ends, deadline_s):
                # Its own group, so that a build stopped at the deadline leaves nothing behind.
                process = self._popen_sync(
                    [command[0], "sync", "--project", str(self.rollout_dir)],
                    stdin=subprocess.DEVNULL,
                    stdout=output,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
                try:
                    code = process.wait(timeout=max(0.0, ends - time.monotonic()))
                except BaseException as exc:
                    stop_group(process.pid, 0.0)
                    process.wait()
                    if isinstance(exc, subprocess.TimeoutExpired):
                        raise ENVIRONMENT_BUILD.error(
                            EnvironmentBuildTimeoutError, f"{what} did not finish", deadline_s
                        ) from None
                    raise
            output.seek(0)
            text = output.read().decode("utf-8", "replace")
        if self.on_output is not None:
            self.on_output(text)
        if code != 0:
            raise RolloutServerError(f"{what} failed (exit {code}): {text.strip()[-2000:]}")

    @property
    def uv_environment(self) -> Path | None:
        """The shared uv environment this rollout runs in (``None``: uv's own choice)."""
        return self._uv_environment

    def _uv_env(self, env: dict[str, str]) -> dict[str, str]:
        if self._uv_environment is not None:
            env[UV_ENV] = str(self._uv_environment)
        return env

    @contextlib.contextmanager
    def _environment_lock(self, ends: float, deadline_s: float) -> Generator[None]:
        """Hold the shared environment's build lock, waited for until ``ends`` at most."""
        if self._uv_environment is None:
            yield
            return
        self._uv_environment.parent.mkdir(parents=True, exist_ok=True)
        lock = self._uv_environment.with_name(self._uv_environment.name + ".lock")
        with lock.open("a") as handle:
            while True:
                try:
                    fcntl.flock(handle.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() >= ends:
                        raise ENVIRONMENT_BUILD.error(
                            EnvironmentBuildTimeoutError,
                            f"another build of {self._uv_environment} did not let go of it",
                            deadline_s,
                        ) from None
                    time.sleep(_LOCK_POLL_SEC)
            try:
                yield
            finally:
                fcntl.flock(handle.fileno(), fcntl.LOCK_UN)

    def start(self) -> RolloutServerProcess:
        """Spawn the server and wait until ``/health`` answers with our instance id."""
        self.spawn()
        self.wait_ready()
        return self

    def spawn(self) -> None:
        """Start the child on the given port (refused if busy) or a free one; returns at once."""
        if not self._port_given:
            self.port = free_port(self.host)
        elif _port_busy(self.port, self.host):  # type: ignore[arg-type]
            raise RolloutServerError(
                f"port {self.port} is already in use: choose another --rollout-port "
                "or stop the process holding it"
            )
        self._spawn()

    def wait_ready(self) -> None:
        """Wait until the spawned child is healthy; raises (having stopped it) if it is not.

        A free port we picked can be taken by another process (or an outgoing connection's
        local port) before the child binds it: the child then fails to bind or another
        server answers, and it is started again on another free port (three tries).
        """
        tries = 1 if self._port_given else _PORT_TRIES
        for attempt in range(tries):
            try:
                self._wait_healthy()
                return
            except _PortTakenError as taken:
                self.stop()
                if attempt == tries - 1:
                    raise RolloutServerError(
                        f"port {self.port} was taken by another process{taken.detail}"
                    ) from None
            self.port = free_port(self.host)
            self._spawn()

    def _popen_sync(self, command: list[str], **kwargs: Any) -> subprocess.Popen[Any]:
        """``uv sync``: contained, it may write only the environment it builds (build
        backends are the workspace's code)."""
        if self._containment is None:
            return subprocess.Popen(command, env=self._uv_env({**os.environ}), **kwargs)
        return self._containment.popen(
            command,
            cwd=self.rollout_dir,
            env=self._contained_env({}),
            read_only=self._contained_reads(),
            writable=[p for p in (self._uv_environment,) if p is not None],
            **kwargs,
        )

    def _contained_env(self, more: Mapping[str, str]) -> dict[str, str]:
        """The environment of a contained child: allowlist, ``env``, then ``more``."""
        assert self._containment is not None
        env = self._containment.environment(os.environ, self.env)
        for name in (PYTHON_ENV, ENV_CACHE_ENV, containment.CONTAINMENT_ENV, "VIRTUAL_ENV"):
            env.pop(name, None)
        env["UV_CACHE_DIR"] = str(Path(self._containment.home) / ".cache" / "uv")
        env.update(more)
        return self._uv_env(env) if self.isolated else env

    def _contained_reads(self) -> list[str | Path]:
        return [*containment.interpreter_paths(), self.rollout_dir, self.entrypoint.parent]

    def _spawn(self) -> None:
        command = self.command()  # first: it decides whether the child is isolated
        if self._containment is not None:
            self._spawn_contained(command)
            return
        env = {**os.environ, **self.env}
        if self.isolated:
            env.pop("VIRTUAL_ENV", None)  # uv picks the rollout's own environment
            self._uv_env(env)
        elif self._python_chosen:
            env.pop("VIRTUAL_ENV", None)  # the chosen interpreter's, not ours
        env.update(
            {
                PORT_ENV: str(self.port),
                ARTIFACT_ROOT_ENV: str(self.artifact_root),
                INSTANCE_ID_ENV: self.instance_id,
                "PYTHONUNBUFFERED": "1",
            }
        )
        if self.host != LOOPBACK:
            env[HOST_ENV] = self.host
        self._tail = OutputTail()
        if self.die_with_parent:
            from osmosis_ai.controller import parent_guard  # (run as a file: stdlib only)

            guard = [sys.executable, "-I", parent_guard.__file__, str(os.getpid())]
            command = [*guard, *command]
        self.process = subprocess.Popen(
            command,
            cwd=self.rollout_dir,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._reader = threading.Thread(
            target=self._pump, name="rollout-server-output", daemon=True
        )
        self._reader.start()

    def _spawn_contained(self, command: list[str]) -> None:
        assert self._containment is not None
        more = {
            PORT_ENV: str(self.port),
            ARTIFACT_ROOT_ENV: str(self.artifact_root),
            INSTANCE_ID_ENV: self.instance_id,
            "PYTHONUNBUFFERED": "1",
        }
        if self.host != LOOPBACK:
            more[HOST_ENV] = self.host
        reads = self._contained_reads()
        if self._uv_environment is not None:
            reads.append(self._uv_environment)
        self._tail = OutputTail()
        self.process = self._containment.popen(
            command,
            cwd=self.rollout_dir,
            env=self._contained_env(more),
            read_only=reads,
            writable=[self.artifact_root],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        self._reader = threading.Thread(
            target=self._pump, name="rollout-server-output", daemon=True
        )
        self._reader.start()

    def _pump(self) -> None:
        assert self.process is not None and self.process.stdout is not None
        self._tail.pump(self.process.stdout, self.on_output)

    def _wait_healthy(self) -> None:
        import httpx

        assert self.process is not None
        deadline = time.monotonic() + self.health_timeout_sec
        # Loopback only: no TLS, so skip loading the CA bundle on the start-up path.
        with httpx.Client(timeout=2.0, verify=False) as client:
            while time.monotonic() < deadline:
                if self.process.poll() is not None:
                    self._died()
                try:
                    response = client.get(f"{self.url}/health")
                except httpx.TransportError:  # not listening yet: a refused connect is cheap
                    time.sleep(_POLL_SEC)
                    continue
                owner = response.headers.get(INSTANCE_HEADER)
                if owner is None and response.status_code == 200:
                    with contextlib.suppress(ValueError, AttributeError):
                        owner = response.json().get("instance_id")
                # Older servers (the original 0.3.0) report no instance id: then the port we
                # picked free a moment ago is taken to be our child's, as long as it lives.
                if owner is not None and owner != self.instance_id:
                    raise _PortTakenError
                if response.status_code == 200:
                    return
                time.sleep(_POLL_SEC)
        self.stop()
        raise RolloutServerError(
            f"the rollout server ({self.entrypoint.name}) did not become healthy within "
            f"{self.health_timeout_sec:.0f}s on port {self.port}; "
            f"its last output:\n{self.output_tail()}"
        )

    def _died(self) -> None:
        assert self.process is not None
        if self._reader is not None:
            self._reader.join(timeout=2)
        code = self.process.returncode
        if not self._port_given and "address already in use" in self.output_tail().lower():
            raise _PortTakenError(f"; its last output:\n{self.output_tail()}")
        raise RolloutServerError(
            f"the rollout server (rollouts/{self.rollout_dir.name}/{self.entrypoint.name}) exited "
            f"with code {code} before it was healthy; its last output:\n{self.output_tail()}"
        )

    def output_tail(self, lines: int = 25) -> str:
        return self._tail.text(lines)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def stop(self, grace_sec: float = 5.0) -> None:
        """SIGTERM the process group, then SIGKILL it after ``grace_sec`` (what is left of the
        group goes even when the server itself has exited)."""
        process = self.process
        if process is None:
            return
        stop_process(process, grace_sec)
        if self._reader is not None:
            self._reader.join(timeout=2)


def stop_if_ours(pid: int, port: int, instance_id: str, *, grace_sec: float = 5.0) -> bool:
    """Stop the rollout server process group ``pid`` (SIGTERM, then SIGKILL after
    ``grace_sec``) if it runs and the server on ``port`` still answers ``/health`` as
    ``instance_id``, so a reused pid or port is never touched; returns whether it did. For
    servers whose starter is gone (a controller killed with -9)."""
    if not pid_alive(pid) or not _answers_as(port, instance_id):
        return False
    stop_group(pid, grace_sec)
    return True


def _answers_as(port: int, instance_id: str) -> bool:
    import httpx

    try:
        response = httpx.get(f"http://127.0.0.1:{port}/health", timeout=2.0)
    except httpx.HTTPError:
        return False
    owner = response.headers.get(INSTANCE_HEADER)
    if owner is None:  # a server that does not send the header names itself in the body
        with contextlib.suppress(ValueError, AttributeError):
            owner = response.json().get("instance_id")
    return owner == instance_id


class _PortTakenError(OsmosisError):
    """Something else answers on, or holds, the port we picked."""

    def __init__(self, detail: str = "") -> None:
        super().__init__(detail)
        self.detail = detail


_PORT_TRIES = 3


def _port_busy(port: int, host: str = LOOPBACK) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, port))
        except OSError:
            return True
    return False
