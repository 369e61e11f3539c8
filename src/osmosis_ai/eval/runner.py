"""``run_eval``: one invocation of a local evaluation, from the plan to the final projections.

Plan → run dir (lock, resume or ``--fresh``) → secrets → the rollout server spawned → while it
boots: the controller's imports, its service and the model preflight → the worker pool
(:mod:`.scheduler`) → projections → result. Everything before the spawn imports only light
modules (``tests/test_startup_imports.py``): the first dispatch waits on the server's start-up.
Process-wide faults halt dispatch and leave the rest pending; nothing journaled is lost. The
first SIGINT/SIGTERM drains (pending items stay resumable), the second aborts.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import os
import signal
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from osmosis_ai.controller.loop import new_event_loop
from osmosis_ai.eval.journal import JournalRecord, JournalState, WorkKey, replay_journal
from osmosis_ai.eval.plan import (
    Confirmation,
    EvalPlan,
    EvalRunOptions,
    build_plan,
    is_credential,
    model_credential_vars,
    repin_generation,
    resolve_secrets,
)
from osmosis_ai.eval.progress import (
    DispatchStartedEvent,
    EvalEvent,
    EvalRunResult,
    EventSink,
    ItemFinishedEvent,
    LiveProjections,
    LogEvent,
    MilestoneEvent,
    PlanEvent,
    TallyCounter,
    WarningEvent,
)
from osmosis_ai.eval.reporting import record_in_trackers
from osmosis_ai.eval.rundir import MANIFEST_FILE, RunDir, open_run
from osmosis_ai.eval.server import RunServer, reap_orphan
from osmosis_ai.eval.workitems import WorkItem, count_work, pending_items
from osmosis_ai.procs import signal_group
from osmosis_ai.rundir.durable import fsync_dir
from osmosis_ai.rundir.logs import LogLevel, Redactor, RunLog

if TYPE_CHECKING:
    from osmosis_ai.controller.balance import BalancedDispatcher, RunsAttempts
    from osmosis_ai.controller.rollout_process import RolloutServerProcess
    from osmosis_ai.controller.service import ControllerService
    from osmosis_ai.controller.upstream import Upstream
    from osmosis_ai.distributed.fleet import ServerInfo
    from osmosis_ai.eval.fleet_run import FleetRun
    from osmosis_ai.eval.scheduler import Scheduler, ServerWatch
    from osmosis_ai.rollout.protocol import Generation

_FLEET_GROW_SEC = 1.0  # how often a fleet run looks for nodes that joined the cluster


def run_eval(options: EvalRunOptions, on_event: EventSink | None = None) -> EvalRunResult:
    """Run (or resume) the evaluation ``options`` describe; ``on_event`` sees its progress."""
    emit: EventSink = on_event or (lambda _event: None)
    plan = build_plan(options)
    emit(PlanEvent(plan))
    for code, message in plan.warnings:
        emit(WarningEvent(code, message))
    environ = os.environ if options.environ is None else options.environ
    secrets = resolve_secrets(
        plan.config.secrets, options.secrets_file_values, environ, options.prompt_secret
    )
    run = open_run(
        plan.output_dir, plan.run_name, plan.inputs, plan.provenance, fresh=options.fresh
    )
    try:
        result = _Invocation(plan, options, run, secrets, environ, emit).execute()
        return record_in_trackers(result, environ, secrets.values(), emit)
    finally:
        run.close()


class _Invocation:
    def __init__(  # noqa: PLR0917 (one private call site)
        self,
        plan: EvalPlan,
        options: EvalRunOptions,
        run: RunDir,
        secrets: dict[str, str],
        environ: Mapping[str, str],
        emit: EventSink,
    ) -> None:
        self.plan, self.options, self.run, self.secrets = plan, options, run, secrets
        self.environ = environ
        self._emit_now = emit
        self.redactor = Redactor([*secrets.values(), *options.secrets_file_values.values()])
        model_vars = model_credential_vars(plan, environ)
        self.redactor.add(*(environ[name] for name in model_vars if is_credential(name)))
        self.generation: Generation = plan.generation
        self.begun = time.monotonic()
        self.latest: dict[WorkKey, JournalRecord] = {}
        self.tally = TallyCounter(len(plan.items), plan.config.evaluation.pass_threshold)
        self.interrupted = False
        self.scheduler: Scheduler | None = None
        self._bringing_up: set[asyncio.Task[None]] = set()  # cancelled by an interrupt
        self._signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread: int | None = None
        self._main: asyncio.Task[None] | None = None
        self.server: RunServer | FleetRun | None = None
        self._dispatch_started = time.monotonic()
        self._resumed_ids: set[str] = set()
        self.runlog: RunLog

    @functools.cached_property
    def projections(self) -> LiveProjections:
        """Made on first use, once the rollout server is starting (it loads the projector)."""
        run = self.run
        return LiveProjections(
            self.plan,
            run.path,
            run.local_run_id,
            run.manifest.created_at,
            self._resumed_ids,
            began=self.begun,
        )

    # -- events and the log ------------------------------------------------------------------

    def emit(self, event: EvalEvent) -> None:
        """Deliver ``event`` on the thread that runs the evaluation (the loop's, if any)."""
        loop = self._loop
        if loop is not None and threading.get_ident() != self._loop_thread:
            with contextlib.suppress(RuntimeError):  # the loop closed: the event is moot
                loop.call_soon_threadsafe(self._emit_now, event)
            return
        self._emit_now(event)

    def note(self, step: str, message: str, details: Mapping[str, object] | None = None) -> None:
        """A milestone: logged, and shown as a stage line (verbose shows the log instead)."""
        self.runlog.info(step, message, details)
        if not self.options.verbose:
            self.emit(MilestoneEvent(message))

    def warn(self, step: str, code: str, message: str) -> None:
        self.runlog.warning(step, message, {"code": code})
        self.emit(WarningEvent(code, self.redactor.redact(message)))

    def _child_output(self, line: str) -> None:
        self.runlog.output("rollout-server", line)

    # -- the invocation ----------------------------------------------------------------------

    def execute(self) -> EvalRunResult:
        plan, run = self.plan, self.run
        state = replay_journal(run.journal_path)
        pending = pending_items(plan.items, state, retry_failed=self.options.retry_failed)
        if pending and self.options.confirm is not None:
            try:
                self.options.confirm(Confirmation.of(plan, len(pending)))
            except BaseException:
                if not run.resumed and not state.records:
                    _discard_new_run(run.path)
                raise
        self.journal = run.open_journal()
        if self.options.verbose:
            self.runlog = _StreamedLog(run.logs_path, self.redactor, self.emit)
        else:
            self.runlog = RunLog(run.logs_path, self.redactor)
        try:
            return self._execute(state, pending)
        except Exception as exc:
            # A child's output or a provider's message may quote a secret: never show it.
            exc.args = tuple(self.redactor.redact(a) if isinstance(a, str) else a for a in exc.args)
            # The run's log ends with what ended it (a stall's named error among them).
            self.runlog.error("run", f"{type(exc).__name__}: {exc}")
            raise
        finally:
            self.journal.close()
            self.runlog.close()

    def _execute(self, state: JournalState, pending: list[WorkItem]) -> EvalRunResult:
        plan, run = self.plan, self.run
        for warning in state.warnings:
            self.warn("resume", "JOURNAL_TORN_TAIL", warning)
        if run.archived_to is not None:
            self.note("run", f"archived the previous run to {run.archived_to}")
        keys = {item.key for item in plan.items}
        for key, record in state.latest.items():
            if key in keys:
                self.latest[key] = record
                self.tally.replace(None, record)
                self._resumed_ids.add(record.rollout_id)
        self.note(
            "run",
            f"{plan.run_name}: {len(pending)} of {len(plan.items)} work items pending"
            + (" (resuming)" if run.resumed else ""),
            {"run_dir": str(run.path), "resumed": run.resumed},
        )
        if pending:
            try:
                if self.options.ray is not None:
                    self._launch_fleet(self.options.ray)
                else:
                    self._launch_server()
                with asyncio.Runner(loop_factory=new_event_loop) as runner:
                    runner.run(self._async_main(pending))
            finally:
                self._loop = None
                if self.server is not None:
                    self.server.stop()
        return self._finish()

    def _launch_server(self) -> None:
        """Start the rollout server now, so that its start-up overlaps everything else."""
        reaped = reap_orphan(self.run.path)
        if reaped is not None:
            self.note(
                "server",
                f"stopped the rollout server (pid {reaped.pid}, port {reaped.port}) that an "
                "earlier, killed invocation of this run left running",
            )
        port = self.options.rollout_port
        server = RunServer.for_plan(
            self.plan, self.run.path, self.secrets, self.environ, port, self._child_output
        )
        if server.process.isolated:
            self.note("deps", f"syncing rollout dependencies ({self.plan.rollout_name})")
            server.process.sync()
        how = "uv environment" if server.process.isolated else "this interpreter"
        self.note("server", f"starting rollout server ({server.process.entrypoint.name}, {how})")
        self.server = server
        server.launch()

    def _launch_fleet(self, address: str) -> None:
        """Join the Ray cluster and start the fleet; it comes up while the controller does."""
        from osmosis_ai.eval.fleet_run import FleetRun

        fleet = FleetRun(
            self.plan,
            self.run.path,
            self.secrets,
            self.environ,
            address,
            self.options.rollout_servers,
        )
        self.note("server", f"joining the Ray cluster ({address})")
        self.server = fleet
        fleet.launch()
        assert fleet.connection is not None
        nodes = len(fleet.connection.nodes())
        self.note(
            "server",
            f"starting {fleet.servers} rollout servers ({fleet.spec.entrypoint.name}) on a Ray "
            f"cluster of {nodes} nodes",
        )

    async def _async_main(self, pending: list[WorkItem]) -> None:
        self._loop = asyncio.get_running_loop()
        self._loop_thread = threading.get_ident()
        self._main = asyncio.current_task()
        handled = self._install_signals()
        try:
            await self._serve_and_dispatch(pending)
        except asyncio.CancelledError:
            if self._signals >= 2:
                raise KeyboardInterrupt from None
            raise
        finally:
            for sig in handled:
                self._loop.remove_signal_handler(sig)

    async def _serve_and_dispatch(self, pending: list[WorkItem]) -> None:
        # Imported here, while the rollout server starts up.
        import anyio

        from osmosis_ai.controller.proxy import PolicyProxy
        from osmosis_ai.controller.service import ControllerService
        from osmosis_ai.controller.upstreams import upstream_from_model_path
        from osmosis_ai.eval import scheduler

        del scheduler  # imported now for its slow imports (the dispatcher), used later
        # The dispatchers' httpx clients run on anyio, whose asyncio backend loads on first
        # use: have it load now rather than delay the first request to the server.
        await anyio.lowlevel.checkpoint()

        assert self.server is not None
        model_env = {**self.environ, **self.options.secrets_file_values, **self.secrets}
        upstream = upstream_from_model_path(self.plan.model_path, model_env)
        proxy = PolicyProxy(upstream)
        # A fleet's servers call the proxy from their nodes: it listens on this node's address.
        fleet = self.server if not isinstance(self.server, RunServer) else None
        connection = fleet.connection if fleet is not None else None
        if connection is not None:
            service = ControllerService(proxy, host=connection.node_ip)
        else:
            service = ControllerService(proxy)
        self.redactor.add(proxy.token, service.controller_token)
        try:
            await service.start()
            self.runlog.info("listener", "controller service listening", {"port": service.port})
            await self._bring_up(upstream, self.server)
            if self.interrupted:
                pass
            elif isinstance(self.server, RunServer):
                await self._dispatch(self.server.process, service, pending)
            else:
                await self._dispatch_fleet(self.server, service, pending)
        finally:
            await asyncio.to_thread(self.server.stop)
            await service.stop()
            await upstream.aclose()

    async def _bring_up(self, upstream: Upstream, server: RunServer | FleetRun) -> None:
        """Check the model while the rollout server comes up; the model's error wins."""
        preflight = asyncio.create_task(self._preflight(upstream))
        ready = asyncio.create_task(server.ready())
        tasks = self._bringing_up = {preflight, ready}
        try:
            await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
            if _failure(preflight) is not None:
                await asyncio.to_thread(server.stop, 1.0)  # no rollout will run
            elif _failure(ready) is not None:
                preflight.cancel()
            await asyncio.wait(tasks)
        finally:
            self._bringing_up = set()
            for task in tasks:
                task.cancel()
        for task in (preflight, ready):
            error = _failure(task)
            if error is not None:
                raise error
        if self.interrupted:
            return
        if isinstance(server, RunServer):
            self.note("server", f"rollout server healthy on port {server.process.port}")
        else:
            where = ", ".join(info.url for info in server.infos)
            self.note("server", f"{len(server.infos)} rollout servers healthy: {where}")
            for info in server.infos:
                self.runlog.info(
                    "server",
                    f"rollout server {info.index}",
                    {"url": info.url, "node": info.node_ip, "pid": info.pid},
                )

    async def _preflight(self, upstream: Upstream) -> None:
        self.note("preflight", f"checking model {self.plan.model_path} ({upstream.target})")
        result = await upstream.preflight()
        if result.warning:
            self.warn("preflight", "MODEL_RATE_LIMITED", result.warning)
        self.runlog.info("preflight", "model answered", {"latency_ms": round(result.latency_ms)})

    # -- dispatch ----------------------------------------------------------------------------

    async def _dispatch(
        self, server: RolloutServerProcess, service: ControllerService, pending: list[WorkItem]
    ) -> None:
        from osmosis_ai.controller.balance import server_capacity
        from osmosis_ai.eval.scheduler import choose_workers, dispatcher_pool

        plan = self.plan
        async with dispatcher_pool(server.url, service) as dispatcher:
            probe = dispatcher(self.generation if plan.generation_forced else "auto")
            capacity = server_capacity(await probe.health())
            if not plan.generation_forced:
                self._pin_generation(await probe.detect_generation())
            workers, warning = choose_workers(plan, capacity, len(pending))
            if warning is not None:
                self.warn("schedule", "CAPACITY_BELOW_MAX_IN_FLIGHT", warning)
            shown = f", server capacity {capacity}" if capacity is not None else ""
            self.note(
                "schedule",
                f"running {len(pending)} work items, up to {workers} in flight "
                f"({self.generation} generation{shown})",
            )
            pool = [probe, *(dispatcher(self.generation) for _ in range(workers - 1))]
            await self._run_scheduler(self._scheduler(), pool, server, pending)

    async def _dispatch_fleet(
        self, fleet: FleetRun, service: ControllerService, pending: list[WorkItem]
    ) -> None:
        """The fleet behind one balanced dispatcher: as many workers as the servers' capacity
        together; a server that dies has its in-flight items run again elsewhere."""
        from osmosis_ai.controller.balance import BalancedDispatcher
        from osmosis_ai.eval.scheduler import choose_workers

        plan = self.plan
        balanced = BalancedDispatcher(
            service, generation=self.generation if plan.generation_forced else "auto"
        )
        try:
            first = await balanced.slot_for(fleet.urls()[0])
            if not plan.generation_forced:
                self._pin_generation(await first.dispatcher.detect_generation())
            balanced.pin(self.generation)
            await self._follow_fleet(balanced, fleet, announce=False)
            workers, warning = choose_workers(plan, balanced.capacity, len(pending))
            if warning is not None:
                self.warn("schedule", "CAPACITY_BELOW_MAX_IN_FLIGHT", warning)
            self.note(
                "schedule",
                f"running {len(pending)} work items, up to {workers} in flight over "
                f"{len(balanced.slots)} rollout servers ({self.generation} generation, "
                f"capacity {balanced.capacity})",
            )

            def dead(info: ServerInfo, why: str) -> None:
                self.warn(
                    "server",
                    "ROLLOUT_SERVER_DIED",
                    f"rollout server {info.index} on {info.node_ip} died ({why.splitlines()[0]}); "
                    "its in-flight items run again on the others",
                )
                self.runlog.output(f"rollout-server-{info.index}", why)
                balanced.mark_dead(info.url, why)

            def output(info: ServerInfo, line: str) -> None:
                self.runlog.output(f"rollout-server-{info.index}", line)

            async def join_new_nodes() -> None:
                while True:
                    await asyncio.sleep(_FLEET_GROW_SEC)
                    _started, failures = await asyncio.to_thread(fleet.grow)
                    for why in failures:
                        self.warn("server", "ROLLOUT_SERVER_NOT_STARTED", why)
                    await self._follow_fleet(balanced, fleet, announce=True)

            watcher = asyncio.create_task(fleet.watch(dead, output))
            joiner = asyncio.create_task(join_new_nodes())
            try:
                await self._run_scheduler(self._scheduler(), [balanced] * workers, fleet, pending)
            finally:
                for task in (watcher, joiner):
                    task.cancel()
                await asyncio.gather(watcher, joiner, return_exceptions=True)
                self.runlog.info(
                    "schedule",
                    "attempts per rollout server",
                    {slot.name: slot.dispatched for slot in balanced.slots},
                )
        finally:
            await balanced.aclose()

    async def _follow_fleet(
        self, balanced: BalancedDispatcher, fleet: FleetRun, *, announce: bool
    ) -> None:
        """Balance over every server the fleet started (one that died stays out); a server
        not reachable from here yet is tried again on the next call."""
        joined, unreachable = await balanced.follow(fleet.urls())
        for url, error in unreachable:
            self.runlog.info(
                "schedule", "rollout server not reachable yet", {"url": url, "error": str(error)}
            )
        infos = {info.url: info for info in fleet.infos}
        for slot in joined if announce else []:
            info = infos[slot.name]
            self.note(
                "schedule",
                f"rollout server {info.index} joined with its node {info.node_ip}: "
                f"{info.url}, capacity {slot.capacity}",
            )

    def _scheduler(self) -> Scheduler:
        from osmosis_ai.eval.scheduler import Scheduler

        return Scheduler(
            self.plan,
            self.journal,
            self.runlog,
            self.run.trials_dir,
            on_record=self._recorded,
            on_trajectory=self.projections.mark_dirty,
        )

    async def _run_scheduler(
        self,
        scheduler: Scheduler,
        pool: Sequence[RunsAttempts],
        server: RolloutServerProcess | ServerWatch,
        pending: list[WorkItem],
    ) -> None:
        self.scheduler = scheduler
        self._dispatch_started = time.monotonic()
        self.emit(DispatchStartedEvent(len(pending), len(pool), self.tally.snapshot()))
        refresher = asyncio.create_task(self.projections.keep_current(self.latest))
        # What exists by now lives for the whole run (and torch, with a local policy): keep
        # it out of full collections, which stall every rollout in flight.
        gc.freeze()
        try:
            await scheduler.run(pool, server, pending)
        finally:
            gc.unfreeze()
            self.projections.stop()  # the final refresh follows, after this one ends
            await asyncio.gather(refresher, return_exceptions=True)

    def _pin_generation(self, detected: Generation) -> None:
        """A new ``--generation auto`` run records the generation the server turned out to speak."""
        if detected != self.generation and not self.latest:
            self.generation = detected
            repin_generation(self.run.path, self.run.manifest, self.plan.inputs, detected)
            self.runlog.info("schedule", "pinned the server's generation", {"to": detected})

    def _recorded(self, record: JournalRecord) -> None:
        self.tally.replace(self.latest.get(record.key), record)
        self.latest[record.key] = record
        self.projections.mark_dirty()
        elapsed = time.monotonic() - self._dispatch_started
        trial = self.run.trials_dir / record.rollout_id
        self.emit(ItemFinishedEvent(record, trial, self.tally.snapshot(), elapsed))

    # -- signals -----------------------------------------------------------------------------

    def _install_signals(self) -> list[signal.Signals]:
        if (
            not self.options.handle_signals
            or threading.current_thread() is not threading.main_thread()
        ):
            return []
        assert self._loop is not None
        handled = [signal.SIGINT, signal.SIGTERM]
        for sig in handled:
            self._loop.add_signal_handler(sig, self._on_signal)
        return handled

    def _on_signal(self) -> None:
        self._signals += 1
        if self._signals == 1:
            self.interrupted = True
            self.note("cancel", "interrupted: cancelling in-flight rollouts (Ctrl-C again to quit)")
            if self.scheduler is not None:
                self.scheduler.halt("interrupted")
                self.scheduler.cancel()
            for task in self._bringing_up:  # a model check that hangs must not hold the stop
                task.cancel()
            return
        server = self.server
        child = server.process.process if isinstance(server, RunServer) else None
        if child is not None:
            signal_group(child.pid, signal.SIGKILL)
        if self._main is not None:
            self._main.cancel()

    # -- finishing ---------------------------------------------------------------------------

    def _finish(self) -> EvalRunResult:
        plan = self.plan
        keys = {item.key for item in plan.items}
        replayed = self.journal.replay()  # the journal, not memory, is the truth
        state = JournalState(latest={k: r for k, r in replayed.latest.items() if k in keys})
        counts = count_work(plan.items, state)
        status = "finished" if counts.pending == 0 else "incomplete"
        projections = self.projections.refresh(state, status)
        scheduler = self.scheduler
        halted = scheduler.halted if scheduler is not None else None
        if halted is not None and not self.interrupted:
            self.warn(
                "dispatch",
                "DISPATCH_HALTED",
                f"dispatch halted: {halted}. {counts.pending} work items stay pending: rerun "
                f"the same command with --name {plan.run_name} to resume",
            )
        duration_ms = round((time.monotonic() - self.begun) * 1000)
        self.runlog.info("run", "run ended", {"pending": counts.pending})
        return EvalRunResult(
            plan=plan,
            local_run_id=self.run.local_run_id,
            run_dir=self.run.path,
            total_work_items=counts.total,
            dispatched=scheduler.dispatched if scheduler is not None else 0,
            succeeded=counts.succeeded,
            failed=counts.failed,
            skipped=counts.skipped,
            resumed=sum(1 for r in state.latest.values() if r.rollout_id in self._resumed_ids),
            pending=counts.pending,
            cancelled=self.interrupted,
            duration_ms=duration_ms,
            metrics=projections.metrics,
            failed_rows=projections.failed_rows,
            halted=halted,
            archived_to=self.run.archived_to,
        )


class _StreamedLog(RunLog):
    """``--verbose``: every line written to ``logs.txt`` is also a :class:`LogEvent`."""

    def __init__(self, path: Path, redactor: Redactor, emit: EventSink) -> None:
        super().__init__(path, redactor)
        self._emit = emit

    def log(
        self, level: LogLevel, step: str, message: str, details: Mapping[str, object] | None = None
    ) -> None:
        super().log(level, step, message, details)
        self._emit(LogEvent(f"{level} [{step}] {self.redactor.redact(message)}"))


def _failure(task: asyncio.Task[None]) -> BaseException | None:
    if not task.done() or task.cancelled():
        return None
    return task.exception()


def _discard_new_run(path: Path) -> None:
    """Remove a run dir this invocation created that holds nothing but its manifest."""
    with contextlib.suppress(OSError):
        if os.listdir(path) == [MANIFEST_FILE]:
            os.unlink(path / MANIFEST_FILE)
            os.rmdir(path)
            fsync_dir(path.parent)
