"""``osmosis eval logs NAME [--limit N] [--cursor C]``: an eval run's logs, oldest first."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.eval_platform import run_path
from osmosis_ai.cli.output import Column, Context, ListResult, Result
from osmosis_ai.cli.platform_session import add_log_arguments, open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the eval run's name (or id)")
    add_log_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        page = session.client.logs(
            run_path(args.name, "logs"), limit=args.limit, cursor=args.cursor
        )
    items = [records.log_entry(entry) for entry in page.logs]
    return ListResult(
        title=f"Eval run logs: {args.name}",
        items=items,
        total_count=len(items),
        has_more=page.next_cursor is not None,
        next_offset=None,
        columns=[
            Column("timestamp", "Time"),
            Column("level", "Level"),
            Column("step", "Step"),
            Column("message", "Message"),
        ],
        extra={"next_cursor": page.next_cursor, **session.result_context()},
    )
