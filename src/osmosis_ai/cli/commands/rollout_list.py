"""``osmosis rollout list [--branch B]``: the rollouts Git Sync found in the repository."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, Result
from osmosis_ai.cli.platform_list import list_resource
from osmosis_ai.cli.platform_session import add_list_arguments

COLUMNS = [
    Column("name", "Name"),
    Column("last_synced_commit_sha", "Commit"),
    Column("created_at", "Created"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)
    parser.add_argument("--branch", help="the branch's catalog (default: the default branch)")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    branch: str | None = args.branch or None
    return list_resource(
        args,
        ctx,
        "/api/cli/rollouts",
        "rollouts",
        title="Rollouts",
        record=records.rollout,
        columns=COLUMNS,
        params={"branch": branch} if branch else None,
        extra=(lambda _: {"branch": branch}) if branch else None,
    )
