"""The rollout servers of an ``osmosis eval run --ray``: a fleet on a Ray cluster.

:class:`FleetRun` joins the cluster (``auto``, an address, or ``local``), starts the fleet in
a background thread while the controller starts its own side, and watches it: a server that
dies is reported and taken out of the :class:`~osmosis_ai.controller.balance.BalancedDispatcher`,
whose in-flight items then run again elsewhere under fresh ids; a node that joins the cluster
mid-run gets a server of its own (:meth:`FleetRun.grow`), which the dispatcher follows
(:meth:`FleetRun.urls`) and which takes work from then on. The controller (proxy, listener,
journal) stays on the machine that runs the command.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import threading
from collections.abc import Callable, Mapping
from pathlib import Path

from osmosis_ai.distributed.cluster import RayConnection, connect
from osmosis_ai.distributed.fleet import FleetSpec, RolloutFleet, ServerInfo
from osmosis_ai.eval.plan import EvalPlan, model_credential_vars
from osmosis_ai.eval.rundir import TRIALS_DIR

DEFAULT_SERVERS = 2


class FleetRun:
    """``servers`` rollout servers for one run dir on the Ray cluster at ``address``."""

    def __init__(  # noqa: PLR0917 (one call site)
        self,
        plan: EvalPlan,
        run_dir: Path,
        secrets: Mapping[str, str],
        environ: Mapping[str, str],
        address: str,
        servers: int | None,
    ) -> None:
        hidden = dict.fromkeys(model_credential_vars(plan, environ), "")
        self.spec = FleetSpec(
            rollout_dir=(plan.config.rollout_dir or Path()).resolve(),
            entrypoint=(plan.config.entrypoint_path or Path()).resolve(),
            artifact_root=(run_dir / TRIALS_DIR).resolve(),
            env={**plan.config.env, **secrets, **hidden},
        )
        self.address = address
        self.servers = servers or DEFAULT_SERVERS
        self.connection: RayConnection | None = None
        self.fleet: RolloutFleet | None = None
        self._started: concurrent.futures.Future[list[ServerInfo]] = concurrent.futures.Future()

    @property
    def infos(self) -> list[ServerInfo]:
        return self.fleet.infos if self.fleet is not None else []

    def urls(self) -> list[str]:
        """Every started server's URL, in start order (one that died included)."""
        return [info.url for info in self.infos]

    def launch(self) -> None:
        """Join the cluster (here: Ray wants its driver set up on the main thread), then
        start the fleet in a thread; :meth:`ready` awaits it."""
        self.connection = connect(self.address)
        self.fleet = RolloutFleet(self.spec, self.servers)
        fleet = self.fleet

        def start() -> None:
            try:
                self._started.set_result(fleet.start())
            except BaseException as exc:
                self._started.set_exception(exc)

        threading.Thread(target=start, name="osmosis-rollout-fleet", daemon=True).start()

    async def ready(self) -> None:
        await asyncio.wrap_future(self._started)

    def stop(self, grace_sec: float = 5.0) -> None:
        """Stop the fleet (once it has started or failed) and leave the cluster."""
        if self.fleet is not None:
            with contextlib.suppress(BaseException):
                self._started.exception(timeout=grace_sec + 120.0)
            self.fleet.stop(grace_sec)
        if self.connection is not None:
            self.connection.close()
            self.connection = None

    def grow(self) -> tuple[list[ServerInfo], list[str]]:
        """Start a server on each node that joined since the start (blocking: call it in a
        thread); the servers started, and why each that did not start failed."""
        if self.fleet is None or not self._started.done() or self._started.exception():
            return [], []
        return self.fleet.grow()

    # -- the scheduler's ServerWatch ---------------------------------------------------------

    def alive(self) -> bool:
        return self.fleet is not None and self.fleet.alive()

    def exit_detail(self) -> str:
        dead = self.fleet.dead if self.fleet is not None else {}
        lines = [f"server {index}: {why}" for index, why in sorted(dead.items())]
        return "every rollout server of the fleet died:\n" + "\n".join(lines)

    async def watch(
        self,
        on_dead: Callable[[ServerInfo, str], None],
        on_output: Callable[[ServerInfo, str], None],
    ) -> None:
        assert self.fleet is not None
        await self.fleet.watch(on_dead, on_output)
