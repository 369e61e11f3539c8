"""Connecting to a Ray cluster, and a local multi-node cluster on loopback.

:func:`connect` joins this process to a cluster as its driver: ``"auto"`` (the cluster this
machine belongs to, as ``ray start`` left it), an address (``host:port`` of the head's GCS,
or ``ray://host:port`` through Ray Client), or :data:`LOCAL`, a one-node cluster started
here for this process and stopped with it. :meth:`RayConnection.close` disconnects; it
stops only a cluster this process started itself.

:class:`LocalCluster` starts a cluster of several nodes on this machine, each a
``ray start --block`` process of its own (head first, then the workers), on loopback
addresses 127.0.0.2, 127.0.0.3, …: Ray replaces 127.0.0.1 with the machine's interface
address, which would send cluster traffic off loopback. Each node runs in a process group
of its own, and :meth:`LocalCluster.stop` ends exactly those groups (never ``ray stop``,
which stops every Ray process on the machine). Tests and ``--ray local`` demos use it.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import Any

from osmosis_ai.errors import MissingExtraError, OsmosisError, UsageError
from osmosis_ai.procs import free_port, stop_process
from osmosis_ai.rundir.durable import Closing

__all__ = [
    "LOCAL",
    "LOOPBACK_NODES",
    "ClusterError",
    "LocalCluster",
    "RayConnection",
    "connect",
    "require_ray",
]

LOCAL = "local"
"""The address that starts a one-node cluster for this process."""
LOOPBACK_NODES = ("127.0.0.2", "127.0.0.3")
"""The node addresses of a local two-node cluster."""
LOOPBACK_ENV = {"GLOO_SOCKET_IFNAME": "lo", "RAY_USAGE_STATS_ENABLED": "0"}
"""Set for the nodes of a local cluster: gloo on loopback, no usage report."""
_OBJECT_STORE_BYTES = 100 * 1024 * 1024  # Ray's floor is 75 MiB; the default is 30% of RAM
_STOP_GRACE_SEC = 15.0  # a node drains its workers before it exits
_HEAD_GRACE_SEC = 3.0
_STARTED = b"Ray runtime started."  # what `ray start` prints once its node is up


class ClusterError(OsmosisError):
    """Ray could not be started or reached, or a node did not come up."""


def require_ray(feature: str) -> Any:
    """The ``ray`` module, or a :class:`MissingExtraError` naming the ``distributed`` extra."""
    try:
        import ray
    except ModuleNotFoundError as exc:
        raise MissingExtraError("distributed", feature, exc.name) from exc
    return ray


@dataclass
class RayConnection(Closing):
    """This process's membership of a Ray cluster, from :func:`connect`."""

    address: str
    node_ip: str
    started_here: bool
    namespace: str | None = None
    joined: bool = True
    """Whether :func:`connect` joined the cluster (``False``: this process already was a
    driver, and :meth:`close` leaves that connection to whoever made it)."""

    def nodes(self) -> list[dict[str, Any]]:
        """The cluster's live nodes (Ray's node records)."""
        ray = require_ray("a Ray cluster")
        return [node for node in ray.nodes() if node.get("Alive")]

    def wait_for_nodes(self, count: int, timeout_sec: float = 60.0) -> list[dict[str, Any]]:
        """Wait until at least ``count`` nodes are alive; returns them."""
        deadline = time.monotonic() + timeout_sec
        while True:
            nodes = self.nodes()
            if len(nodes) >= count:
                return nodes
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"the Ray cluster at {self.address} has {len(nodes)} live nodes, not the "
                    f"{count} awaited within {timeout_sec:g}s: check that every node ran "
                    "`ray start --address` with this head's address"
                )
            time.sleep(0.1)

    def close(self) -> None:
        """Disconnect (a cluster started by :func:`connect` itself stops with it)."""
        ray = require_ray("a Ray cluster")
        if self.joined and ray.is_initialized():
            ray.shutdown()


def connect(
    address: str | None = LOCAL,
    *,
    namespace: str | None = None,
    num_cpus: int | None = None,
    node_ip: str | None = None,
    auth_token: str | None = None,
) -> RayConnection:
    """Join this process to a Ray cluster as its driver.

    Args:
        address: ``"auto"``, ``host:port``, ``ray://host:port``, or ``"local"`` (``None``
            too) for a one-node cluster of this process on a loopback address.
        namespace: the Ray namespace of this driver's named actors.
        num_cpus: the logical CPUs of a local cluster (default: this machine's).
        node_ip: this driver's node address; by default the address's own host when it
            is a loopback one (so traffic to a local cluster stays on loopback).
        auth_token: the cluster's token (Ray's token authentication); without it Ray reads
            ``RAY_AUTH_TOKEN`` or ``~/.ray/auth_token`` as usual.
    """
    if auth_token is not None:  # before Ray loads its config, which reads them once
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = auth_token
    ray = require_ray("a Ray cluster")
    target = (address or LOCAL).strip()
    if target != LOCAL:
        _check_address(target)
    if ray.is_initialized():  # a driver already (a test, or a trainer): share its connection
        context = ray.get_runtime_context()
        gcs = str(context.gcs_address)
        if target not in (LOCAL, "auto", gcs) and not gcs.endswith(target.removeprefix("ray://")):
            raise UsageError(
                f"this process is already connected to the Ray cluster at {gcs}, not {target}: "
                "disconnect first (ray.shutdown()) or pass that address"
            )
        here = str(ray.util.get_node_ip_address())
        return RayConnection(gcs, here, False, context.namespace, joined=False)
    options: dict[str, Any] = {
        "namespace": namespace,
        "logging_level": "warning",
        "log_to_driver": False,
        "configure_logging": False,
    }
    started_here = target == LOCAL
    if started_here:
        ip = node_ip or local_node_ip()
        options |= {
            "num_cpus": num_cpus,
            "include_dashboard": False,
            "object_store_memory": _OBJECT_STORE_BYTES,
            "_node_ip_address": ip,
        }
        os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        ray_address: str | None = None
    else:
        ip = node_ip or _loopback_host(target) or ""
        if ip:
            options["_node_ip_address"] = ip
        ray_address = target
    if auth_token is not None:
        _use_token()
    try:
        context = ray.init(address=ray_address, **options)
    except (ConnectionError, RuntimeError, ValueError) as exc:
        where = "a local Ray cluster" if started_here else f"the Ray cluster at {target}"
        raise ClusterError(
            f"cannot connect to {where}: {exc}. Start one with `ray start --head` (then pass "
            "--ray auto or --ray HEAD:6379), or pass --ray local to start one here"
        ) from exc
    gcs = str(getattr(context, "address_info", {}).get("gcs_address") or target)
    here = ip or str(ray.util.get_node_ip_address())
    return RayConnection(gcs, here, started_here, namespace)


def _use_token() -> None:
    """Make a Ray loaded earlier in this process read the token settings again."""
    with contextlib.suppress(ImportError, AttributeError):
        from importlib import import_module

        raylet = import_module("ray._raylet")
        raylet.Config.initialize("")
        raylet.AuthenticationTokenLoader.instance().reset_cache()


def local_node_ip() -> str:
    """The node address of a cluster started here: 127.0.0.2 where the whole 127/8 answers
    (Linux), else 127.0.0.1 (which Ray may swap for the interface address)."""
    return LOOPBACK_NODES[0] if _bindable(LOOPBACK_NODES[0]) else "127.0.0.1"


def _check_address(address: str) -> None:
    if address == "auto" or address.startswith("ray://"):
        return
    host, sep, port = address.rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"Ray address {address!r} is not HOST:PORT: pass the head's GCS address (as "
            "`ray start --head` printed it, e.g. 10.0.0.1:6379), ray://HOST:10001, auto or local"
        )


def _loopback_host(address: str) -> str | None:
    host = address.removeprefix("ray://").rpartition(":")[0]
    return host if host.startswith("127.") else None


def _bindable(host: str) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind((host, 0))
        except OSError:
            return False
    return True


def _ray_command() -> list[str]:
    """``ray`` of this interpreter's environment (the nodes run this Python)."""
    beside = Path(sys.executable).with_name("ray")
    found = str(beside) if beside.is_file() else shutil.which("ray")
    if found is None:
        raise MissingExtraError("distributed", "a local Ray cluster", "ray")
    return [found]


@dataclass
class LocalCluster:
    """A Ray cluster of ``len(nodes)`` nodes on this machine, each its own ``ray start``.

    Use as a context manager, or :meth:`start` then :meth:`stop`. :attr:`address` is the
    head's GCS address for :func:`connect`.
    """

    nodes: Sequence[str] = LOOPBACK_NODES
    cpus_per_node: int = 2
    object_store_bytes: int = _OBJECT_STORE_BYTES
    env: Mapping[str, str] = field(default_factory=dict)
    start_timeout_sec: float = 60.0
    temp_dir: Path | None = None
    auth_token: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    """The cluster's own token: every node and driver must present it (the GCS listens on
    every interface; the token keeps the rest of the network out)."""
    _procs: list[subprocess.Popen[bytes]] = field(default_factory=list, init=False)
    _logs: list[Path] = field(default_factory=list, init=False)
    _port: int | None = field(default=None, init=False)
    _owned_temp: bool = field(default=False, init=False)

    def __post_init__(self) -> None:
        if not self.nodes:
            raise UsageError("a local Ray cluster needs at least one node address")
        for host in self.nodes:
            if not _bindable(host):
                raise ClusterError(
                    f"cannot bind {host} on this machine: a local multi-node cluster needs "
                    "the whole 127.0.0.0/8 on loopback (Linux has it; elsewhere add aliases, "
                    "e.g. `ifconfig lo0 alias 127.0.0.2`)"
                )

    @property
    def head_ip(self) -> str:
        return self.nodes[0]

    @property
    def address(self) -> str:
        if self._port is None:
            raise UsageError("the local Ray cluster is not started: call start() first")
        return f"{self.head_ip}:{self._port}"

    @property
    def pids(self) -> list[int]:
        """The ``ray start`` process of each node (each leads the process group of its node)."""
        return [proc.pid for proc in self._procs]

    def start(self) -> LocalCluster:
        """Start the head and then the worker nodes; returns once the head accepts
        connections (the workers join on their own: :meth:`RayConnection.wait_for_nodes`)."""
        if self._procs:
            raise UsageError("this local Ray cluster is already started")
        if self.temp_dir is None:
            # Short: Ray's unix socket paths live under it and are limited to 107 bytes.
            self.temp_dir = Path(tempfile.mkdtemp(prefix="osmray-", dir="/tmp"))
            self._owned_temp = True
        self._port = free_port(self.head_ip)
        try:
            self._spawn(self.head_ip, head=True)
            self._await_head()
            for host in self.nodes[1:]:  # they boot while the head finishes its own start
                self._spawn(host, head=False)
            self._await_started(0)
        except BaseException:
            self.stop()
            raise
        return self

    def _spawn(self, host: str, *, head: bool) -> None:
        assert self.temp_dir is not None
        command = [
            *_ray_command(),
            "start",
            "--block",
            f"--node-ip-address={host}",
            f"--num-cpus={self.cpus_per_node}",
            f"--object-store-memory={self.object_store_bytes}",
            "--disable-usage-stats",
            # Ephemeral ports everywhere: two clusters on one machine must not collide.
            "--min-worker-port=0",
            "--max-worker-port=0",
            "--dashboard-agent-listen-port=0",
            "--dashboard-agent-grpc-port=0",
            "--metrics-export-port=0",
            "--runtime-env-agent-port=0",
        ]
        if head:
            command += [
                "--head",
                f"--port={self._port}",
                "--include-dashboard=false",
                f"--temp-dir={self.temp_dir}",
            ]
        else:
            command.append(f"--address={self.address}")
        log = self.temp_dir / f"node-{host}.log"
        self._logs.append(log)
        env = {**os.environ, **LOOPBACK_ENV, **self.env}
        env |= {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN": self.auth_token}
        with log.open("wb") as out:
            proc = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                env=env,
                start_new_session=True,
            )
        self._procs.append(proc)

    def _await_head(self) -> None:
        deadline = time.monotonic() + self.start_timeout_sec
        head = self._procs[0]
        while time.monotonic() < deadline:
            if head.poll() is not None:
                raise ClusterError(
                    f"the Ray head on {self.head_ip} exited with code {head.returncode}; "
                    f"its output:\n{self.output_tail(0)}"
                )
            with (
                contextlib.suppress(OSError),
                socket.create_connection((self.head_ip, self._port or 0), timeout=1.0),
            ):
                return
            time.sleep(0.1)
        raise ClusterError(
            f"the Ray head on {self.head_ip} did not listen within {self.start_timeout_sec:g}s; "
            f"its output:\n{self.output_tail(0)}"
        )

    def _await_started(self, index: int) -> None:
        """Wait until node ``index``'s ``ray start`` reports the runtime started (a driver
        that connects earlier may find no raylet yet on the node's address)."""
        deadline = time.monotonic() + self.start_timeout_sec
        proc, log = self._procs[index], self._logs[index]
        while time.monotonic() < deadline:
            with contextlib.suppress(OSError):
                if _STARTED in log.read_bytes():
                    return
            if proc.poll() is not None:
                break
            time.sleep(0.1)
        raise ClusterError(
            f"the Ray node on {self.nodes[index]} did not start within "
            f"{self.start_timeout_sec:g}s (exit code {proc.poll()}); its output:\n"
            f"{self.output_tail(index)}"
        )

    def add_node(self, host: str) -> int:
        """Start one more worker node on ``host`` (a loopback address not yet used) and wait
        until its runtime started; returns its index (for :meth:`stop_node`)."""
        if not self._procs:
            raise UsageError("start the local Ray cluster before adding nodes to it")
        if host in self.nodes:
            raise UsageError(f"{host} already runs a node of this cluster: choose another address")
        if not _bindable(host):
            raise ClusterError(f"cannot bind {host} on this machine for a Ray node")
        self.nodes = (*self.nodes, host)
        self._spawn(host, head=False)
        index = len(self._procs) - 1
        self._await_started(index)
        return index

    def output_tail(self, index: int, lines: int = 20) -> str:
        """The last lines node ``index`` printed."""
        try:
            text = self._logs[index].read_text(encoding="utf-8", errors="replace")
        except (IndexError, OSError):
            return "(no output)"
        return "\n".join(text.splitlines()[-lines:]) or "(no output)"

    def stop_node(self, index: int, *, grace_sec: float = _STOP_GRACE_SEC) -> None:
        """Stop node ``index`` (its whole process group): SIGTERM, SIGKILL after the grace."""
        stop_process(self._procs[index], grace_sec)

    def stop(self) -> None:
        """Stop the workers, then the head (only this cluster's processes), and drop its
        temp dir if this cluster made it."""
        # One at a time, workers first: a worker node drains through the head, and waits out
        # its whole drain timeout when the head is already gone. The head itself waits out
        # that timeout (30 s) once its GCS is down, so it gets a short grace: the cluster
        # ends with it, and nothing of its state is kept.
        for index in reversed(range(len(self._procs))):
            stop_process(self._procs[index], _STOP_GRACE_SEC if index else _HEAD_GRACE_SEC)
        self._procs.clear()
        if self._owned_temp and self.temp_dir is not None:
            shutil.rmtree(self.temp_dir, ignore_errors=True)
            self.temp_dir = None
            self._owned_temp = False

    def __enter__(self) -> LocalCluster:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
