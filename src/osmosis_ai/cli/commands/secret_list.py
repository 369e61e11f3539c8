"""``osmosis secret list [--scope all|workspace|personal]``: secret names, never values."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, ListResult, Result
from osmosis_ai.cli.platform_session import add_list_arguments, list_options, open_session

WIRE_SCOPES = {"all": "all", "workspace": "workspace", "personal": records.WIRE_PERSONAL}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)
    parser.add_argument(
        "--scope", choices=tuple(WIRE_SCOPES), default="all", help="which secrets (default all)"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    limit, fetch_all = list_options(args)
    with open_session(ctx) as session:
        page = session.client.fetch(
            "/api/cli/environment-secrets",
            "environment_secrets",
            limit=limit,
            fetch_all=fetch_all,
            params={"scope": WIRE_SCOPES[args.scope]},
        )
    extra = session.result_context()
    url = page.body.get("platform_url")
    if isinstance(url, str) and url:
        extra["platform_url"] = url
    return ListResult(
        title="Secrets",
        items=[records.secret(item) for item in page.items],
        total_count=page.total_count,
        has_more=page.has_more,
        next_offset=page.next_offset,
        columns=[
            Column("name", "Name"),
            Column("scope", "Scope"),
            Column("updated_at", "Updated"),
            Column("updater_name", "Updated by"),
        ],
        extra=extra,
    )
