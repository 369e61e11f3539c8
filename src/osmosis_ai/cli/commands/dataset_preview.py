"""``osmosis dataset preview NAME [--rows N]``: the first rows the platform extracted."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.output import Context, DetailResult, Result, plain_value
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.platform.client import segment

IN_PROGRESS = ("pending", "uploading", "processing")


def _rows(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the dataset's name (or id)")
    parser.add_argument("--rows", type=_rows, default=5, help="rows to show (default 5)")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        record = session.client.call("GET", f"/api/cli/datasets/{segment(args.name)}")
    dataset = records.dataset(record)
    preview = record.get("data_preview")
    name = record.get("file_name") or args.name
    if preview is None:
        status = record.get("status")
        message = (
            f"The dataset is still processing (status: {status})."
            if status in IN_PROGRESS
            else "No preview is available for this dataset."
        )
        return DetailResult(
            title="Dataset preview",
            data={
                "dataset": dataset,
                "rows": None,
                "requested_rows": args.rows,
                "returned_rows": 0,
                "available": False,
                "message": message,
                **session.result_context(),
            },
            fields=[("Dataset", name), ("Status", status), ("Preview", message)],
        )
    fields: list[tuple[str, object]] = [("Dataset", name)]
    if isinstance(preview, list):
        shown = preview[: args.rows]
        rows: object = shown
        returned = len(shown)
        fields.append(("Rows", f"{returned} of {len(preview)}"))
        fields += [(f"Row {i}", plain_value(row)) for i, row in enumerate(shown, 1)]
    else:
        rows, returned = preview, 1
        fields.append(("Preview", plain_value(preview)))
    return DetailResult(
        title="Dataset preview",
        data={
            "dataset": dataset,
            "rows": rows,
            "requested_rows": args.rows,
            "returned_rows": returned,
            "available": True,
            **session.result_context(),
        },
        fields=fields,
    )
