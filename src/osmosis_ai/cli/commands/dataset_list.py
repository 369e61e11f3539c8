"""``osmosis dataset list [--limit N] [--all]``: the workspace's datasets on the platform."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, ListResult, Result
from osmosis_ai.cli.platform_session import add_list_arguments, list_options, open_session


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    limit, fetch_all = list_options(args)
    with open_session(ctx) as session:
        page = session.client.fetch(
            "/api/cli/datasets", "datasets", limit=limit, fetch_all=fetch_all
        )
        return ListResult(
            title="Datasets",
            items=[records.dataset(item) for item in page.items],
            total_count=page.total_count,
            has_more=page.has_more,
            next_offset=page.next_offset,
            columns=[
                Column("file_name", "Name"),
                Column("status", "Status"),
                Column("file_size", "Size (bytes)"),
                Column("row_count", "Rows"),
                Column("created_at", "Uploaded"),
                Column("creator_name", "Uploaded by"),
            ],
            extra=session.result_context(),
        )
