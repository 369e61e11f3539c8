"""One attempt of one run, in its own process: ``python -m osmosis_ai.platform.worker.execute
SPEC.json``, or started ahead of a claim with ``--standby`` (it imports what runs need, then
reads the spec's path from its stdin, so a claimed run does not wait for an interpreter to
start).

The worker (:mod:`osmosis_ai.platform.worker.runner`) starts this process in a session of
its own, with its stdin a pipe it never writes to. The process:

1. reads the spec (:class:`RunSpec`), opens the database and the object store, and reports
   through a :class:`~osmosis_ai.platform.worker.report.RunReporter` fenced by the attempt;
2. checks the code out (:mod:`~osmosis_ai.platform.worker.checkout`), resolves the run's
   secrets and ``[env]``, and builds the :class:`~osmosis_ai.platform.worker.job.JobContext`;
3. calls the job (``eval_job.execute`` or ``train_job.execute``, or the spec's ``job``),
   which ends the run itself. An error it raises ends the run ``failed`` (eval) or
   ``crashed`` (training) with the redacted traceback in the run's logs.

Signals and the worker: SIGTERM sets ``ctx.stop`` (the job stops its rollout server and
returns). SIGUSR1 (sent just before SIGTERM) means the worker is shutting down: the run is
then not ended but handed back, so another worker resumes it. End of file on stdin means the
worker died: this process kills everything it started and itself, and the run's lease runs out.
The worker starts this process without the platform's own settings (``OSMOSIS_PLATFORM_*``:
database URL, secret key): they come in the spec, a file only the worker's user reads.

Unless the platform is single-tenant (the spec's ``isolation``), the workspace's code (its
rollout server with its grader, and the build of its environment) runs contained
(:mod:`osmosis_ai.controller.containment`): this process puts the policy in its own
environment, where :class:`~osmosis_ai.controller.rollout_process.RolloutServerProcess` (here
or in a training run's rollout I/O process) finds it. The contained process sees the system
read-only, the run's checkout read-only, and writes only its artifacts folder and a private
home; never the data dir, the keys, the database or another run's folder; its environment is
an allowlist plus the run's ``[env]`` and secrets. This process, which holds the database,
never imports the workspace's modules.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import logging
import os
import signal
import socket
import sys
import threading
import traceback
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

from osmosis_ai.controller import containment
from osmosis_ai.controller.rollout_process import ENV_CACHE_ENV
from osmosis_ai.platform import gitsync
from osmosis_ai.platform.crypto import SECRET_KEY_ENV, SecretBox, secret_key
from osmosis_ai.platform.objects import ObjectStore
from osmosis_ai.platform.services.runs import TERMINAL, run_secret_values
from osmosis_ai.platform.services.work import LeaseLostError
from osmosis_ai.platform.settings import KEY_FILES, SQLITE_FILE, PlatformSettings, load_settings
from osmosis_ai.platform.store.database import open_database
from osmosis_ai.platform.store.orm import Run
from osmosis_ai.platform.worker import liveness
from osmosis_ai.platform.worker.checkout import checkout_run
from osmosis_ai.platform.worker.job import JobContext
from osmosis_ai.platform.worker.report import RunReporter
from osmosis_ai.procs import kill_descendants
from osmosis_ai.rundir.logs import Redactor

DEFAULT_JOBS: Mapping[str, str] = {
    "eval": "osmosis_ai.platform.worker.eval_job:execute",
    "training": "osmosis_ai.platform.worker.train_job:execute",
}
RELEASE_SIGNAL = signal.SIGUSR1
PLATFORM_ENV_PREFIX = "OSMOSIS_PLATFORM_"
ENVS_DIR = "envs"
HOME_DIR = "home"
CONTAINED = "bubblewrap"
UNCONTAINED = "none"
TRACEBACK_CHARS = 6000
EXIT_LEASE_LOST = 3
EXIT_FAILED = 1


@dataclass(frozen=True)
class RunSpec:
    """What the worker tells the process executing one attempt (written as JSON, mode 600:
    the database URL may hold a password)."""

    run_id: str
    kind: str
    worker_id: str
    attempt: int
    resumed: bool
    data_dir: str
    database_url: str
    public_url: str
    work_dir: str
    job: str
    isolation: str = CONTAINED  # or UNCONTAINED: the platform is single-tenant
    keys_dir: str | None = None
    bwrap: str = "bwrap"
    sandbox_uid: int | None = None  # the uid contained code runs as (a root worker)
    secret_key: str | None = None  # the worker's OSMOSIS_PLATFORM_SECRET_KEY, if it has one

    def write(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            json.dump(asdict(self), handle, indent=2)

    @classmethod
    def read(cls, path: Path) -> RunSpec:
        data: dict[str, Any] = json.loads(path.read_text())
        return cls(**data)


def work_dir_of(data_dir: Path, run_id: str) -> Path:
    """A run's persistent folder on this machine."""
    return data_dir / "work" / "runs" / run_id


def load_job(path: str) -> Callable[[JobContext], None]:
    """The function ``module:name`` names."""
    module_name, _, attribute = path.partition(":")
    if not module_name or not attribute:
        raise ValueError(f"job {path!r} is not module:function, e.g. package.module:execute")
    module = importlib.import_module(module_name)
    job = getattr(module, attribute, None)
    if not callable(job):
        raise ValueError(f"{module_name} has no function {attribute!r}")
    return cast("Callable[[JobContext], None]", job)


class AttemptReporter(RunReporter):
    """The reporter the job is given: once the worker asked for the run back (SIGUSR1),
    ending the run other than ``finished`` hands it back instead (the worker releases it)."""

    def __init__(self, *args: Any, releasing: threading.Event, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.releasing = releasing

    def end(self, status: str, *, error: str | None = None, message: str | None = None) -> None:
        if self.releasing.is_set() and status != "finished":
            self.log(
                "Stopped for a worker shutting down: another worker resumes the run",
                step="worker",
            )
            return
        super().end(status, error=error, message=message)


STANDBY = "--standby"

logger = logging.getLogger("osmosis_ai.platform.worker.execute")


def log_to_stderr(target: logging.Logger, line_format: str) -> None:
    """``target``'s records of INFO and up as ``line_format`` lines on stderr, once per
    process, and nowhere else."""
    if not target.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter(line_format))
        target.addHandler(handler)
        target.setLevel(logging.INFO)
        target.propagate = False


def configure_logging() -> None:
    """This process's lines on stderr, as they are: the worker copies them into the attempt's
    log and keeps the last ones for a crash's message."""
    log_to_stderr(logger, "%(message)s")


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    configure_logging()
    if args == [STANDBY]:
        # Started ahead of any claim, so a claimed run skips this interpreter's start-up:
        # import what runs need, then wait for the spec's path on stdin (end of file: the
        # worker went away or did not need this process).
        _warm_up()
        line = _read_line(0)
        if not line:
            return 0
        args = [line]
        os.chdir(Path(line).parent)  # the run's work dir holds its spec
    if len(args) != 1:
        logger.error("usage: python -m osmosis_ai.platform.worker.execute SPEC.json | %s", STANDBY)
        return 2
    spec = RunSpec.read(Path(args[0]))
    liveness.start_beating(liveness.beat_path(Path(spec.work_dir), spec.attempt))
    stop = threading.Event()
    releasing = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())

    def release(signum: int, frame: object) -> None:
        releasing.set()
        stop.set()

    signal.signal(RELEASE_SIGNAL, release)
    threading.Thread(target=_watch_worker, name="worker-watch", daemon=True).start()
    try:
        return _execute(spec, stop, releasing)
    finally:
        kill_descendants()  # nothing this attempt started outlives it


def _warm_up() -> None:
    """Import the default jobs and what they run on (not the training libraries, which
    a training job loads itself)."""
    for path in DEFAULT_JOBS.values():
        importlib.import_module(path.partition(":")[0])
    importlib.import_module("osmosis_ai.eval.runner")


def _read_line(fd: int) -> str:
    """One line from ``fd`` without buffering past it ('' at end of file)."""
    data = bytearray()
    while not data.endswith(b"\n"):
        chunk = os.read(fd, 1)
        if not chunk:
            return ""
        data += chunk
    return data.decode().strip()


def _watch_worker() -> None:
    """Wait for the end of stdin: the worker died (or closed it after this process ended)."""
    with contextlib.suppress(OSError):  # the raw fd: a buffered read blocks the shutdown
        while os.read(0, 4096):
            pass
    with contextlib.suppress(OSError):  # the worker read our output: likely gone too
        os.write(2, b"the worker is gone: stopping this run's processes\n")
    try:
        kill_descendants()
    finally:
        os.killpg(os.getpgrp(), signal.SIGKILL)


def _execute(spec: RunSpec, stop: threading.Event, releasing: threading.Event) -> int:
    for name in [n for n in os.environ if n.startswith(PLATFORM_ENV_PREFIX)]:
        del os.environ[name]
    settings = load_settings(
        data_dir=spec.data_dir,
        database_url=spec.database_url,
        public_url=spec.public_url,
        keys_dir=spec.keys_dir,
        single_tenant=spec.isolation == UNCONTAINED,
    )
    given = {SECRET_KEY_ENV: spec.secret_key} if spec.secret_key else {}
    box = SecretBox(secret_key(settings.key_dir, environ=given))
    database = open_database(settings, migrate=False)
    reporter = AttemptReporter(
        database,
        ObjectStore(settings.objects_dir),
        run_id=spec.run_id,
        worker_id=spec.worker_id,
        attempt=spec.attempt,
        releasing=releasing,
    )
    redactor = Redactor()
    phase = "setup"
    try:
        run = reporter.run()
        phase = "checkout"
        checkout = _checkout(spec, settings, reporter, run)
        phase = "environment"
        ctx = _context(
            spec, settings, reporter, run, checkout, box=box, redactor=redactor, stop=stop
        )
        if stop.is_set():
            reporter.end("stopped", message=f"Stopped during {phase}, before the job started")
            return 0
        job = load_job(spec.job)
        phase = "run"
        job(ctx)
        _after_job(reporter, spec, stop)
        return 0
    except LeaseLostError as exc:
        logger.warning("run %s: %s", spec.run_id, exc)
        return EXIT_LEASE_LOST
    except BaseException as exc:
        _fail(reporter, spec, phase, exc, redactor=redactor, stop=stop)
        return 0 if stop.is_set() else EXIT_FAILED
    finally:
        database.dispose()


def _checkout(spec: RunSpec, settings: PlatformSettings, reporter: RunReporter, run: Run) -> Path:
    work_dir = Path(spec.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    how = f"resuming after a lost worker (attempt {spec.attempt})" if spec.resumed else "new"
    reporter.log(
        f"Preparing the run on {socket.gethostname()} (pid {os.getpid()}, {how})",
        step="setup",
        details={"attempt": spec.attempt, "work_dir": str(work_dir)},
    )
    checkout = checkout_run(
        reporter.database,
        settings,
        workspace_id=run.workspace_id,
        commit_sha=run.commit_sha,
        work_dir=work_dir,
    )
    where = "reused the checkout at" if checkout.reused else "checked out"
    fetched = " (fetched the repository first)" if checkout.fetched else ""
    reporter.log(
        f"Code: {where} {run.commit_sha[:12]}{fetched}, rollout {run.rollout_name} "
        f"({run.entrypoint})",
        step="checkout",
        details={"commit_sha": run.commit_sha, "path": str(checkout.path)},
    )
    return checkout.path


def _context(
    spec: RunSpec,
    settings: PlatformSettings,
    reporter: RunReporter,
    run: Run,
    checkout: Path,
    *,
    box: SecretBox,
    redactor: Redactor,
    stop: threading.Event,
) -> JobContext:
    """The job's context: the environment is this process's (less ``VIRTUAL_ENV``; contained,
    only its allowlisted part), then the run's ``[env]``, then its secrets."""
    with reporter.database.read() as session:
        secrets = run_secret_values(session, run, box=box)
    redactor.add(*secrets.values())
    env = dict(run.env_config or {})
    reporter.log(
        f"Environment: [env] sets {_names(env)}; secrets {_names(secrets)} (values hidden)",
        step="environment",
        details={"env": sorted(env), "secrets": sorted(secrets)},
    )
    # uv environments of isolated rollouts are shared by the runs of one workspace on this
    # machine, keyed by the rollout's lock files (see controller/rollout_process.py).
    os.environ[ENV_CACHE_ENV] = str(Path(spec.data_dir) / ENVS_DIR / run.workspace_id)
    inherited = {k: v for k, v in os.environ.items() if k != "VIRTUAL_ENV"}
    if spec.isolation != UNCONTAINED:
        policy = contain_policy(spec, settings, checkout)
        os.environ[containment.CONTAINMENT_ENV] = policy.to_json()
        inherited = policy.environment(os.environ, {})
        reporter.log(
            "Isolation: the rollout server and its environment build run in bubblewrap "
            f"(uid {policy.uid if policy.uid is not None else os.getuid()} outside, own user, "
            "PID and IPC namespaces, no capabilities); they see the checkout read-only and "
            "write only their artifacts and home",
            step="environment",
        )
    else:
        reporter.log(
            "Isolation: none (the platform is single-tenant): the rollout server runs with "
            "this worker's user and environment",
            step="environment",
            level="warning",
        )
    values = tuple(sorted({v for v in secrets.values() if v}, key=len, reverse=True))
    return JobContext(
        settings=settings,
        run=run,
        attempt=spec.attempt,
        resumed=spec.resumed,
        checkout=checkout,
        work_dir=Path(spec.work_dir),
        environ={**inherited, **env, **secrets},
        secret_values=values,
        reporter=reporter,
        stop=stop,
    )


def contain_policy(
    spec: RunSpec, settings: PlatformSettings, checkout: Path
) -> containment.Containment:
    """What a run's contained processes may see: the system and the checkout read-only, a
    private home; never the data dir, the keys, the database, the operator's home."""
    hidden = {str(settings.data_dir), os.path.expanduser("~"), "/root", str(settings.key_dir)}
    hidden.update(p for p in ("/run/postgresql", "/var/run/postgresql") if os.path.isdir(p))
    files = [str(settings.key_dir / name) for name in KEY_FILES]
    database = settings.database_url.removeprefix("sqlite:///")
    if database != settings.database_url:
        files += [database, f"{database}-wal", f"{database}-shm"]
    files.append(str(settings.data_dir / SQLITE_FILE))
    return containment.Containment(
        home=str(Path(spec.work_dir) / HOME_DIR),
        hidden=tuple(sorted(hidden)),
        hidden_files=tuple(files),
        read_only=(str(checkout),),
        uid=spec.sandbox_uid if os.geteuid() == 0 else None,
        bwrap=spec.bwrap,
    )


def _after_job(reporter: RunReporter, spec: RunSpec, stop: threading.Event) -> None:
    """A job returned: a run it left open is stopped (if asked to) or failed."""
    with contextlib.suppress(LeaseLostError):
        run = reporter.run()
        if run.status in TERMINAL[run.kind]:
            return
        if stop.is_set():
            reporter.end("stopped", message="Stopped")
            return
        problem = "The run's job returned without ending the run"
        reporter.end(_failed(spec), error=problem, message=problem)


def _fail(
    reporter: RunReporter,
    spec: RunSpec,
    phase: str,
    exc: BaseException,
    *,
    redactor: Redactor,
    stop: threading.Event,
) -> None:
    """End the run after ``exc``: stopped if a stop was asked for, else failed/crashed, with
    the redacted traceback in its logs."""

    def clean(text: str) -> str:
        return gitsync.redact(redactor.redact(text))

    error = clean(f"{type(exc).__name__}: {exc}")
    trace = clean("".join(traceback.format_exception(exc)))[-TRACEBACK_CHARS:]
    logger.error("%s", trace)
    try:
        if stop.is_set():
            reporter.log(trace, step=phase, level="warning")
            reporter.end("stopped", message=f"Stopped during {phase}")
            return
        reporter.log(trace, step=phase, level="error")
        reporter.end(_failed(spec), error=error, message=f"The run failed during {phase}: {error}")
    except LeaseLostError as lost:
        logger.warning("run %s: %s", spec.run_id, lost)


def _failed(spec: RunSpec) -> str:
    return "failed" if spec.kind == "eval" else "crashed"


def _names(values: Mapping[str, str]) -> str:
    return ", ".join(sorted(values)) if values else "nothing"


def _exit(code: int) -> None:
    """Exit now, whatever threads the job left running (they would hold the process, and
    its run's slot, until they end)."""
    lingering = [
        t.name
        for t in threading.enumerate()
        if t.is_alive() and not t.daemon and t is not threading.main_thread()
    ]
    if lingering:
        logger.warning("exiting with threads still running: %s", ", ".join(lingering))
    with contextlib.suppress(OSError, ValueError):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    _exit(main())
