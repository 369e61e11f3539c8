"""The worker pool of a local evaluation: pending work items → dispatched attempts → records.

A fixed number of workers take items in order. Each attempt's terminal outcome is classified
and appended to the journal (fsync) inside the dispatcher's commit hook, so before the
callback ack (callback generation) or before moving on (polling). Process-wide faults halt
the pool: no new item starts and the rest stay pending, without a record.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Iterator, Sequence
from pathlib import Path
from typing import Protocol

import httpx

from osmosis_ai.controller.balance import RunsAttempts
from osmosis_ai.controller.dispatch import (
    HTTP_TIMEOUT_SEC,
    Dispatcher,
    DispatchOutcome,
    DispatchRequest,
)
from osmosis_ai.controller.rollout_process import RolloutServerProcess
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.errors import ProtocolError
from osmosis_ai.eval.journal import Journal, JournalRecord
from osmosis_ai.eval.outcome import (
    classify_admission_rejection,
    classify_callback_result,
    classify_polling_result,
    supervisor_error_record,
)
from osmosis_ai.eval.plan import EvalPlan, GenerationChoice
from osmosis_ai.eval.projections import TRAJECTORY_FILE
from osmosis_ai.eval.workitems import Attempt, WorkItem
from osmosis_ai.rollout.http import async_client
from osmosis_ai.rundir.logs import RunLog

TRAJECTORY_WAIT_SEC = 30.0
_SERVER_CHECK_SEC = 0.2
LOST_IN_TRANSIT_RETRIES = 3  # fresh ids an item may take when submit answers are lost

RecordHook = Callable[[JournalRecord], None]
"""Told about each record once it is durable."""


class ServerWatch(Protocol):
    """Rollout servers watched as one (a fleet): alive while any of them is."""

    def alive(self) -> bool: ...

    def exit_detail(self) -> str: ...


@contextlib.asynccontextmanager
async def dispatcher_pool(
    server_url: str, service: ControllerService
) -> AsyncGenerator[Callable[[GenerationChoice], Dispatcher]]:
    """Yields a factory of dispatchers to ``server_url``, each with its own HTTP client on
    the lean loopback transport (its protocol calls skip httpx's client layer); all are
    closed on exit."""
    clients: list[httpx.AsyncClient] = []

    def make(generation: GenerationChoice) -> Dispatcher:
        # A plain-http server needs no CA bundle loaded; an https one is checked as usual.
        client = async_client(timeout=HTTP_TIMEOUT_SEC, verify=server_url.startswith("https:"))
        clients.append(client)
        return Dispatcher(server_url, service, generation=generation, http_client=client)

    try:
        yield make
    finally:
        await asyncio.gather(*(client.aclose() for client in clients))


def choose_workers(plan: EvalPlan, capacity: int | None, pending: int) -> tuple[int, str | None]:
    """In-flight limit: ``--max-in-flight``, else ``evaluation.batch_size``, else the server's
    capacity, else 1 (never more than ``pending``); plus a warning when the chosen limit is
    above the advertised capacity. The limit is never lowered silently."""
    wanted = plan.max_in_flight or plan.batch_size
    workers = min(wanted or capacity or 1, pending)
    if wanted is None or capacity is None or wanted <= capacity:
        return workers, None
    return workers, (
        f"{wanted} rollouts in flight requested, but the rollout server advertises capacity "
        f"for {capacity}: the rest wait in its queue (or retry on 429)"
    )


class Scheduler:
    """Runs the pending items of ``plan``, one worker per dispatcher."""

    def __init__(
        self,
        plan: EvalPlan,
        journal: Journal,
        runlog: RunLog,
        trials_dir: Path,
        *,
        on_record: RecordHook,
        on_trajectory: Callable[[], None],
    ) -> None:
        self.plan = plan
        self.journal = journal
        self.runlog = runlog
        self.trials_dir = trials_dir
        self.on_record = on_record
        self.on_trajectory = on_trajectory
        self.dispatched = 0
        self.halted: str | None = None
        self._workers: list[asyncio.Task[None]] = []
        self._waits: set[asyncio.Task[None]] = set()

    def halt(self, reason: str) -> None:
        """Start no new item; the first reason given is the one reported."""
        if self.halted is None:
            self.halted = reason
            self.runlog.error("dispatch", "dispatch halted", {"reason": reason})

    def cancel(self) -> None:
        """Cancel the in-flight attempts: each cancels its rollout remotely, none is recorded."""
        for worker in self._workers:
            worker.cancel()

    async def run(
        self,
        pool: Sequence[RunsAttempts],
        server: RolloutServerProcess | ServerWatch,
        pending: list[WorkItem],
    ) -> None:
        """Dispatch ``pending`` with one worker per dispatcher in ``pool`` until done or
        halted; then settle the trajectory waits."""
        items = iter(pending)
        self._workers = [asyncio.create_task(self._worker(d, items)) for d in pool]
        monitor = asyncio.create_task(self._monitor(server))
        try:
            await asyncio.gather(*self._workers, return_exceptions=True)
        finally:
            monitor.cancel()
            if self.halted is not None:  # interrupted or broken: do not wait for trajectories
                for wait in self._waits:
                    wait.cancel()
            await asyncio.gather(*self._waits, return_exceptions=True)

    async def _worker(self, dispatcher: RunsAttempts, items: Iterator[WorkItem]) -> None:
        while self.halted is None:
            item = next(items, None)
            if item is None:
                return
            try:
                await self._run_item(dispatcher, item)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a fault of this process (e.g. the disk): stop dispatching
                self.runlog.error("dispatch", "worker failed", {"error": repr(exc)})
                self.halt(f"{type(exc).__name__}: {exc}")

    async def _run_item(self, dispatcher: RunsAttempts, item: WorkItem) -> None:
        """Runs ``item`` until an attempt settles it. An attempt whose submit answer was
        lost runs again under a fresh id, up to ``LOST_IN_TRANSIT_RETRIES`` times; when the
        answers keep being lost, the run halts with the last one's detail."""
        tries = 0
        while True:
            attempt = item.new_attempt()
            tries += 1
            lost = await self._attempt(dispatcher, attempt)
            if lost is None or self.halted is not None:  # settled, or the run is stopping
                return
            if tries > LOST_IN_TRANSIT_RETRIES:
                self.halt(
                    f"the answers to {tries} submits in a row for row {item.row_index} run "
                    f"{item.run_index} were lost (a rollout server that does not replay "
                    f"submits, or one that died); the last: {lost}"
                )
                return
            self.runlog.warning(
                "dispatch",
                "submit answer lost; the item runs again under a fresh id",
                {"id": attempt.rollout_id, "detail": lost},
            )

    async def _attempt(self, dispatcher: RunsAttempts, attempt: Attempt) -> str | None:
        """Runs one attempt; when it was lost in transit (admitted, its answer lost, the
        rollout cancelled, nothing journaled), returns why, and the item may run again."""
        row = self.plan.rows[attempt.row_index]
        timeouts = self.plan.inputs.timeouts
        request = DispatchRequest(
            initial_messages=row.initial_messages,
            label=row.label,
            metadata=row.metadata,
            agent_timeout_sec=timeouts.agent_timeout_sec,
            grader_timeout_sec=timeouts.grader_timeout_sec,
            extra_fields={"row_index": attempt.row_index, "run_index": attempt.run_index},
            rollout_id=attempt.rollout_id,
        )
        committed: list[JournalRecord] = []

        async def commit(outcome: DispatchOutcome) -> None:
            record = self._classify(attempt, outcome)
            if record is not None:
                await self._append(record)
                committed.append(record)

        self.dispatched += 1
        if self.dispatched == 1:
            self.runlog.info("dispatch", "first rollout dispatched", {"id": attempt.rollout_id})
        outcome = await dispatcher.run(request, commit=commit)
        record: JournalRecord | None = None
        if outcome.kind == "admission_rejected":
            code = outcome.status_code or 0
            record = classify_admission_rejection(attempt, code, duration_ms=outcome.duration_ms)
        elif outcome.kind == "timeout" and outcome.admitted and outcome.generation == "callback":
            record = classify_callback_result(
                attempt, None, None, duration_ms=outcome.duration_ms, deadline_exceeded=True
            )
        if record is not None:
            await self._append(record)
            committed.append(record)
        elif outcome.lost_in_transit and not committed:
            return outcome.detail or outcome.kind
        elif outcome.kind in ("timeout", "transport_error", "admission_rejected"):
            self.halt(outcome.detail or outcome.kind)
        if committed:
            self._recorded(committed[-1], outcome)
        return None

    async def _append(self, record: JournalRecord) -> None:
        # Shielded: a cancel arriving mid-write must not leave the caller unsure; the record
        # is durable either way and the final replay reads it back.
        await asyncio.shield(asyncio.to_thread(self.journal.append, record))

    def _classify(self, attempt: Attempt, outcome: DispatchOutcome) -> JournalRecord | None:
        used = any(call.usage is not None for call in outcome.calls)
        tokens = outcome.total_tokens if used else None
        try:
            if outcome.result is None and outcome.generation == "callback":
                return classify_callback_result(
                    attempt,
                    outcome.completion,
                    outcome.grader,
                    duration_ms=outcome.duration_ms,
                    tokens=tokens,
                )
            if outcome.result is None:
                raise ProtocolError(f"rollout {attempt.rollout_id!r} ended without a result body")
            return classify_polling_result(
                attempt, outcome.result, duration_ms=outcome.duration_ms, tokens=tokens
            )
        except ProtocolError as exc:
            self.runlog.error("result", str(exc), {"rollout_id": attempt.rollout_id})
            return supervisor_error_record(attempt, duration_ms=outcome.duration_ms)

    def _recorded(self, record: JournalRecord, outcome: DispatchOutcome) -> None:
        self.runlog.info(
            "result",
            f"row {record.row_index} run {record.run_index}: {record.status}",
            record.to_json(),
        )
        trajectory = self.trials_dir / record.rollout_id / TRAJECTORY_FILE
        if outcome.sample is not None and not trajectory.exists():
            wait = asyncio.create_task(self._await_trajectory(trajectory))
            self._waits.add(wait)
            wait.add_done_callback(self._waits.discard)
        self.on_record(record)

    async def _await_trajectory(self, path: Path) -> None:
        """Wait up to 30 s for the server to save the trajectory of a returned sample."""
        deadline = time.monotonic() + TRAJECTORY_WAIT_SEC
        while time.monotonic() < deadline:
            await asyncio.sleep(0.05)
            if await asyncio.to_thread(path.exists):
                self.on_trajectory()
                return
        self.runlog.warning("trajectory", "no trajectory.json within 30 s", {"path": str(path)})

    async def _monitor(self, server: RolloutServerProcess | ServerWatch) -> None:
        """Halt and cancel the pool when the rollout server (every one of a fleet) dies."""
        while server.alive():  # noqa: ASYNC110 (a child process has no event to await)
            await asyncio.sleep(_SERVER_CHECK_SEC)
        if isinstance(server, RolloutServerProcess):
            code = server.process.returncode if server.process is not None else None
            detail = f"the rollout server exited with code {code} mid-run; its last output:\n"
            detail += server.output_tail()
        else:
            detail = server.exit_detail()
        self.halt(self.runlog.redactor.redact(detail))
        self.cancel()
