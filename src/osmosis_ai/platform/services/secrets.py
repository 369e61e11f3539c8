"""Environment secrets: write-only values, by name, in a workspace or personal scope.

A secret is ``workspace`` (shared; only owners and admins may set or delete it) or ``user``
(personal to its owner inside one workspace; the CLI shows it as ``personal``). Values are
sealed with :class:`~osmosis_ai.platform.crypto.SecretBox`, bound to their row, and never
leave this module except through :func:`resolve_secrets`, which hands them to a run. No
answer, log line or error carries a value.

At run time the same name resolves as: a value the run was given > the caller's personal
secret > the workspace secret.
"""

from __future__ import annotations

import datetime as dt
import re
from collections.abc import Iterable, Mapping, Sequence

from sqlalchemy import Select, or_, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session

from osmosis_ai.platform.crypto import SecretBox
from osmosis_ai.platform.errors import InvalidRequestError, NotFoundError, PermissionDeniedError
from osmosis_ai.platform.services import accounts
from osmosis_ai.platform.services.accounts import MANAGER_ROLES, WorkspaceAccess
from osmosis_ai.platform.services.paging import Page, offset_page
from osmosis_ai.platform.store.orm import Secret

SCOPES = ("workspace", "user")
LIST_SCOPES = ("all", *SCOPES)
MAX_VALUE_BYTES = 64 * 1024
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,254}$")


class MissingRunSecretsError(InvalidRequestError):
    """A run needs secrets that are neither given nor stored (names only, never values)."""

    default_code = "SECRETS_MISSING"

    def __init__(self, missing: Sequence[str]) -> None:
        self.missing = list(missing)
        super().__init__(
            f"Missing secrets: {', '.join(self.missing)}. Set them with osmosis secret set "
            "NAME, or pass them with --secrets-file.",
            field="secrets",
            details={"missing": self.missing},
        )


def check_name(name: str) -> str:
    if not _NAME.match(name):
        raise InvalidRequestError(
            f"Not a secret name: {name!r}. Use an environment variable name: letters, digits "
            "and '_', not starting with a digit (e.g. OPENAI_API_KEY).",
            field="name",
        )
    return name


def check_scope(scope: str, *, allowed: tuple[str, ...] = SCOPES) -> str:
    if scope not in allowed:
        raise InvalidRequestError(
            f"Not a secret scope: {scope!r}. Use one of {', '.join(allowed)}.", field="scope"
        )
    return scope


def _require_manager(workspace: WorkspaceAccess, action: str) -> None:
    if workspace.role not in MANAGER_ROLES:
        raise PermissionDeniedError(
            f"Only a workspace owner or admin can {action} workspace secrets; your role in "
            f"{workspace.name!r} is {workspace.role}. Use --scope personal for your own.",
            code="WORKSPACE_ADMIN_REQUIRED",
        )


def _visible(workspace_id: str, user_id: str) -> Select[Secret]:
    return select(Secret).where(
        Secret.workspace_id == workspace_id,
        or_(
            Secret.scope == "workspace",
            (Secret.scope == "user") & (Secret.owner_user_id == user_id),
        ),
    )


def _find(
    session: Session, workspace_id: str, user_id: str, name: str, scope: str
) -> Secret | None:
    query = select(Secret).where(
        Secret.workspace_id == workspace_id, Secret.name == name, Secret.scope == scope
    )
    if scope == "user":
        query = query.where(Secret.owner_user_id == user_id)
    return session.scalar(query)


def list_secrets(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    *,
    scope: str,
    limit: int,
    offset: int,
) -> Page[Secret]:
    """The workspace's secrets and the caller's personal ones (``scope`` narrows), by name."""
    check_scope(scope, allowed=LIST_SCOPES)
    query = _visible(workspace.id, user_id)
    if scope != "all":
        query = query.where(Secret.scope == scope)
    return offset_page(session, query.order_by(Secret.name, Secret.scope), limit, offset)


def set_secret(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    *,
    name: str,
    value: str,
    scope: str,
    box: SecretBox,
    now: dt.datetime,
) -> Secret:
    """Create or replace the value of ``name`` in ``scope``; answers the row (value sealed)."""
    check_name(name)
    check_scope(scope)
    if scope == "workspace":
        _require_manager(workspace, "set")
    size = len(value.encode("utf-8"))
    if size == 0:
        raise InvalidRequestError("The secret value is empty: give a value.", field="value")
    if size > MAX_VALUE_BYTES:
        raise InvalidRequestError(
            f"The secret value is {size} bytes; the limit is {MAX_VALUE_BYTES}.", field="value"
        )
    for attempt in range(2):
        secret = _find(session, workspace.id, user_id, name, scope)
        if secret is None:
            secret = Secret(
                workspace_id=workspace.id,
                scope=scope,
                owner_user_id=user_id if scope == "user" else None,
                name=name,
                encrypted_value="",
                creator_id=user_id,
                created_at=now,
            )
        secret.encrypted_value = box.encrypt(value, bound_to=_bound(secret, workspace.id))
        secret.updater_id = user_id
        secret.updated_at = now
        try:
            with session.begin_nested():
                session.add(secret)
                session.flush()
        except IntegrityError:  # another request created the same name meanwhile
            if attempt:
                raise
            continue
        return secret
    raise AssertionError("unreachable")


def delete_secret(
    session: Session, workspace: WorkspaceAccess, user_id: str, *, name: str, scope: str
) -> Secret:
    """Remove ``name`` from ``scope``; answers the removed row."""
    check_scope(scope)
    if scope == "workspace":
        _require_manager(workspace, "delete")
    secret = _find(session, workspace.id, user_id, name, scope)
    if secret is None:
        shown = "personal" if scope == "user" else scope
        raise NotFoundError(
            f"No {shown} secret named {name!r} in workspace {workspace.name!r}.",
            code="SECRET_NOT_FOUND",
        )
    session.delete(secret)
    session.flush()
    return secret


def resolve_secrets(
    session: Session,
    workspace_id: str,
    user_id: str,
    names: Iterable[str],
    *,
    box: SecretBox,
    provided: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The values a run of ``user_id`` gets for ``names``: given > personal > workspace.

    Raises :class:`MissingRunSecretsError` (names only) when some are found nowhere.
    """
    wanted = list(dict.fromkeys(names))
    given = provided or {}
    rows = _rows_for(session, workspace_id, user_id, wanted, given)
    return {
        name: given[name]
        if name in given
        else box.decrypt(rows[name].encrypted_value, bound_to=_bound(rows[name], workspace_id))
        for name in wanted
    }


def resolve_secret_scopes(
    session: Session,
    workspace_id: str,
    user_id: str,
    names: Iterable[str],
    *,
    provided: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """Where each of ``names`` comes from: ``provided``, ``user`` or ``workspace`` (no values)."""
    wanted = list(dict.fromkeys(names))
    given = provided or {}
    rows = _rows_for(session, workspace_id, user_id, wanted, given)
    return {name: "provided" if name in given else rows[name].scope for name in wanted}


def _rows_for(
    session: Session,
    workspace_id: str,
    user_id: str,
    wanted: Sequence[str],
    given: Mapping[str, str],
) -> dict[str, Secret]:
    """For each wanted name not ``given``, the row a run uses: the personal one if any, else
    the workspace one. Raises :class:`MissingRunSecretsError` (names only) when some are
    found nowhere.
    """
    names = [name for name in wanted if name not in given]
    found: dict[str, Secret] = {}
    if names:
        query = _visible(workspace_id, user_id).where(Secret.name.in_(names))
        for row in session.scalars(query):
            if row.name not in found or row.scope == "user":
                found[row.name] = row
    missing = [name for name in names if name not in found]
    if missing:
        raise MissingRunSecretsError(missing)
    return found


def _bound(secret: Secret, workspace_id: str) -> str:
    """What a sealed value is bound to: its workspace, scope, owner and name."""
    return "/".join((workspace_id, secret.scope, secret.owner_user_id or "", secret.name))


def display_names(session: Session, secrets: Sequence[Secret]) -> dict[str, str]:
    """Display names (name, else email) of the secrets' creators and updaters, by user id."""
    return accounts.display_names(
        session, (i for s in secrets for i in (s.creator_id, s.updater_id))
    )
