"""The rollout servers of ``osmosis train run --ray``: a fleet of ``R`` servers (Ray actors,
each the user's entrypoint started exactly as on one machine) that every trainer worker
balances its rollouts over.

The driver owns the fleet: it starts the servers spread over the nodes, publishes the live
servers' URLs in a directory actor that each trainer worker reads as each step ends, and keeps
the fleet whole in a thread of its own while the workers train:

* a server that dies (its process, its actor or its node) is taken out of the directory; the
  workers have already run its in-flight rollouts again elsewhere under fresh ids (their
  dispatchers notice the dead server on their own). A server whose process died under its
  live actor is replaced on a live node; one that went with its node is dropped with it;
* a node that joins the cluster gets a server of its own, used from the next step on;
* a stop request on the driver (Ctrl-C, SIGTERM, a platform's stop) reaches the workers
  once their steps have begun (:attr:`TrainingFleet.steps_begun`; before that the driver
  ends the run itself), and they agree on the step to stop after, save, and end as on one
  machine.

Replacements are capped (``2 × R`` in a run), so a server that fails at every start ends as
a clear error in the log rather than a loop.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

from osmosis_ai.distributed.fleet import FleetDirectory, FleetSpec, RolloutFleet, ServerInfo
from osmosis_ai.train.session import Session

_KEEP_EVERY_SEC = 1.0


class TrainingFleet:
    """``servers`` rollout servers for ``run``, from :meth:`start` to :meth:`close`."""

    def __init__(self, run: Session, servers: int) -> None:
        config = run.plan.config
        assert config.rollout_dir is not None and config.entrypoint_path is not None
        self.run = run
        self.wanted = servers
        self.spec = FleetSpec(
            rollout_dir=Path(config.rollout_dir).resolve(),
            entrypoint=Path(config.entrypoint_path).resolve(),
            artifact_root=run.rundir.rollouts.resolve(),
            env=run.server_env(),
        )
        self.fleet = RolloutFleet(self.spec, servers)
        self.directory: Any = None
        self.replacements_left = 2 * servers
        self._loop: asyncio.AbstractEventLoop | None = None
        self._main: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()  # one change of the fleet at a time
        self._stop_sent = False
        self._said_no_more = False
        self._replaced: set[int] = set()  # dead servers already replaced (or given up on)
        self.steps_begun = threading.Event()  # set by the driver when a first step ended

    # -- start and stop ----------------------------------------------------------------------

    def start(self, should_stop: Callable[[], bool] | None = None) -> list[str]:
        """Start every server and the directory; returns the servers' URLs
        (:class:`~osmosis_ai.distributed.fleet.FleetStartCancelledError` once ``should_stop``)."""
        import ray

        self.run.stage(f"starting {self.wanted} rollout server(s) across the cluster")
        for info in self.fleet.start(should_stop):
            self._announce(info, "started")
        self.directory = ray.remote(FleetDirectory).options(num_cpus=0).remote()
        self._publish()
        self._thread = threading.Thread(target=self._keep, name="osmosis-fleet", daemon=True)
        self._thread.start()
        return self.urls()

    def close(self) -> None:
        import ray

        loop, main, thread = self._loop, self._main, self._thread
        if loop is not None and main is not None and thread is not None:
            with contextlib.suppress(RuntimeError):  # (its loop already closed)
                loop.call_soon_threadsafe(main.cancel)
            thread.join(timeout=30)
        self.fleet.stop()
        if self.directory is not None:
            with contextlib.suppress(Exception):
                ray.kill(self.directory)

    def urls(self) -> list[str]:
        return [info.url for info in self.fleet.live()]

    # -- keeping it whole --------------------------------------------------------------------

    def _keep(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        self._main = loop.create_task(self._keeping())
        try:
            loop.run_until_complete(self._main)
        except asyncio.CancelledError:
            pass
        finally:
            loop.close()

    async def _keeping(self) -> None:
        watch = asyncio.ensure_future(self.fleet.watch(self._died, self._output))
        try:
            while True:
                await asyncio.sleep(_KEEP_EVERY_SEC)
                stopping = self.run.stop.requested and self.steps_begun.is_set()
                if stopping and not self._stop_sent:
                    self._stop_sent = True
                    await asyncio.to_thread(self._pass_stop)
                await asyncio.to_thread(self.maintain)
        finally:
            watch.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await watch

    def maintain(self) -> None:
        """Replace servers that died and give each node that joined a server; publish."""
        with self._lock:
            nodes = self.fleet.nodes()
            if not nodes:
                return
            per_node = Counter(info.node_id for info in self.fleet.live())
            # a server whose process died under its live actor is replaced; one that went
            # with its actor or node is dropped (a node that left takes its share along,
            # and its CPUs are not there to start another: the trainers need what is left)
            crashed = [
                index
                for index in self.fleet.dead
                if index not in self.fleet.actors_gone and index not in self._replaced
            ]
            by_load = sorted(nodes, key=lambda n: per_node[str(n["NodeID"])])
            joined, failures = self.fleet.grow()
            for why in failures:
                self.run.warn("ROLLOUT_SERVER_NOT_STARTED", why)
            for info in joined:
                self._announce(info, "joined with its node")
            for turn, index in enumerate(crashed):
                self._replaced.add(index)
                if self.replacements_left <= 0:
                    if not self._said_no_more:
                        self._said_no_more = True
                        self.run.warn(
                            "ROLLOUT_SERVERS_NOT_REPLACED",
                            f"{2 * self.wanted} rollout servers were already started in place "
                            "of ones that died: no more replacements in this run; see the "
                            "servers' output in the log",
                        )
                    continue
                self.replacements_left -= 1
                node = str(by_load[turn % len(by_load)]["NodeID"])
                try:
                    info = self.fleet.add(node)
                except Exception as exc:
                    why = f"a rollout server did not start on node {node[:12]}: {exc}"
                    self.run.warn("ROLLOUT_SERVER_NOT_STARTED", why)
                    continue
                self._announce(info, f"replaced server {index}")
            self._publish()

    def _pass_stop(self) -> None:
        """The driver was asked to stop: the workers finish their step, save, and end."""
        import ray

        ray.get(self.directory.request_stop.remote())
        self.run.stage("stop requested: the trainer workers finish the step, then save")

    def _publish(self) -> None:
        import ray

        ray.get(self.directory.publish.remote(self.urls()))

    def _announce(self, info: ServerInfo, how: str) -> None:
        self.run.stage(
            f"rollout server {info.index} {how}: {info.url} on node {info.node_ip} "
            f"(pid {info.pid})",
            server=info.index,
            url=info.url,
            node=info.node_ip,
            pid=info.pid,
        )

    def _died(self, info: ServerInfo, why: str) -> None:
        first, _, tail = why.strip().partition("\n")
        first = first.removesuffix("; its last output:") or "gone"
        if tail:
            self.run.rundir.journal.output(f"rollout-server-{info.index}", tail)
        self.run.warn(
            "ROLLOUT_SERVER_DIED",
            f"rollout server {info.index} ({info.url}, node {info.node_ip}) died: {first}; "
            "its rollouts in flight run again on the other servers under fresh ids",
        )
        with contextlib.suppress(Exception):
            self._publish()

    def _output(self, info: ServerInfo, line: str) -> None:
        self.run.rundir.journal.output(f"rollout-server-{info.index}", line)
