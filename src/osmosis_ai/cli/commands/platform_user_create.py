"""``osmosis platform user create EMAIL [--name N]``: add a user to a self-hosted platform."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import add_store_options, platform_errors, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("email", metavar="EMAIL", help="the user's email address (their login)")
    parser.add_argument("--name", help="display name")
    add_store_options(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform import admin

    with platform_errors():
        user = admin.create_user(settings_from(args), args.email, name=args.name)
    return OperationResult(
        operation="platform.user.create",
        status="success",
        resource=user,
        message=f"Created user {user['email']}.",
        next_steps=[f"Give them a token: osmosis platform token create --email {user['email']}"],
    )
