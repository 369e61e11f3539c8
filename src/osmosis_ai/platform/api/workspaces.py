"""``GET /api/cli/workspaces``: the caller's workspaces (no Git scope needed)."""

from __future__ import annotations

from fastapi import APIRouter

from osmosis_ai.platform.api.deps import PlatformDep, PrincipalDep
from osmosis_ai.platform.api.wire import WireModel
from osmosis_ai.platform.services.accounts import workspaces_of

router = APIRouter(prefix="/api/cli", tags=["workspaces"])


class WorkspaceOut(WireModel):
    id: str
    name: str
    connected_repo_full_name: str
    role: str


class WorkspacesOut(WireModel):
    workspaces: list[WorkspaceOut]


@router.get("/workspaces")
def list_workspaces(principal: PrincipalDep, platform: PlatformDep) -> WorkspacesOut:
    with platform.read() as session:
        found = workspaces_of(session, principal.user_id)
    return WorkspacesOut(
        workspaces=[
            WorkspaceOut(
                id=w.id, name=w.name, connected_repo_full_name=w.repo_full_name, role=w.role
            )
            for w in found
        ]
    )
