"""Metric trackers a config names in ``report_to``: TensorBoard, MLflow, W&B, trackio.

One code path for ``osmosis train run`` (per-step metrics, the names ``metrics.jsonl``
uses), managed training runs (the same runner), and ``osmosis eval run`` (its final
metrics). Every tracker writes locally unless told otherwise:

* ``tensorboard``: event files under ``<run dir>/tensorboard/`` (``tensorboard --logdir``);
* ``mlflow``: the tracking URI of ``[advanced] mlflow_tracking_uri``, else of
  ``MLFLOW_TRACKING_URI``, else a SQLite store ``<run dir>/mlflow/mlflow.db``;
* ``wandb``: an offline run under ``<run dir>/wandb/`` (``wandb sync`` uploads it later);
  no server is contacted;
* ``trackio``: trackio's local database (``TRACKIO_DIR``, default the Hugging Face cache;
  ``trackio show``).

Each library is imported only when its target is opened, and a missing one is a
:class:`~osmosis_ai.errors.MissingExtraError` naming the ``trackers`` extra, raised before
the run starts (:func:`require_installed`). A tracker that fails while logging is closed
with one warning and the run goes on: the run's own files stay the record.
"""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import math
import os
import re
import secrets
import time
import warnings
from collections.abc import Callable, Generator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Literal

from osmosis_ai.errors import ConfigError, MissingExtraError
from osmosis_ai.rundir.durable import atomic_write_json

EXTRA = "trackers"
STATE_FILE = "trackers.json"
# target -> the modules it needs (the first is the one named when missing)
TARGET_MODULES: dict[str, tuple[str, ...]] = {
    "tensorboard": ("tensorboard",),
    "mlflow": ("mlflow", "sqlalchemy", "alembic"),
    "wandb": ("wandb",),
    "trackio": ("trackio",),
}
MLFLOW_URI_KEY = "mlflow_tracking_uri"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")

RunKind = Literal["train", "eval"]
Notify = Callable[[str], None]


def require_installed(
    targets: Sequence[str],
    feature: str,
    environ: Mapping[str, str],
    *,
    mlflow_uri: str | None = None,
) -> None:
    """Fail before a run starts when a named tracker's library is missing.

    MLflow's SQLAlchemy and Alembic are needed only for its local SQLite store (no
    ``mlflow_uri`` and no ``MLFLOW_TRACKING_URI``)."""
    for target in targets:
        modules = TARGET_MODULES.get(target)
        if modules is None:
            known = ", ".join(repr(t) for t in TARGET_MODULES)
            raise ConfigError(f"report_to lists {target!r}, which is not one of {known}")
        if target == "mlflow" and (mlflow_uri or environ.get("MLFLOW_TRACKING_URI")):
            modules = modules[:1]
        for module in modules:
            if importlib.util.find_spec(module) is None:
                raise MissingExtraError(EXTRA, f"{feature} with report_to = [{target!r}]", module)


def mlflow_tracking_uri(advanced: Mapping[str, object]) -> str | None:
    """``[advanced] mlflow_tracking_uri``, checked (a non-empty string) or ``None``."""
    value = advanced.get(MLFLOW_URI_KEY)
    if value is None:
        return None
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(
            f"advanced.{MLFLOW_URI_KEY} must be a non-empty string (a tracking URI such as "
            f"'http://127.0.0.1:5000' or 'sqlite:///mlflow.db'), got {value!r}"
        )
    return value.strip()


@dataclass(frozen=True)
class TrackedRun:
    """What the trackers need to know about the run they record."""

    kind: RunKind
    name: str
    run_dir: Path
    project: str  # the W&B project, MLflow experiment and trackio project
    config: Mapping[str, object]  # logged as params / config (no secret values)
    resumed: bool = False
    resume_step: int | None = None  # steps after it are dropped where a tracker can do so
    environ: Mapping[str, str] = field(default_factory=lambda: dict(os.environ))
    mlflow_tracking_uri: str | None = None


def open_trackers(
    targets: Sequence[str],
    run: TrackedRun,
    *,
    on_warning: Notify | None = None,
    on_output: Notify | None = None,
) -> Trackers:
    """Open every target (in order) for ``run``; an error closes those already open."""
    warn: Notify = on_warning or (lambda _message: None)
    output: Notify = on_output or (lambda _line: None)
    state = _State.load(run.run_dir / STATE_FILE)
    opened: list[_Tracker] = []
    try:
        for target in dict.fromkeys(targets):
            opened.append(_OPENERS[target](run, state, output))
    except BaseException:
        for tracker in reversed(opened):
            with contextlib.suppress(Exception):
                tracker.close("failed")
        raise
    state.save()
    return Trackers(opened, warn)


class Trackers:
    """The open trackers of one run; each call reaches every tracker still healthy."""

    def __init__(self, trackers: list[_Tracker], warn: Notify) -> None:
        self._trackers = trackers
        self._warn = warn
        self._closed = False

    @property
    def locations(self) -> list[str]:
        """Where each tracker writes, as one line each, for the run's log."""
        return [f"{t.target}: {t.location}" for t in self._trackers]

    def log(self, step: int, metrics: Mapping[str, object]) -> None:
        """Scalar ``metrics`` at ``step`` (non-numeric and non-finite values are left out)."""
        values = scalars(metrics)
        if values:
            self._each(lambda tracker: tracker.log(step, values))

    def summary(self, metrics: Mapping[str, object]) -> None:
        """A run's final figures (an eval's metrics): its summary where a tracker has one,
        else scalars at step 0."""
        values = scalars(metrics)
        if values:
            self._each(lambda tracker: tracker.summary(values))

    def close(self, status: str) -> None:
        """End every tracker's run: ``status`` is ``success``, ``partial``, ``interrupted``
        or ``failed``. Safe to call twice."""
        if self._closed:
            return
        self._closed = True
        self._each(lambda tracker: tracker.close(status))
        self._trackers = []

    def _each(self, call: Callable[[_Tracker], None]) -> None:
        for tracker in list(self._trackers):
            try:
                call(tracker)
            except Exception as exc:
                self._trackers.remove(tracker)
                self._warn(
                    f"{tracker.target} stopped recording this run: {type(exc).__name__}: {exc}"
                )
                with contextlib.suppress(Exception):
                    tracker.close("failed")


def scalars(metrics: Mapping[str, object]) -> dict[str, float]:
    """The finite numbers of ``metrics`` as floats (booleans and ``None`` are left out)."""
    values: dict[str, float] = {}
    for key, value in metrics.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            continue
        number = float(value)
        if math.isfinite(number):
            values[key] = number
    return values


def flat_params(config: Mapping[str, object], prefix: str = "") -> dict[str, str]:
    """``{"training": {"lr": 1e-6}}`` → ``{"training.lr": "1e-06"}`` (lists as JSON)."""
    params: dict[str, str] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            params.update(flat_params(value, f"{name}."))  # pyright: ignore[reportUnknownArgumentType]
        elif isinstance(value, str):
            params[name] = value
        else:
            params[name] = json.dumps(value, default=str)
    return params


# --- the trackers -----------------------------------------------------------------------------


class _Tracker:
    target: str
    location: str

    def log(self, step: int, values: dict[str, float]) -> None:
        raise NotImplementedError

    def summary(self, values: dict[str, float]) -> None:
        self.log(0, values)

    def close(self, status: str) -> None:
        raise NotImplementedError


@dataclass
class _State:
    """``<run dir>/trackers.json``: the ids that let a resumed run continue its tracker runs."""

    path: Path
    values: dict[str, str]

    @classmethod
    def load(cls, path: Path) -> _State:
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError):
            raw = {}
        values = {str(k): str(v) for k, v in raw.items()} if isinstance(raw, dict) else {}  # pyright: ignore[reportUnknownVariableType]
        return cls(path, values)

    def save(self) -> None:
        atomic_write_json(self.path, self.values)


@contextlib.contextmanager
def _captured(output: Notify) -> Generator[None]:
    """Keep a library's prints off our stdout (``--json`` owns it): each line goes to
    ``output`` (the run's log) instead."""
    buffer = io.StringIO()
    try:
        with contextlib.redirect_stdout(buffer):
            yield
    finally:
        for line in _ANSI.sub("", buffer.getvalue()).splitlines():
            if line.strip():
                output(line)


class _TensorBoard(_Tracker):
    target = "tensorboard"

    def __init__(self, run: TrackedRun, _state: _State, _output: Notify) -> None:
        from tensorboard.summary.writer.event_file_writer import EventFileWriter

        folder = run.run_dir / "tensorboard"
        self.location = str(folder)
        self._writer = EventFileWriter(str(folder), flush_secs=5)
        if run.resumed:
            # Readers drop what an earlier invocation logged past the resume point.
            event, session_log = _pb("event_pb2", "Event", "SessionLog")
            start = 0 if run.resume_step is None else run.resume_step + 1
            started = session_log(status=session_log.START)
            self._writer.add_event(event(wall_time=time.time(), step=start, session_log=started))
        self._text("config", json.dumps(run.config, indent=2, sort_keys=True, default=str))

    def _text(self, tag: str, text: str) -> None:
        (event,) = _pb("event_pb2", "Event")
        summary, metadata = _pb("summary_pb2", "Summary", "SummaryMetadata")
        (tensor,) = _pb("tensor_pb2", "TensorProto")
        (shape,) = _pb("tensor_shape_pb2", "TensorShapeProto")
        (dt_string,) = _pb("types_pb2", "DT_STRING")
        (text_data,) = _pb("text", "TextPluginData")
        value = summary.Value(
            tag=tag,
            metadata=metadata(
                plugin_data=metadata.PluginData(
                    plugin_name="text", content=text_data(version=0).SerializeToString()
                )
            ),
            tensor=tensor(
                dtype=dt_string,
                string_val=[f"```\n{text}\n```".encode()],
                tensor_shape=shape(dim=[shape.Dim(size=1)]),
            ),
        )
        self._writer.add_event(event(wall_time=time.time(), step=0, summary=summary(value=[value])))

    def log(self, step: int, values: dict[str, float]) -> None:
        (event,) = _pb("event_pb2", "Event")
        (summary,) = _pb("summary_pb2", "Summary")
        scalars = summary(
            value=[summary.Value(tag=key, simple_value=value) for key, value in values.items()]
        )
        self._writer.add_event(event(wall_time=time.time(), step=step, summary=scalars))
        self._writer.flush()

    def close(self, status: str) -> None:
        self._writer.close()


def _pb(module: str, *names: str) -> list[Any]:
    """Names of TensorBoard's generated protobuf modules (``text``: the text plugin's)."""
    import importlib

    path = (
        "tensorboard.plugins.text.plugin_data_pb2"
        if module == "text"
        else f"tensorboard.compat.proto.{module}"
    )
    loaded = importlib.import_module(path)
    return [getattr(loaded, name) for name in names]


class _MLflow(_Tracker):
    target = "mlflow"
    _STATUS: ClassVar[dict[str, str]] = {
        "success": "FINISHED",
        "partial": "FINISHED",
        "interrupted": "KILLED",
    }

    def __init__(self, run: TrackedRun, state: _State, output: Notify) -> None:
        import logging

        folder = run.run_dir / "mlflow"
        uri = run.mlflow_tracking_uri or run.environ.get("MLFLOW_TRACKING_URI")
        if not uri:
            folder.mkdir(parents=True, exist_ok=True)
            uri = f"sqlite:///{(folder / 'mlflow.db').resolve()}"
        self.location = uri
        with warnings.catch_warnings(), _captured(output):
            warnings.simplefilter("ignore")  # SQLAlchemy deprecations inside MLflow's store
            from mlflow.entities import Param
            from mlflow.tracking import MlflowClient

            # (after the import, which sets MLflow's level) a new store logs its table
            # creation at INFO; that is not the run's news
            for name in ("mlflow", "alembic"):
                logger = logging.getLogger(name)
                logger.setLevel(max(logger.level, logging.WARNING))
            self._client = client = MlflowClient(tracking_uri=uri)
            experiment = client.get_experiment_by_name(run.project)
            if experiment is not None:
                experiment_id = experiment.experiment_id
            elif uri.startswith("sqlite:"):
                artifacts = (folder / "artifacts").resolve().as_uri()
                experiment_id = client.create_experiment(run.project, artifact_location=artifacts)
            else:
                experiment_id = client.create_experiment(run.project)
            previous = state.values.get("mlflow_run_id")
            if run.resumed and previous and state.values.get("mlflow_tracking_uri") == uri:
                self._run_id = previous
                client.update_run(previous, status="RUNNING")
            else:
                created = client.create_run(
                    experiment_id,
                    run_name=run.name,
                    tags={"osmosis.kind": run.kind, "osmosis.run_dir": str(run.run_dir)},
                )
                self._run_id = created.info.run_id
                params = [Param(k, v[:6000]) for k, v in flat_params(run.config).items()]
                for start in range(0, len(params), 100):  # the store takes 100 per batch
                    client.log_batch(self._run_id, params=params[start : start + 100])
        state.values["mlflow_run_id"] = self._run_id
        state.values["mlflow_tracking_uri"] = uri

    def log(self, step: int, values: dict[str, float]) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        metrics = [Metric(_mlflow_key(k), v, now, step) for k, v in values.items()]
        self._client.log_batch(self._run_id, metrics=metrics)

    def close(self, status: str) -> None:
        self._client.set_terminated(self._run_id, self._STATUS.get(status, "FAILED"))


def _mlflow_key(key: str) -> str:
    """MLflow keys allow letters, digits, ``_ - . / :`` and spaces; others become ``_``."""
    return "".join(c if c.isalnum() or c in "_-./: " else "_" for c in key)


class _WandB(_Tracker):
    target = "wandb"
    _EXIT: ClassVar[dict[str, int]] = {"success": 0, "partial": 0, "interrupted": 255}

    def __init__(self, run: TrackedRun, state: _State, output: Notify) -> None:
        import wandb

        run_id = state.values.get("wandb_id") if run.resumed else None
        run_id = run_id or secrets.token_hex(8)
        settings = wandb.Settings(
            console="off",
            silent=True,
            disable_git=True,
            disable_code=True,
            save_code=False,
            x_disable_stats=True,
            x_disable_meta=True,
            x_disable_machine_info=True,
        )
        with _captured(output):
            self._run = wandb.init(
                project=run.environ.get("WANDB_PROJECT") or run.project,
                name=run.name,
                id=run_id,
                dir=str(run.run_dir),
                mode="offline",
                config=dict(run.config),
                job_type=run.kind,
                resume="allow",
                reinit="create_new",
                settings=settings,
            )
        self.location = str(Path(self._run.dir).parent)  # .../wandb/offline-run-<time>-<id>
        state.values["wandb_id"] = run_id

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def summary(self, values: dict[str, float]) -> None:
        self._run.summary.update(values)

    def close(self, status: str) -> None:
        self._run.finish(exit_code=self._EXIT.get(status, 1))


class _Trackio(_Tracker):
    target = "trackio"

    def __init__(self, run: TrackedRun, _state: _State, output: Notify) -> None:
        self._output = output
        with _captured(output):
            import trackio
            from trackio.utils import TRACKIO_DIR

            self._run = trackio.init(
                project=run.project,
                name=run.name,
                config=dict(run.config),
                resume="allow" if run.resumed else "never",
                embed=False,
                auto_log_cpu=False,
                auto_log_gpu=False,
            )
        self.location = f"{TRACKIO_DIR} (project {run.project!r}, run {self._run.name!r})"

    def log(self, step: int, values: dict[str, float]) -> None:
        self._run.log(values, step=step)

    def close(self, status: str) -> None:
        with _captured(self._output):
            try:
                from trackio import context_vars

                current = context_vars.current_run
            except ImportError:  # pragma: no cover - older trackio layouts
                current = None
            self._run.finish()
            if current is not None and current.get() is self._run:
                current.set(None)  # else trackio's exit hook finishes it again, printing


_OPENERS: dict[str, Callable[[TrackedRun, _State, Notify], _Tracker]] = {
    "tensorboard": _TensorBoard,
    "mlflow": _MLflow,
    "wandb": _WandB,
    "trackio": _Trackio,
}
