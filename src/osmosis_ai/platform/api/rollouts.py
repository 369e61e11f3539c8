"""``GET /api/cli/rollouts?branch=`` (syncs the repository first, unless it was fetched less
than the settings' ``git_refresh_s`` ago) and ``POST /api/cli/rollouts/sync`` (an explicit
re-sync that always fetches and reports failure as 502)."""

from __future__ import annotations

from datetime import datetime, timedelta

from fastapi import APIRouter, Query

from osmosis_ai.platform.api.deps import PlatformDep, WorkspaceDep
from osmosis_ai.platform.api.wire import WireModel, page_fields
from osmosis_ai.platform.errors import NotFoundError
from osmosis_ai.platform.gitsync import GitSyncError
from osmosis_ai.platform.services import rollouts

router = APIRouter(prefix="/api/cli/rollouts", tags=["rollouts"])


class RolloutOut(WireModel):
    id: str
    name: str
    description: str | None
    is_active: bool
    last_synced_commit_sha: str | None
    repo_full_name: str
    branch: str
    created_at: datetime


class SyncStatusOut(WireModel):
    status: str
    message: str | None = None
    default_branch: str | None = None
    fetched: bool = True  # False: this answer reuses a recent fetch
    fetched_at: datetime | None = None


class BranchOut(WireModel):
    name: str
    commit_sha: str
    changed: bool
    rollouts: int | None


class RolloutsOut(WireModel):
    rollouts: list[RolloutOut]
    total_count: int
    has_more: bool
    next_offset: int | None
    branch: str | None
    sync: SyncStatusOut


class SyncOut(WireModel):
    status: str
    default_branch: str | None
    branches: list[BranchOut]


@router.get("")
def list_rollouts(
    workspace: WorkspaceDep,
    platform: PlatformDep,
    branch: str | None = Query(default=None, max_length=255),
    limit: int = Query(default=rollouts.MAX_PAGE),
    offset: int = Query(default=0),
) -> RolloutsOut:
    outcome = rollouts.sync_workspace(
        platform.database,
        platform.settings,
        workspace.id,
        now=platform.now,
        max_age=timedelta(seconds=platform.settings.git_refresh_s),
    )
    if outcome.status == "success" and branch and branch not in outcome.branch_names:
        raise NotFoundError(
            f"The repository {workspace.repo_full_name} has no branch {branch!r}.",
            code="BRANCH_NOT_FOUND",
            field="branch",
        )
    with platform.read() as session:
        page = rollouts.list_rollouts(
            session, workspace.id, branch=branch, limit=limit, offset=offset
        )
        items = [
            RolloutOut(
                id=row.id,
                name=row.name,
                description=row.description,
                is_active=row.is_active,
                last_synced_commit_sha=row.last_synced_commit_sha,
                repo_full_name=workspace.repo_full_name,
                branch=row.branch,
                created_at=row.created_at,
            )
            for row in page.items
        ]
    return RolloutsOut(
        rollouts=items,
        **page_fields(page),
        branch=page.branch,
        sync=SyncStatusOut(
            status=outcome.status,
            message=outcome.message,
            default_branch=outcome.default_branch,
            fetched=outcome.fetched,
            fetched_at=outcome.fetched_at,
        ),
    )


@router.post("/sync")
def sync(workspace: WorkspaceDep, platform: PlatformDep) -> SyncOut:
    outcome = rollouts.sync_workspace(
        platform.database, platform.settings, workspace.id, now=platform.now
    )
    if outcome.status != "success":
        raise GitSyncError(
            f"Git sync of {workspace.repo_full_name} failed: {outcome.message}",
        )
    return SyncOut(
        status=outcome.status,
        default_branch=outcome.default_branch,
        branches=[
            BranchOut(name=b.name, commit_sha=b.commit_sha, changed=b.changed, rollouts=b.rollouts)
            for b in outcome.branches
        ],
    )
