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
from osmosis_ai.platform.client.login import logout, saved_login_store


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """-y/--yes is common to every command (see osmosis_ai.cli.commands.parse)."""


def run(args: argparse.Namespace, ctx: Context) -> Result:
    target = platform_target(ctx, check_env_token=False)
    platform_url = target.platform_url
    env_token_set = bool(os.environ.get("OSMOSIS_TOKEN"))
    store = credential_store(ctx, target)
    saved = saved_login_store(store)
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
    revoked = logout(platform_url, store=store, warn=ctx.warn)
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
