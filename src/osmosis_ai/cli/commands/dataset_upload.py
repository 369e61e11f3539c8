"""``osmosis dataset upload FILE [--overwrite] [-y]``: validate, then upload to the platform.

The file is checked with the same rules as ``osmosis dataset validate``; the dataset is
named after the file's stem. The bytes go to presigned URLs (one PUT, or parts with their
ETags), streamed from disk; on failure or Ctrl-C the platform is told to abort.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli import records
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import Session, open_session
from osmosis_ai.cli.transfer_progress import transfer_progress
from osmosis_ai.platform.client import JSONObject, PlatformClientError, UploadInstructions, segment

COMPLETE_ATTEMPTS = 5


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "file", metavar="FILE", type=Path, help="the dataset file (.jsonl, .csv or .parquet)"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a dataset of the same name"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.workspace import validate_dataset

    with open_session(ctx) as session:
        path: Path = args.file.expanduser().resolve()
        if not path.is_file():
            raise CLIError(
                CLIErrorCode.NOT_FOUND, f"File not found: {args.file}", {"file": str(args.file)}
            )
        validation = validate_dataset(path)
        for warning in validation.warnings:
            ctx.warn(warning.code, warning.message)
        if not validation.valid:
            problems = "\n".join(f"  - {error}" for error in validation.errors)
            raise CLIError(
                CLIErrorCode.VALIDATION,
                f"{path} is not a valid dataset:\n{problems}",
                validation.to_dict(),
            )
        size, name, extension = path.stat().st_size, path.stem, validation.extension
        confirm(
            f"Replace the dataset '{name}' with {path.name}?"
            if args.overwrite
            else f"Upload {path.name} as dataset '{name}'?",
            yes=args.yes,
            summary={"File": path.name, "Size": records.size_text(size), "Dataset": name},
            warnings=["--overwrite replaces the dataset of the same name."]
            if args.overwrite
            else [],
        )
        created = _create(session, name, size, extension, overwrite=args.overwrite)
        dataset = _upload(ctx, session, created, path, extension)
        resource = {**records.dataset(dataset), **session.result_context()}
        url = dataset.get("platform_url")
        warnings = [w.to_dict() for w in validation.warnings]
        return OperationResult(
            operation="dataset.upload",
            status="success",
            resource=resource,
            message=f"Dataset uploaded: {dataset.get('file_name') or name}",
            next_steps=[
                f"Processing continues on the platform: {url}"
                if url
                else f"Processing continues on the platform; check it with: osmosis dataset "
                f"info {name}"
            ],
            next_steps_structured=[{"label": "View dataset", "url": url}]
            if url
            else [{"action": "dataset_info", "id": dataset.get("id")}],
            extra={"warnings": warnings} if warnings else {},
        )


def _create(
    session: Session, name: str, size: int, extension: str, *, overwrite: bool
) -> JSONObject:
    payload: dict[str, object] = {"file_name": name, "file_size": size, "extension": extension}
    try:
        return session.client.call("POST", "/api/cli/datasets", json=payload)
    except PlatformClientError as exc:
        existing = exc.details.get("existing_dataset_id")
        if exc.status_code != 409 or not isinstance(existing, str):
            raise
        if not overwrite:
            raise CLIError(
                CLIErrorCode.CONFLICT,
                f"A dataset named '{name}' already exists. Use --overwrite to replace it.",
                dict(exc.details),
            ) from exc
    return session.client.call(
        "POST", "/api/cli/datasets", json={**payload, "overwrite_dataset_id": existing}
    )


def _upload(
    ctx: Context, session: Session, created: JSONObject, path: Path, extension: str
) -> JSONObject:
    client = session.client
    dataset_id = created.get("id")
    if not isinstance(dataset_id, str) or not isinstance(created.get("upload"), dict):
        raise CLIError(
            CLIErrorCode.PLATFORM_ERROR,
            "The platform created no upload for the dataset (no id or upload instructions).",
        )
    instructions = client.model(UploadInstructions, created["upload"], "POST /api/cli/datasets")
    try:
        with (
            session.transfers() as transfers,
            transfer_progress(ctx, path.stat().st_size, f"Uploading {path.name}") as progress,
        ):
            parts = transfers.upload(instructions, path, progress=progress)
    except BaseException as exc:  # Ctrl-C too: the platform must not keep a half upload
        _abort(ctx, session, dataset_id)
        if isinstance(exc, PlatformClientError | KeyboardInterrupt | CLIError):
            raise
        if isinstance(exc, OSError):
            raise CLIError(
                CLIErrorCode.VALIDATION, f"Cannot read {path}: {exc}", {"file": str(path)}
            ) from exc
        raise
    body: dict[str, object] = {"file_extension": extension}
    if parts is not None:
        body["parts"] = parts
    return _complete(session, dataset_id, body) or created


def _abort(ctx: Context, session: Session, dataset_id: str) -> None:
    try:
        session.client.call("POST", f"/api/cli/datasets/{segment(dataset_id)}/abort", json={})
    except PlatformClientError as exc:
        ctx.warn("ABORT_FAILED", f"The platform could not abort the upload: {exc.message}")


def _complete(session: Session, dataset_id: str, body: dict[str, object]) -> JSONObject:
    """Tell the platform the bytes are there; transient failures are retried with backoff."""
    path = f"/api/cli/datasets/{segment(dataset_id)}/complete"
    last: PlatformClientError | None = None
    for attempt in range(COMPLETE_ATTEMPTS):
        if attempt:
            session.client.sleep(min(2.0 ** (attempt - 1), 8.0))
        try:
            return session.client.call("POST", path, json=body, timeout=120.0)
        except PlatformClientError as exc:
            transient = exc.status_code is None or exc.status_code >= 500 or exc.status_code == 429
            if exc.code == "AUTH_REQUIRED" or not transient:
                raise
            last = exc
    assert last is not None
    raise CLIError(
        CLIErrorCode.PLATFORM_ERROR,
        f"The file was uploaded, but the platform was not told so after {COMPLETE_ATTEMPTS} "
        f"attempts ({last.message}). Run the upload again.",
        {"dataset_id": dataset_id, **last.details},
    ) from last
