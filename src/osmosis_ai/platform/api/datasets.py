"""``/api/cli/datasets``: create with an upload plan, complete, abort, list, detail, download,
logs (reference §6.1). A thin layer over :mod:`osmosis_ai.platform.services.datasets`.

Request bodies are exactly what the CLI sends (unknown fields are refused). A file up to
:data:`~osmosis_ai.platform.services.datasets.INLINE_PROCESSING_BYTES` is processed before
``complete`` answers, so the answer already says ``uploaded`` or ``error``; a larger one
answers ``processing`` and is processed right after the answer.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, BackgroundTasks, Body, Query, Response
from pydantic import BaseModel, ConfigDict, Field
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from osmosis_ai.platform.api.deps import Platform, PlatformDep, PrincipalDep, WorkspaceDep
from osmosis_ai.platform.api.logs import add_logs_route
from osmosis_ai.platform.api.objects import object_store, url_signer
from osmosis_ai.platform.api.wire import WireModel, json_bytes, page_fields
from osmosis_ai.platform.services import datasets as service
from osmosis_ai.platform.services.accounts import WorkspaceAccess
from osmosis_ai.platform.services.paging import MAX_PAGE
from osmosis_ai.platform.store.orm import Dataset

router = APIRouter(prefix="/api/cli/datasets", tags=["datasets"])


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class DatasetCreateIn(_Strict):
    file_name: str
    file_size: int
    extension: str
    overwrite_dataset_id: str | None = None


class PartIn(_Strict):
    PartNumber: int = Field(ge=1)
    ETag: str = Field(min_length=1, max_length=200)


class CompleteIn(_Strict):
    file_extension: str | None = None
    parts: list[PartIn] | None = Field(default=None, max_length=10_000)


class AbortIn(_Strict):
    pass


class DatasetOut(WireModel):
    id: str
    file_name: str
    file_size: int
    status: str
    data_preview: list[dict[str, Any]] | None = None
    file_format: str | None = None
    original_file_format: str | None = None
    row_count: int | None = None
    original_file_size: int | None = None
    creator_name: str | None = None
    created_at: datetime
    updated_at: datetime
    platform_url: str | None = None


class DatasetCreatedOut(DatasetOut):
    upload: dict[str, Any]


class DatasetsPageOut(WireModel):
    datasets: list[DatasetOut]
    total_count: int
    has_more: bool
    next_offset: int | None = None


class DownloadOut(WireModel):
    presigned_url: str
    expires_in: int
    file_name: str


def dataset_out(dataset: Dataset, creators: dict[str, str]) -> DatasetOut:
    return DatasetOut(
        id=dataset.id,
        file_name=dataset.file_name,
        file_size=dataset.file_size,
        status=dataset.status,
        data_preview=dataset.data_preview,
        file_format=dataset.file_format,
        original_file_format=dataset.original_file_format,
        row_count=dataset.row_count,
        original_file_size=dataset.original_file_size,
        creator_name=creators.get(dataset.creator_id or ""),
        created_at=dataset.created_at,
        updated_at=dataset.updated_at,
    )


def _one(session: Session, dataset: Dataset) -> DatasetOut:
    return dataset_out(dataset, service.creator_names(session, [dataset]))


@router.post("", status_code=201)
def create_dataset(
    body: DatasetCreateIn,
    platform: PlatformDep,
    principal: PrincipalDep,
    workspace: WorkspaceDep,
) -> DatasetCreatedOut:
    with platform.transaction() as session:
        created = service.create_dataset(
            session,
            workspace,
            principal.user_id,
            file_name=body.file_name,
            file_size=body.file_size,
            extension=body.extension,
            overwrite_dataset_id=body.overwrite_dataset_id,
            store=object_store(platform),
            signer=url_signer(platform),
            base_url=platform.settings.public_url,
            now=platform.now(),
            quota_bytes=platform.settings.workspace_quota_bytes,
        )
        out = _one(session, created.dataset)
    plan = {k: v for k, v in vars(created.upload).items() if v is not None}
    return DatasetCreatedOut(**out.model_dump(), upload=plan)


@router.post("/{dataset_id}/complete")
def complete_upload(
    dataset_id: str,
    platform: PlatformDep,
    workspace: WorkspaceDep,
    background: BackgroundTasks,
    body: Annotated[CompleteIn | None, Body()] = None,
) -> DatasetOut:
    request = body or CompleteIn()
    parts = [(p.PartNumber, p.ETag) for p in request.parts] if request.parts else None
    with platform.transaction() as session:
        dataset = service.complete_upload(
            session,
            workspace,
            dataset_id,
            parts=parts,
            file_extension=request.file_extension,
            store=object_store(platform),
            now=platform.now(),
        )
        inline = service.needs_inline_processing(dataset)
        later = dataset.status == "processing" and not inline
    if inline:
        _process(platform, dataset_id)
    elif later:
        background.add_task(_process, platform, dataset_id)
    with platform.transaction() as session:
        return _one(session, service.get_dataset(session, workspace, dataset_id))


def _process(platform: Platform, dataset_id: str) -> None:
    service.process_dataset(
        platform.database, object_store(platform), dataset_id, clock=platform.now
    )


def resume_processing(platform: Platform) -> int:
    """Process the datasets a previous run of the server left ``processing`` (how many), and
    cancel uploads abandoned long ago."""
    with platform.transaction() as session:
        service.expire_stale_uploads(session, object_store(platform), platform.now())
        pending = service.datasets_in_processing(session)
    for dataset_id in pending:
        _process(platform, dataset_id)
    return len(pending)


@router.post("/{dataset_id}/abort")
def abort_upload(
    dataset_id: str,
    platform: PlatformDep,
    principal: PrincipalDep,
    workspace: WorkspaceDep,
    body: Annotated[AbortIn | None, Body()] = None,
) -> DatasetOut:
    with platform.transaction() as session:
        dataset = service.abort_upload(
            session,
            workspace,
            principal.user_id,
            dataset_id,
            store=object_store(platform),
            now=platform.now(),
        )
        return _one(session, dataset)


@router.get("", response_model=DatasetsPageOut)
async def list_datasets(
    platform: PlatformDep,
    workspace: WorkspaceDep,
    limit: Annotated[int, Query()] = MAX_PAGE,
    offset: Annotated[int, Query()] = 0,
) -> Response:
    """The hot read of the CLI: plain rows straight to JSON (the shape of DatasetsPageOut),
    from one statement outside a transaction.

    On SQLite the read (half a millisecond, from the index, never waiting for the write lock)
    runs on the event loop: under fifty clients a thread-pool hop per call cost more than the
    read. PostgreSQL's reads wait on the network, so they run in the thread pool.
    """
    if platform.database.local:
        body = _datasets_page(platform, workspace, limit, offset)
    else:
        body = await run_in_threadpool(_datasets_page, platform, workspace, limit, offset)
    return Response(body, media_type="application/json")


def _datasets_page(
    platform: Platform, workspace: WorkspaceAccess, limit: int, offset: int
) -> bytes:
    with platform.database.read_statement() as connection:
        page = service.list_datasets(connection, workspace, limit=limit, offset=offset)
    return json_bytes({"datasets": page.items, **page_fields(page)})


@router.get("/{name_or_id}")
def get_dataset(name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep) -> DatasetOut:
    with platform.read() as session:
        return _one(session, service.get_dataset(session, workspace, name_or_id))


@router.get("/{name_or_id}/download")
def download_dataset(
    name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep
) -> DownloadOut:
    with platform.read() as session:
        found = service.download_dataset(
            session,
            workspace,
            name_or_id,
            signer=url_signer(platform),
            base_url=platform.settings.public_url,
        )
    return DownloadOut(
        presigned_url=found.presigned_url, expires_in=found.expires_in, file_name=found.file_name
    )


add_logs_route(router, "dataset_logs", service.dataset_logs)
