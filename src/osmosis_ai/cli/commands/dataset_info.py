"""``osmosis dataset info NAME``: one dataset and its processing status."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Context, DetailResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client import segment


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the dataset's name (or id)")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        record = session.client.call("GET", f"/api/cli/datasets/{segment(args.name)}")
    data = {**records.dataset(record), **session.result_context()}
    file_format = record.get("file_format")
    original = record.get("original_file_format")
    shown_format = str(file_format).upper() if file_format else None
    if shown_format and original and original != file_format:
        shown_format += f" (uploaded as {str(original).upper()})"
    fields: list[tuple[str, object]] = [
        ("File", record.get("file_name")),
        ("Status", record.get("status")),
        ("Format", shown_format),
        ("Rows", record.get("row_count")),
        ("Size", records.size_text(record.get("file_size"))),
        ("Uploaded", record.get("created_at")),
        ("Uploaded by", record.get("creator_name")),
    ]
    if data.get("platform_url"):
        fields.append(("URL", data["platform_url"]))
    if record.get("status") == "error":
        fields.append(("Logs", f"osmosis dataset logs {record.get('file_name') or args.name}"))
    return DetailResult(title="Dataset", data=data, fields=fields)
