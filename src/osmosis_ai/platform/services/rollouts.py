"""Rollouts found by Git sync, per branch, and the sync that finds them.

``sync_workspace`` takes the database rather than a session: the fetch can take a while and
must not hold a transaction (on SQLite, the write lock) while git runs. It records one
``GitSyncEvent`` per branch whose head moved (commit, author, success) or one failed event,
marks rollouts gone from a branch (or on a deleted branch) inactive, and learns the
repository's default branch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from osmosis_ai.platform import gitsync
from osmosis_ai.platform.errors import InvalidRequest, NotFound
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import GitSyncEvent, Rollout, Workspace

MAX_PAGE = 50


@dataclass(frozen=True)
class BranchSync:
    name: str
    commit_sha: str
    rollouts: int | None  # None: the head did not move, nothing was read
    changed: bool


@dataclass(frozen=True)
class SyncOutcome:
    status: str  # success | failed
    message: str | None = None
    default_branch: str | None = None
    branches: list[BranchSync] = field(default_factory=list[BranchSync])

    @property
    def branch_names(self) -> set[str]:
        return {branch.name for branch in self.branches}


@dataclass(frozen=True)
class RolloutPage:
    branch: str | None
    items: list[Rollout]
    total_count: int
    offset: int

    @property
    def has_more(self) -> bool:
        return self.offset + len(self.items) < self.total_count

    @property
    def next_offset(self) -> int | None:
        return self.offset + len(self.items) if self.has_more else None


def sync_workspace(
    database: Database,
    settings: PlatformSettings,
    workspace_id: str,
    *,
    now: Callable[[], datetime],
    timeout: float = gitsync.GIT_TIMEOUT_S,
) -> SyncOutcome:
    """Fetch the workspace's repository and record the rollouts of every branch that moved."""
    started = now()
    with database.transaction() as session:
        workspace = session.get(Workspace, workspace_id)
        if workspace is None:
            raise NotFound(f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND")
        clone_url = workspace.clone_url
        synced = _synced_heads(session, workspace_id)
    mirror = gitsync.mirror_path(settings.mirrors_dir, workspace_id)
    try:
        with gitsync.mirror_lock(mirror):
            gitsync.fetch(clone_url, mirror, timeout=timeout)
            heads = gitsync.branches(mirror)
            default = gitsync.default_branch(mirror)
            found = {
                head.name: gitsync.rollouts_at(mirror, head.commit_sha)
                for head in heads
                if synced.get(head.name) != head.commit_sha
            }
    except gitsync.GitSyncFailed as exc:
        with database.transaction() as session:
            session.add(
                GitSyncEvent(
                    workspace_id=workspace_id,
                    status="failed",
                    message=gitsync.redact(exc.message),
                    created_at=started,
                    started_at=started,
                    finished_at=now(),
                )
            )
        return SyncOutcome(status="failed", message=gitsync.redact(exc.message))
    finished = now()
    with database.transaction() as session:
        workspace = session.get(Workspace, workspace_id)
        if workspace is None:  # deleted while git ran
            raise NotFound(f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND")
        workspace.default_branch = default
        rows = {
            (row.branch, row.name): row
            for row in session.scalars(select(Rollout).where(Rollout.workspace_id == workspace_id))
        }
        live = {head.name for head in heads}
        for (branch, _), row in rows.items():
            if branch not in live and row.is_active:
                row.is_active = False
                row.updated_at = finished
        for branch in sorted(set(synced) - live):  # a deleted branch: read it afresh if it returns
            session.add(
                GitSyncEvent(
                    workspace_id=workspace_id,
                    branch=branch,
                    status="success",
                    message="branch deleted",
                    created_at=started,
                    started_at=started,
                    finished_at=finished,
                )
            )
        results: list[BranchSync] = []
        for head in heads:
            if head.name not in found:
                results.append(BranchSync(head.name, head.commit_sha, None, changed=False))
                continue
            rollouts = found[head.name]
            _record_branch(
                session, workspace_id, head=head, rollouts=rollouts, rows=rows, now=finished
            )
            session.add(
                GitSyncEvent(
                    workspace_id=workspace_id,
                    branch=head.name,
                    commit_sha=head.commit_sha,
                    author=head.author[:255] if head.author else None,
                    status="success",
                    message=f"{len(rollouts)} rollout(s)",
                    created_at=started,
                    started_at=started,
                    finished_at=finished,
                )
            )
            results.append(BranchSync(head.name, head.commit_sha, len(rollouts), changed=True))
    return SyncOutcome(status="success", default_branch=default, branches=results)


def _record_branch(
    session: Session,
    workspace_id: str,
    *,
    head: gitsync.BranchHead,
    rollouts: list[gitsync.FoundRollout],
    rows: dict[tuple[str, str], Rollout],
    now: datetime,
) -> None:
    names = {rollout.name for rollout in rollouts}
    for rollout in rollouts:
        row = rows.get((head.name, rollout.name))
        if row is None:
            row = Rollout(
                workspace_id=workspace_id,
                branch=head.name,
                name=rollout.name,
                created_at=now,
            )
            session.add(row)
        row.description = rollout.description
        row.is_active = True
        row.last_synced_commit_sha = head.commit_sha
        row.updated_at = now
    for (branch, name), row in rows.items():
        if branch == head.name and name not in names and row.is_active:
            row.is_active = False
            row.updated_at = now


def _synced_heads(session: Session, workspace_id: str) -> dict[str, str]:
    """The commit each branch was last synced at."""
    latest = (
        select(GitSyncEvent.branch, func.max(GitSyncEvent.finished_at).label("at"))
        .where(
            GitSyncEvent.workspace_id == workspace_id,
            GitSyncEvent.status == "success",
            GitSyncEvent.branch.is_not(None),
        )
        .group_by(GitSyncEvent.branch)
        .subquery()
    )
    rows = session.execute(
        select(GitSyncEvent.branch, GitSyncEvent.commit_sha)
        .join(
            latest,
            (GitSyncEvent.branch == latest.c.branch) & (GitSyncEvent.finished_at == latest.c.at),
        )
        .where(GitSyncEvent.workspace_id == workspace_id, GitSyncEvent.status == "success")
    ).all()
    return {branch: sha for branch, sha in rows if branch is not None and sha is not None}


def list_rollouts(
    session: Session,
    workspace_id: str,
    *,
    branch: str | None,
    limit: int = MAX_PAGE,
    offset: int = 0,
) -> RolloutPage:
    """The rollouts of ``branch`` (default: the repository's default branch), active first."""
    if not 1 <= limit <= MAX_PAGE:
        raise InvalidRequest(f"limit must be from 1 to {MAX_PAGE}, got {limit}", field="limit")
    if offset < 0:
        raise InvalidRequest(f"offset must be 0 or more, got {offset}", field="offset")
    workspace = session.get(Workspace, workspace_id)
    if workspace is None:
        raise NotFound(f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND")
    chosen = branch or workspace.default_branch
    if chosen is None:
        return RolloutPage(branch=None, items=[], total_count=0, offset=offset)
    query = select(Rollout).where(Rollout.workspace_id == workspace_id, Rollout.branch == chosen)
    total = session.scalar(select(func.count()).select_from(query.subquery())) or 0
    items = list(
        session.scalars(
            query.order_by(Rollout.is_active.desc(), Rollout.name).limit(limit).offset(offset)
        )
    )
    return RolloutPage(branch=chosen, items=items, total_count=int(total), offset=offset)
