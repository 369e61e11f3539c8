"""A fleet of rollout servers as Ray actors, spread over the cluster's nodes.

Each actor starts the user's entrypoint exactly as a single-machine run does
(:class:`~osmosis_ai.controller.rollout_process.RolloutServerProcess`), bound to its node's
own address, and reports its URL, its ``/health`` body, and its output. The driver places
server ``i`` on live node ``i mod n`` (a soft affinity: a full node passes it on), polls each
actor, and hears about a server that died (its process exited, or the actor or its node went
away) within one poll.

Secrets in :attr:`FleetSpec.env` travel to the nodes inside Ray's task arguments: run the
cluster on a private network (Ray's traffic is not encrypted).
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.controller.rollout_process import RolloutServerError, RolloutServerProcess
from osmosis_ai.distributed.cluster import ClusterError, require_ray
from osmosis_ai.errors import OsmosisError

__all__ = [
    "SERVER_CPUS",
    "FleetDirectory",
    "FleetSpec",
    "FleetStartCancelledError",
    "RolloutFleet",
    "ServerInfo",
    "ServerState",
]

SERVER_CPUS = 0.25
"""The logical CPUs a server's actor reserves by default. Its process mostly waits on the
model and the network; a whole CPU each would leave a small cluster (two servers on a
two-CPU machine) no room for the trainer workers, which then wait for CPUs forever."""
_POLL_SEC = 0.2
_OUTPUT_KEEP = 2000  # lines an actor holds between two polls
_PLACE_WAIT_SEC = 60.0  # for a node's resources, on top of the server's own start-up


@dataclass(frozen=True)
class FleetSpec:
    """What every server of the fleet runs: the same entrypoint, environment and artifact root
    (a path every node can write: on one machine, or a shared file system)."""

    rollout_dir: Path
    entrypoint: Path
    artifact_root: Path
    env: Mapping[str, str] = field(default_factory=dict[str, str])
    health_timeout_sec: float = 90.0


@dataclass(frozen=True)
class ServerInfo:
    """One started server of the fleet."""

    index: int
    url: str
    node_ip: str
    node_id: str
    pid: int
    instance_id: str
    health: Mapping[str, Any]


@dataclass(frozen=True)
class ServerState:
    """One poll of a server: alive or not, why it is not, and the output since the last poll;
    ``actor_gone``: its actor did not answer (killed, or its node left), rather than its
    server process having exited under a live actor."""

    alive: bool
    exit_detail: str = ""
    lines: tuple[str, ...] = ()
    actor_gone: bool = False


class FleetStartCancelledError(OsmosisError):
    """:meth:`RolloutFleet.start` was asked to stop before every server was up (the servers
    that did start are stopped again)."""


class _ServerHost:
    """The actor body (made a Ray actor by :class:`RolloutFleet`): one rollout server child."""

    def __init__(self, spec: FleetSpec, index: int) -> None:
        self.spec = spec
        self.index = index
        self.process: RolloutServerProcess | None = None
        self._lines: list[str] = []
        self._lock = threading.Lock()

    def _collect(self, line: str) -> None:
        with self._lock:
            self._lines.append(line)
            del self._lines[:-_OUTPUT_KEEP]

    def start(self) -> ServerInfo:
        import httpx
        import ray

        spec = self.spec
        ip = str(ray.util.get_node_ip_address())
        process = RolloutServerProcess(
            rollout_dir=spec.rollout_dir,
            entrypoint=spec.entrypoint,
            artifact_root=spec.artifact_root,
            env=dict(spec.env),
            on_output=self._collect,
            health_timeout_sec=spec.health_timeout_sec,
            host=ip,
            die_with_parent=True,  # an actor killed with -9, or its node gone, takes it along
        )
        self.process = process
        if process.command() and process.isolated:
            process.sync()
        process.start()
        health = httpx.get(f"{process.url}/health", timeout=10.0).json()
        assert process.process is not None
        return ServerInfo(
            index=self.index,
            url=process.url,
            node_ip=ip,
            node_id=str(ray.get_runtime_context().get_node_id()),
            pid=process.process.pid,
            instance_id=process.instance_id,
            health=health if isinstance(health, dict) else {},
        )

    def poll(self) -> ServerState:
        with self._lock:
            lines, self._lines = tuple(self._lines), []
        process = self.process
        if process is not None and process.alive():
            return ServerState(True, lines=lines)
        code = None if process is None or process.process is None else process.process.returncode
        tail = process.output_tail() if process is not None else "(not started)"
        return ServerState(False, f"exited with code {code}; its last output:\n{tail}", lines)

    def stop(self, grace_sec: float) -> None:
        if self.process is not None:
            self.process.stop(grace_sec)


class RolloutFleet:
    """``servers`` rollout servers as Ray actors; this process must be a Ray driver
    (:func:`~osmosis_ai.distributed.cluster.connect`).

    Args:
        spec: what each server runs.
        servers: how many servers (at least 1).
        cpus_per_server: the logical CPUs each actor reserves on its node.
    """

    def __init__(
        self, spec: FleetSpec, servers: int, *, cpus_per_server: float = SERVER_CPUS
    ) -> None:
        if servers < 1:
            raise ClusterError(f"a fleet needs at least one rollout server, got {servers}")
        self.spec = spec
        self.servers = servers
        self.cpus_per_server = cpus_per_server
        self.infos: list[ServerInfo] = []
        self.dead: dict[int, str] = {}
        self.actors_gone: set[int] = set()  # dead with their actor (or node), not alone
        self.nodes_seen: set[str] = set()  # the nodes there were at start, and those since added
        self._actors: list[Any] = []

    # -- start and stop ----------------------------------------------------------------------

    def nodes(self) -> list[dict[str, Any]]:
        """The live nodes big enough for a server."""
        ray = require_ray("a rollout server fleet")
        return [
            n
            for n in ray.nodes()
            if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) >= self.cpus_per_server
        ]

    def new_nodes(self) -> list[str]:
        """Live nodes (ids) that joined the cluster after :meth:`start` and hold no server
        of this fleet yet: each is worth one (:meth:`add`)."""
        return [str(n["NodeID"]) for n in self.nodes() if str(n["NodeID"]) not in self.nodes_seen]

    def grow(self) -> tuple[list[ServerInfo], list[str]]:
        """Start a server on each node that joined since :meth:`start` (blocking); the
        servers started, and why each one that did not start failed."""
        started: list[ServerInfo] = []
        failures: list[str] = []
        for node in self.new_nodes():
            try:
                started.append(self.add(node))
            except Exception as exc:
                failures.append(f"a rollout server did not start on node {node[:12]}: {exc}")
        return started, failures

    def place(self) -> list[str]:
        """The node id for each server: live nodes with room, round robin by address."""
        nodes = self.nodes()
        self.nodes_seen.update(str(n["NodeID"]) for n in nodes)
        if not nodes:
            raise ClusterError(
                f"no live node of the Ray cluster has {self.cpus_per_server:g} CPU free for a "
                "rollout server: add nodes, or lower the CPUs per server"
            )
        nodes.sort(key=lambda n: str(n.get("NodeManagerAddress")))
        return [str(nodes[i % len(nodes)]["NodeID"]) for i in range(self.servers)]

    def start(self, should_stop: Callable[[], bool] | None = None) -> list[ServerInfo]:
        """Start every server (in parallel) and wait until each is healthy: at most the
        server's health timeout plus the wait for a node's resources, and only while
        ``should_stop`` says no (:class:`FleetStartCancelledError` when it says yes)."""
        ray = require_ray("a rollout server fleet")
        for node in self.place():
            self._actors.append(self._actor(node, len(self._actors), soft=True))
        wait = self.spec.health_timeout_sec + _PLACE_WAIT_SEC
        deadline = time.monotonic() + wait
        pending = [actor.start.remote() for actor in self._actors]
        try:
            while True:
                ready, _ = ray.wait(pending, num_returns=len(pending), timeout=_POLL_SEC)
                ray.get(ready)  # (a server that failed to start fails the fleet now)
                if len(ready) == len(pending):
                    break
                if should_stop is not None and should_stop():
                    raise FleetStartCancelledError(
                        "asked to stop while the rollout servers started"
                    )
                if time.monotonic() > deadline:
                    raise ClusterError(
                        f"{self.servers - len(ready)} of {self.servers} rollout server(s) were "
                        f"not up within {wait:.0f}s: the cluster has no "
                        f"{self.cpus_per_server:g} CPU free for each on its nodes (other work "
                        "holds it), or the server is slow to start (see its output in the log)"
                    )
            self.infos = list(ray.get(pending))
        except (FleetStartCancelledError, ClusterError):
            self.stop()
            raise
        except Exception as exc:
            self.stop()
            raise _start_error(exc) from exc
        return self.infos

    def add(self, node_id: str) -> ServerInfo:
        """Start one more server on node ``node_id`` (a node that joined, or a replacement
        for a server that died) and wait until it is healthy; its index is the next one."""
        ray = require_ray("a rollout server fleet")
        self.nodes_seen.add(node_id)
        actor = self._actor(node_id, len(self._actors), soft=False)
        self._actors.append(actor)
        wait = self.spec.health_timeout_sec + _PLACE_WAIT_SEC
        try:
            info: ServerInfo = ray.get(actor.start.remote(), timeout=wait)
        except Exception as exc:
            self._actors.pop()
            with contextlib.suppress(Exception):
                ray.kill(actor)
            if isinstance(exc, ray.exceptions.GetTimeoutError):
                raise ClusterError(
                    f"a rollout server on node {node_id[:12]} was not up within {wait:.0f}s "
                    f"(the node has no {self.cpus_per_server:g} CPU free, or the server is slow "
                    "to start)"
                ) from exc
            raise _start_error(exc) from exc
        self.infos.append(info)
        return info

    def live(self) -> list[ServerInfo]:
        """The started servers not known to have died."""
        return [info for info in self.infos if info.index not in self.dead]

    def _actor(self, node_id: str, index: int, *, soft: bool) -> Any:
        ray = require_ray("a rollout server fleet")
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        strategy = NodeAffinitySchedulingStrategy(node_id, soft=soft)
        return (
            ray.remote(_ServerHost)
            .options(num_cpus=self.cpus_per_server, scheduling_strategy=strategy, max_restarts=0)
            .remote(self.spec, index)
        )

    def stop(self, grace_sec: float = 5.0) -> None:
        """Stop every server, then end the actors."""
        ray = require_ray("a rollout server fleet")
        stops = [actor.stop.remote(grace_sec) for actor in self._actors]
        with contextlib.suppress(Exception):
            ray.get(stops, timeout=grace_sec + 10.0)
        for actor in self._actors:
            with contextlib.suppress(Exception):
                ray.kill(actor)
        self._actors = []

    # -- watching ----------------------------------------------------------------------------

    def alive(self) -> bool:
        """Whether any server still runs (as of the last poll)."""
        return len(self.dead) < len(self._actors)

    async def poll(self, index: int) -> ServerState:
        """One server's state; an actor (or node) that is gone counts as a dead server."""
        try:
            state: ServerState = await self._actors[index].poll.remote()
        except Exception as exc:  # RayActorError, ActorDiedError, a lost node
            detail = f"its Ray actor is gone ({type(exc).__name__}: {exc})"
            return ServerState(False, detail, actor_gone=True)
        return state

    def _release(self, index: int) -> None:
        """End a dead server's actor, giving its CPUs back to the node (for a replacement)."""
        ray = require_ray("a rollout server fleet")
        with contextlib.suppress(Exception):
            ray.kill(self._actors[index])

    async def watch(
        self,
        on_dead: Callable[[ServerInfo, str], None],
        on_output: Callable[[ServerInfo, str], None] | None = None,
        interval_sec: float = _POLL_SEC,
    ) -> None:
        """Poll every live server until cancelled; ``on_dead`` hears of each that died once."""
        while True:
            live = [i for i in range(len(self.infos)) if i not in self.dead]
            states = await asyncio.gather(*(self.poll(i) for i in live))
            for index, state in zip(live, states, strict=True):
                info = self.infos[index]
                if on_output is not None:
                    for line in state.lines:
                        on_output(info, line)
                if not state.alive:
                    self.dead[index] = state.exit_detail
                    if state.actor_gone:
                        self.actors_gone.add(index)
                    self._release(index)
                    on_dead(info, state.exit_detail)
            await asyncio.sleep(interval_sec)


def _start_error(exc: Exception) -> Exception:
    cause = getattr(exc, "cause", None) or exc
    if isinstance(cause, RolloutServerError):
        return cause
    return ClusterError(f"the rollout server fleet did not start: {cause}")


class FleetDirectory:
    """The actor body that tells trainer workers which servers to use: the driver publishes
    the live servers' URLs after every change, each worker reads them as each step ends. It
    also carries the driver's stop request (a Ctrl-C) to the workers."""

    def __init__(self) -> None:
        self.urls: list[str] = []
        self.stopping = False

    def request_stop(self) -> None:
        self.stopping = True

    def publish(self, urls: list[str]) -> None:
        self.urls = list(urls)

    def poll(self) -> tuple[list[str], bool]:
        """The servers' URLs, and whether the run is to stop."""
        return list(self.urls), self.stopping
