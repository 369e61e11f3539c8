"""A dataset's way up (a validated file, the dataset created, the bytes sent, the platform
told) and down (a stored dataset into a local file), through presigned URLs.

An upload that fails, or is interrupted, after the dataset was created is aborted on the
platform, so no half upload is left behind.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from urllib.parse import unquote, urlsplit

from osmosis_ai.platform.client.api import (
    DownloadLink,
    JSONObject,
    PlatformClient,
    UploadInstructions,
    Warn,
    segment,
)
from osmosis_ai.platform.client.errors import (
    AlreadyExistsError,
    LocalFileError,
    NotCompletedError,
    NotReadyError,
    PlatformClientError,
)
from osmosis_ai.platform.client.transfer import (
    ProgressBar,
    progress_of,
    safe_name,
    transfers_for,
)
from osmosis_ai.rundir.datasets import DATASET_SUFFIXES

DATASETS_PATH = "/api/cli/datasets"
COMPLETE_ATTEMPTS = 5
IN_PROGRESS = ("pending", "uploading", "processing")


# --- up -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatasetFile:
    """A local dataset file that passed validation; the dataset is named after its stem."""

    path: Path
    size: int
    extension: str
    warnings: list[dict[str, str]]

    @property
    def name(self) -> str:
        return self.path.stem


def check_dataset_file(file: Path, *, warn: Warn | None = None) -> DatasetFile:
    """``file`` checked with the rules of ``osmosis dataset validate``; each warning goes to
    ``warn``. Raises :class:`LocalFileError` (``NOT_FOUND`` or ``VALIDATION``)."""
    from osmosis_ai.workspace import validate_dataset

    path = file.expanduser().resolve()
    if not path.is_file():
        raise LocalFileError(f"File not found: {file}", {"file": str(file)}, code="NOT_FOUND")
    validation = validate_dataset(path)
    for warning in validation.warnings:
        if warn is not None:
            warn(warning.code, warning.message)
    if not validation.valid:
        problems = "\n".join(f"  - {error}" for error in validation.errors)
        raise LocalFileError(f"{path} is not a valid dataset:\n{problems}", validation.to_dict())
    return DatasetFile(
        path, path.stat().st_size, validation.extension, [w.to_dict() for w in validation.warnings]
    )


def upload_dataset(
    client: PlatformClient,
    dataset: DatasetFile,
    *,
    overwrite: bool = False,
    progress: ProgressBar | None = None,
) -> JSONObject:
    """Create the dataset (replacing one of the same name with ``overwrite``), send its
    bytes and tell the platform; the dataset's record."""
    created = _create(client, dataset, overwrite=overwrite)
    dataset_id = created.get("id")
    if not isinstance(dataset_id, str) or not isinstance(created.get("upload"), dict):
        raise PlatformClientError(
            "PLATFORM_ERROR",
            "The platform created no upload for the dataset (no id or upload instructions).",
        )
    instructions = client.model(UploadInstructions, created["upload"], f"POST {DATASETS_PATH}")
    path = dataset.path
    try:
        with (
            transfers_for(client) as transfers,
            progress_of(progress, path.stat().st_size, f"Uploading {path.name}") as shown,
        ):
            parts = transfers.upload(instructions, path, progress=shown)
    except BaseException as exc:  # Ctrl-C too: the platform must not keep a half upload
        _abort(client, dataset_id)
        if isinstance(exc, OSError):
            raise LocalFileError(f"Cannot read {path}: {exc}", {"file": str(path)}) from exc
        raise
    body: dict[str, object] = {"file_extension": dataset.extension}
    if parts is not None:
        body["parts"] = parts
    return _complete(client, dataset_id, body) or created


def _create(client: PlatformClient, dataset: DatasetFile, *, overwrite: bool) -> JSONObject:
    payload: dict[str, object] = {
        "file_name": dataset.name,
        "file_size": dataset.size,
        "extension": dataset.extension,
    }
    try:
        return client.call("POST", DATASETS_PATH, json=payload)
    except PlatformClientError as exc:
        existing = exc.details.get("existing_dataset_id")
        if exc.status_code != 409 or not isinstance(existing, str):
            raise
        if not overwrite:
            raise AlreadyExistsError(
                f"A dataset named '{dataset.name}' already exists. Use --overwrite to replace it.",
                dict(exc.details),
            ) from exc
    return client.call("POST", DATASETS_PATH, json={**payload, "overwrite_dataset_id": existing})


def _abort(client: PlatformClient, dataset_id: str) -> None:
    try:
        client.call("POST", f"{DATASETS_PATH}/{segment(dataset_id)}/abort", json={})
    except PlatformClientError as exc:
        if client.warn is not None:
            client.warn("ABORT_FAILED", f"The platform could not abort the upload: {exc.message}")


def _complete(client: PlatformClient, dataset_id: str, body: dict[str, object]) -> JSONObject:
    """Tell the platform the bytes are there; transient failures are retried with backoff."""
    path = f"{DATASETS_PATH}/{segment(dataset_id)}/complete"
    last: PlatformClientError | None = None
    for attempt in range(COMPLETE_ATTEMPTS):
        if attempt:
            client.sleep(min(2.0 ** (attempt - 1), 8.0))
        try:
            return client.call("POST", path, json=body, timeout=120.0)
        except PlatformClientError as exc:
            transient = exc.status_code is None or exc.status_code >= 500 or exc.status_code == 429
            if exc.code == "AUTH_REQUIRED" or not transient:
                raise
            last = exc
    assert last is not None
    raise NotCompletedError(
        f"The file was uploaded, but the platform was not told so after {COMPLETE_ATTEMPTS} "
        f"attempts ({last.message}). Run the upload again.",
        {"dataset_id": dataset_id, **last.details},
    ) from last


# --- down -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class DownloadedDataset:
    record: JSONObject  # the dataset as the platform describes it
    path: Path


def download_dataset(
    client: PlatformClient,
    name: str,
    output: str | None = None,
    *,
    overwrite: bool = False,
    progress: ProgressBar | None = None,
) -> DownloadedDataset:
    """Fetch the dataset ``name`` (or id) into ``output``: a file, or a directory (existing,
    or ending in ``/``) to put the platform's file name in; by default the working directory."""
    record = client.call("GET", f"{DATASETS_PATH}/{segment(name)}")
    status = record.get("status")
    if status != "uploaded":
        why = (
            f"it is still processing (status: {status}); try again when it is done"
            if status in IN_PROGRESS
            else f"its status is {status}"
        )
        raise NotReadyError(f"The dataset {name} cannot be downloaded: {why}.", {"status": status})
    path = f"{DATASETS_PATH}/{segment(name)}/download"
    link = client.model(DownloadLink, client.call("GET", path), f"GET {path}")
    file_name = safe_name(link.file_name or record.get("file_name") or name)
    destination = _destination(output, _with_extension(file_name, link.presigned_url))
    size = record.get("file_size")
    expected = size if isinstance(size, int) and not isinstance(size, bool) else None
    try:
        with (
            transfers_for(client) as transfers,
            progress_of(progress, expected or 0, f"Downloading {destination.name}") as shown,
        ):
            transfers.download(
                link.presigned_url,
                destination,
                overwrite=overwrite,
                expected_size=expected,
                progress=shown,
            )
    except FileExistsError:
        raise AlreadyExistsError(
            f"{destination} already exists. Use --overwrite to replace it.",
            {"output_path": str(destination)},
        ) from None
    return DownloadedDataset(record, destination)


def _with_extension(name: str, url: str) -> str:
    if Path(name).suffix.lower() in DATASET_SUFFIXES:
        return name
    suffix = PurePosixPath(unquote(urlsplit(url).path)).suffix.lower()
    return f"{name}{suffix}" if suffix in DATASET_SUFFIXES else name


def _destination(output: str | None, file_name: str) -> Path:
    if output is None:
        return Path.cwd() / file_name
    target = Path(output).expanduser()
    if target.is_dir() or output.endswith((os.sep, "/")):
        return target / file_name
    return target
