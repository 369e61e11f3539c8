"""``/api/cli/training-runs/{name_or_id}/metrics``, ``…/checkpoints`` and
``…/checkpoints/{step}/download``: what a training run produced (reference §6.1).

Metrics answer ``{status, overview, metrics}`` with non-finite values as ``null`` and
timestamps in milliseconds; checkpoints ``{training_run_name, checkpoints}``; a download
answers a signed GET URL per file of the checkpoint (a Hugging Face folder). A thin layer
over :mod:`osmosis_ai.platform.services.training_results`.
"""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter

from osmosis_ai.platform.api.deps import PlatformDep, WorkspaceDep
from osmosis_ai.platform.api.objects import object_store, url_signer
from osmosis_ai.platform.api.wire import WireModel
from osmosis_ai.platform.services import training_results as service

router = APIRouter(prefix="/api/cli/training-runs", tags=["training results"])


class MetricSummaryOut(WireModel):
    key: str
    title: str
    initial: float | None
    latest: float | None
    delta: float | None
    min: float | None
    max: float | None


class OverviewOut(WireModel):
    duration_ms: int | None
    metric_summaries: list[MetricSummaryOut]
    examples_processed_count: int | None
    latest_step: int | None
    total_steps: int | None


class DataPointOut(WireModel):
    step: int
    value: float | None
    timestamp: int  # milliseconds since the epoch


class MetricOut(WireModel):
    metric_key: str
    title: str
    data_points: list[DataPointOut]


class MetricsOut(WireModel):
    status: str
    overview: OverviewOut
    metrics: list[MetricOut]


class CheckpointOut(WireModel):
    id: str
    checkpoint_step: int
    status: str
    checkpoint_name: str
    created_at: datetime
    reward: float | None = None


class CheckpointsOut(WireModel):
    training_run_name: str
    checkpoints: list[CheckpointOut]


class CheckpointFileOut(WireModel):
    path: str
    size: int
    url: str


class CheckpointDownloadOut(WireModel):
    training_run_name: str
    checkpoint_name: str
    checkpoint_step: int
    expires_in: int
    files: list[CheckpointFileOut]


@router.get("/{name_or_id}/metrics")
def training_run_metrics(
    name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep
) -> MetricsOut:
    with platform.read() as session:
        answer = service.run_metrics(session, workspace, name_or_id, now=platform.now())
    return MetricsOut.model_validate(answer)


@router.get("/{name_or_id}/checkpoints")
def training_run_checkpoints(
    name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep
) -> CheckpointsOut:
    with platform.read() as session:
        run, checkpoints = service.run_checkpoints(session, workspace, name_or_id)
        return CheckpointsOut(
            training_run_name=run.name,
            checkpoints=[CheckpointOut(**service.checkpoint_row(c)) for c in checkpoints],  # pyright: ignore[reportArgumentType]
        )


def _download(
    platform: PlatformDep, workspace: WorkspaceDep, name_or_id: str, step: int | None
) -> CheckpointDownloadOut:
    with platform.read() as session:
        found = service.checkpoint_download(
            session,
            workspace,
            name_or_id,
            step,
            objects=object_store(platform),
            signer=url_signer(platform),
            base_url=platform.settings.public_url,
        )
        return CheckpointDownloadOut(
            training_run_name=found.run.name,
            checkpoint_name=found.checkpoint.name,
            checkpoint_step=found.checkpoint.step,
            expires_in=found.expires_in,
            files=[CheckpointFileOut(path=f.path, size=f.size, url=f.url) for f in found.files],
        )


@router.get("/{name_or_id}/checkpoints/latest/download")
def download_latest_checkpoint(
    name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep
) -> CheckpointDownloadOut:
    return _download(platform, workspace, name_or_id, None)


@router.get("/{name_or_id}/checkpoints/{step}/download")
def download_checkpoint(
    name_or_id: str, step: int, platform: PlatformDep, workspace: WorkspaceDep
) -> CheckpointDownloadOut:
    return _download(platform, workspace, name_or_id, step)
