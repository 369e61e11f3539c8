"""The workspace's other pages: datasets (upload from the browser, preview, processing logs),
models and their deployments, secrets (names only; values never leave the server), and the
members with the signed-in person's own tokens.

A browser upload goes the way the CLI's does: ``upload`` creates the dataset and answers the
signed URLs, the browser PUTs the file (in parts when large) straight to ``/objects``, and
``complete`` finishes it and starts processing. Both calls carry the CSRF token in the
``X-CSRF-Token`` header.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from fastapi import APIRouter, BackgroundTasks, Request
from fastapi.responses import JSONResponse, RedirectResponse, Response
from sqlalchemy import or_, select
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from osmosis_ai.platform.api.deps import Platform, PlatformDep
from osmosis_ai.platform.api.objects import object_store, url_signer
from osmosis_ai.platform.auth import revoke_token
from osmosis_ai.platform.errors import InvalidRequestError, PlatformError
from osmosis_ai.platform.services import accounts, deployments, models, secrets
from osmosis_ai.platform.services import datasets as dataset_service
from osmosis_ai.platform.store.orm import (
    Dataset,
    DatasetLog,
    Membership,
    Model,
    Run,
    Secret,
    Token,
    User,
)
from osmosis_ai.platform.web import session
from osmosis_ai.platform.web.dashboard import Page, open_page, safe_next

router = APIRouter(include_in_schema=False)

LIST_LIMIT = 200
MAX_JSON_BYTES = 256 * 1024


# --- datasets --------------------------------------------------------------------------------


@router.get("/w/{workspace_name}/datasets")
def datasets_page(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    with platform.read() as db:
        found = list(
            db.scalars(
                select(Dataset)
                .where(Dataset.workspace_id == page.workspace.id)
                .order_by(Dataset.created_at.desc(), Dataset.id.desc())
                .limit(LIST_LIMIT)
            )
        )
        creators = dataset_service.creator_names(db, found)
    return page.render("datasets.html", "datasets", datasets=found, creators=creators)


@router.get("/w/{workspace_name}/datasets/{dataset_id}")
def dataset_page(
    workspace_name: str, dataset_id: str, request: Request, platform: PlatformDep
) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    try:
        with platform.read() as db:
            dataset = dataset_service.get_dataset(db, page.workspace, dataset_id)
            logs = list(
                db.scalars(
                    select(DatasetLog)
                    .where(DatasetLog.dataset_id == dataset.id)
                    .order_by(DatasetLog.id)
                )
            )
            creator = dataset_service.creator_names(db, [dataset]).get(dataset.creator_id or "")
            used_by = list(
                db.execute(
                    select(Run.id, Run.kind, Run.name, Run.status, Run.created_at)
                    .where(
                        Run.workspace_id == page.workspace.id,
                        Run.dataset_name == dataset.file_name,
                    )
                    .order_by(Run.created_at.desc())
                    .limit(LIST_LIMIT)
                )
            )
    except PlatformError as exc:
        return page.error(exc)
    preview = dataset.data_preview or []
    columns: list[str] = []
    for row in preview:
        columns.extend(k for k in row if k not in columns)
    cells = [[_cell(row.get(c)) for c in columns] for row in preview]
    return page.render(
        "dataset.html",
        "datasets",
        dataset=dataset,
        creator=creator or "—",
        columns=columns,
        cells=cells,
        logs=logs,
        processing=dataset.status in ("uploading", "pending", "processing"),
        used_by=used_by,
    )


@router.get("/w/{workspace_name}/datasets/{dataset_id}/download")
def dataset_download(
    workspace_name: str, dataset_id: str, request: Request, platform: PlatformDep
) -> Response:
    """The dataset's file: a redirect to its signed download URL on this server (the path and
    query only, so it works whatever address the server names itself by)."""
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    try:
        with platform.read() as db:
            found = dataset_service.download_dataset(
                db,
                page.workspace,
                dataset_id,
                signer=url_signer(platform),
                base_url=platform.settings.public_url,
            )
    except PlatformError as exc:
        return page.error(exc)
    signed = urlsplit(found.presigned_url)
    return RedirectResponse(
        f"{signed.path}?{signed.query}" if signed.query else signed.path, status_code=303
    )


def _cell(value: object) -> str:
    if value is None:
        return ""
    return value if isinstance(value, str) else json.dumps(value, default=str)


async def _json_body(request: Request, platform: Platform) -> dict[str, Any]:
    session.check_csrf(request, platform, None)
    body = await request.body()
    if len(body) > MAX_JSON_BYTES:
        raise InvalidRequestError("request body too large")
    try:
        data = json.loads(body or b"{}")
    except ValueError:
        raise InvalidRequestError("the body is not JSON") from None
    if not isinstance(data, dict):
        raise InvalidRequestError("the body is not a JSON object")
    return data


def _signed_in(
    request: Request, platform: Platform, workspace_name: str
) -> tuple[session.Viewer, accounts.WorkspaceAccess] | Response:
    viewer = session.current_viewer(request, platform)
    if viewer is None:
        return JSONResponse(
            {"error": "UNAUTHORIZED", "message": "Sign in at /login first."}, status_code=401
        )
    with platform.read() as db:
        found = accounts.workspace_for_name(db, viewer.user_id, workspace_name)
    if found is None:
        return JSONResponse(
            {"error": "NOT_FOUND", "message": f"No workspace {workspace_name!r} of yours."},
            status_code=404,
        )
    return viewer, found


@router.post("/w/{workspace_name}/datasets/upload")
async def start_upload(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    data = await _json_body(request, platform)
    who = _signed_in(request, platform, workspace_name)
    if isinstance(who, Response):
        return who
    viewer, workspace = who
    file_name, size = data.get("file_name"), data.get("file_size")
    if not isinstance(file_name, str) or not isinstance(size, int) or isinstance(size, bool):
        raise InvalidRequestError("send {file_name: string, file_size: integer}")
    stem, _, extension = file_name.rpartition(".")
    if not stem:
        raise InvalidRequestError(
            f"file {file_name!r} has no extension: upload a .jsonl, .csv or .parquet file",
            field="file_name",
        )
    overwrite = data.get("overwrite_dataset_id")
    with platform.transaction() as db:
        created = dataset_service.create_dataset(
            db,
            workspace,
            viewer.user_id,
            file_name=stem,
            file_size=size,
            extension=extension,
            overwrite_dataset_id=overwrite if isinstance(overwrite, str) else None,
            store=object_store(platform),
            signer=url_signer(platform),
            base_url=platform.settings.public_url,
            now=platform.now(),
            quota_bytes=platform.settings.workspace_quota_bytes,
        )
        dataset_id = created.dataset.id
    plan = {k: v for k, v in vars(created.upload).items() if v is not None}
    return JSONResponse({"id": dataset_id, "upload": plan}, status_code=201)


@router.post("/w/{workspace_name}/datasets/{dataset_id}/complete")
async def complete_upload(
    workspace_name: str,
    dataset_id: str,
    request: Request,
    platform: PlatformDep,
    background: BackgroundTasks,
) -> Response:
    data = await _json_body(request, platform)
    who = _signed_in(request, platform, workspace_name)
    if isinstance(who, Response):
        return who
    _, workspace = who
    raw_parts = data.get("parts")
    parts: list[tuple[int, str]] | None = None
    if isinstance(raw_parts, list):
        parts = []
        for part in raw_parts:
            if (
                not isinstance(part, dict)
                or not isinstance(part.get("PartNumber"), int)
                or not isinstance(part.get("ETag"), str)
            ):
                raise InvalidRequestError("parts must be [{PartNumber, ETag}]", field="parts")
            parts.append((int(part["PartNumber"]), str(part["ETag"])))
    with platform.transaction() as db:
        dataset = dataset_service.complete_upload(
            db,
            workspace,
            dataset_id,
            parts=parts,
            file_extension=None,
            store=object_store(platform),
            now=platform.now(),
        )
        inline = dataset_service.needs_inline_processing(dataset)
        later = dataset.status == "processing" and not inline
    store = object_store(platform)
    if inline:  # small files: processed before answering, as the CLI's completion does
        await run_in_threadpool(
            dataset_service.process_dataset,
            platform.database,
            store,
            dataset_id,
            clock=platform.now,
        )
    elif later:
        background.add_task(
            dataset_service.process_dataset,
            platform.database,
            store,
            dataset_id,
            clock=platform.now,
        )
    with platform.read() as db:
        status = dataset_service.get_dataset(db, workspace, dataset_id).status
    return JSONResponse({"id": dataset_id, "status": status})


# --- models ----------------------------------------------------------------------------------


@router.get("/w/{workspace_name}/models")
def models_page(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    with platform.read() as db:
        workspace_id = page.workspace.id
        base = list(
            db.scalars(
                select(Model)
                .where(Model.kind == "base")
                .where(or_(Model.workspace_id.is_(None), Model.workspace_id == workspace_id))
                .order_by(Model.name)
                .limit(LIST_LIMIT)
            )
        )
        lora = list(
            db.scalars(
                select(Model)
                .where(Model.kind == "lora", Model.workspace_id == workspace_id)
                .order_by(Model.created_at.desc(), Model.id.desc())
                .limit(LIST_LIMIT)
            )
        )
        run_names = models.training_run_names(db, lora)
        deployers = models.deployer_names(db, lora)
        active = models.active_deployments(db, page.workspace.id)
        base_paths = _base_paths(db, lora)
    return page.render(
        "models.html",
        "models",
        base_models=base,
        lora=lora,
        run_names=run_names,
        deployers=deployers,
        active=active,
        quota=deployments.max_active_deployments(),
        serving_url=deployments.serving_base_url(platform.settings.public_url),
        is_active=deployments.is_active,
        weights={m.id: checkpoint_kind(m.path) for m in lora},
        base_paths=base_paths,
    )


def checkpoint_kind(path: str | None) -> str | None:
    """``lora`` for an adapter folder (``adapter_config.json``), ``full`` for a whole model
    (a full fine-tune, or LoRA merged into its weights), ``None`` when the folder is not here."""
    if not path:
        return None
    folder = Path(path)
    try:
        if (folder / "adapter_config.json").is_file():
            return "lora"
        if (folder / "config.json").is_file():
            return "full"
    except OSError:
        return None
    return None


def _base_paths(db: Session, trained: Sequence[Model]) -> dict[str, str]:
    """Each trained model's base model as its training run loaded it (the run's model path)."""
    ids = {m.training_run_id for m in trained if m.training_run_id}
    if not ids:
        return {}
    found = db.execute(select(Run.id, Run.model_path).where(Run.id.in_(ids)))
    paths = {run_id: model_path for run_id, model_path in found}
    return {m.id: paths[m.training_run_id] for m in trained if m.training_run_id in paths}


# --- secrets ---------------------------------------------------------------------------------


@router.get("/w/{workspace_name}/secrets")
def secrets_page(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    with platform.read() as db:
        mine = or_(
            Secret.scope == "workspace",
            (Secret.scope == "user") & (Secret.owner_user_id == page.viewer.user_id),
        )
        found = list(
            db.scalars(
                select(Secret)
                .where(Secret.workspace_id == page.workspace.id, mine)
                .order_by(Secret.name, Secret.scope)
                .limit(LIST_LIMIT)
            )
        )
        names = secrets.display_names(db, found)
    rows = [
        {
            "name": s.name,
            "scope": "personal" if s.scope == "user" else "workspace",
            "updated_at": s.updated_at,
            "updater": names.get(s.updater_id or s.creator_id or "", "—"),
        }
        for s in found
    ]
    return page.render("secrets.html", "secrets", secrets=rows)


# --- members and tokens ----------------------------------------------------------------------


@router.get("/w/{workspace_name}/members")
def members_page(workspace_name: str, request: Request, platform: PlatformDep) -> Response:
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    with platform.read() as db:
        members = db.execute(
            select(User, Membership.role, Membership.created_at)
            .join(Membership, Membership.user_id == User.id)
            .where(Membership.workspace_id == page.workspace.id)
            .order_by(User.email)
        ).all()
        tokens = list(
            db.scalars(
                select(Token)
                .where(Token.user_id == page.viewer.user_id)
                .order_by(Token.created_at.desc())
            )
        )
    now = platform.now()
    return page.render(
        "members.html",
        "members",
        members=[
            {"email": u.email, "name": u.name, "role": role, "since": since}
            for u, role, since in members
        ],
        tokens=[
            {
                "id": t.id,
                "name": t.name,
                "created_at": t.created_at,
                "expires_at": t.expires_at,
                "last_used_at": t.last_used_at,
                "revoked": t.revoked_at is not None,
                "expired": t.expires_at <= now,
                "current": t.id == page.viewer.token_id,
            }
            for t in tokens
        ],
    )


@router.post("/w/{workspace_name}/tokens/{token_id}/revoke")
async def revoke(
    workspace_name: str, token_id: str, request: Request, platform: PlatformDep
) -> Response:
    form = await session.read_form(request, platform)
    page = open_page(request, platform, workspace_name)
    if not isinstance(page, Page):
        return page
    try:
        with platform.transaction() as db:
            revoke_token(db, token_id, now=platform.now(), user_id=page.viewer.user_id)
    except PlatformError as exc:
        return page.error(exc)
    return RedirectResponse(safe_next(form.get("next")), status_code=303)
