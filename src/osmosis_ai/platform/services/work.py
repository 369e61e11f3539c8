"""Executing runs: workers, the lease a worker holds on a run, and waking idle workers.

A worker registers (:func:`register_worker`), then claims runs (:func:`claim_run`): the
oldest ``pending``/``queued`` run, or a ``running`` one whose lease ran out because its worker
died. A claim bumps the run's ``attempt``; every later write of that worker about the run
carries ``(worker_id, attempt)`` and is refused once the run was claimed again
(:class:`LeaseLostError`), so a worker that comes back from a pause never overwrites its
successor. On PostgreSQL the claim reads ``FOR UPDATE SKIP LOCKED`` (workers never queue
behind each other); on SQLite the write transaction holds the database's write lock, which
serializes claims the same way.

A run whose workers keep dying is not retried forever: after :data:`MAX_ATTEMPTS` claims it
ends ``failed`` (eval) or ``crashed`` (training) with a message saying so. A retry of an
ended run (``attempts_base`` = its attempt so far) gets a fresh count.

Waking: a submit calls :func:`wake_workers` after its commit. Each live worker listens on a
loopback UDP port it registered (one datagram wakes it at once); on PostgreSQL a ``NOTIFY``
on :data:`CHANNEL` also wakes workers on other machines. Workers still poll now and then, so
a lost datagram costs latency, never a run.
"""

from __future__ import annotations

import contextlib
import socket
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Literal

from sqlalchemy import or_, select, text, update
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import ConflictError
from osmosis_ai.platform.services.runs import TERMINAL, add_log, finish
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Run, Worker

CHANNEL = "osmosis_runs"
MAX_ATTEMPTS = 3
DEFAULT_LEASE_S = 15.0
# A worker that has not heartbeaten for this long is not sent wake-ups.
WORKER_STALE_S = 60.0
WAKE_MESSAGE = b"runs"

HeartbeatState = Literal["ok", "stopped", "lost"]


class LeaseLostError(ConflictError):
    """The run was claimed again by another attempt (or ended): this worker must let go."""

    default_code = "LEASE_LOST"


@dataclass(frozen=True)
class Claim:
    """A run a worker now holds: its id, kind and the attempt that fences its writes."""

    run_id: str
    kind: str
    attempt: int
    resumed: bool  # an earlier attempt started it (its worker was lost)


def register_worker(
    session: Session, *, name: str, slots: int, wake_address: str | None, now: datetime
) -> Worker:
    worker = Worker(
        name=name, slots=slots, wake_address=wake_address, started_at=now, heartbeat_at=now
    )
    session.add(worker)
    session.flush()
    return worker


def worker_alive(session: Session, worker_id: str, *, now: datetime) -> None:
    session.execute(update(Worker).where(Worker.id == worker_id).values(heartbeat_at=now))


def worker_stopped(session: Session, worker_id: str, *, now: datetime) -> None:
    session.execute(update(Worker).where(Worker.id == worker_id).values(stopped_at=now))


def claim_run(
    session: Session,
    worker_id: str,
    *,
    now: datetime,
    lease_s: float = DEFAULT_LEASE_S,
    kinds: tuple[str, ...] = ("eval", "training"),
) -> Claim | None:
    """Take the oldest runnable run for ``worker_id``, or ``None`` when there is none."""
    while True:
        query = (
            select(Run)
            .where(
                Run.kind.in_(kinds),
                or_(
                    Run.status.in_(("pending", "queued")),
                    (Run.status == "running") & (Run.lease_expires_at < now),
                ),
            )
            .order_by(Run.created_at, Run.id)
            .limit(1)
            .with_for_update(skip_locked=True)
        )
        run = session.scalar(query)
        if run is None:
            return None
        worker = session.get(Worker, worker_id)
        where = worker.name if worker is not None else worker_id
        resumed = run.attempt > run.attempts_base
        if run.attempt - run.attempts_base >= MAX_ATTEMPTS:
            status = "failed" if run.kind == "eval" else "crashed"
            message = (
                f"Gave up after {run.attempt - run.attempts_base} attempts: the worker "
                "running it was lost each time (killed, or stopped heartbeating)"
            )
            run.error = message
            run.worker_id = None
            run.lease_expires_at = None
            finish(run, status, now=now)
            add_log(session, run, now, "worker", message, level="error")
            session.flush()
            continue  # look for another run
        run.attempt += 1
        run.worker_id = worker_id
        run.lease_expires_at = now + timedelta(seconds=lease_s)
        run.status = "running"
        run.started_at = run.started_at or now
        run.updated_at = now
        if resumed:
            add_log(
                session,
                run,
                now,
                "worker",
                f"Resumed on worker {where} (attempt {run.attempt}): the previous worker's "
                "lease expired",
                level="warning",
            )
        else:
            add_log(session, run, now, "worker", f"Started on worker {where}")
        session.flush()
        return Claim(run_id=run.id, kind=run.kind, attempt=run.attempt, resumed=resumed)


def held_run(session: Session, run_id: str, worker_id: str, attempt: int) -> Run:
    """The run, if this attempt still holds it (else :class:`LeaseLostError`)."""
    run = session.get(Run, run_id)
    if run is None or run.worker_id != worker_id or run.attempt != attempt:
        raise LeaseLostError(f"Run {run_id} is no longer held by this worker (attempt {attempt}).")
    return run


def heartbeat(
    session: Session,
    run_id: str,
    worker_id: str,
    attempt: int,
    *,
    now: datetime,
    lease_s: float = DEFAULT_LEASE_S,
) -> HeartbeatState:
    """Extend the lease; ``stopped`` when the run was stopped (or ended), ``lost`` when another
    attempt holds it."""
    try:
        run = held_run(session, run_id, worker_id, attempt)
    except LeaseLostError:
        return "lost"
    if run.status in TERMINAL[run.kind]:
        return "stopped"
    run.lease_expires_at = now + timedelta(seconds=lease_s)
    return "ok"


def end_attempt(
    session: Session,
    run_id: str,
    worker_id: str,
    attempt: int,
    *,
    status: str,
    now: datetime,
    error: str | None = None,
    message: str | None = None,
) -> Run:
    """End the run with ``status`` (a stopped run stays stopped) and release its lease."""
    run = held_run(session, run_id, worker_id, attempt)
    if run.status not in TERMINAL[run.kind]:
        finish(run, status, now=now)
        if error is not None:
            run.error = error
    run.lease_expires_at = None
    run.updated_at = now
    if message is not None:
        add_log(
            session,
            run,
            now,
            "worker",
            message,
            level="error" if status in ("failed", "crashed") else "info",
        )
    return run


def release(session: Session, run_id: str, worker_id: str, attempt: int, *, now: datetime) -> None:
    """Give a running run back at once (a worker shutting down): another worker resumes it."""
    with contextlib.suppress(LeaseLostError):
        run = held_run(session, run_id, worker_id, attempt)
        if run.status not in TERMINAL[run.kind]:
            run.lease_expires_at = now
            add_log(session, run, now, "worker", "Released by a worker shutting down")


# --- waking -----------------------------------------------------------------------------


def wake_workers(database: Database, *, now: datetime) -> int:
    """Wake idle workers after a commit that made a run runnable: a ``NOTIFY`` on
    PostgreSQL, and a datagram to every live worker; the number of datagrams sent."""
    if not database.local:
        with database.transaction() as session:
            session.execute(text(f"NOTIFY {CHANNEL}"))
    since = now - timedelta(seconds=WORKER_STALE_S)
    with database.read() as session:
        addresses = session.scalars(
            select(Worker.wake_address).where(
                Worker.stopped_at.is_(None),
                Worker.heartbeat_at >= since,
                Worker.wake_address.is_not(None),
            )
        ).all()
    sent = 0
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for address in addresses:
            host, _, port = (address or "").rpartition(":")
            with contextlib.suppress(OSError, ValueError):
                sock.sendto(WAKE_MESSAGE, (host, int(port)))
                sent += 1
    return sent
