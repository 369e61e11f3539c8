"""A managed training run on a worker: ``osmosis train run``'s code path, reported live.

The run's sections (as submitted and stored on the run) make its training config, checked
by the rules of ``osmosis train run``'s loader
(:func:`~osmosis_ai.workspace.config.parse_training_config`, the checkout as its
workspace), the dataset is copied from the object store into the run's work dir, and the
base model is the registered platform model's folder. Then
:func:`osmosis_ai.train.runner.run_training` trains, with its run directory at
``<work_dir>/training/<run name>/``. While it runs:

* every step's metrics go to the run's metric points (platform keys, see
  :mod:`osmosis_ai.platform.training_metrics`) and its progress fields;
* every checkpoint it saves is uploaded (``runs/<id>/checkpoints/step-<N>/``), recorded, and
  registered as a trained model (``<run name>-step-<N>``) a deployment can serve; the
  trainer's resumable state goes with it under ``runs/<id>/files/state-<N>/`` (pointed at by
  ``runs/<id>/files/state.json``), so another machine can resume;
* stages and warnings go to the run's logs.

Stop (``ctx.stop``): the step in flight finishes, the trainer saves, the last checkpoint is
recorded, and the run ends ``stopped``. A run the trainer stopped for want of a learning
signal keeps its checkpoints too, and ends ``failed`` with the error
``no_learning_signal: …``. A new attempt resumes from the run dir left on this machine,
else from the state in the object store, else starts over; a run that cannot be resumed
ends ``crashed`` saying why. Bad configs, datasets or models end ``failed``.
"""

from __future__ import annotations

import json
import math
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from osmosis_ai.errors import OsmosisError
from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.services import work
from osmosis_ai.platform.store.orm import Dataset, Model
from osmosis_ai.platform.worker.job import JobContext
from osmosis_ai.platform.worker.report import run_prefix
from osmosis_ai.rundir.logs import Redactor

if TYPE_CHECKING:
    from osmosis_ai.workspace import TrainingConfig

CONFIG_DIR = Path("configs") / "training"
STATE_POINTER = "files/state.json"
_CHECKPOINT = re.compile(r"^step-(\d+)$")
_RESUME_POINT = re.compile(r"^checkpoint-(\d+)$")
_LOG_STEP = "train"


class JobError(OsmosisError):
    """The run cannot go on, for a reason its owner can fix (the message says which)."""

    def __init__(self, message: str, *, status: str = "failed") -> None:
        super().__init__(message)
        self.status = status


def execute(ctx: JobContext) -> None:
    """Train the run of ``ctx`` to its end; ends the run itself (finished, stopped, failed,
    crashed), and raises only on errors it does not understand."""
    _TrainJob(ctx).execute()


class _TrainJob:
    def __init__(self, ctx: JobContext) -> None:
        self.ctx = ctx
        self.reporter = ctx.reporter
        self.run = ctx.run
        self.output = ctx.work_dir / "training"
        self.run_dir = self.output / self.run.name
        self.recorded = {c.step for c in self.reporter.checkpoints()}
        self.rewards: dict[int, float | None] = {}
        self.batch = 1
        self.state_step: int | None = None

    # -- the run ---------------------------------------------------------------------------

    def execute(self) -> None:
        from osmosis_ai.errors import ConfigError, UsageError
        from osmosis_ai.train.errors import TrainingError

        try:
            options = self._options()
            result = self._train(options)
        except JobError as exc:
            self._end(exc.status, str(exc))
            return
        except (ConfigError, UsageError, TrainingError) as exc:
            self._end("failed", f"{type(exc).__name__}: {self._redact(str(exc))}")
            return
        self._collect_checkpoints()
        self._save_state()
        if result.status == "interrupted":
            kept = max(self.recorded, default=None)
            where = f"; checkpoint step-{kept} kept" if kept is not None else ""
            self._end("stopped", f"Stopped after step {result.steps_done}{where}")
            return
        if result.status == "failed":  # it ran, saved, and did not do its job (the reason)
            self._end("failed", f"{result.error}: {self._redact(str(result.error_message))}")
            return
        start, end = result.reward_start, result.reward_end
        self._end(
            "finished",
            f"Finished: {result.steps_done} of {result.total_steps} steps, training reward "
            f"{_shown(start)} → {_shown(end)}",
        )

    def _train(self, options: Any) -> Any:
        from osmosis_ai.errors import UsageError
        from osmosis_ai.train.plan import build_plan
        from osmosis_ai.train.runner import run_training

        plan = build_plan(options)
        self.batch = plan.batch
        self.reporter.progress(total_steps=plan.steps)
        try:
            return run_training(options, self._on_event)
        except UsageError as exc:
            if options.resume:  # the saved state does not fit the run any more
                raise JobError(
                    f"Could not resume the run: {self._redact(str(exc))}", status="crashed"
                ) from exc
            raise

    def _end(self, status: str, message: str) -> None:
        error = message if status in ("failed", "crashed") else None
        self.reporter.end(status, error=error, message=message)

    # -- inputs ----------------------------------------------------------------------------

    def _options(self) -> Any:
        from osmosis_ai.train.plan import TrainRunOptions

        model_dir = self._model_dir()
        dataset = self._dataset()
        config = self._config(model_dir)
        resume = self._restore()
        return TrainRunOptions(
            config=config,
            cwd=self.ctx.checkout,
            name=self.run.name,
            output=self.output,
            dataset_file=dataset,
            resume=resume,
            environ=dict(self.ctx.environ),
            handle_signals=False,
            stop=self.ctx.stop,
        )

    def _model_dir(self) -> Path:
        run = self.run
        with self.reporter.database.read() as session:
            model = session.get(Model, run.model_id) if run.model_id else None
            path = model.path if model is not None else None
            name = model.name if model is not None else run.model_path
        if path is None:
            raise JobError(
                f"The base model {run.model_path!r} is not registered on this platform; an admin "
                "adds it with: osmosis platform model add NAME --path DIR"
            )
        folder = Path(path)
        if not (folder / "config.json").is_file():
            raise JobError(
                f"The base model {name!r} points at {folder}, which holds no config.json on this "
                "machine; register the folder of a Hugging Face model"
            )
        return folder

    def _dataset(self) -> Path:
        run, objects = self.run, self.reporter.objects
        with self.reporter.database.read() as session:
            dataset = session.get(Dataset, run.dataset_id) if run.dataset_id else None
            found = (
                (dataset.object_key, dataset.file_name, dataset.extension, dataset.status)
                if dataset is not None
                else None
            )
        key = found[0] if found is not None else None
        if found is None or key is None or found[3] != "uploaded":
            raise JobError(
                f"The dataset {run.dataset_name!r} is not available (deleted, or not uploaded); "
                "upload it again and submit a new run"
            )
        _, file_name, extension, _ = found
        target = self.ctx.work_dir / "dataset" / f"{Path(file_name).name}.{extension}"
        size = objects.stat(key).size
        if not target.is_file() or target.stat().st_size != size:
            target.parent.mkdir(parents=True, exist_ok=True)
            temp = target.with_name(f".{target.name}.part")
            with objects.open(key) as source, temp.open("wb") as sink:
                shutil.copyfileobj(source, sink, 1 << 20)
            temp.replace(target)
        return target

    def _config(self, model_dir: Path) -> TrainingConfig:
        """The run's sections as a training config, named
        ``configs/training/.platform-<run>.toml`` in the checkout (no file is written)."""
        from osmosis_ai.workspace import Workspace
        from osmosis_ai.workspace.config import parse_training_config

        run = self.run
        tables: dict[str, dict[str, object]] = {
            "experiment": {
                "rollout": run.rollout_name,
                "entrypoint": run.entrypoint,
                "model_path": str(model_dir.resolve()),
                "dataset": run.dataset_name,
            },
            "training": dict(run.training_config or {}),
            "sampling": dict(run.sampling_config or {}),
            "checkpoints": dict(run.checkpoints_config or {}),
            "advanced": dict(run.advanced_config or {}),
            "env": dict(run.env_config or {}),
            "secrets": {"required": list(run.required_secrets or [])},
        }
        checkout = self.ctx.checkout
        return parse_training_config(
            {name: table for name, table in tables.items() if table},
            path=checkout / CONFIG_DIR / f".platform-{run.name}.toml",
            workspace=Workspace(checkout),
        )

    # -- resuming --------------------------------------------------------------------------

    def _restore(self) -> bool:
        """Whether to resume: the run dir is here, or was fetched from the object store."""
        if (self.run_dir / "run.json").is_file():
            if self.ctx.resumed:
                self.reporter.log(
                    "Resuming from the run directory an earlier attempt left on this machine",
                    step=_LOG_STEP,
                )
            return True
        if not self.ctx.resumed:
            return False
        objects = self.reporter.objects
        pointer_key = f"{run_prefix(self.run.id)}/{STATE_POINTER}"
        if not objects.exists(pointer_key):
            self.reporter.log(
                "An earlier attempt saved no resumable state: training starts over",
                step=_LOG_STEP,
                level="warning",
            )
            return False
        try:
            with objects.open(pointer_key) as handle:
                pointer = json.loads(handle.read())
            prefix = str(pointer["prefix"]).rstrip("/") + "/"
            step = int(pointer["step"])
            stored = objects.list(prefix)
            if not stored:
                raise ValueError(f"no files under {prefix}")
            for info in stored:
                target = self.run_dir / info.key[len(prefix) :]
                target.parent.mkdir(parents=True, exist_ok=True)
                with objects.open(info.key) as source, target.open("wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            shutil.rmtree(self.run_dir, ignore_errors=True)
            raise JobError(
                f"Could not resume the run: its saved state in the object store is unreadable "
                f"({type(exc).__name__}: {exc})",
                status="crashed",
            ) from exc
        self.state_step = step
        self.reporter.log(
            f"Resuming from the state saved at step {step} (fetched from the object store)",
            step=_LOG_STEP,
        )
        return True

    def _save_state(self) -> None:
        """Upload the trainer's newest resumable state (with the run manifest and metrics),
        then point ``files/state.json`` at it and drop the older one."""
        resume = self.run_dir / "resume"
        points = (
            sorted(
                (int(m.group(1)), p)
                for p in resume.iterdir()
                if (m := _RESUME_POINT.match(p.name)) and (p / "trainer_state.json").is_file()
            )
            if resume.is_dir()
            else []
        )
        if not points:
            return
        step, point = points[-1]
        if step == self.state_step:
            return
        reporter, base = self.reporter, run_prefix(self.run.id)
        prefix = f"{base}/files/state-{step}"
        reporter.objects.delete_prefix(prefix + "/")
        for name in ("run.json", "metrics.jsonl"):
            if (self.run_dir / name).is_file():
                reporter.put_file(f"{prefix}/{name}", self.run_dir / name)
        reporter.put_tree(f"{prefix}/resume/{point.name}", point)
        reporter.objects.put(
            f"{base}/{STATE_POINTER}", json.dumps({"step": step, "prefix": prefix}).encode()
        )
        if self.state_step is not None:
            reporter.objects.delete_prefix(f"{base}/files/state-{self.state_step}/")
        self.state_step = step

    # -- events ----------------------------------------------------------------------------

    def _on_event(self, event: object) -> None:
        from osmosis_ai.train.events import (
            LogEvent,
            StageEvent,
            StepEvent,
            ValidationEvent,
            WarmupEvent,
            WarningEvent,
        )

        reporter = self.reporter
        if isinstance(event, StepEvent):
            values = training_metrics.step_values(event.metrics)
            reward = training_metrics.finite(event.metrics.get("training_reward"))
            self.rewards[event.step] = reward
            reporter.record_metrics(event.step, values)
            reporter.progress(
                current_step=event.step,
                total_steps=event.total,
                examples_processed=event.step * self.batch,
                reward=reward,
            )
            self._collect_checkpoints()
        elif isinstance(event, ValidationEvent):
            summary = event.summary
            values = {
                training_metrics.wire_key("validation_reward"): summary.mean_reward,
                "validation_pass_rate": summary.pass_rate,
            }
            if summary.policy_version is not None:  # validated beside asynchronous training
                values["validation_policy_version"] = summary.policy_version
            reporter.record_metrics(summary.step, values)
            reporter.log(
                f"Validation at step {summary.step}: reward {_shown(summary.mean_reward)}, "
                f"pass rate {_shown(summary.pass_rate)} over {summary.scored} rollouts",
                step=_LOG_STEP,
            )
        elif isinstance(event, WarningEvent):
            reporter.log(
                event.message, step=_LOG_STEP, level="warning", details={"code": event.code}
            )
        elif isinstance(event, StageEvent):
            reporter.log(event.message, step=_LOG_STEP)
        elif isinstance(event, LogEvent):
            reporter.log(event.line, step=_LOG_STEP)
        elif isinstance(event, WarmupEvent) and event.step == event.total:
            reporter.log(f"Warm-up done: {event.total} supervised steps", step=_LOG_STEP)

    def _collect_checkpoints(self) -> None:
        """Record every checkpoint the runner exported since the last look."""
        folder = self.run_dir / "checkpoints"
        if not folder.is_dir():
            return
        found = sorted(
            (int(m.group(1)), p)
            for p in folder.iterdir()
            if (m := _CHECKPOINT.match(p.name)) and p.is_dir()
        )
        new = [(step, path) for step, path in found if step not in self.recorded]
        for step, path in new:
            reward = self.rewards.get(step)
            checkpoint = self.reporter.record_checkpoint(step, path, reward=reward)
            self._register_model(step, checkpoint.object_prefix, reward)
            self.recorded.add(step)
            self.reporter.log(
                f"Saved checkpoint {checkpoint.name} (step {step})",
                step=_LOG_STEP,
                details={"step": step, "reward": reward},
            )
        if new:
            self._save_state()

    def _register_model(self, step: int, object_prefix: str, reward: float | None) -> None:
        from osmosis_ai.platform.services.training_results import register_checkpoint_model

        reporter = self.reporter
        with reporter.database.transaction() as session:
            run = work.held_run(session, reporter.run_id, reporter.worker_id, reporter.attempt)
            register_checkpoint_model(
                session, run, step=step, path=object_prefix, reward=reward, now=reporter.clock()
            )

    def _redact(self, text: str) -> str:
        return Redactor(self.ctx.secret_values).redact(text)


def _shown(value: float | None) -> str:
    return "n/a" if value is None or not math.isfinite(value) else f"{value:.3f}"
