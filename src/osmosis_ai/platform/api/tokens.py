"""``GET /api/cli/verify`` (who am I, on which workspace) and ``DELETE /api/cli/tokens/{id}``."""

from __future__ import annotations

from datetime import datetime

from fastapi import APIRouter, Response

from osmosis_ai.platform.api.deps import OptionalWorkspaceDep, PlatformDep, PrincipalDep
from osmosis_ai.platform.api.wire import UserOut, WireModel, WorkspaceRoleOut
from osmosis_ai.platform.auth import revoke_token

router = APIRouter(prefix="/api/cli", tags=["auth"])


class VerifyOut(WireModel):
    token_id: str
    user: UserOut
    expires_at: datetime
    workspace: WorkspaceRoleOut | None = None


@router.get("/verify")
def verify(principal: PrincipalDep, workspace: OptionalWorkspaceDep) -> VerifyOut:
    return VerifyOut(
        token_id=principal.token_id,
        user=UserOut(id=principal.user_id, email=principal.email, name=principal.name),
        expires_at=principal.expires_at,
        workspace=(
            WorkspaceRoleOut(id=workspace.id, name=workspace.name, role=workspace.role)
            if workspace is not None
            else None
        ),
    )


@router.delete("/tokens/{token_id}", status_code=204)
def revoke(token_id: str, principal: PrincipalDep, platform: PlatformDep) -> Response:
    """Revoke one of the caller's own tokens (usually the one it calls with)."""
    with platform.transaction() as session:
        revoke_token(session, token_id, now=platform.now(), user_id=principal.user_id)
    return Response(status_code=204)
