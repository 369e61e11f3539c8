"""``osmosis platform workspace create NAME --repo OWNER/REPO --clone-url URL``."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import add_store_options, platform_errors, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the workspace's name")
    parser.add_argument(
        "--repo",
        required=True,
        metavar="OWNER/REPO",
        help="the repository identity clones send (their origin's owner/repo)",
    )
    parser.add_argument(
        "--clone-url",
        required=True,
        metavar="URL",
        help="where the platform fetches the repository: a local path, ssh or https URL",
    )
    add_store_options(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform import admin

    with platform_errors():
        workspace = admin.create_workspace(
            settings_from(args), args.name, repo=args.repo, clone_url=args.clone_url
        )
    return OperationResult(
        operation="platform.workspace.create",
        status="success",
        resource=workspace,
        message=f"Created workspace {workspace['name']} for {workspace['repo_full_name']}.",
        next_steps=[
            f"Add people: osmosis platform workspace add-member '{workspace['name']}' EMAIL "
            "--role owner"
        ],
    )
