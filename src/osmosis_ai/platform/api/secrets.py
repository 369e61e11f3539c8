"""``/api/cli/environment-secrets``: list (names and metadata), set (upsert), delete.

Values go in and never come out: answers carry ``{id, name, scope, created_at, updated_at,
creator_name, updater_name}`` only, and the request model keeps the value as a
``SecretStr`` so not even its repr shows it. A thin layer over
:mod:`osmosis_ai.platform.services.secrets`.
"""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Body, Query
from pydantic import BaseModel, ConfigDict, SecretStr

from osmosis_ai.platform.api.deps import Platform, PlatformDep, PrincipalDep, WorkspaceDep
from osmosis_ai.platform.api.wire import WireModel, page_fields
from osmosis_ai.platform.crypto import SecretBox, secret_key
from osmosis_ai.platform.services import secrets as service
from osmosis_ai.platform.services.paging import MAX_PAGE
from osmosis_ai.platform.store.orm import Secret

router = APIRouter(prefix="/api/cli/environment-secrets", tags=["secrets"])


def secret_box(platform: Platform) -> SecretBox:
    """The platform's sealer of secret values (key from the environment or the data dir)."""
    box = platform.extras.get("secret_box")
    if not isinstance(box, SecretBox):
        box = platform.extras["secret_box"] = SecretBox(secret_key(platform.settings.key_dir))
    return box


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class SecretSetIn(_Strict):
    name: str
    value: SecretStr
    scope: str


class SecretDeleteIn(_Strict):
    name: str
    scope: str


class SecretOut(WireModel):
    id: str
    name: str
    scope: str
    created_at: datetime
    updated_at: datetime
    creator_name: str | None = None
    updater_name: str | None = None


class SecretsPageOut(WireModel):
    environment_secrets: list[SecretOut]
    total_count: int
    has_more: bool
    next_offset: int | None = None


def secret_out(secret: Secret, names: dict[str, str]) -> SecretOut:
    return SecretOut(
        id=secret.id,
        name=secret.name,
        scope=secret.scope,
        created_at=secret.created_at,
        updated_at=secret.updated_at,
        creator_name=names.get(secret.creator_id or ""),
        updater_name=names.get(secret.updater_id or ""),
    )


@router.get("")
def list_secrets(
    *,
    platform: PlatformDep,
    principal: PrincipalDep,
    workspace: WorkspaceDep,
    scope: Annotated[str, Query()] = "all",
    limit: Annotated[int, Query()] = MAX_PAGE,
    offset: Annotated[int, Query()] = 0,
) -> SecretsPageOut:
    with platform.read() as session:
        page = service.list_secrets(
            session, workspace, principal.user_id, scope=scope, limit=limit, offset=offset
        )
        names = service.display_names(session, page.items)
    return SecretsPageOut(
        environment_secrets=[secret_out(s, names) for s in page.items],
        **page_fields(page),
    )


@router.post("")
def set_secret(
    body: SecretSetIn, platform: PlatformDep, principal: PrincipalDep, workspace: WorkspaceDep
) -> SecretOut:
    with platform.transaction() as session:
        secret = service.set_secret(
            session,
            workspace,
            principal.user_id,
            name=body.name,
            value=body.value.get_secret_value(),
            scope=body.scope,
            box=secret_box(platform),
            now=platform.now(),
        )
        return secret_out(secret, service.display_names(session, [secret]))


@router.delete("")
def delete_secret(
    body: Annotated[SecretDeleteIn, Body()],
    platform: PlatformDep,
    principal: PrincipalDep,
    workspace: WorkspaceDep,
) -> SecretOut:
    with platform.transaction() as session:
        secret = service.delete_secret(
            session, workspace, principal.user_id, name=body.name, scope=body.scope
        )
        return secret_out(secret, service.display_names(session, [secret]))
