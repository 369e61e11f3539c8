"""``/api/cli/models``: base models (``/base``, ``/base/{name_or_path}``) and the LoRA models
training produces (``/lora``, ``/{name}``, ``POST /{name}/deploy`` and ``/{name}/undeploy``).
A thin layer over :mod:`osmosis_ai.platform.services.models` and
:mod:`osmosis_ai.platform.services.deployments`."""

from __future__ import annotations

from datetime import datetime
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Query

from osmosis_ai.platform.api.deps import PlatformDep, PrincipalDep, WorkspaceDep
from osmosis_ai.platform.api.wire import WireModel, page_fields
from osmosis_ai.platform.services import deployments
from osmosis_ai.platform.services import models as service
from osmosis_ai.platform.services.paging import MAX_PAGE
from osmosis_ai.platform.store.orm import Model

router = APIRouter(prefix="/api/cli/models", tags=["models"])


class BaseModelOut(WireModel):
    id: str
    model_name: str
    base_model: str | None = None
    creator_name: str | None = None
    created_at: datetime
    updated_at: datetime


class BaseModelDetailOut(BaseModelOut):
    namespace: str = ""
    parameters: int | None = None
    context_window: int | None = None
    hf_url: str | None = None
    platform_url: str | None = None


class BaseModelsPageOut(WireModel):
    models: list[BaseModelOut]
    total_count: int
    has_more: bool
    next_offset: int | None = None


class LoraModelOut(WireModel):
    id: str
    model_name: str
    base_model: str | None = None
    training_run_name: str | None = None
    checkpoint_step: int | None = None
    reward: float | None = None
    deployment_status: str = "inactive"
    deployed_at: datetime | None = None
    deployed_by: str | None = None
    created_at: datetime
    # "lora" (an adapter folder) or "full" (every weight); absent when the folder is gone
    checkpoint_type: str | None = None


class LoraModelDetailOut(LoraModelOut):
    hf_upload_status: str = ""
    hf_url: str | None = None
    uploaded_by: str | None = None
    inference_model: str | None = None
    inference_base_url: str | None = None
    platform_url: str | None = None


class LoraModelsPageOut(WireModel):
    models: list[LoraModelOut]
    total_count: int
    has_more: bool
    next_offset: int | None = None
    active_deployments: int
    max_active_deployments: int


def _base_out(model: Model, creators: dict[str, str]) -> BaseModelOut:
    return BaseModelOut(
        id=model.id,
        model_name=model.name,
        base_model=model.base_model,
        creator_name=creators.get(model.creator_id or ""),
        created_at=model.created_at,
        updated_at=model.updated_at,
    )


class DeploymentOut(WireModel):
    id: str
    model_name: str
    status: str


def _lora_out(model: Model, runs: dict[str, str], users: dict[str, str]) -> LoraModelOut:
    return LoraModelOut(
        id=model.id,
        model_name=model.name,
        base_model=model.base_model,
        training_run_name=runs.get(model.training_run_id or ""),
        checkpoint_step=model.checkpoint_step,
        reward=model.reward,
        deployment_status=model.deployment_status or deployments.INACTIVE,
        deployed_at=model.deployed_at,
        deployed_by=users.get(model.deployed_by or ""),
        created_at=model.created_at,
        checkpoint_type=checkpoint_type(model.path),
    )


def checkpoint_type(path: str | None) -> str | None:
    """``lora`` when the checkpoint folder holds an adapter, ``full`` when a whole model."""
    if not path:
        return None
    folder = Path(path)
    if (folder / "adapter_config.json").is_file():
        return "lora"
    if (folder / "config.json").is_file():
        return "full"
    return None


@router.get("/base")
def list_base_models(
    platform: PlatformDep,
    workspace: WorkspaceDep,
    limit: Annotated[int, Query()] = MAX_PAGE,
    offset: Annotated[int, Query()] = 0,
) -> BaseModelsPageOut:
    with platform.read() as session:
        page = service.list_base_models(session, workspace.id, limit=limit, offset=offset)
        creators = service.creator_names(session, page.items)
    return BaseModelsPageOut(
        models=[_base_out(m, creators) for m in page.items],
        **page_fields(page),
    )


@router.get("/lora")
def list_lora_models(
    platform: PlatformDep,
    workspace: WorkspaceDep,
    limit: Annotated[int, Query()] = MAX_PAGE,
    offset: Annotated[int, Query()] = 0,
) -> LoraModelsPageOut:
    with platform.read() as session:
        page = service.list_lora_models(session, workspace.id, limit=limit, offset=offset)
        active = service.active_deployments(session, workspace.id)
        runs = service.training_run_names(session, page.items)
        users = service.deployer_names(session, page.items)
    return LoraModelsPageOut(
        models=[_lora_out(m, runs, users) for m in page.items],
        **page_fields(page),
        active_deployments=active,
        max_active_deployments=deployments.max_active_deployments(),
    )


@router.get("/base/{name_or_path:path}")
def get_base_model(
    name_or_path: str, platform: PlatformDep, workspace: WorkspaceDep
) -> BaseModelDetailOut:
    with platform.read() as session:
        model = service.get_base_model(session, workspace.id, name_or_path)
        creators = service.creator_names(session, [model])
    config = service.model_config(model)
    origin = model.base_model or model.name
    context = config.get("max_position_embeddings")
    return BaseModelDetailOut(
        **_base_out(model, creators).model_dump(),
        namespace=origin.split("/", 1)[0] if "/" in origin else "",
        context_window=context if isinstance(context, int) else None,
        hf_url=service.hf_url(model),
    )


@router.get("/{name}")
def get_lora_model(name: str, platform: PlatformDep, workspace: WorkspaceDep) -> LoraModelDetailOut:
    with platform.read() as session:
        model = service.get_lora_model(session, workspace.id, name)
        runs = service.training_run_names(session, [model])
        users = service.deployer_names(session, [model])
    return LoraModelDetailOut(
        **_lora_out(model, runs, users).model_dump(),
        hf_upload_status="none",
        inference_model=deployments.inference_model(model),
        inference_base_url=deployments.serving_base_url(platform.settings.public_url),
    )


@router.post("/{name}/deploy")
def deploy_model(
    name: str, platform: PlatformDep, principal: PrincipalDep, workspace: WorkspaceDep
) -> DeploymentOut:
    """Serve the LoRA model (already served: unchanged), within the workspace's quota."""
    limit = deployments.max_active_deployments()
    with platform.transaction() as session:
        model = deployments.deploy(
            session,
            workspace.id,
            name,
            user_id=principal.user_id,
            now=platform.now(),
            limit=limit,
        )
        out = DeploymentOut(id=model.id, model_name=model.name, status=deployments.ACTIVE)
    deployments.notify_changed(platform.extras)
    return out


@router.post("/{name}/undeploy")
def undeploy_model(
    name: str, platform: PlatformDep, principal: PrincipalDep, workspace: WorkspaceDep
) -> DeploymentOut:
    """Stop serving the LoRA model (not served: unchanged); who deployed it, or an admin."""
    with platform.transaction() as session:
        model = deployments.undeploy(session, workspace, principal.user_id, name)
        out = DeploymentOut(id=model.id, model_name=model.name, status=deployments.INACTIVE)
    deployments.notify_changed(platform.extras)
    return out
