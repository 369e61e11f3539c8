"""``osmosis dataset download NAME [-o FILE|DIR] [--overwrite]``: fetch a stored dataset."""

from __future__ import annotations

import argparse
import os
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from osmosis_ai.cli import records
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.cli.transfer_progress import transfer_progress
from osmosis_ai.platform.client import DownloadLink, segment

IN_PROGRESS = ("pending", "uploading", "processing")
EXTENSIONS = (".jsonl", ".csv", ".parquet")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="the dataset's name (or id)")
    parser.add_argument(
        "-o", "--output", help="file, or directory (existing, or ending in /) to download into"
    )
    parser.add_argument("--overwrite", action="store_true", help="replace an existing file")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    with open_session(ctx) as session:
        client = session.client
        record = client.call("GET", f"/api/cli/datasets/{segment(args.name)}")
        status = record.get("status")
        if status != "uploaded":
            why = (
                f"it is still processing (status: {status}); try again when it is done"
                if status in IN_PROGRESS
                else f"its status is {status}"
            )
            raise CLIError(
                CLIErrorCode.VALIDATION,
                f"The dataset {args.name} cannot be downloaded: {why}.",
                {"status": status},
            )
        path = f"/api/cli/datasets/{segment(args.name)}/download"
        link = client.model(DownloadLink, client.call("GET", path), f"GET {path}")
        file_name = _safe_name(link.file_name or record.get("file_name") or args.name)
        destination = _destination(args.output, _with_extension(file_name, link.presigned_url))
        size = record.get("file_size")
        expected = size if isinstance(size, int) and not isinstance(size, bool) else None
        try:
            with (
                session.transfers() as transfers,
                transfer_progress(ctx, expected or 0, f"Downloading {destination.name}") as bar,
            ):
                transfers.download(
                    link.presigned_url,
                    destination,
                    overwrite=args.overwrite,
                    expected_size=expected,
                    progress=bar,
                )
        except FileExistsError:
            raise CLIError(
                CLIErrorCode.CONFLICT,
                f"{destination} already exists. Use --overwrite to replace it.",
                {"output_path": str(destination)},
            ) from None
        resource = {
            **records.dataset(record),
            "output_path": str(destination),
            **session.result_context(),
        }
        return OperationResult(
            operation="dataset.download",
            status="success",
            resource=resource,
            message=f"Dataset downloaded: {destination}",
        )


def _safe_name(name: object) -> str:
    """A file name from the platform, reduced to its last component."""
    base = PurePosixPath(str(name).replace("\\", "/")).name
    if base in ("", ".", ".."):
        raise CLIError(CLIErrorCode.PLATFORM_ERROR, f"The platform sent a bad file name: {name!r}")
    return base


def _with_extension(name: str, url: str) -> str:
    if Path(name).suffix.lower() in EXTENSIONS:
        return name
    suffix = PurePosixPath(unquote(urlsplit(url).path)).suffix.lower()
    return f"{name}{suffix}" if suffix in EXTENSIONS else name


def _destination(output: str | None, file_name: str) -> Path:
    if output is None:
        return Path.cwd() / file_name
    target = Path(output).expanduser()
    if target.is_dir() or output.endswith((os.sep, "/")):
        return target / file_name
    return target
