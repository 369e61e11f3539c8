"""A managed evaluation run, executed by a worker through the same code as ``osmosis eval run``.

:func:`execute` builds the run's config from its ``[experiment]``, ``[evaluation]``,
``[advanced]``, ``[env]`` and ``[secrets]`` as submitted, checked by the rules of
``osmosis eval run``'s loader (:func:`~osmosis_ai.workspace.config.parse_eval_config`, the
checkout as its workspace), copies the dataset from the object store into the work dir,
picks the rows (``limit`` unset → every row, as ``osmosis eval run`` does; set → the first
``limit`` rows; the hosted platform of the reference samples 10 % without a limit, which
surprised users, see its known pain points) and calls
:func:`~osmosis_ai.eval.runner.run_eval` with both, the run dir under the work dir, no prompt
and no confirmation. The run's results carry ``rows``
(evaluated) and ``dataset_rows`` from the start, so ``eval info`` and the dashboard show them.

While it runs, every finished work item is stored as the run's sample (with the trajectory
and artifacts of that attempt) and every stage line and warning becomes a run log entry,
redacted of every secret value. Both are buffered and written by one thread every
:data:`FLUSH_INTERVAL_S` (or every :data:`FLUSH_ITEMS` items), so the event loop that drives
the rollouts never waits on the database.

Resuming (a new attempt of the same run): when the run dir of an earlier attempt is on this
machine, ``run_eval`` resumes from its journal, and results journaled but never stored are
stored first. Otherwise the journal is seeded from the stored samples, so only the work
items without a stored sample run. A retry (``POST …/retry``, which sets
``results.retry_failed``) also runs the failed and skipped items again.

The run ends ``finished`` when every item has a result, ``failed`` when dispatch halted on
a process-wide fault (the reason is the run's error) or the run could not start, and
``stopped`` when it was stopped (SIGTERM, or the run's status) — pending items stay pending
for a later retry or resume.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Any

from osmosis_ai.errors import ConfigError, OsmosisError
from osmosis_ai.eval.journal import JournalRecord, WorkKey, replay_journal
from osmosis_ai.eval.plan import EvalRunOptions, is_credential
from osmosis_ai.eval.progress import ItemFinishedEvent, MilestoneEvent, Tally, WarningEvent
from osmosis_ai.platform.services.work import LeaseLostError
from osmosis_ai.platform.worker.report import LogEntry, SampleRecord
from osmosis_ai.rundir.logs import Redactor
from osmosis_ai.workspace import EvalConfig, Workspace
from osmosis_ai.workspace.config import parse_eval_config

if TYPE_CHECKING:
    from osmosis_ai.eval.plan import EvalPlan
    from osmosis_ai.eval.progress import EvalEvent, EvalRunResult
    from osmosis_ai.platform.store.orm import RunSample
    from osmosis_ai.platform.worker.job import JobContext

EVAL_DIR = "eval"
DATASET_DIR = "dataset"
CONFIG_DIR = Path("configs") / "eval"
FLUSH_INTERVAL_S = 0.2
FLUSH_ITEMS = 64
TRAJECTORY_WAIT_S = 30.0
STATUS_CHECK_S = 1.0
PROGRESS_S = 1.0
RETRY_FLAG = "retry_failed"
TRAJECTORY_FILE = "trajectory.json"
ARTIFACTS_DIR = "artifacts"
LOGS_KEY = "files/logs.txt"


def execute(ctx: JobContext) -> None:
    """Run the managed evaluation ``ctx.run`` and end it (see the module docstring)."""
    _EvalJob(ctx).execute()


# --- rows ------------------------------------------------------------------------------


def managed_rows(total: int, limit: int | None) -> list[int]:
    """The source rows of a managed run: the first ``limit``, else every row."""
    return list(range(total if limit is None else min(limit, total)))


# --- forwarding results ----------------------------------------------------------------------


@dataclass
class _Finished:
    record: JournalRecord
    trial: Path
    since: float


class _Forwarder:
    """Buffers finished items and log lines; one thread stores them in batches."""

    def __init__(self, job: _EvalJob) -> None:
        self.job = job
        self.lock = threading.Lock()
        self.wake = threading.Event()
        self.closed = threading.Event()
        self.items: list[_Finished] = []
        self.logs: list[LogEntry] = []
        self.tally: Tally | None = None
        self.without_trajectory: dict[WorkKey, _Finished] = {}
        self.stored = 0
        self.cpu_s = 0.0
        self.lost = False
        self.failure: BaseException | None = None
        self._last_status_check = 0.0
        self._last_progress = 0.0
        self._thread = threading.Thread(target=self._loop, name="eval-results", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def item(self, record: JournalRecord, trial: Path, tally: Tally) -> None:
        with self.lock:
            self.items.append(_Finished(record, trial, time.monotonic()))
            self.tally = tally
            full = len(self.items) >= FLUSH_ITEMS
        if full:
            self.wake.set()

    def log(self, entry: LogEntry) -> None:
        with self.lock:
            self.logs.append(entry)

    def close(self) -> None:
        """Stop the thread, then store everything left (trajectories that came late too)."""
        self.closed.set()
        self.wake.set()
        self._thread.join()
        if not self.lost:
            self.flush(final=True)

    def _loop(self) -> None:
        while not self.closed.is_set():
            self.wake.wait(FLUSH_INTERVAL_S)
            self.wake.clear()
            if self.closed.is_set():
                return
            try:
                self.flush(final=False)
                self._check_status()
            except LeaseLostError:
                self.lost = True
                self.job.ctx.stop.set()
                return
            except Exception as exc:  # the database or the store failed: stop the run
                self.failure = exc
                self.job.ctx.stop.set()
                return
            self.job.poke()

    def flush(self, *, final: bool) -> None:
        began = time.thread_time()
        now = time.monotonic()
        with self.lock:
            items, self.items = self.items, []
            logs, self.logs = self.logs, []
            tally = self.tally
        ready: list[_Finished] = []
        for finished in items:
            if (
                final
                or finished.record.status == "failed"
                or (finished.trial / TRAJECTORY_FILE).is_file()
                or now - finished.since >= TRAJECTORY_WAIT_S
            ):
                ready.append(finished)
            else:
                with self.lock:
                    self.items.append(finished)  # its trajectory is still being written
        if final:
            late = [f for f in self.without_trajectory.values() if _has_trajectory(f.trial)]
            ready.extend(late)
        reporter = self.job.ctx.reporter
        if ready:
            samples = [self.sample(f) for f in ready]
            reporter.record_samples(samples)
            self.stored += len(samples)
            for finished, sample in zip(ready, samples, strict=True):
                key = finished.record.key
                if sample.trajectory is None:
                    self.without_trajectory[key] = finished
                else:
                    self.without_trajectory.pop(key, None)
        if logs:
            reporter.logs(logs)
        if tally is not None and ready and (final or now - self._last_progress >= PROGRESS_S):
            self._last_progress = now
            reporter.progress(
                current_step=tally.done, total_steps=tally.total, examples_processed=tally.done
            )
        self.cpu_s += time.thread_time() - began

    def sample(self, finished: _Finished) -> SampleRecord:
        record, trial = finished.record, finished.trial
        trajectory = trial / TRAJECTORY_FILE
        has_trajectory = _has_trajectory(trial)
        tokens = record.tokens
        if tokens is None and has_trajectory:
            tokens = _trajectory_tokens(trajectory)
        artifacts = trial / ARTIFACTS_DIR
        return SampleRecord(
            row_index=record.row_index,
            run_index=record.run_index,
            rollout_id=record.rollout_id,
            status=record.status,
            reward=record.reward,
            tokens=tokens,
            duration_ms=record.duration_ms,
            error_type=record.error_type,
            source_row_index=record.source_row_index,
            trajectory=trajectory if has_trajectory else None,
            artifacts=artifacts if _is_dir(artifacts) else None,
        )

    def _check_status(self) -> None:
        now = time.monotonic()
        if now - self._last_status_check < STATUS_CHECK_S:
            return
        self._last_status_check = now
        from osmosis_ai.platform.services.runs import TERMINAL

        if self.job.ctx.reporter.run().status in TERMINAL["eval"]:
            self.job.ctx.stop.set()


def _has_trajectory(trial: Path) -> bool:
    path = trial / TRAJECTORY_FILE
    return path.is_file() and not path.is_symlink()


def _is_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink()


def _trajectory_tokens(path: Path) -> int | None:
    from osmosis_ai.eval.projections import trajectory_tokens

    try:
        document = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(document, dict):
        return None
    return trajectory_tokens(document)  # pyright: ignore[reportUnknownArgumentType]


class _StopRequestedError(OsmosisError):
    """The run was stopped: dispatch halts; pending items stay pending."""


# --- the job --------------------------------------------------------------------------------


class _EvalJob:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.run = ctx.run
        self.redactor = Redactor(ctx.secret_values)
        self.redactor.add(*(v for k, v in ctx.environ.items() if is_credential(k)))
        self.forwarder = _Forwarder(self)
        self._main = threading.main_thread().ident
        self._signals = threading.current_thread() is threading.main_thread()
        self._running = True
        self._signalled = False
        self.rows: dict[str, object] = {}

    # -- the run ----------------------------------------------------------------------------

    def _prepare(self) -> EvalRunOptions | None:
        """The options of the run, its journal reconciled; ``None`` when it cannot start."""
        try:
            options = self._options()
            plan = self._reconcile(options)
            self.rows = {"rows": len(plan.rows), "dataset_rows": plan.total_rows}
            self.ctx.reporter.progress(
                total_steps=len(plan.items), results={**(self.run.results or {}), **self.rows}
            )
            self.ctx.reporter.log(
                f"Evaluating {len(plan.items)} work items ({len(plan.rows)} of "
                f"{plan.total_rows} rows x {plan.n})",
                step="eval",
                details={"rows": len(plan.rows), "retry_failed": options.retry_failed},
            )
        except LeaseLostError:
            return None
        except OsmosisError as exc:
            self._end("failed", self._redact(str(exc)))
            return None
        return options

    def execute(self) -> None:
        options = self._prepare()
        if options is None:
            return
        from osmosis_ai.eval.runner import run_eval

        if self.ctx.stop.is_set():
            self._end("stopped", None, message="Stopped before the evaluation started")
            return
        self.forwarder.start()
        result: EvalRunResult | None = None
        interrupted = False
        saved = _signal_handlers() if self._signals else {}
        try:
            result = run_eval(options, self._on_event)
        except KeyboardInterrupt:  # a second SIGTERM: the run was aborted
            interrupted = True
        except LeaseLostError:
            self.forwarder.lost = True
        except OsmosisError as exc:
            self._close_forwarder()
            if not self.forwarder.lost:
                self._end_on_error(exc)
            return
        except BaseException:
            self._close_forwarder()
            raise
        finally:
            self._running = False
            for sig, handler in saved.items():  # asyncio leaves the default ones behind
                signal.signal(sig, handler)
        self._close_forwarder()
        if self.forwarder.lost:
            return
        if self.forwarder.failure is not None:
            raise self.forwarder.failure
        self._upload_logs(options)
        if result is None or interrupted:
            self._end("stopped", None, message="Stopped: the evaluation was interrupted")
            return
        self._finish(result)

    def _end_on_error(self, exc: OsmosisError) -> None:
        """``run_eval`` failed: stopped if a stop caused it (e.g. it ended the rollout's uv
        sync), else failed."""
        reason = self._redact(str(exc))
        if self.ctx.stop.is_set():
            self._end("stopped", None, message=f"Stopped while starting up ({reason})")
        else:
            self._end("failed", reason)

    def _close_forwarder(self) -> None:
        with contextlib.suppress(LeaseLostError):
            self.forwarder.close()

    def _finish(self, result: EvalRunResult) -> None:
        reporter = self.ctx.reporter
        metrics = result.metrics
        summary = metrics.to_json()
        reporter.record_metrics(0, metric_points(summary))
        reporter.progress(
            current_step=result.total_work_items - result.pending,
            total_steps=result.total_work_items,
            examples_processed=result.total_work_items - result.pending,
            reward=metrics.reward_stats.mean if metrics.reward_stats is not None else None,
            results={
                **summary,
                "duration_ms": result.duration_ms,
                "pending": result.pending,
                **self.rows,
            },
        )
        forwarded = self.forwarder
        if forwarded.stored:
            reporter.log(
                f"Stored {forwarded.stored} samples; forwarding took "
                f"{forwarded.cpu_s * 1000 / forwarded.stored:.2f} ms CPU per sample",
                step="eval",
                details={"samples": forwarded.stored, "cpu_ms": round(forwarded.cpu_s * 1000, 3)},
            )
        stopped = self.ctx.stop.is_set() or result.cancelled
        if stopped and result.pending:
            self._end("stopped", None, message=f"Stopped with {result.pending} work items pending")
        elif result.halted is not None and result.pending:
            reason = self._redact(result.halted)
            self._end(
                "failed",
                reason,
                message=f"Dispatch halted with {result.pending} work items pending: {reason}",
            )
        elif result.pending:
            self._end("failed", f"{result.pending} work items have no result")
        else:
            rate = f"{metrics.pass_rate:.1%}"
            self._end(
                "finished",
                None,
                message=(
                    f"Finished: {metrics.passed} of {metrics.completed_samples} passed ({rate}), "
                    f"{metrics.failed} failed, {metrics.skipped} skipped"
                ),
            )

    def _end(self, status: str, error: str | None, *, message: str | None = None) -> None:
        with contextlib.suppress(LeaseLostError):
            self.ctx.reporter.end(status, error=error, message=message or error)

    def _redact(self, text: str) -> str:
        return self.redactor.redact(text)

    # -- events -------------------------------------------------------------------------------

    def _on_event(self, event: EvalEvent) -> None:
        if isinstance(event, ItemFinishedEvent):
            self.forwarder.item(event.record, event.rollout_dir, event.tally)
            if self.ctx.stop.is_set() and not self._interrupt():
                raise _StopRequestedError("the run was stopped")
        elif isinstance(event, MilestoneEvent):
            self.forwarder.log(LogEntry(self._redact(event.message), step="eval"))
            self.poke()
        elif isinstance(event, WarningEvent):
            self.forwarder.log(
                LogEntry(
                    self._redact(event.message),
                    step="eval",
                    level="warning",
                    details={"code": event.code},
                )
            )

    def poke(self) -> None:
        """Interrupt the evaluation once the run was asked to stop."""
        if self.ctx.stop.is_set():
            self._interrupt()

    def _interrupt(self) -> bool:
        """Send this process the SIGTERM ``run_eval`` drains on, if its handler is in place."""
        if self._signalled:
            return True
        if not (self._signals and self._running and _loop_handles(signal.SIGTERM)):
            return False
        self._signalled = True
        assert self._main is not None
        signal.pthread_kill(self._main, signal.SIGTERM)
        return True

    # -- preparing ------------------------------------------------------------------------------

    def _options(self) -> EvalRunOptions:
        run, ctx = self.run, self.ctx
        eval_dir = ctx.work_dir / EVAL_DIR
        eval_dir.mkdir(parents=True, exist_ok=True)
        dataset = self._dataset(ctx.work_dir / DATASET_DIR)
        from osmosis_ai.workspace import read_rows

        evaluation = dict(run.evaluation_config or {})
        limit = evaluation.get("limit")
        rows = managed_rows(len(read_rows(dataset)), limit) if isinstance(limit, int) else None
        results = run.results or {}
        return EvalRunOptions(
            config=self._config(evaluation),
            cwd=ctx.checkout,
            name=run.name,
            output_dir=eval_dir,
            dataset_file=dataset,
            rows=rows,
            retry_failed=bool(results.get(RETRY_FLAG)),
            handle_signals=self._signals,
            environ={**ctx.environ, **self._model_environment()},
        )

    def _model_environment(self) -> dict[str, str]:
        found = model_environment(self.ctx)
        self.redactor.add(*(v for k, v in found.items() if is_credential(k)))
        if found:
            self.ctx.reporter.log(
                f"The model {self.run.model_path} is deployed on this platform: the run calls "
                f"it at {found.get('OPENAI_BASE_URL', 'its serving endpoint')}",
                step="eval",
            )
        return found

    def _dataset(self, folder: Path) -> Path:
        """Copy the run's dataset from the object store (once per work dir)."""
        from osmosis_ai.platform.services.datasets import object_key, stored_file_name
        from osmosis_ai.platform.store.orm import Dataset

        reporter = self.ctx.reporter
        with reporter.database.read() as session:
            dataset = session.get(Dataset, self.run.dataset_id) if self.run.dataset_id else None
            if dataset is None or dataset.status != "uploaded":
                raise ConfigError(
                    f"the dataset {self.run.dataset_name!r} of this run is gone or not ready; "
                    "upload it again and submit a new run"
                )
            key = dataset.object_key or object_key(dataset)
            name = stored_file_name(dataset)
        folder.mkdir(parents=True, exist_ok=True)
        target = folder / name
        info = reporter.objects.stat(key)
        if target.is_file() and target.stat().st_size == info.size:
            return target
        partial = folder / f".{name}.part"
        with reporter.objects.open(key) as source, partial.open("wb") as out:
            while chunk := source.read(1 << 20):
                out.write(chunk)
        os.replace(partial, target)
        return target

    def _config(self, evaluation: dict[str, object]) -> EvalConfig:
        """The run's config as submitted, at the checkout's commit against the model of the
        run, checked as ``osmosis eval run`` checks a config file."""
        run = self.run
        experiment = {
            k: v
            for k, v in (run.experiment_config or {}).items()
            if k not in ("branch", "commit_sha")  # the checkout is at the run's commit
        }
        experiment["model_path"] = run.model_path
        tables: dict[str, object] = {
            "experiment": experiment,
            "evaluation": evaluation,
            "advanced": dict(run.advanced_config or {}),
            "env": dict(run.env_config or {}),
            "secrets": {"required": list(run.required_secrets or [])},
        }
        checkout = self.ctx.checkout
        return parse_eval_config(
            {name: table for name, table in tables.items() if table},
            path=checkout / CONFIG_DIR / f"{run.name}.toml",
            workspace=Workspace(checkout),
        )

    def _reconcile(self, options: EvalRunOptions) -> EvalPlan:
        """Make the run dir's journal and the stored samples agree before dispatch.

        Results journaled on this machine but never stored are stored; stored results the
        journal lacks (another machine ran them) are appended to it, so they do not run
        again.
        """
        from osmosis_ai.eval.plan import build_plan
        from osmosis_ai.eval.rundir import MANIFEST_FILE, open_run

        plan = build_plan(options)
        reporter = self.ctx.reporter
        stored = {(s.row_index, s.run_index): s for s in reporter.samples()}
        keys = {item.key for item in plan.items}
        local = (plan.run_dir / MANIFEST_FILE).is_file()
        if not local and not stored:
            return plan  # a first attempt: run_eval creates the run dir
        try:
            run_dir = open_run(
                plan.output_dir, plan.run_name, plan.inputs, plan.provenance, fresh=False
            )
        except ConfigError:  # inputs changed or the dir is damaged: keep it aside, start anew
            run_dir = open_run(
                plan.output_dir, plan.run_name, plan.inputs, plan.provenance, fresh=True
            )
        with run_dir:
            state = replay_journal(run_dir.journal_path)
            unstored = [
                record for key, record in state.latest.items() if key in keys and key not in stored
            ]
            if unstored:
                trials = run_dir.trials_dir
                self.forwarder.without_trajectory.clear()
                samples = [
                    self.forwarder.sample(_Finished(r, trials / r.rollout_id, 0.0))
                    for r in unstored
                ]
                reporter.record_samples(samples)
                reporter.log(
                    f"Stored {len(samples)} results an earlier attempt journaled on this machine",
                    step="eval",
                )
            missing = [
                _journal_record(sample)
                for key, sample in sorted(stored.items())
                if key in keys
                and (key not in state.latest or state.latest[key].rollout_id != sample.rollout_id)
            ]
            if missing:
                with run_dir.open_journal() as journal:
                    for record in missing:
                        journal.append(record)
        return plan

    def _upload_logs(self, options: EvalRunOptions) -> None:
        """Keep the run's ``logs.txt`` (already redacted by the run) with the run."""
        from osmosis_ai.platform.worker.report import run_prefix

        assert options.output_dir is not None and options.name is not None
        path = options.output_dir / options.name / "logs.txt"
        if path.is_file():
            with contextlib.suppress(LeaseLostError, OSError):
                self.ctx.reporter.put_file(f"{run_prefix(self.run.id)}/{LOGS_KEY}", path)


def _journal_record(sample: RunSample) -> JournalRecord:
    status = sample.status if sample.status in ("success", "failed", "skipped") else "failed"
    return JournalRecord(
        row_index=sample.row_index,
        run_index=sample.run_index,
        rollout_id=sample.rollout_id,
        status=status,  # pyright: ignore[reportArgumentType]
        duration_ms=max(0, sample.duration_ms or 0),
        source_row_index=sample.source_row_index,
        reward=sample.reward,
        tokens=sample.tokens,
        error_type=sample.error_type,
    )


def metric_points(summary: Mapping[str, object]) -> dict[str, float | None]:
    """The numbers of a metrics summary as flat metric points (``reward_mean``,
    ``pass_at_2``, …)."""
    points: dict[str, float | None] = {}
    for key, value in summary.items():
        if isinstance(value, bool):
            continue
        if isinstance(value, int | float):
            points[key] = float(value)
        elif key == "reward_stats" and isinstance(value, Mapping):
            stats: Mapping[str, object] = value  # pyright: ignore[reportUnknownVariableType]
            for stat, number in stats.items():
                if isinstance(number, int | float) and not isinstance(number, bool):
                    points[f"reward_{stat}"] = float(number)
        elif key == "pass_at_k" and isinstance(value, list):
            entries: list[object] = value  # pyright: ignore[reportUnknownVariableType]
            for entry in entries:
                if isinstance(entry, Mapping):
                    point: Mapping[str, object] = entry  # pyright: ignore[reportUnknownVariableType]
                    k, number = point.get("k"), point.get("value")
                    if isinstance(k, int) and isinstance(number, int | float):
                        points[f"pass_at_{k}"] = float(number)
    return points


def model_environment(ctx: JobContext) -> dict[str, str]:
    """Where the model of the run is served, when it is a model deployed on this platform.

    A ``model_path`` of ``openai/<name>`` naming a model deployed in the run's workspace is
    reached through the platform's OpenAI-compatible endpoint with the workspace's serving
    key (:func:`~osmosis_ai.platform.services.deployments.eval_model_environment`).
    Otherwise the run's own ``[env]`` and secrets (``OPENAI_BASE_URL``, ``OPENAI_API_KEY``,
    provider keys) say where the model is, as for ``osmosis eval run``, and nothing is added.
    """
    from osmosis_ai.platform.services.deployments import eval_model_environment

    return eval_model_environment(ctx.reporter.database, ctx.run, ctx.settings)


def _signal_handlers() -> dict[signal.Signals, Callable[[int, FrameType | None], Any] | int]:
    """The SIGINT and SIGTERM handlers in place (to put back after ``run_eval``)."""
    found: dict[signal.Signals, Callable[[int, FrameType | None], Any] | int] = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        handler = signal.getsignal(sig)
        if handler is not None:
            found[sig] = handler
    return found


def _loop_handles(sig: signal.Signals) -> bool:
    """Whether an asyncio loop's handler is installed for ``sig`` (``run_eval`` draining)."""
    handler = signal.getsignal(sig)
    return getattr(handler, "__name__", "") == "_sighandler_noop"
