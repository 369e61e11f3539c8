"""What a training run produced, as the CLI reads it: metric series, checkpoints, and signed
URLs for a checkpoint's files (reference §6.1); and the model row a saved checkpoint becomes.

Metric points are stored per ``(run, key, step)`` under the platform's keys (see
:mod:`osmosis_ai.platform.training_metrics`); a non-finite value is stored and answered as
``null``. Checkpoint files live in the object store under the checkpoint's
``object_prefix`` (``runs/<run_id>/checkpoints/step-<N>/``), a Hugging Face model folder.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform import training_metrics
from osmosis_ai.platform.errors import ConflictError, NotFoundError
from osmosis_ai.platform.objects import DEFAULT_EXPIRES_IN, ObjectStore, UrlSigner
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.services.runs import get_run
from osmosis_ai.platform.store.orm import Model, Run, RunCheckpoint, RunMetric

NOT_STARTED = ("pending", "queued")
MAX_CHECKPOINT_FILES = 1000


class CheckpointNotFoundError(NotFoundError):
    default_code = "CHECKPOINT_NOT_FOUND"


def _ms(moment: datetime) -> int:
    return round(moment.timestamp() * 1000)


def run_metrics(
    session: Session, workspace: WorkspaceAccess, name_or_id: str, *, now: datetime
) -> dict[str, object]:
    """``{status, overview{...}, metrics[{metric_key, title, data_points[...]}]}`` of a run;
    a run that has not started yet has no metrics."""
    run = get_run(session, workspace, "training", name_or_id)
    series: dict[str, list[RunMetric]] = defaultdict(list)
    if run.status not in NOT_STARTED:
        points = session.scalars(
            select(RunMetric).where(RunMetric.run_id == run.id).order_by(RunMetric.step)
        )
        for point in points:
            series[point.key].append(point)
    keys = training_metrics.order(series)
    summaries = [
        {
            "key": key,
            "title": training_metrics.title(key),
            **training_metrics.summarize(p.value for p in series[key]),
        }
        for key in keys
    ]
    metrics = [
        {
            "metric_key": key,
            "title": training_metrics.title(key),
            "data_points": [
                {
                    "step": p.step,
                    "value": training_metrics.finite(p.value),
                    "timestamp": _ms(p.timestamp),
                }
                for p in series[key]
            ],
        }
        for key in keys
    ]
    latest = max((p.step for points in series.values() for p in points), default=None)
    return {
        "status": run.status,
        "overview": {
            "duration_ms": duration_ms(run, now),
            "metric_summaries": summaries,
            "examples_processed_count": run.examples_processed_count,
            "latest_step": run.current_step if run.current_step is not None else latest,
            "total_steps": run.total_steps,
        },
        "metrics": metrics,
    }


def duration_ms(run: Run, now: datetime) -> int | None:
    if run.started_at is None:
        return None
    end = run.completed_at or now
    return max(0, _ms(end) - _ms(run.started_at))


def checkpoint_row(checkpoint: RunCheckpoint) -> dict[str, object]:
    return {
        "id": checkpoint.id,
        "checkpoint_step": checkpoint.step,
        "status": checkpoint.status,
        "checkpoint_name": checkpoint.name,
        "created_at": checkpoint.created_at,
        "reward": training_metrics.finite(checkpoint.reward),
    }


def run_checkpoints(
    session: Session, workspace: WorkspaceAccess, name_or_id: str
) -> tuple[Run, list[RunCheckpoint]]:
    run = get_run(session, workspace, "training", name_or_id)
    found = session.scalars(
        select(RunCheckpoint).where(RunCheckpoint.run_id == run.id).order_by(RunCheckpoint.step)
    )
    return run, list(found)


@dataclass(frozen=True)
class CheckpointFile:
    path: str  # relative to the checkpoint folder
    size: int
    url: str


@dataclass(frozen=True)
class CheckpointDownload:
    run: Run
    checkpoint: RunCheckpoint
    files: list[CheckpointFile]
    expires_in: int


def checkpoint_download(
    session: Session,
    workspace: WorkspaceAccess,
    name_or_id: str,
    step: int | None,
    *,
    objects: ObjectStore,
    signer: UrlSigner,
    base_url: str,
) -> CheckpointDownload:
    """Signed GET URLs for every file of checkpoint ``step`` (default: the latest saved)."""
    run, checkpoints = run_checkpoints(session, workspace, name_or_id)
    saved = [c for c in checkpoints if c.status == "saved"]
    if not saved:
        raise CheckpointNotFoundError(
            f"Training run {run.name!r} has no saved checkpoint yet (status {run.status}); "
            "checkpoints are saved every [checkpoints] checkpoint_save_freq steps and at the end"
        )
    if step is None:
        checkpoint = saved[-1]
    else:
        match = [c for c in saved if c.step == step]
        if not match:
            steps = ", ".join(str(c.step) for c in saved)
            raise CheckpointNotFoundError(
                f"Training run {run.name!r} has no checkpoint at step {step}; saved steps: {steps}"
            )
        checkpoint = match[0]
    prefix = checkpoint.object_prefix.rstrip("/") + "/"
    stored = objects.list(prefix)
    if not stored:
        raise ConflictError(
            f"The files of checkpoint {checkpoint.name!r} are missing from the object store",
            code="CHECKPOINT_FILES_MISSING",
        )
    if len(stored) > MAX_CHECKPOINT_FILES:
        raise ConflictError(
            f"Checkpoint {checkpoint.name!r} has {len(stored)} files, more than "
            f"{MAX_CHECKPOINT_FILES} can be listed at once",
            code="CHECKPOINT_TOO_MANY_FILES",
        )
    files = [
        CheckpointFile(
            path=info.key[len(prefix) :],
            size=info.size,
            url=signer.url(
                base_url,
                "get",
                info.key,
                {"name": info.key.rsplit("/", 1)[-1]},
                expires_in=DEFAULT_EXPIRES_IN,
            ),
        )
        for info in stored
    ]
    return CheckpointDownload(run, checkpoint, files, DEFAULT_EXPIRES_IN)


def register_checkpoint_model(
    session: Session,
    run: Run,
    *,
    step: int,
    path: str,
    reward: float | None,
    now: datetime,
) -> Model:
    """The model a saved checkpoint of ``run`` becomes (kind ``lora``: a trained model of the
    workspace, named ``<run name>-step-<N>``), created or brought up to date; ``path`` is the
    Hugging Face folder a deployment loads."""
    found = session.scalar(
        select(Model).where(Model.training_run_id == run.id, Model.checkpoint_step == step)
    )
    base = session.get(Model, run.model_id) if run.model_id else None
    base_name = (base.base_model or base.name) if base is not None else run.model_path
    if found is None:
        name = f"{run.name}-step-{step}"
        if session.scalar(select(Model.id).where(Model.name == name)) is not None:
            name = f"{run.name}-{run.id[:8]}-step-{step}"  # model names are platform-wide
        found = Model(
            kind="lora",
            name=name,
            workspace_id=run.workspace_id,
            training_run_id=run.id,
            checkpoint_step=step,
            creator_id=run.creator_id,
            created_at=now,
            deployment_status="inactive",
        )
        session.add(found)
    found.path = path
    found.base_model = base_name
    found.reward = training_metrics.finite(reward)
    found.updated_at = now
    session.flush()
    return found
