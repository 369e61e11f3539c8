"""Users, workspaces and memberships, and which workspace a request's Git identity names."""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import (
    ConflictError,
    InvalidRequestError,
    NotFoundError,
    PermissionDeniedError,
)
from osmosis_ai.platform.store.orm import ROLES, Membership, User, Workspace

_EMAIL = re.compile(r"^[^@\s]+@[^@\s]+$")
_REPO = re.compile(r"^[a-z0-9](?:[a-z0-9._-]*)/[a-z0-9._-]+$")
_WORKSPACE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._ -]{0,99}$")
# The roles that may change what any member made (stop or retry a run, replace a dataset…).
MANAGER_ROLES = ("owner", "admin")


@dataclass(frozen=True)
class WorkspaceAccess:
    """A workspace as one user sees it: with that user's role."""

    id: str
    name: str
    repo_full_name: str
    role: str


def require_creator_or_manager(
    workspace: WorkspaceAccess,
    user_id: str,
    creator_id: str | None,
    *,
    action: str,
    what: str,
    code: str,
) -> None:
    """Refuse (403 ``code``) unless ``user_id`` made ``what`` or is a workspace owner or admin.

    The one rule for changing another member's work: ``action`` is the verb (``stop``),
    ``what`` names the thing (``eval run 'nightly'``).
    """
    if creator_id == user_id or workspace.role in MANAGER_ROLES:
        return
    raise PermissionDeniedError(
        f"Only the creator of {what} or a workspace owner or admin can {action} it; your "
        f"role in {workspace.name!r} is {workspace.role}.",
        code=code,
    )


# --- users -----------------------------------------------------------------------------------


def normalize_email(email: str) -> str:
    value = email.strip().lower()
    if not _EMAIL.match(value) or len(value) > 320:
        raise InvalidRequestError(f"Not an email address: {email!r}.", field="email")
    return value


def create_user(session: Session, email: str, *, name: str | None = None) -> User:
    address = normalize_email(email)
    if session.scalar(select(User).where(User.email == address)) is not None:
        raise ConflictError(f"A user with email {address} exists already.", field="email")
    user = User(email=address, name=(name or "").strip() or None)
    session.add(user)
    session.flush()
    return user


def user_by_email(session: Session, email: str) -> User:
    address = normalize_email(email)
    user = session.scalar(select(User).where(User.email == address))
    if user is None:
        raise NotFoundError(
            f"No user with email {address}. Create one with "
            f"'osmosis platform user create {address}'.",
            code="USER_NOT_FOUND",
        )
    return user


# --- workspaces ------------------------------------------------------------------------------


def normalize_repo(repo: str) -> str:
    """``owner/repo`` lower-cased; a ``.git`` suffix is dropped."""
    value = repo.strip().lower().removesuffix(".git")
    if not _REPO.match(value):
        raise InvalidRequestError(
            f"Not a repository name: {repo!r}. Give it as OWNER/REPO, e.g. acme/agents.",
            field="repo",
        )
    return value


def create_workspace(session: Session, name: str, *, repo: str, clone_url: str) -> Workspace:
    label = name.strip()
    if not _WORKSPACE_NAME.match(label):
        raise InvalidRequestError(
            f"Not a workspace name: {name!r}. Use up to 100 letters, digits, spaces, "
            "'.', '_' or '-', starting with a letter or digit.",
            field="name",
        )
    full_name = normalize_repo(repo)
    if not clone_url.strip():
        raise InvalidRequestError(
            "The clone URL is empty: give any git URL or path.", field="clone_url"
        )
    if session.scalar(select(Workspace).where(Workspace.name == label)) is not None:
        raise ConflictError(f"A workspace named {label!r} exists already.", field="name")
    taken = session.scalar(select(Workspace).where(Workspace.repo_full_name == full_name))
    if taken is not None:
        raise ConflictError(
            f"The repository {full_name} is connected to workspace {taken.name!r} already.",
            field="repo",
        )
    workspace = Workspace(name=label, repo_full_name=full_name, clone_url=clone_url.strip())
    session.add(workspace)
    session.flush()
    return workspace


def workspace_by_name(session: Session, name: str) -> Workspace:
    workspace = session.scalar(select(Workspace).where(Workspace.name == name.strip()))
    if workspace is None:
        raise NotFoundError(f"No workspace named {name!r}.", code="WORKSPACE_NOT_FOUND")
    return workspace


def add_member(session: Session, workspace: Workspace, user: User, *, role: str) -> Membership:
    """Add ``user`` to ``workspace`` with ``role``, or change the role of a member."""
    if role not in ROLES:
        raise InvalidRequestError(
            f"Not a role: {role!r}. Pick one of {', '.join(ROLES)}.", field="role"
        )
    membership = session.get(Membership, (workspace.id, user.id))
    if membership is None:
        membership = Membership(workspace_id=workspace.id, user_id=user.id, role=role)
        session.add(membership)
    else:
        membership.role = role
    session.flush()
    return membership


def workspaces_of(session: Session, user_id: str) -> list[WorkspaceAccess]:
    """The workspaces ``user_id`` belongs to, by name."""
    rows = session.execute(
        select(Workspace, Membership.role)
        .join(Membership, Membership.workspace_id == Workspace.id)
        .where(Membership.user_id == user_id)
        .order_by(Workspace.name)
    ).all()
    return [_access(workspace, role) for workspace, role in rows]


def workspace_for_repo(session: Session, user_id: str, repo: str) -> WorkspaceAccess | None:
    """The workspace connected to ``repo`` if ``user_id`` is a member of it; else ``None``.

    Not connected and not a member look the same, so a token learns nothing about
    workspaces it cannot see.
    """
    row = session.execute(
        select(Workspace, Membership.role)
        .join(Membership, Membership.workspace_id == Workspace.id)
        .where(Membership.user_id == user_id, Workspace.repo_full_name == repo)
    ).first()
    return None if row is None else _access(row[0], row[1])


def workspace_for_name(session: Session, user_id: str, name: str) -> WorkspaceAccess | None:
    """The workspace called ``name`` if ``user_id`` is a member of it; else ``None``."""
    row = session.execute(
        select(Workspace, Membership.role)
        .join(Membership, Membership.workspace_id == Workspace.id)
        .where(Membership.user_id == user_id, Workspace.name == name)
    ).first()
    return None if row is None else _access(row[0], row[1])


def display_names(session: Session, user_ids: Iterable[str | None]) -> dict[str, str]:
    """Display names (name, else email) of the users ``user_ids``, by user id."""
    ids = {user_id for user_id in user_ids if user_id}
    if not ids:
        return {}
    return {u.id: u.name or u.email for u in session.scalars(select(User).where(User.id.in_(ids)))}


def _access(workspace: Workspace, role: str) -> WorkspaceAccess:
    return WorkspaceAccess(
        id=workspace.id, name=workspace.name, repo_full_name=workspace.repo_full_name, role=role
    )
