"""``osmosis auth whoami``: who the platform says the current token belongs to.

The token is ``OSMOSIS_TOKEN`` or the saved login; the platform verifies it. Inside a
workspace directory the answer also names the workspace (and the caller's role) that the
repository's ``origin`` is connected to; ``null`` when the platform cannot resolve it.
"""

from __future__ import annotations

import argparse

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, DetailResult, Result
from osmosis_ai.cli.platform_session import (
    credential_store,
    find_workspace_directory,
    platform_target,
    require_login,
)
from osmosis_ai.platform.client import (
    PlatformClient,
    PlatformClientError,
    Verification,
    default_expiry,
    parse_timestamp,
)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    del parser  # no options


def run(args: argparse.Namespace, ctx: Context) -> Result:
    target = platform_target(ctx)
    credentials = require_login(ctx, target)
    from_env = credentials.source == "environment"
    try:
        saved = credential_store(ctx, target).stored_in()
    except PlatformClientError:
        if not from_env:
            raise
        saved = None
    directory = find_workspace_directory()
    client = PlatformClient(
        target.platform_url,
        credentials.access_token,
        git_identity=directory.identity if directory is not None else None,
        using_env_token=from_env,
        warn=ctx.warn,
    )
    with client:
        verified = _verify(client)
    effective = "environment" if from_env else (credentials.source or "credentials")
    expires_at = parse_timestamp(verified.expires_at, default=default_expiry())
    workspace = verified.workspace.model_dump() if verified.workspace is not None else None
    user = verified.user
    account: dict[str, object] = {
        "email": user.email,
        "name": user.name,
        "expires_at": expires_at.isoformat(),
        "platform_url": target.platform_url,
        "source": "environment" if from_env else "credentials",
        "effective_source": effective,
        "persistent_login": saved is not None,
    }
    if verified.token_id:
        account["token_id"] = verified.token_id
    data: dict[str, object] = {
        "account": account,
        **{k: v for k, v in account.items() if k != "token_id"},
        "workspace": workspace,
    }
    fields: list[tuple[str, object]] = [("Email", user.email)]
    if user.name:
        fields.append(("Name", user.name))
    if workspace is not None:
        fields.append(("Workspace", workspace["name"]))
        if workspace.get("role"):
            fields.append(("Role", workspace["role"]))
    fields += [
        ("Platform", target.platform_url),
        ("Auth source", effective),
        ("Saved login", f"yes ({saved})" if saved else "no"),
        ("Expires", expires_at.strftime("%Y-%m-%d")),
    ]
    return DetailResult(title="Account", data=data, fields=fields)


def _verify(client: PlatformClient) -> Verification:
    """Verify with the workspace scope; a scope the platform rejects only drops the workspace."""
    try:
        return client.verify()
    except PlatformClientError as exc:
        if exc.code == "AUTH_REQUIRED" or client.git_identity is None:
            raise _auth_error(exc) from exc
    client.git_identity = None
    try:
        return client.verify()
    except PlatformClientError as exc:
        raise _auth_error(exc) from exc


def _auth_error(exc: PlatformClientError) -> Exception:
    if exc.code == "NOT_FOUND":
        return CLIError(
            CLIErrorCode.PLATFORM_ERROR,
            f"{exc.message} (the platform has no /api/cli/verify: check OSMOSIS_PLATFORM_URL)",
            dict(exc.details),
        )
    return exc
