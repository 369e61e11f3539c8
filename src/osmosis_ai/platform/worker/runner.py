"""``Worker``: the process that executes submitted runs (``osmosis platform worker``).

It registers itself (:func:`~osmosis_ai.platform.services.work.register_worker`) with a
loopback UDP port a submit sends a datagram to; on PostgreSQL it also ``LISTEN``s on
:data:`~osmosis_ai.platform.services.work.CHANNEL`. Between wake-ups it polls every
``poll_s`` seconds, so a lost datagram costs latency, never a run. It claims runs while it
has free slots and starts one process per run (:mod:`osmosis_ai.platform.worker.execute`)
in a session of its own, its stdin a pipe the process watches: if this worker dies, the
pipe closes and the process kills itself and everything it started.

Every ``heartbeat_s`` it extends the lease of each run it holds (and marks itself alive).
A run that was stopped (``stopped``) or claimed by another attempt after this worker
stalled (``lost``) has its processes ended: SIGTERM to each process group beneath the
run's process, SIGKILL after ``grace_s``. A process that exits without ending its run ends
it ``failed`` (eval) or ``crashed`` (training) with its exit code and the redacted tail of
its output in the run's logs.

Before it registers, the worker checks that it can contain workspace code (a trivial process
started in bubblewrap, :mod:`osmosis_ai.controller.containment`): where it cannot, it refuses
to start, naming the fix, unless the platform is declared single-tenant
(``settings.single_tenant``). Run processes start without the platform's ``OSMOSIS_PLATFORM_*``
variables (the spec carries what they need, mode 0600, outside what contained code sees).

SIGTERM or SIGINT stops the worker: it asks each run's process to hand its run back
(SIGUSR1, then SIGTERM), releases the runs so another worker resumes them at
once, and marks itself stopped. A second signal kills the processes without waiting.

:class:`WorkerProcesses` runs workers beside a platform server (``osmosis platform serve
--workers N``), each ``python -m osmosis_ai.platform.worker.runner``, stopped with the
server; a worker so started also stops when its stdin closes (the server died).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from types import TracebackType
from typing import IO, Any, Self

from osmosis_ai.controller import containment
from osmosis_ai.deadlines import RUN_HEARTBEAT
from osmosis_ai.errors import ConfigError, DeadlineError
from osmosis_ai.platform import gitsync
from osmosis_ai.platform.crypto import SECRET_KEY_ENV, SecretBox, secret_key
from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.runs import TERMINAL, add_log, run_secret_values
from osmosis_ai.platform.settings import (
    DATA_DIR_ENV,
    DATABASE_URL_ENV,
    KEYS_DIR_ENV,
    SINGLE_TENANT_ENV,
    PlatformSettings,
    load_settings,
)
from osmosis_ai.platform.store.database import Database, open_database
from osmosis_ai.platform.store.orm import Run, utcnow
from osmosis_ai.platform.worker import liveness
from osmosis_ai.platform.worker.execute import (
    CONTAINED,
    DEFAULT_JOBS,
    PLATFORM_ENV_PREFIX,
    RELEASE_SIGNAL,
    STANDBY,
    UNCONTAINED,
    RunSpec,
    log_to_stderr,
    work_dir_of,
)
from osmosis_ai.procs import kill_tree, signal_tree
from osmosis_ai.rundir.logs import Redactor

logger = logging.getLogger("osmosis_ai.platform.worker")

BWRAP_ENV = "OSMOSIS_PLATFORM_BWRAP"  # the bubblewrap binary (default: bwrap on PATH)
DEFAULT_POLL_S = 5.0
DEFAULT_HEARTBEAT_S = 3.0
DEFAULT_GRACE_S = 6.0  # SIGTERM to SIGKILL; with the kill, a stop takes at most ~8 s
TAIL_LINES = 40
TAIL_CHARS = 4000

# What woke the worker before a claim, best first (recorded with each claim).
_TRIGGERS = ("udp", "notify", "slot", "start", "poll")
_EXIT_POLL_S = 0.05
_EXIT_WATCH_S = 10.0  # after that, a process that closed its output is looked at each beat


@dataclass
class _Child:
    """One run's process as the worker tracks it."""

    claim: work.Claim
    process: subprocess.Popen[bytes]
    log_path: Path
    reader: threading.Thread | None = None
    tail: deque[str] = field(default_factory=lambda: deque[str](maxlen=TAIL_LINES))
    output_ended: float | None = None  # when its output ended (its exit is then near)
    started: float = field(default_factory=time.time)  # (wall clock, as the beat file's)
    stalled: str | None = None  # the RunStalledError text, once its heartbeat stopped
    # Set once its processes are being ended: why, and when SIGKILL follows.
    ending: str | None = None  # stopped | lost | shutdown
    kill_at: float | None = None
    killed: bool = False


class Worker:
    """Claims runs and executes each in its own process; :meth:`run` until a signal (or
    :meth:`request_stop`)."""

    def __init__(
        self,
        settings: PlatformSettings,
        *,
        slots: int = 1,
        poll_s: float = DEFAULT_POLL_S,
        heartbeat_s: float = DEFAULT_HEARTBEAT_S,
        lease_s: float = work.DEFAULT_LEASE_S,
        grace_s: float = DEFAULT_GRACE_S,
        run_stall_s: float | None = None,
        jobs: Mapping[str, str] | None = None,
        name: str | None = None,
        python: str = sys.executable,
        clock: Callable[[], datetime] = utcnow,
    ) -> None:
        if slots < 1:
            raise ValueError(f"a worker needs at least one slot, not {slots}")
        self.settings = settings
        self.slots = slots
        self.poll_s = poll_s
        self.heartbeat_s = heartbeat_s
        self.lease_s = lease_s
        self.grace_s = grace_s
        self.run_stall_s = RUN_HEARTBEAT.seconds() if run_stall_s is None else run_stall_s
        self.jobs = {**DEFAULT_JOBS, **(jobs or {})}
        self.name = name or f"{socket.gethostname()}:{os.getpid()}"
        self.python = python
        self.clock = clock
        self.worker_id: str | None = None
        self.children: dict[str, _Child] = {}
        self._stopping = 0  # signals received
        self._waker_r, self._waker_w = socket.socketpair()
        self._waker_r.setblocking(False)
        self._waker_w.setblocking(False)
        self._udp: socket.socket | None = None
        self._listener: _Listener | None = None
        self._database: Database | None = None
        self._box: SecretBox | None = None
        self._standby: subprocess.Popen[bytes] | None = None
        self.isolation = UNCONTAINED if settings.single_tenant else CONTAINED
        self.bwrap = os.environ.get(BWRAP_ENV) or "bwrap"

    # --- running -------------------------------------------------------------------------

    def run(self) -> None:
        """Register, execute runs until stopped, then hand back what is held."""
        self.check_isolation()
        handled = self._install_signals()
        database = self._database = open_database(self.settings)  # migrated, under a lock
        try:
            self._start_standby()  # warming up while this worker registers
            self._udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
            self._udp.bind(("127.0.0.1", 0))
            self._udp.setblocking(False)
            host, port = self._udp.getsockname()[:2]
            with database.transaction() as session:
                worker = work.register_worker(
                    session,
                    name=self.name,
                    slots=self.slots,
                    wake_address=f"{host}:{port}",
                    now=self.clock(),
                )
                self.worker_id = worker.id
            if not database.local:
                self._listener = _Listener(self.settings.database_url, self._wake)
            logger.info(
                "worker %s (%s) ready: %d slot(s), wake-ups on udp %s:%s",
                self.name,
                self.worker_id,
                self.slots,
                host,
                port,
            )
            self._loop()
            self._shutdown()
        finally:
            if self._standby is not None:
                _close_standby(self._standby)
            for sig, previous in handled.items():
                signal.signal(sig, previous)
            if self._listener is not None:
                self._listener.close()
            if self._udp is not None:
                self._udp.close()
            if self.worker_id is not None:
                with contextlib.suppress(Exception), database.transaction() as session:
                    work.worker_stopped(session, self.worker_id, now=self.clock())
            database.dispose()

    def check_isolation(self) -> None:
        """Refuse to run workspace code uncontained unless the platform is single-tenant."""
        self.settings.secure()
        if self.isolation == UNCONTAINED:
            logger.warning(
                "isolation: single-tenant (none): workspace code runs as this worker's user"
            )
            return
        found = shutil.which(self.bwrap)
        probe = containment.Containment(
            home=str(self.settings.data_dir / "work" / "probe-home"),
            hidden=(str(self.settings.data_dir), os.path.expanduser("~"), "/root"),
            uid=self.settings.sandbox_uid if os.geteuid() == 0 else None,
            bwrap=found or self.bwrap,
        )
        try:
            containment.check(probe)
        except containment.ContainmentError as exc:
            raise ConfigError(
                f"This worker cannot contain workspace code: {exc}. If every workspace on "
                "this platform is trusted, start it with --single-tenant "
                "(OSMOSIS_PLATFORM_SINGLE_TENANT=1) instead"
            ) from exc
        self.bwrap = found or self.bwrap
        logger.info("isolation: bubblewrap (%s)", self.bwrap)

    def request_stop(self) -> None:
        """Stop as SIGTERM would (safe from any thread and from a signal handler)."""
        self._stopping += 1
        self._wake(b"s")

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous: dict[int, Any] = {}
        for sig in (signal.SIGTERM, signal.SIGINT):
            previous[sig] = signal.signal(sig, lambda signum, frame: self.request_stop())
        return previous

    def _wake(self, tag: bytes) -> None:
        with contextlib.suppress(OSError):
            self._waker_w.send(tag)

    def _loop(self) -> None:
        now = time.monotonic()
        next_beat = now + self.heartbeat_s
        next_poll = now + self.poll_s
        triggers = {"start"}
        while not self._stopping:
            if self._reap():  # a slot is free: whatever woke us for one may have come early
                triggers.add("slot")
            now = time.monotonic()
            if now >= next_beat:
                self._heartbeat()
                next_beat = now + self.heartbeat_s
            self._watch_stalls()
            self._escalate()
            if now >= next_poll:
                triggers.add("poll")
                next_poll = now + self.poll_s
            if triggers and len(self.children) < self.slots:
                self._claim(min(triggers, key=_TRIGGERS.index))
            triggers = set()
            deadline = min(next_beat, next_poll, *self._kill_deadlines(), *self._exiting())
            triggers = self._wait(max(0.0, deadline - time.monotonic()))

    def _wait(self, timeout: float) -> set[str]:
        """Sleep until a wake-up, a child's exit or ``timeout``; what woke it."""
        assert self._udp is not None
        readable, _, _ = select.select([self._udp, self._waker_r], [], [], timeout)
        woke: set[str] = set()
        if self._udp in readable:
            with contextlib.suppress(BlockingIOError):
                while self._udp.recv(64):
                    woke.add("udp")
        if self._waker_r in readable:
            with contextlib.suppress(BlockingIOError):
                while data := self._waker_r.recv(256):
                    if b"n" in data:
                        woke.add("notify")
                    if b"c" in data:
                        woke.add("slot")
        return woke

    def _kill_deadlines(self) -> list[float]:
        return [c.kill_at for c in self.children.values() if c.kill_at and not c.killed]

    def _exiting(self) -> list[float]:
        """A moment from now when a run's output ended lately but its process has not yet
        exited (its slot frees within moments: look again soon, not at the next beat)."""
        now = time.monotonic()
        ending = any(
            c.output_ended is not None and now - c.output_ended < _EXIT_WATCH_S
            for c in self.children.values()
        )
        return [now + _EXIT_POLL_S] if ending else []

    # --- claiming ------------------------------------------------------------------------

    def _claim(self, trigger: str) -> None:
        database, worker_id = self._database, self.worker_id
        assert database is not None and worker_id is not None
        while len(self.children) < self.slots and not self._stopping:
            woke = time.monotonic()
            try:
                with database.transaction() as session:
                    claim = work.claim_run(
                        session, worker_id, now=self.clock(), lease_s=self.lease_s
                    )
                    if claim is None:
                        return
                    run = session.get(Run, claim.run_id)
                    assert run is not None
                    queued_ms = round((self.clock() - run.created_at).total_seconds() * 1000)
                    add_log(
                        session,
                        run,
                        self.clock(),
                        "worker",
                        f"Claimed after a {trigger} wake-up"
                        if trigger in ("udp", "notify")
                        else f"Claimed on a {trigger}",
                        details={
                            "trigger": trigger,
                            "claim_ms": round((time.monotonic() - woke) * 1000, 1),
                            "queued_ms": None if claim.resumed else queued_ms,
                            "worker": self.name,
                            "attempt": claim.attempt,
                        },
                    )
            except Exception:
                logger.exception("claiming a run failed; trying again later")
                return
            logger.info(
                "claimed %s run %s (attempt %d, on %s)",
                claim.kind,
                claim.run_id,
                claim.attempt,
                trigger,
            )
            self._start(claim)

    def _start(self, claim: work.Claim) -> None:
        assert self.worker_id is not None
        work_dir = work_dir_of(self.settings.data_dir, claim.run_id)
        spec_path = work_dir / f"attempt-{claim.attempt}.json"
        log_path = work_dir / f"attempt-{claim.attempt}.log"
        try:
            job = self.jobs.get(claim.kind)
            if job is None:
                raise ValueError(f"this worker has no job for {claim.kind} runs")
            RunSpec(
                run_id=claim.run_id,
                kind=claim.kind,
                worker_id=self.worker_id,
                attempt=claim.attempt,
                resumed=claim.resumed,
                data_dir=str(self.settings.data_dir),
                database_url=self.settings.database_url,
                public_url=self.settings.public_url,
                work_dir=str(work_dir),
                job=job,
                isolation=self.isolation,
                keys_dir=str(self.settings.keys_dir) if self.settings.keys_dir else None,
                bwrap=self.bwrap,
                sandbox_uid=self.settings.sandbox_uid,
                # Not in the run process's environment (/proc shows it): in the 0600 spec.
                secret_key=os.environ.get(SECRET_KEY_ENV) or None,
            ).write(spec_path)
            process = self._take_standby(spec_path)
            if process is None:
                process = self._popen([str(spec_path)], cwd=work_dir)
            self._start_standby()
        except Exception as exc:
            self._end(
                claim,
                status=_failed(claim.kind),
                error=f"The worker could not start the run: {exc}",
                message=f"The worker could not start the run: {exc}",
            )
            return
        child = _Child(claim=claim, process=process, log_path=log_path)
        child.reader = threading.Thread(
            target=self._pump, args=(child,), name=f"run-{claim.run_id}", daemon=True
        )
        child.reader.start()
        self.children[claim.run_id] = child

    def _popen(self, args: list[str], *, cwd: Path) -> subprocess.Popen[bytes]:
        return subprocess.Popen(
            [self.python, "-m", "osmosis_ai.platform.worker.execute", *args],
            cwd=cwd,
            env={
                **{k: v for k, v in os.environ.items() if not k.startswith(PLATFORM_ENV_PREFIX)},
                "PYTHONUNBUFFERED": "1",
            },
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )

    def _start_standby(self) -> None:
        """Keep one run process started and warmed up ahead of the next claim."""
        if self._standby is not None and self._standby.poll() is None:
            return
        try:
            folder = self.settings.data_dir / "work"
            folder.mkdir(parents=True, exist_ok=True)
            self._standby = self._popen([STANDBY], cwd=folder)
        except OSError:
            logger.exception("starting a standby run process failed; runs start cold")
            self._standby = None

    def _take_standby(self, spec_path: Path) -> subprocess.Popen[bytes] | None:
        """The standby process, handed ``spec_path``; ``None`` if there is none alive."""
        process, self._standby = self._standby, None
        if process is None or process.poll() is not None or process.stdin is None:
            return None
        try:
            process.stdin.write(f"{spec_path}\n".encode())
            process.stdin.flush()
        except OSError:
            _close_standby(process)
            return None
        return process

    def _pump(self, child: _Child) -> None:
        """Copy the run process's output to its attempt log and keep the last lines."""
        stream: IO[bytes] | None = child.process.stdout
        assert stream is not None
        with child.log_path.open("ab") as log:
            for raw in stream:
                log.write(raw)
                log.flush()
                child.tail.append(raw.decode("utf-8", "replace").rstrip("\n"))
        child.output_ended = time.monotonic()
        self._wake(b"c")

    # --- holding -------------------------------------------------------------------------

    def _heartbeat(self) -> None:
        database, worker_id = self._database, self.worker_id
        assert database is not None and worker_id is not None
        try:
            with database.transaction() as session:
                work.worker_alive(session, worker_id, now=self.clock())
                states = {
                    run_id: work.heartbeat(
                        session,
                        run_id,
                        worker_id,
                        child.claim.attempt,
                        now=self.clock(),
                        lease_s=self.lease_s,
                    )
                    for run_id, child in self.children.items()
                    if child.ending is None
                }
        except Exception:
            logger.exception("heartbeat failed; trying again")
            return
        for run_id, state in states.items():
            if state != "ok":
                logger.info("run %s is %s: ending its processes", run_id, state)
                self._terminate(self.children[run_id], state)

    def _watch_stalls(self) -> None:
        """Kill the processes of a run whose process stopped beating (stopped, hung, or
        starved) for longer than the run heartbeat deadline; its run then fails."""
        now = time.time()
        for child in self.children.values():
            if child.ending is not None or child.process.poll() is not None:
                continue
            path = liveness.beat_path(child.log_path.parent, child.claim.attempt)
            last = liveness.last_beat(path, child.started)
            silent = now - (child.started if last is None else last)
            allowed = self.run_stall_s
            if last is None:  # not beating yet: a cold start may still be importing
                allowed = max(allowed, liveness.FIRST_BEAT_S)
            if silent <= allowed:
                continue
            error = RUN_HEARTBEAT.error(
                RunStalledError,
                f"the run's process (pid {child.process.pid}) gave no heartbeat for "
                f"{silent:.1f}s, so its processes were killed",
                allowed,
            )
            child.stalled = f"{type(error).__name__}: {error}"
            logger.warning("run %s: %s", child.claim.run_id, child.stalled)
            child.ending = "stalled"
            child.kill_at = time.monotonic()
            child.killed = True
            kill_tree(child.process.pid)

    def _terminate(self, child: _Child, why: str) -> None:
        """SIGTERM the run's process groups (``release`` first on a shutdown)."""
        if child.ending is not None:
            return
        child.ending = why
        child.kill_at = time.monotonic() + self.grace_s
        if child.process.poll() is not None:
            return
        if why == "shutdown":  # to the run's process alone: its own handler, read first
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.process.pid, RELEASE_SIGNAL)
        signal_tree(child.process.pid, signal.SIGTERM)

    def _escalate(self, *, now: float | None = None) -> None:
        now = time.monotonic() if now is None else now
        for child in self.children.values():
            if child.kill_at is not None and not child.killed and now >= child.kill_at:
                child.killed = True
                if child.process.poll() is None:
                    logger.warning(
                        "run %s did not stop within %.0f s: killing it",
                        child.claim.run_id,
                        self.grace_s,
                    )
                    kill_tree(child.process.pid)

    def _reap(self) -> bool:
        """Settle the runs whose process exited; whether any did (a slot is free)."""
        reaped = False
        for run_id, child in list(self.children.items()):
            code = child.process.poll()
            if code is None:
                continue
            if child.reader is not None:
                child.reader.join(timeout=2)
            if child.process.stdin is not None:
                with contextlib.suppress(OSError):
                    child.process.stdin.close()
            del self.children[run_id]
            self._settle(child, code)
            reaped = True
        return reaped

    def _settle(self, child: _Child, code: int) -> None:
        """After a run's process exited: release, tidy or end the run as the case needs."""
        claim = child.claim
        database = self._database
        assert database is not None and self.worker_id is not None
        if child.ending == "lost":
            return  # another attempt holds it now
        now = self.clock()
        try:
            with database.transaction() as session:
                if child.ending == "shutdown":
                    work.release(session, claim.run_id, self.worker_id, claim.attempt, now=now)
                    return
                try:
                    run = work.held_run(session, claim.run_id, self.worker_id, claim.attempt)
                except work.LeaseLostError:
                    return
                if run.status in TERMINAL[run.kind]:
                    run.lease_expires_at = None  # it ended itself, or was stopped
                    return
        except Exception:
            logger.exception("settling run %s failed", claim.run_id)
            return
        how = _exit_text(code)
        error = child.stalled or f"The run's process {how} without ending the run"
        tail = self._redacted_tail(child, claim.run_id)
        self._end(
            claim,
            status=_failed(claim.kind),
            error=error,
            message=f"{error}. Its last output:\n{tail}",
        )

    def _end(self, claim: work.Claim, *, status: str, error: str, message: str) -> None:
        database = self._database
        assert database is not None and self.worker_id is not None
        logger.warning("run %s: %s", claim.run_id, error)
        try:
            with database.transaction() as session:
                work.end_attempt(
                    session,
                    claim.run_id,
                    self.worker_id,
                    claim.attempt,
                    status=status,
                    now=self.clock(),
                    error=error,
                    message=message,
                )
        except work.LeaseLostError:
            pass
        except Exception:
            logger.exception("ending run %s failed", claim.run_id)

    def _redacted_tail(self, child: _Child, run_id: str) -> str:
        text = "\n".join(child.tail)[-TAIL_CHARS:] or "(no output)"
        redactor = Redactor()
        database = self._database
        assert database is not None
        try:
            if self._box is None:
                self._box = SecretBox(secret_key(self.settings.key_dir))
            with database.read() as session:
                run = session.get(Run, run_id)
                if run is not None:
                    redactor.add(*run_secret_values(session, run, box=self._box).values())
        except Exception:
            logger.exception("could not read run %s's secrets to hide them", run_id)
            return "(hidden: the run's secrets could not be read to redact it)"
        return gitsync.redact(redactor.redact(text))

    # --- stopping ------------------------------------------------------------------------

    def _shutdown(self) -> None:
        """Hand every held run back: its process is asked to stop, then the run released."""
        if self.children:
            logger.info("stopping: handing back %d run(s)", len(self.children))
        for child in self.children.values():
            self._terminate(child, "shutdown")
        next_beat = time.monotonic() + self.heartbeat_s
        while self.children:
            if self._stopping > 1:  # a second signal: no more waiting
                self._escalate(now=float("inf"))
            self._escalate()
            self._reap()
            if not self.children:
                break
            if time.monotonic() >= next_beat:
                self._heartbeat_only_worker()
                next_beat = time.monotonic() + self.heartbeat_s
            self._wait(0.1)

    def _heartbeat_only_worker(self) -> None:
        database, worker_id = self._database, self.worker_id
        assert database is not None and worker_id is not None
        with contextlib.suppress(Exception), database.transaction() as session:
            work.worker_alive(session, worker_id, now=self.clock())


class _Listener:
    """``LISTEN`` on PostgreSQL in a thread: each notification wakes the worker."""

    def __init__(self, database_url: str, wake: Callable[[bytes], None]) -> None:
        import psycopg
        from sqlalchemy.engine import make_url

        url = make_url(database_url).set(drivername="postgresql")
        self._connection = psycopg.connect(
            url.render_as_string(hide_password=False), autocommit=True
        )
        self._connection.execute(f"LISTEN {work.CHANNEL}")
        self._wake = wake
        self._closing = threading.Event()
        self._thread = threading.Thread(target=self._listen, name="pg-listen", daemon=True)
        self._thread.start()

    def _listen(self) -> None:
        try:
            while not self._closing.is_set():
                for _ in self._connection.notifies(timeout=1.0):
                    self._wake(b"n")
        except Exception:
            if not self._closing.is_set():
                logger.exception("PostgreSQL LISTEN stopped; polling only")

    def close(self) -> None:
        self._closing.set()
        self._thread.join(timeout=3)
        with contextlib.suppress(Exception):
            self._connection.close()


class RunStalledError(DeadlineError):
    """A run's process gave no heartbeat within the run heartbeat deadline
    (``OSMOSIS_RUN_STALL_S``): its worker killed it and failed the run."""


def _failed(kind: str) -> str:
    return "failed" if kind == "eval" else "crashed"


def _exit_text(code: int) -> str:
    if code < 0:
        with contextlib.suppress(ValueError):
            return f"was killed by {signal.Signals(-code).name}"
        return f"was killed by signal {-code}"
    return f"exited with code {code}"


# --- workers beside a server ---------------------------------------------------------------

WORKER_STOP_WAIT_S = 15.0  # a worker's own shutdown takes at most its grace and a kill


class WorkerProcesses:
    """``count`` worker processes for a server's lifetime (a context manager)."""

    def __init__(self, settings: PlatformSettings, count: int, *, slots: int = 1) -> None:
        if count < 0:
            raise ValueError(f"cannot start {count} workers")
        self.settings = settings
        self.count = count
        self.slots = slots
        self.processes: list[subprocess.Popen[bytes]] = []
        self._previous_sigterm: Any = None

    def __enter__(self) -> Self:
        if self.count and threading.current_thread() is threading.main_thread():
            # A server re-raises the SIGTERM it handled once it has shut down (uvicorn does):
            # the default action would end this process before the workers are stopped.
            self._previous_sigterm = signal.signal(signal.SIGTERM, _exit_on_sigterm)
        env = {
            **os.environ,
            DATA_DIR_ENV: str(self.settings.data_dir),
            DATABASE_URL_ENV: self.settings.database_url,  # not on the command line: ps shows it
            SINGLE_TENANT_ENV: "1" if self.settings.single_tenant else "0",
        }
        if self.settings.keys_dir is not None:
            env[KEYS_DIR_ENV] = str(self.settings.keys_dir)
        command = [
            sys.executable,
            "-m",
            "osmosis_ai.platform.worker.runner",
            "--public-url",
            self.settings.public_url,
            "--slots",
            str(self.slots),
        ]
        try:
            for _ in range(self.count):
                self.processes.append(subprocess.Popen(command, env=env, stdin=subprocess.PIPE))
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            self.stop()
        finally:
            if self._previous_sigterm is not None:
                signal.signal(signal.SIGTERM, self._previous_sigterm)
                self._previous_sigterm = None

    def stop(self) -> None:
        """SIGTERM every worker (each hands its runs back), SIGKILL one that lingers."""
        for process in self.processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + WORKER_STOP_WAIT_S
        for process in self.processes:
            try:
                process.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdin is not None:
                with contextlib.suppress(OSError):
                    process.stdin.close()


def _close_standby(process: subprocess.Popen[bytes]) -> None:
    """End an unused standby process: it holds nothing yet, so it is killed outright."""
    if process.stdin is not None:
        with contextlib.suppress(OSError):
            process.stdin.close()
    with contextlib.suppress(OSError):
        process.kill()
    process.wait()


def _exit_on_sigterm(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def configure_logging() -> None:
    """Worker lines on stderr, once per process."""
    log_to_stderr(logger, "%(asctime)s worker: %(message)s")


def main(argv: list[str] | None = None) -> int:
    """A worker started by :class:`WorkerProcesses`: settings from the environment, and it
    stops when its stdin closes."""
    parser = argparse.ArgumentParser(prog="python -m osmosis_ai.platform.worker.runner")
    parser.add_argument("--public-url", default=None)
    parser.add_argument("--slots", type=int, default=1)
    args = parser.parse_args(argv)
    configure_logging()
    worker = Worker(load_settings(public_url=args.public_url), slots=args.slots)

    def watch() -> None:
        with contextlib.suppress(OSError):  # the raw fd: a buffered read blocks the shutdown
            while os.read(0, 4096):
                pass
        worker.request_stop()

    threading.Thread(target=watch, name="server-watch", daemon=True).start()
    try:
        worker.run()
    except PlatformError as exc:
        logger.error("the worker stopped: %s", exc.message)
        return 1
    except ConfigError as exc:
        logger.error("the worker stopped: %s", exc)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
