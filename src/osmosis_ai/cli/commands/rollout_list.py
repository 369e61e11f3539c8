"""``osmosis rollout list [--branch B]``: the rollouts Git Sync found in the repository."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, ListResult, Result
from osmosis_ai.cli.platform_session import add_list_arguments, list_options, open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)
    parser.add_argument("--branch", help="the branch's catalog (default: the default branch)")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    limit, fetch_all = list_options(args)
    branch: str | None = args.branch or None
    with open_session(ctx) as session:
        page = session.client.fetch(
            "/api/cli/rollouts",
            "rollouts",
            limit=limit,
            fetch_all=fetch_all,
            params={"branch": branch} if branch else None,
        )
    extra = session.result_context()
    if branch:
        extra["branch"] = branch
    return ListResult(
        title="Rollouts",
        items=[records.rollout(item) for item in page.items],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        columns=[
            Column("name", "Name"),
            Column("last_synced_commit_sha", "Commit"),
            Column("created_at", "Created"),
        ],
        extra=extra,
    )
