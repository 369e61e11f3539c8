"""``osmosis dataset list [--limit N] [--all]``: the workspace's datasets on the platform."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Column, Context, Result
from osmosis_ai.cli.platform_list import list_resource
from osmosis_ai.cli.platform_session import add_list_arguments

COLUMNS = [
    Column("file_name", "Name"),
    Column("status", "Status"),
    Column("file_size", "Size (bytes)"),
    Column("row_count", "Rows"),
    Column("created_at", "Uploaded"),
    Column("creator_name", "Uploaded by"),
]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_list_arguments(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    return list_resource(
        args,
        ctx,
        "/api/cli/datasets",
        "datasets",
        title="Datasets",
        record=records.dataset,
        columns=COLUMNS,
    )
