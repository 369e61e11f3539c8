"""``osmosis platform workspace add-member NAME EMAIL [--role owner|admin|member]``."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import add_store_options, platform_errors, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("workspace", metavar="NAME", help="the workspace's name")
    parser.add_argument("email", metavar="EMAIL", help="the user to add (or whose role to set)")
    parser.add_argument(
        "--role", default="member", choices=("owner", "admin", "member"), help="default member"
    )
    add_store_options(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform import admin

    with platform_errors():
        member = admin.add_member(settings_from(args), args.workspace, args.email, role=args.role)
    return OperationResult(
        operation="platform.workspace.add_member",
        status="success",
        resource=member,
        message=f"{member['email']} is {member['role']} of workspace {member['workspace']}.",
    )
