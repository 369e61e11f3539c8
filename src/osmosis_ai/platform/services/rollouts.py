"""Rollouts found by Git sync, per branch, and the sync that finds them.

``sync_workspace`` takes the database rather than a session: the fetch can take a while and
must not hold a transaction (on SQLite, the write lock) while git runs. ``GitBranch`` rows
hold each branch's head as of the last sync, so only branches that moved are read; each of
those gets a ``GitSyncEvent`` (commit, author, success), a failed fetch gets one failed
event. Rollouts gone from a branch, or on a deleted branch, turn inactive; the repository's
default branch is learnt on the way.

A listing need not fetch each time: given ``max_age``, a sync whose workspace was fetched
successfully less than ``max_age`` ago answers from that fetch (``fetched=False``), so many
clients listing at once cause one fetch, not one each. An explicit sync and a run submit
always fetch.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from pathlib import Path

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform import gitsync
from osmosis_ai.platform.errors import NotFoundError
from osmosis_ai.platform.services.paging import MAX_PAGE, Page, check_page, offset_page
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import GitBranch, GitSyncEvent, Rollout, Workspace


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
    fetched: bool = True  # False: answered from a fetch younger than max_age
    fetched_at: datetime | None = None  # when the fetch this answer reflects began

    @property
    def branch_names(self) -> set[str]:
        return {branch.name for branch in self.branches}


@dataclass(frozen=True)
class RolloutPage(Page[Rollout]):
    branch: str | None  # the branch listed: the one asked for, else the default branch


def sync_workspace(
    database: Database,
    settings: PlatformSettings,
    workspace_id: str,
    *,
    now: Callable[[], datetime],
    timeout: float = gitsync.GIT_TIMEOUT_S,
    max_age: timedelta | None = None,
) -> SyncOutcome:
    """Fetch the workspace's repository and record the rollouts of every branch that moved.

    Syncs of one workspace run one at a time (the mirror's lock is held throughout), so two
    never record the same branch move twice. With ``max_age``, a fetch that succeeded less
    than ``max_age`` ago is reused instead (checked again once the lock is held, so callers
    that queued behind a fetch reuse it).
    """
    if max_age is not None:
        recent = _recent_outcome(database, workspace_id, now=now, max_age=max_age)
        if recent is not None:
            return recent
    mirror = gitsync.mirror_path(settings.mirrors_dir, workspace_id)
    with gitsync.mirror_lock(mirror):
        if max_age is not None:
            recent = _recent_outcome(database, workspace_id, now=now, max_age=max_age)
            if recent is not None:
                return recent
        return _sync_locked(database, workspace_id, mirror, now=now, timeout=timeout)


def _recent_outcome(
    database: Database, workspace_id: str, *, now: Callable[[], datetime], max_age: timedelta
) -> SyncOutcome | None:
    """What the last fetch found, if it succeeded less than ``max_age`` ago."""
    with database.read() as session:
        workspace = session.get(Workspace, workspace_id)
        if workspace is None:
            raise NotFoundError(
                f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND"
            )
        fetched_at = workspace.git_fetched_at
        if fetched_at is None or not timedelta(0) <= now() - fetched_at < max_age:
            return None  # never fetched, too old, or the clock went back: fetch
        heads = session.scalars(
            select(GitBranch).where(GitBranch.workspace_id == workspace_id).order_by(GitBranch.name)
        ).all()
        return SyncOutcome(
            status="success",
            default_branch=workspace.default_branch,
            branches=[BranchSync(h.name, h.commit_sha, None, changed=False) for h in heads],
            fetched=False,
            fetched_at=fetched_at,
        )


def _sync_locked(
    database: Database,
    workspace_id: str,
    mirror: Path,
    *,
    now: Callable[[], datetime],
    timeout: float,
) -> SyncOutcome:
    started = now()
    with database.transaction() as session:
        workspace = session.get(Workspace, workspace_id)
        if workspace is None:
            raise NotFoundError(
                f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND"
            )
        clone_url = workspace.clone_url
        synced = _synced_heads(session, workspace_id)
    try:
        gitsync.fetch(clone_url, mirror, timeout=timeout)
        heads = gitsync.branches(mirror)
        default = gitsync.default_branch(mirror, heads)
        found = {
            head.name: gitsync.rollouts_at(mirror, head.commit_sha)
            for head in heads
            if synced.get(head.name) != head.commit_sha
        }
    except gitsync.GitSyncError as exc:
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
            raise NotFoundError(
                f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND"
            )
        workspace.default_branch = default
        workspace.git_fetched_at = started
        rows = {
            (row.branch, row.name): row
            for row in session.scalars(select(Rollout).where(Rollout.workspace_id == workspace_id))
        }
        live = {head.name for head in heads}
        for (branch, _), row in rows.items():
            if branch not in live and row.is_active:
                row.is_active = False
                row.updated_at = finished
        known = {
            branch.name: branch
            for branch in session.scalars(
                select(GitBranch).where(GitBranch.workspace_id == workspace_id)
            )
        }
        for name in sorted(set(known) - live):  # deleted: read afresh should it come back
            session.delete(known.pop(name))
            session.add(
                GitSyncEvent(
                    workspace_id=workspace_id,
                    branch=name,
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
            tracked = known.get(head.name)
            if tracked is None:
                session.add(
                    GitBranch(
                        workspace_id=workspace_id,
                        name=head.name,
                        commit_sha=head.commit_sha,
                        synced_at=finished,
                    )
                )
            else:
                tracked.commit_sha = head.commit_sha
                tracked.synced_at = finished
            results.append(BranchSync(head.name, head.commit_sha, len(rollouts), changed=True))
    return SyncOutcome(
        status="success", default_branch=default, branches=results, fetched_at=started
    )


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
    """The commit each branch was last read at."""
    rows = session.execute(
        select(GitBranch.name, GitBranch.commit_sha).where(GitBranch.workspace_id == workspace_id)
    ).all()
    return {name: sha for name, sha in rows}


def list_rollouts(
    session: Session,
    workspace_id: str,
    *,
    branch: str | None,
    limit: int = MAX_PAGE,
    offset: int = 0,
) -> RolloutPage:
    """The rollouts of ``branch`` (default: the repository's default branch), active first."""
    check_page(limit, offset)
    workspace = session.get(Workspace, workspace_id)
    if workspace is None:
        raise NotFoundError(f"No workspace with id {workspace_id!r}.", code="WORKSPACE_NOT_FOUND")
    chosen = branch or workspace.default_branch
    if chosen is None:
        return RolloutPage(items=[], total_count=0, offset=offset, branch=None)
    query = (
        select(Rollout)
        .where(Rollout.workspace_id == workspace_id, Rollout.branch == chosen)
        .order_by(Rollout.is_active.desc(), Rollout.name)
    )
    page = offset_page(session, query, limit, offset)
    return RolloutPage(
        items=page.items, total_count=page.total_count, offset=page.offset, branch=chosen
    )
