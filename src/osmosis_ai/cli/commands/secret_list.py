"""``osmosis secret list [--scope all|workspace|personal]``: secret names, never values."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, Result
from osmosis_ai.cli.platform_list import list_resource
from osmosis_ai.cli.platform_session import add_list_arguments

if TYPE_CHECKING:
    from osmosis_ai.platform.client import Page

WIRE_SCOPES = {"all": "all", "workspace": "workspace", "personal": records.WIRE_PERSONAL}
COLUMNS = [
    Column("name", "Name"),
    Column("scope", "Scope"),
    Column("updated_at", "Updated"),
    Column("updater_name", "Updated by"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)
    parser.add_argument(
        "--scope", choices=tuple(WIRE_SCOPES), default="all", help="which secrets (default all)"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return list_resource(
        args,
        ctx,
        "/api/cli/environment-secrets",
        "environment_secrets",
        title="Secrets",
        record=records.secret,
        columns=COLUMNS,
        params={"scope": WIRE_SCOPES[args.scope]},
        extra=_platform_url,
    )


def _platform_url(page: Page) -> dict[str, object]:
    url = page.body.get("platform_url")
    return {"platform_url": url} if isinstance(url, str) and url else {}
