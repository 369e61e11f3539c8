"""``osmosis auth logout [-y]``: revoke the saved login's token and forget it.

Revocation is best effort (``TOKEN_REVOKE_FAILED`` warns); the local login is removed
either way. ``OSMOSIS_TOKEN`` is not touched: when it is set, it stays in effect.
"""

from __future__ import annotations

import argparse
import os

from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import credential_store, platform_target
from osmosis_ai.platform.client import PlatformClient, PlatformClientError
from osmosis_ai.platform.client.credentials import Credentials, CredentialStore

_UNREADABLE = ("CREDENTIALS_PARSE_FAILED", "CREDENTIALS_VERSION_CHANGED")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """-y/--yes is common to every command (see osmosis_ai.cli.commands.parse)."""


def run(args: argparse.Namespace, ctx: Context) -> Result:
    target = platform_target(ctx, check_env_token=False)
    platform_url = target.platform_url
    env_token_set = bool(os.environ.get("OSMOSIS_TOKEN"))
    store = credential_store(ctx, target)
    try:
        saved = store.stored_in()
    except PlatformClientError as exc:
        if exc.code not in _UNREADABLE:
            raise
        saved = "unknown"
    if saved is None:
        resource: dict[str, object] = {
            "logged_in": env_token_set,
            "env_token_set": env_token_set,
            "persistent_login": False,
            "effective_source": "environment" if env_token_set else None,
            "platform_url": platform_url,
        }
        if env_token_set:
            return OperationResult(
                operation="auth.logout",
                status="noop",
                resource=resource,
                message="No saved login. OSMOSIS_TOKEN is set: run 'unset OSMOSIS_TOKEN' to "
                "log out.",
                next_steps_structured=[{"action": "unset_env", "name": "OSMOSIS_TOKEN"}],
            )
        return OperationResult(
            operation="auth.logout",
            status="noop",
            resource=resource,
            message=f"Not logged in to {platform_url}.",
        )
    confirm(
        f"Log out of {platform_url}?",
        yes=args.yes,
        summary={"Platform": platform_url, "Token store": saved},
    )
    credentials = _saved_login(ctx, store)
    revoked = False
    if credentials is not None and not credentials.is_expired():
        revoked = _revoke(ctx, platform_url, credentials)
    store.delete()
    if env_token_set:
        ctx.warn(
            "ENV_TOKEN_ACTIVE",
            "OSMOSIS_TOKEN is still set, so commands keep using it. Unset it to log out fully.",
        )
    return OperationResult(
        operation="auth.logout",
        status="success",
        resource={
            "logged_in": env_token_set,
            "revoked": revoked,
            "env_token_set": env_token_set,
            "persistent_login": False,
            "effective_source": "environment" if env_token_set else None,
            "platform_url": platform_url,
        },
        message=(
            "Saved login removed; OSMOSIS_TOKEN is still active."
            if env_token_set
            else f"Logged out of {platform_url}."
        ),
        next_steps=["Unset OSMOSIS_TOKEN to log out fully."] if env_token_set else [],
        next_steps_structured=(
            [{"action": "unset_env", "name": "OSMOSIS_TOKEN"}] if env_token_set else []
        ),
    )


def _saved_login(ctx: Context, store: CredentialStore) -> Credentials | None:
    try:
        return store.load()
    except PlatformClientError as exc:
        if exc.code == "KEYRING_UNAVAILABLE" or exc.code in _UNREADABLE:
            ctx.warn(
                "TOKEN_REVOKE_FAILED",
                f"The saved token could not be read ({exc.message}), so it was not revoked.",
            )
            return None
        raise


def revoke_token(ctx: Context, platform_url: str, credentials: Credentials) -> str | None:
    """Revoke the token of ``credentials`` on the platform, asking the platform for its id
    when the login did not save one. None once it is revoked or already unknown there;
    otherwise why it could not be revoked (``auth login`` revokes a replaced login here too).
    """
    with PlatformClient(platform_url, credentials.access_token, warn=ctx.warn) as client:
        token_id = credentials.token_id
        if token_id is None:
            try:
                token_id = client.verify().token_id
            except PlatformClientError as exc:
                if exc.code == "AUTH_REQUIRED":
                    return None  # the platform no longer knows the token: nothing to revoke
                return exc.message
            if not token_id:
                return "the platform did not say which token it is"
        return client.revoke(token_id)


def _revoke(ctx: Context, platform_url: str, credentials: Credentials) -> bool:
    failure = revoke_token(ctx, platform_url, credentials)
    if failure is not None:
        ctx.warn(
            "TOKEN_REVOKE_FAILED", f"The token could not be revoked on the platform: {failure}"
        )
        return False
    return True
