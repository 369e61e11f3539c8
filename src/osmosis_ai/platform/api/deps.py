"""What routes depend on: the running platform, the caller's principal, its workspace.

Routes get plain values (``Principal``, ``WorkspaceAccess``) and open their own transaction
around one service call: ``platform.transaction()`` to write, so a commit always happens
before the answer is sent, or ``platform.read()`` to only read (on SQLite it never waits
for the write lock). Authentication and the workspace lookup only read, and are kept for
a moment in :class:`~osmosis_ai.platform.api.access.AccessCache`: a revoke or membership
change committed in this process applies to the next request, one committed by another
process (an admin command) within ``ACCESS_CACHE_TTL_S`` (one second).
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Annotated

from fastapi import Depends, Request
from sqlalchemy.orm import Session
from starlette.concurrency import run_in_threadpool

from osmosis_ai.platform.api.access import AccessCache
from osmosis_ai.platform.auth import Principal, authenticate, hash_token, recheck, touch_token
from osmosis_ai.platform.errors import InvalidRequestError, NotFoundError
from osmosis_ai.platform.services.accounts import (
    WorkspaceAccess,
    normalize_repo,
    workspace_for_name,
    workspace_for_repo,
)
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import utcnow

GIT_HEADER = "x-osmosis-git"
WORKSPACE_HEADER = "x-osmosis-workspace"


@dataclass
class Platform:
    """One running platform: settings, database, clock (injected in tests), and the cache of
    recent token and workspace lookups (:mod:`osmosis_ai.platform.api.access`)."""

    settings: PlatformSettings
    database: Database
    clock: Callable[[], datetime] = utcnow
    access: AccessCache = field(default_factory=AccessCache)
    extras: dict[str, object] = field(default_factory=dict[str, object])

    def now(self) -> datetime:
        return self.clock()

    @contextmanager
    def transaction(self) -> Generator[Session]:
        with self.database.transaction() as session:
            yield session

    @contextmanager
    def read(self) -> Generator[Session]:
        with self.database.read() as session:
            yield session


# Dependencies are ``async``: FastAPI runs a plain ``def`` dependency in its thread pool, and
# a hop there costs more than the work (a third of a list call's time). The two that read
# hop only when the access cache has no answer, so a route pays at most its own hop.
async def current_platform(request: Request) -> Platform:
    platform = request.app.state.platform
    assert isinstance(platform, Platform)
    return platform


PlatformDep = Annotated[Platform, Depends(current_platform)]


def bearer_token(request: Request) -> str | None:
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def authenticated(request: Request, platform: PlatformDep) -> Principal:
    """The caller, from ``Authorization: Bearer <token>``; 401 with a code otherwise.

    Answered from :class:`AccessCache` when the token was authenticated a moment ago (no
    thread-pool hop, no transaction); its expiry is checked again either way.
    """
    raw = bearer_token(request)
    now = platform.now()
    if raw is None:  # refused by authenticate() with its own code
        return await run_in_threadpool(_authenticate, platform, raw, now)
    key = hash_token(raw)
    cache = platform.access
    cached = cache.principals.get(key)
    if cached is not None:
        principal = recheck(cached, now=now)
    else:
        loaded = await cache.principals.fetch(
            key, lambda: run_in_threadpool(_authenticate, platform, raw, now)
        )
        assert loaded is not None  # a token that fails raises, and is never cached
        principal = recheck(loaded, now=now)
    if principal.touch_due and cache.claim_touch(key, now):  # once a minute per token
        await run_in_threadpool(_touch, platform, principal.token_id, now)
    return principal


def _authenticate(platform: Platform, raw: str | None, now: datetime) -> Principal:
    with platform.read() as session:
        return authenticate(
            session, raw, platform_url=platform.settings.public_url, now=now, touch=False
        )


def _touch(platform: Platform, token_id: str, now: datetime) -> None:
    with platform.transaction() as session:
        touch_token(session, token_id, now=now)


PrincipalDep = Annotated[Principal, Depends(authenticated)]


async def optional_workspace(
    request: Request, platform: PlatformDep, principal: PrincipalDep
) -> WorkspaceAccess | None:
    """The workspace the request is scoped to, if it names one (``X-Osmosis-Git`` or name)."""
    git = request.headers.get(GIT_HEADER)
    name = request.headers.get(WORKSPACE_HEADER)
    if not git and not name:
        return None
    if git:
        try:
            repo = normalize_repo(git)
        except InvalidRequestError:
            raise InvalidRequestError(
                f"The X-Osmosis-Git header {git!r} is not an owner/repo identity.",
                code="GIT_SCOPE_HEADER_INVALID",
                field="X-Osmosis-Git",
            ) from None
        key = (principal.user_id, "repo", repo)
        label = f"repository {repo}"
    else:
        assert name is not None
        key = (principal.user_id, "name", name.strip())
        label = f"workspace {name.strip()!r}"
    found = await platform.access.workspaces.fetch(
        key, lambda: run_in_threadpool(_find_workspace, platform, key)
    )
    if found is None:
        raise NotFoundError(
            f"No workspace you belong to is connected to {label}. Check the repository's "
            "origin, or ask a workspace admin to add you.",
            code="GIT_SCOPE_HEADER_ACCESS_DENIED",
        )
    return found


def _find_workspace(platform: Platform, key: tuple[str, str, str]) -> WorkspaceAccess | None:
    user_id, kind, value = key
    with platform.read() as session:
        if kind == "repo":
            return workspace_for_repo(session, user_id, value)
        return workspace_for_name(session, user_id, value)


async def required_workspace(
    workspace: Annotated[WorkspaceAccess | None, Depends(optional_workspace)],
) -> WorkspaceAccess:
    """The workspace of a repo-scoped call: 400 when the request names none."""
    if workspace is None:
        raise InvalidRequestError(
            "This call needs a workspace: send X-Osmosis-Git: owner/repo (run the command "
            "inside the workspace repository).",
            code="GIT_SCOPE_HEADER_REQUIRED",
            field="X-Osmosis-Git",
        )
    return workspace


WorkspaceDep = Annotated[WorkspaceAccess, Depends(required_workspace)]
OptionalWorkspaceDep = Annotated[WorkspaceAccess | None, Depends(optional_workspace)]
