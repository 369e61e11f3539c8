"""Administering a platform from its machine: users, workspaces, members, tokens, models.

Each function opens the platform's database (migrating it first, under the same lock the
server takes), does one thing in one transaction and returns plain data; it works the same
with the server running (SQLite in WAL mode waits for the writer) or stopped. Tokens are
scoped to the platform's public URL: the one recorded by ``osmosis platform serve`` in the
data dir, unless another is given.
"""

from __future__ import annotations

from collections.abc import Callable, Generator
from contextlib import contextmanager
from datetime import datetime
from pathlib import Path

from sqlalchemy.orm import Session

from osmosis_ai.platform import auth
from osmosis_ai.platform.gitsync import redact
from osmosis_ai.platform.services import accounts, models
from osmosis_ai.platform.settings import PlatformSettings, normalize_url
from osmosis_ai.platform.store.database import open_database
from osmosis_ai.platform.store.orm import User, utcnow


@contextmanager
def _transaction(settings: PlatformSettings) -> Generator[Session]:
    database = open_database(settings)
    try:
        with database.transaction() as session:
            yield session
    finally:
        database.dispose()


def create_user(
    settings: PlatformSettings, email: str, *, name: str | None = None
) -> dict[str, object]:
    with _transaction(settings) as session:
        user = accounts.create_user(session, email, name=name)
        return _user(user)


def create_workspace(
    settings: PlatformSettings, name: str, *, repo: str, clone_url: str
) -> dict[str, object]:
    with _transaction(settings) as session:
        workspace = accounts.create_workspace(session, name, repo=repo, clone_url=clone_url)
        return {
            "id": workspace.id,
            "name": workspace.name,
            "repo_full_name": workspace.repo_full_name,
            "clone_url": redact(workspace.clone_url),  # the answer is printed; a token is not
            "created_at": workspace.created_at,
        }


def add_member(
    settings: PlatformSettings, workspace: str, email: str, *, role: str = "member"
) -> dict[str, object]:
    with _transaction(settings) as session:
        found = accounts.workspace_by_name(session, workspace)
        user = accounts.user_by_email(session, email)
        membership = accounts.add_member(session, found, user, role=role)
        return {
            "workspace_id": found.id,
            "workspace": found.name,
            "user_id": user.id,
            "email": user.email,
            "role": membership.role,
        }


def create_token(
    settings: PlatformSettings,
    email: str,
    *,
    expires_days: int = auth.DEFAULT_TOKEN_DAYS,
    platform_url: str | None = None,
    name: str = "admin",
    clock: Callable[[], datetime] = utcnow,
) -> dict[str, object]:
    """A new token for ``email``; the raw ``token`` is in the answer and nowhere else."""
    lifetime = auth.token_lifetime(expires_days)
    scope = normalize_url(platform_url) if platform_url else settings.public_url
    with _transaction(settings) as session:
        user = accounts.user_by_email(session, email)
        issued = auth.issue_token(
            session, user, platform_url=scope, name=name, now=clock(), lifetime=lifetime
        )
        return {
            "id": issued.id,
            "user_id": user.id,
            "email": user.email,
            "platform_url": issued.platform_url,
            "expires_at": issued.expires_at,
            "token": issued.raw,
        }


def revoke_token(
    settings: PlatformSettings, token_id: str, *, clock: Callable[[], datetime] = utcnow
) -> dict[str, object]:
    with _transaction(settings) as session:
        token = auth.revoke_token(session, token_id, now=clock())
        return {"id": token.id, "user_id": token.user_id, "revoked_at": token.revoked_at}


def add_model(settings: PlatformSettings, name: str, path: Path) -> dict[str, object]:
    with _transaction(settings) as session:
        model = models.register_base_model(session, name, path)
        return {
            "id": model.id,
            "model_name": model.name,
            "base_model": model.base_model,
            "path": model.path,
            "kind": model.kind,
            "created_at": model.created_at,
        }


def _user(user: User) -> dict[str, object]:
    return {"id": user.id, "email": user.email, "name": user.name, "created_at": user.created_at}
