"""``/api/cli/eval-runs``: an eval run's metrics, samples manifest and downloads, retry, and
the import of local runs (reference §5.7, §5.9, §6.1). A thin layer over
:mod:`osmosis_ai.platform.services.eval_results`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, Field, SecretStr

from osmosis_ai.platform.api.deps import PlatformDep, PrincipalDep, WorkspaceDep
from osmosis_ai.platform.api.objects import CONTENT_TYPE, object_store, url_signer
from osmosis_ai.platform.api.secrets import secret_box
from osmosis_ai.platform.api.wire import WireModel
from osmosis_ai.platform.errors import InvalidRequestError
from osmosis_ai.platform.objects import ObjectNotFoundError
from osmosis_ai.platform.services import eval_results as service
from osmosis_ai.platform.services import work
from osmosis_ai.platform.services.runs import get_run
from osmosis_ai.platform.store.orm import EvalImport, Run

router = APIRouter(prefix="/api/cli/eval-runs", tags=["eval results"])

Table = dict[str, Any]


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class DownloadItemIn(_Strict):
    token: str = Field(min_length=1, max_length=1024)
    path: str = Field(min_length=1, max_length=1024)


class DownloadUrlsIn(_Strict):
    items: list[DownloadItemIn] = Field(max_length=service.MAX_DOWNLOAD_ITEMS)


class RetrySecretsIn(_Strict):
    provided: dict[str, SecretStr] | None = None


class RetryIn(_Strict):
    secrets: RetrySecretsIn | None = None


class ImportFileIn(_Strict):
    path: str = Field(min_length=1, max_length=1024)
    size: int = Field(ge=0)
    sha256: str


class ImportIn(_Strict):
    schema_version: int
    local_run_id: str
    manifest_digest: str
    run: Table
    schema_versions: Table = Field(default_factory=dict[str, Any])
    provenance: Table = Field(default_factory=dict[str, Any])
    files: list[ImportFileIn] = Field(max_length=1_000_000)


class UploadsIn(_Strict):
    paths: list[str] = Field(max_length=service.MAX_UPLOAD_PATHS)


class PartIn(_Strict):
    part_number: int
    etag: str


class CompleteIn(_Strict):
    path: str
    parts: list[PartIn] | None = None


class FinalizeIn(_Strict):
    pass


class ManifestFileOut(WireModel):
    token: str | None = None
    path: str
    size: int


class ManifestOut(WireModel):
    files: list[ManifestFileOut]
    totals: Table


class DownloadUrlOut(WireModel):
    path: str
    url: str
    token: str


class DownloadUrlsOut(WireModel):
    items: list[DownloadUrlOut]
    expires_in: int


class RetriedOut(WireModel):
    id: str
    name: str
    status: str
    retry_items: int


class ImportFileOut(WireModel):
    path: str
    size: int
    state: str


class ImportSessionOut(WireModel):
    session_id: str
    status: str
    expected_files: int
    uploaded_files: int
    files: list[ImportFileOut]
    expires_at: datetime
    eval_run_id: str
    eval_run_name: str
    platform_url: str | None = None


class UploadOut(WireModel):
    method: str
    presigned_url: str
    upload_headers: dict[str, str]
    expires_in: int


class UploadFileOut(WireModel):
    path: str
    size: int
    sha256: str
    upload: UploadOut


class UploadsOut(WireModel):
    files: list[UploadFileOut]


class CompletedOut(WireModel):
    path: str
    state: str


class FinalizedOut(WireModel):
    session_id: str
    status: str
    eval_run_id: str
    eval_run_name: str
    run_status: str
    results: Table | None = None
    platform_url: str | None = None


# --- results of a run ------------------------------------------------------------------------


@router.get("/{name_or_id}/metrics")
def eval_run_metrics(name_or_id: str, platform: PlatformDep, workspace: WorkspaceDep) -> Table:
    with platform.read() as session:
        run = get_run(session, workspace, "eval", name_or_id)
        return service.run_metrics(session, run, now=platform.now())


@router.get("/{name_or_id}/samples/manifest")
def samples_manifest(
    name_or_id: str,
    platform: PlatformDep,
    workspace: WorkspaceDep,
    types: Annotated[str | None, Query()] = None,
    rows: Annotated[str | None, Query()] = None,
) -> ManifestOut:
    chosen = service.parse_types(types)
    selected = service.parse_rows(rows)
    with platform.read() as session:
        run = get_run(session, workspace, "eval", name_or_id)
        files, totals = service.samples_manifest(
            session, run, object_store(platform), types=chosen, rows=selected, now=platform.now()
        )
    return ManifestOut(
        files=[ManifestFileOut(token=f.token, path=f.path, size=f.size) for f in files],
        totals=totals,
    )


@router.post("/{name_or_id}/samples/download-urls")
def samples_download_urls(
    name_or_id: str, body: DownloadUrlsIn, platform: PlatformDep, workspace: WorkspaceDep
) -> DownloadUrlsOut:
    with platform.read() as session:
        run = get_run(session, workspace, "eval", name_or_id)
    urls = service.download_urls(
        run,
        object_store(platform),
        url_signer(platform),
        platform.settings.public_url,
        [(item.token, item.path) for item in body.items],
    )
    return DownloadUrlsOut(
        items=[DownloadUrlOut(path=u.path, url=u.url, token=u.token) for u in urls],
        expires_in=service.DOWNLOAD_EXPIRES_IN,
    )


@router.post("/{name_or_id}/retry")
def retry_eval_run(
    name_or_id: str,
    platform: PlatformDep,
    principal: PrincipalDep,
    workspace: WorkspaceDep,
    body: Annotated[RetryIn | None, Body()] = None,
) -> RetriedOut:
    given = body.secrets.provided if body is not None and body.secrets is not None else None
    provided = {k: v.get_secret_value() for k, v in (given or {}).items()}
    with platform.transaction() as session:
        run, count = service.retry_run(
            session,
            workspace,
            principal.user_id,
            name_or_id,
            provided=provided,
            box=secret_box(platform),
            now=platform.now(),
        )
        out = RetriedOut(id=run.id, name=run.name, status=run.status, retry_items=count)
    work.wake_workers(platform.database, now=platform.now())
    return out


# --- importing local runs --------------------------------------------------------------------


@router.post("/imports")
def open_import(
    body: ImportIn, platform: PlatformDep, principal: PrincipalDep, workspace: WorkspaceDep
) -> ImportSessionOut:
    if body.schema_version != 1:
        raise InvalidRequestError(
            f"schema_version {body.schema_version} is not supported (1 is); upgrade osmosis-ai",
            field="schema_version",
        )
    request = service.ImportRequest(
        local_run_id=body.local_run_id,
        manifest_digest=body.manifest_digest,
        run=body.run,
        schema_versions=body.schema_versions,
        provenance=body.provenance,
        files=[service.ImportFile(f.path, f.size, f.sha256) for f in body.files],
    )
    with platform.transaction() as session:
        imported = service.open_import(
            session,
            workspace,
            principal.user_id,
            request,
            now=platform.now(),
            quota_bytes=platform.settings.workspace_quota_bytes,
        )
        run = get_run(session, workspace, "eval", imported.run_id)
        return ImportSessionOut.model_validate(service.import_session(imported, run))


@router.post("/imports/{session_id}/uploads")
def import_uploads(
    session_id: str, body: UploadsIn, platform: PlatformDep, workspace: WorkspaceDep
) -> UploadsOut:
    with platform.transaction() as session:
        imported = service.get_import(session, workspace, session_id)
        signed = service.sign_uploads(
            imported,
            body.paths,
            object_store(platform),
            url_signer(platform),
            platform.settings.public_url,
        )
    return UploadsOut(
        files=[
            UploadFileOut(
                path=s.path,
                size=s.size,
                sha256=s.sha256,
                upload=UploadOut(
                    method="simple",
                    presigned_url=s.url,
                    upload_headers={"Content-Type": CONTENT_TYPE},
                    expires_in=service.UPLOAD_EXPIRES_IN,
                ),
            )
            for s in signed
        ]
    )


@router.post("/imports/{session_id}/uploads/complete")
def import_upload_complete(
    session_id: str, body: CompleteIn, platform: PlatformDep, workspace: WorkspaceDep
) -> CompletedOut:
    if body.parts:
        raise InvalidRequestError(
            "uploads of a local run are simple PUTs: send no parts", field="parts"
        )
    with platform.transaction() as session:
        imported = service.get_import(session, workspace, session_id)
        item = service.complete_file(imported, body.path, object_store(platform))
        return CompletedOut(path=str(item["path"]), state=str(item["state"]))


@router.post("/imports/{session_id}/finalize")
def import_finalize(
    session_id: str,
    platform: PlatformDep,
    workspace: WorkspaceDep,
    body: Annotated[FinalizeIn | None, Body()] = None,
) -> FinalizedOut:
    store = object_store(platform)
    try:
        with platform.transaction() as session:
            imported = service.get_import(session, workspace, session_id)
            run = service.finalize_import(session, imported, store, now=platform.now())
            return _finalized(imported, run)
    except (InvalidRequestError, ObjectNotFoundError) as exc:
        # What was uploaded cannot become a run: the run ends failed, saying why.
        with platform.transaction() as session:
            imported = service.get_import(session, workspace, session_id)
            if imported.status == "uploading":
                service.fail_import(
                    session,
                    imported,
                    store,
                    reason=f"The import failed: {exc.message}",
                    now=platform.now(),
                )
        raise


def _finalized(imported: EvalImport, run: Run) -> FinalizedOut:
    return FinalizedOut(
        session_id=imported.id,
        status=imported.status,
        eval_run_id=run.id,
        eval_run_name=run.name,
        run_status=run.status,
        results=run.results,
    )
