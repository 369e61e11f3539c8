"""Datasets: create with an upload plan, complete, process, abort, list, find, download, logs.

A dataset's life (reference §6.2): ``uploading`` (created; the file goes to the object
store through signed URLs) → ``processing`` (upload completed) → ``uploaded`` (valid, with
``row_count`` and ``data_preview``) or ``error`` (the validation errors are its logs); an
aborted upload ends ``cancelled``. Processing runs the same checks as
``osmosis dataset validate`` (:func:`osmosis_ai.workspace.dataset.validate_dataset`).

Names are the file's stem, unique per workspace among datasets that are not cancelled.
Creating a name that exists answers 409 with ``existing_dataset_id``; sending that id as
``overwrite_dataset_id`` creates a new dataset that replaces every older one of the name
once it is ``uploaded`` (until then the old one stays usable).
"""

from __future__ import annotations

import datetime as dt
import json
import math
import re
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import TimeoutError as FutureTimeout
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, Integer, String, bindparam, delete, func, select
from sqlalchemy.orm import Session

from osmosis_ai.deadlines import DATASET_PROCESSING
from osmosis_ai.errors import DeadlineError
from osmosis_ai.platform.errors import ConflictError, InvalidRequestError, NotFoundError
from osmosis_ai.platform.objects import (
    DEFAULT_EXPIRES_IN,
    ObjectNotFoundError,
    ObjectStore,
    UrlSigner,
)
from osmosis_ai.platform.services import storage
from osmosis_ai.platform.services.accounts import (
    WorkspaceAccess,
    display_names,
    require_creator_or_manager,
)
from osmosis_ai.platform.services.paging import CursorPage, Page, check_page, cursor_page
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Dataset, DatasetLog, Upload, User
from osmosis_ai.workspace.dataset import (
    EXTENSIONS,
    MAX_FILE_SIZE,
    DatasetValidation,
    read_rows,
    validate_dataset,
)

CONTENT_TYPE = "application/octet-stream"
MULTIPART_THRESHOLD = 100 * 1024 * 1024  # larger files are sent in parts
PART_SIZE = 64 * 1024 * 1024
PREVIEW_ROWS = 20
PREVIEW_VALUE_CHARS = 2000
# An upload not completed this long after its URLs expired is cancelled and its data dropped.
STALE_UPLOAD_GRACE = dt.timedelta(days=1)
# Files up to this size are processed before ``complete`` answers; larger ones after it.
INLINE_PROCESSING_BYTES = 16 * 1024 * 1024
# In bytes: the name is a file name on disk (``<name>.<extension>``, at most 255 bytes).
MAX_NAME_BYTES = 200
_BAD_NAME_CHARS = re.compile(r"[/\\\x00-\x1f\x7f]")


class DatasetExistsError(ConflictError):
    """409 naming the dataset that holds the name (the CLI offers ``--overwrite``)."""

    default_code = "DATASET_EXISTS"

    def __init__(self, name: str, existing_id: str) -> None:
        self.existing_id = existing_id
        super().__init__(
            f"A dataset named {name!r} exists already (id {existing_id}); upload with "
            "--overwrite to replace it.",
            field="file_name",
            details={"existing_dataset_id": existing_id},
        )

    def envelope(self) -> dict[str, object]:
        # Older CLIs read the id from the top level of the error body.
        return {**super().envelope(), "existing_dataset_id": self.existing_id}


class DatasetNotFoundError(NotFoundError):
    default_code = "DATASET_NOT_FOUND"


# --- the upload plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class UploadPlan:
    """How the client sends the file (the ``upload`` object of the create answer)."""

    method: str
    expires_in: int
    presigned_url: str | None = None
    upload_headers: dict[str, str] | None = None
    part_size: int | None = None
    total_parts: int | None = None
    presigned_urls: list[dict[str, object]] | None = None


@dataclass(frozen=True)
class CreatedDataset:
    dataset: Dataset
    upload: UploadPlan


def object_key(dataset: Dataset) -> str:
    return f"datasets/{dataset.workspace_id}/{dataset.id}/{stored_file_name(dataset)}"


def stored_file_name(dataset: Dataset) -> str:
    """The file name a download is saved as: ``<name>.<extension>``."""
    return f"{dataset.file_name}.{dataset.extension}"


def check_name(name: str) -> str:
    """A dataset name (a file stem); path separators, control characters and dot names refused."""
    if not name or not name.strip():
        raise InvalidRequestError(
            "file_name is empty: name the dataset by its file stem", field="file_name"
        )
    if name != name.strip():
        raise InvalidRequestError(
            f"file_name {name!r} starts or ends with white space; remove it", field="file_name"
        )
    size = len(name.encode("utf-8", errors="replace"))
    if size > MAX_NAME_BYTES:
        raise InvalidRequestError(
            f"file_name is {size} bytes in UTF-8; the limit is {MAX_NAME_BYTES} bytes (a "
            "character outside ASCII takes 2 to 4): use a shorter name",
            field="file_name",
        )
    bad = _BAD_NAME_CHARS.search(name)
    if bad or name in (".", ".."):
        what = f"the character {bad.group()!r}" if bad else "a relative path"
        raise InvalidRequestError(
            f"file_name {name!r} contains {what}: a dataset name is a file stem without "
            "folders, such as 'train-v2'",
            field="file_name",
        )
    return name


def check_extension(extension: str) -> str:
    value = extension.strip().lower().lstrip(".")
    if value not in EXTENSIONS:
        raise InvalidRequestError(
            f"extension {extension!r} is not supported: use jsonl, csv or parquet",
            field="extension",
        )
    return value


def create_dataset(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    *,
    file_name: str,
    file_size: int,
    extension: str,
    overwrite_dataset_id: str | None,
    store: ObjectStore,
    signer: UrlSigner,
    base_url: str,
    now: dt.datetime,
    quota_bytes: int,
) -> CreatedDataset:
    """A new dataset in ``uploading`` and the signed URLs its file goes to, if the workspace
    has room for it under ``quota_bytes``."""
    name = check_name(file_name)
    ext = check_extension(extension)
    expire_stale_uploads(session, store, now, workspace_id=workspace.id)
    if not 0 < file_size <= MAX_FILE_SIZE:
        raise InvalidRequestError(
            f"file_size {file_size} is out of range: a dataset holds 1 byte to "
            f"{MAX_FILE_SIZE} bytes (5 GiB)",
            field="file_size",
        )
    current = _current_by_name(session, workspace.id, name)
    if current is not None and current.id != overwrite_dataset_id:
        raise DatasetExistsError(name, current.id)
    storage.check_room(session, workspace.id, file_size, quota_bytes=quota_bytes)
    if overwrite_dataset_id is not None and current is None:
        raise DatasetNotFoundError(
            f"overwrite_dataset_id {overwrite_dataset_id!r} is not a dataset named {name!r} in "
            "this workspace; upload without it",
            field="overwrite_dataset_id",
        )
    if current is not None:
        require_creator_or_manager(
            workspace,
            user_id,
            current.creator_id,
            action="overwrite",
            what=f"dataset {name!r}",
            code="DATASET_OVERWRITE_FORBIDDEN",
        )
    dataset = Dataset(
        workspace_id=workspace.id,
        file_name=name,
        extension=ext,
        file_size=file_size,
        status="uploading",
        original_file_format=ext,
        original_file_size=file_size,
        creator_id=user_id,
        created_at=now,
        updated_at=now,
    )
    session.add(dataset)
    session.flush()
    key = dataset.object_key = object_key(dataset)
    multipart = file_size > MULTIPART_THRESHOLD
    upload = Upload(
        dataset_id=dataset.id,
        method="multipart" if multipart else "simple",
        expected_size=file_size,
        part_size=PART_SIZE if multipart else None,
        total_parts=math.ceil(file_size / PART_SIZE) if multipart else None,
        state="pending",
        created_at=now,
        updated_at=now,
        expires_at=now + dt.timedelta(seconds=DEFAULT_EXPIRES_IN),
    )
    session.add(upload)
    session.flush()
    replacing = f", replacing {current.id}" if current is not None else ""
    _log(
        session,
        dataset,
        now,
        "upload",
        f"Upload started: {file_size} bytes, {upload.method}{replacing}",
    )
    store.start_upload(key, upload.id)
    return CreatedDataset(dataset, _plan(dataset, upload, signer, base_url))


def _plan(dataset: Dataset, upload: Upload, signer: UrlSigner, base_url: str) -> UploadPlan:
    key = dataset.object_key or object_key(dataset)
    if upload.method == "simple":
        params = {
            "upload_id": upload.id,
            "size": str(dataset.file_size),
            "content_type": CONTENT_TYPE,
        }
        return UploadPlan(
            method="simple",
            expires_in=DEFAULT_EXPIRES_IN,
            presigned_url=signer.url(base_url, "put", key, params, expires_in=DEFAULT_EXPIRES_IN),
            upload_headers={"Content-Type": CONTENT_TYPE},
        )
    part_size = upload.part_size or PART_SIZE
    total = upload.total_parts or 1
    urls: list[dict[str, object]] = []
    for number in range(1, total + 1):
        size = min(part_size, dataset.file_size - (number - 1) * part_size)
        offset = (number - 1) * part_size  # parts land in place: completing copies nothing
        params = {
            "upload_id": upload.id,
            "part_number": str(number),
            "size": str(size),
            "offset": str(offset),
        }
        url = signer.url(base_url, "part", key, params, expires_in=DEFAULT_EXPIRES_IN)
        urls.append({"part_number": number, "presigned_url": url, "size": size})
    return UploadPlan(
        method="multipart",
        expires_in=DEFAULT_EXPIRES_IN,
        part_size=part_size,
        total_parts=total,
        presigned_urls=urls,
    )


# --- complete, abort, process --------------------------------------------------------------


def complete_upload(
    session: Session,
    workspace: WorkspaceAccess,
    dataset_id: str,
    *,
    parts: Sequence[tuple[int, str]] | None,
    file_extension: str | None,
    store: ObjectStore,
    now: dt.datetime,
) -> Dataset:
    """Make the uploaded file the dataset's object; the dataset moves to ``processing``.

    Completing again after success answers the dataset as it is (a client retrying a
    completion whose answer it lost). A refused completion leaves the upload open.
    """
    dataset = _by_id(session, workspace.id, dataset_id)
    upload = _latest_upload(session, dataset)
    if dataset.status != "uploading":
        if upload is not None and upload.state == "completed":
            return dataset
        raise ConflictError(
            f"dataset {dataset.file_name!r} is {dataset.status}, not uploading: start a new upload",
            code="DATASET_NOT_UPLOADING",
        )
    if file_extension is not None and check_extension(file_extension) != dataset.extension:
        raise InvalidRequestError(
            f"file_extension {file_extension!r} differs from the {dataset.extension!r} the "
            "upload was created with",
            field="file_extension",
        )
    if upload is None or upload.state != "pending":
        raise ConflictError(
            f"dataset {dataset.file_name!r} has no upload in flight", code="NO_UPLOAD"
        )
    if upload.method == "multipart":
        if not parts:
            raise InvalidRequestError(
                "this upload is multipart: send parts [{PartNumber, ETag}] for every part",
                field="parts",
            )
        numbers = sorted(number for number, _ in parts)
        if numbers != list(range(1, (upload.total_parts or 0) + 1)):
            raise InvalidRequestError(
                f"parts must name each of the {upload.total_parts} parts once, got part "
                f"numbers {numbers}",
                field="parts",
            )
    elif parts:
        raise InvalidRequestError("this upload is a simple PUT: send no parts", field="parts")
    key = dataset.object_key or object_key(dataset)
    try:
        store.complete_upload(
            upload.id, parts if upload.method == "multipart" else None, size=dataset.file_size
        )
    except ObjectNotFoundError:
        # Completed on disk by an earlier call whose transaction did not commit.
        if not store.exists(key) or store.stat(key).size != dataset.file_size:
            raise
    upload.state = "completed"
    upload.parts = (
        [{"part_number": n, "etag": e.strip('"')} for n, e in sorted(parts)] if parts else None
    )
    upload.updated_at = now
    dataset.status = "processing"
    dataset.updated_at = now
    _log(session, dataset, now, "upload", f"Upload complete: {dataset.file_size} bytes received")
    session.flush()
    return dataset


def abort_upload(
    session: Session,
    workspace: WorkspaceAccess,
    user_id: str,
    dataset_id: str,
    *,
    store: ObjectStore,
    now: dt.datetime,
) -> Dataset:
    """Cancel an upload in flight (idempotent); the dataset ends ``cancelled``.

    Only its creator or a workspace owner or admin may."""
    dataset = _by_id(session, workspace.id, dataset_id)
    require_creator_or_manager(
        workspace,
        user_id,
        dataset.creator_id,
        action="abort",
        what=f"the upload of dataset {dataset.file_name!r}",
        code="DATASET_ABORT_FORBIDDEN",
    )
    if dataset.status == "cancelled":
        return dataset
    if dataset.status != "uploading":
        raise ConflictError(
            f"dataset {dataset.file_name!r} is {dataset.status}: only an upload in flight can "
            "be aborted",
            code="DATASET_NOT_UPLOADING",
        )
    for upload in session.scalars(select(Upload).where(Upload.dataset_id == dataset.id)):
        if upload.state == "pending":
            store.abort_upload(upload.id)
            upload.state = "aborted"
            upload.updated_at = now
    dataset.status = "cancelled"
    dataset.updated_at = now
    _log(session, dataset, now, "upload", "Upload cancelled")
    session.flush()
    return dataset


@dataclass(frozen=True)
class DatasetProcessing:
    """What processing learnt from a dataset file."""

    validation: DatasetValidation
    data_preview: list[dict[str, object]] | None = None
    notes: list[str] = field(default_factory=list[str])

    @property
    def valid(self) -> bool:
        return self.validation.valid

    @property
    def row_count(self) -> int | None:
        return self.validation.row_count

    @property
    def file_format(self) -> str:
        return self.validation.extension


def process_file(path: Path, *, preview_rows: int = PREVIEW_ROWS) -> DatasetProcessing:
    """Validate a dataset file as ``osmosis dataset validate`` does, and read its first rows."""
    validation = validate_dataset(path)
    if not validation.valid:
        return DatasetProcessing(validation)
    notes = [warning.message for warning in validation.warnings]
    try:
        rows = read_rows(path, limit=preview_rows)
    except ImportError as exc:  # Parquet without pyarrow: validation was skipped too
        return DatasetProcessing(validation, None, [*notes, f"No preview: {exc}"])
    return DatasetProcessing(validation, [_preview_row(row) for row in rows], notes)


def process_dataset(
    database: Database,
    store: ObjectStore,
    dataset_id: str,
    *,
    clock: Callable[[], dt.datetime],
) -> str:
    """Process a ``processing`` dataset's file; returns the status it ends in.

    The file is read outside any transaction (it can take a while); the outcome, its logs
    and the removal of the datasets it replaces are written in one transaction after.
    """
    with database.transaction() as session:
        dataset = session.get(Dataset, dataset_id)
        if dataset is None or dataset.status != "processing":
            return dataset.status if dataset is not None else "missing"
        key = dataset.object_key or object_key(dataset)
        _log(session, dataset, clock(), "processing", "Processing: validating the file")
    outcome = _process_within(store.path(key), DATASET_PROCESSING.seconds())
    with database.transaction() as session:
        dataset = session.get(Dataset, dataset_id)
        if dataset is None or dataset.status != "processing":
            return dataset.status if dataset is not None else "missing"
        now = clock()
        dataset.updated_at = now
        if isinstance(outcome, str):
            dataset.status = "error"
            _log(session, dataset, now, "processing", outcome, level="error")
            return dataset.status
        for note in outcome.notes:
            _log(session, dataset, now, "processing", note, level="warning")
        if not outcome.valid:
            dataset.status = "error"
            errors = outcome.validation.errors
            for message in errors:
                _log(session, dataset, now, "validation", message, level="error")
            _log(
                session,
                dataset,
                now,
                "validation",
                f"Validation failed with {len(errors)} error(s); fix the file and upload it "
                "again with --overwrite",
                level="error",
                details={"errors": list(errors)},
            )
            return dataset.status
        dataset.status = "uploaded"
        dataset.row_count = outcome.row_count
        dataset.data_preview = outcome.data_preview
        dataset.file_format = outcome.file_format
        replaced = _replace_older(session, dataset, store)
        note = f"; replaced {len(replaced)} older dataset(s)" if replaced else ""
        rows = "an unknown number of" if outcome.row_count is None else str(outcome.row_count)
        _log(session, dataset, now, "processing", f"Ready: {rows} rows{note}")
        return dataset.status


class DatasetProcessingTimeoutError(DeadlineError):
    """A dataset file was not read and validated within the dataset processing deadline
    (``OSMOSIS_DATASET_PROCESSING_TIMEOUT_S``); the dataset ends in ``error``."""


def _process_within(path: Path, deadline_s: float) -> DatasetProcessing | str:
    """:func:`process_file` in a thread of its own, waited for at most ``deadline_s``: the
    outcome, or why there is none (a file that cannot be read, or one still being read at
    the deadline, whose thread is left to end on its own and whose outcome is then moot)."""
    done: Future[DatasetProcessing | str] = Future()

    def work() -> None:
        try:
            done.set_result(process_file(path))
        except Exception as exc:  # the outcome must be recorded whatever went wrong
            done.set_result(f"Processing failed: {type(exc).__name__}: {exc}")

    threading.Thread(target=work, name="dataset-processing", daemon=True).start()
    try:
        return done.result(timeout=deadline_s)
    except FutureTimeout:
        error = DATASET_PROCESSING.error(
            DatasetProcessingTimeoutError,
            "reading and validating the file did not finish",
            deadline_s,
        )
        return f"Processing failed: {type(error).__name__}: {error}"


def _replace_older(session: Session, dataset: Dataset, store: ObjectStore) -> list[str]:
    older = list(
        session.scalars(
            select(Dataset).where(
                Dataset.workspace_id == dataset.workspace_id,
                Dataset.file_name == dataset.file_name,
                Dataset.id != dataset.id,
                Dataset.created_at <= dataset.created_at,
            )
        )
    )
    for old in older:
        for upload in session.scalars(select(Upload).where(Upload.dataset_id == old.id)):
            if upload.state == "pending":
                store.abort_upload(upload.id)
        store.delete(old.object_key or object_key(old))
        session.execute(delete(DatasetLog).where(DatasetLog.dataset_id == old.id))
        session.execute(delete(Upload).where(Upload.dataset_id == old.id))
        session.delete(old)
    return [old.id for old in older]


def expire_stale_uploads(
    session: Session,
    store: ObjectStore,
    now: dt.datetime,
    *,
    workspace_id: str | None = None,
) -> int:
    """Cancel uploads whose URLs expired :data:`STALE_UPLOAD_GRACE` ago (in one workspace, or
    all), dropping what they received; how many. An abandoned upload holds no disk forever."""
    query = (
        select(Upload, Dataset)
        .join(Dataset, Dataset.id == Upload.dataset_id)
        .where(Upload.state == "pending", Upload.expires_at < now - STALE_UPLOAD_GRACE)
    )
    if workspace_id is not None:
        query = query.where(Dataset.workspace_id == workspace_id)
    expired = session.execute(query).all()
    for upload, dataset in expired:
        store.abort_upload(upload.id)
        upload.state = "aborted"
        upload.updated_at = now
        if dataset.status == "uploading":
            dataset.status = "cancelled"
            dataset.updated_at = now
            _log(session, dataset, now, "upload", "Upload expired unfinished; its data was dropped")
    session.flush()
    return len(expired)


def datasets_in_processing(session: Session) -> list[str]:
    """Ids of datasets left ``processing`` (by a server that stopped before finishing)."""
    query = select(Dataset.id).where(Dataset.status == "processing").order_by(Dataset.updated_at)
    return list(session.scalars(query))


def needs_inline_processing(dataset: Dataset) -> bool:
    return dataset.status == "processing" and dataset.file_size <= INLINE_PROCESSING_BYTES


# --- reading -----------------------------------------------------------------------------


# What a list item shows: every column but the preview (the detail has it), as plain rows.
LIST_COLUMNS = (
    Dataset.id,
    Dataset.file_name,
    Dataset.file_size,
    Dataset.status,
    Dataset.file_format,
    Dataset.original_file_format,
    Dataset.row_count,
    Dataset.original_file_size,
    Dataset.created_at,
    Dataset.updated_at,
)


# One page of a workspace's datasets, newest first, each row with its creator's name and
# email and the workspace's count of datasets (an uncorrelated subquery: counted once).
# Built once, so its SQL is compiled once and its cache key is not recomputed per call.
_WORKSPACE_ID = bindparam("workspace_id", type_=String)
_LIST_PAGE = (
    select(
        *LIST_COLUMNS,
        User.name,
        User.email,
        select(func.count())
        .select_from(Dataset)
        .where(Dataset.workspace_id == _WORKSPACE_ID)
        .scalar_subquery(),
    )
    .outerjoin(User, User.id == Dataset.creator_id)
    .where(Dataset.workspace_id == _WORKSPACE_ID)
    .order_by(Dataset.created_at.desc(), Dataset.id.desc())
    .limit(bindparam("limit", type_=Integer))
    .offset(bindparam("offset", type_=Integer))
)
_LIST_KEYS = tuple(column.key for column in LIST_COLUMNS)


def list_datasets(
    connection: Connection, workspace: WorkspaceAccess, *, limit: int, offset: int
) -> Page[dict[str, object]]:
    """The workspace's datasets, newest first, without previews, with ``creator_name``.

    Plain rows (no ORM objects) from one statement that also counts, so it needs no
    transaction (:meth:`Database.read_statement`): this is the CLI's most frequent read.
    Only a page past the end needs a second statement for the total.
    """
    check_page(limit, offset)
    params = {"workspace_id": workspace.id, "limit": limit, "offset": offset}
    width = len(_LIST_KEYS)
    items: list[dict[str, object]] = []
    total: int | None = None
    for row in connection.execute(_LIST_PAGE, params).all():
        data: tuple[object, ...] = tuple(row)
        item = dict(zip(_LIST_KEYS, data[:width], strict=True))
        item["data_preview"] = None
        item["creator_name"] = data[width] or data[width + 1]  # the creator's name, else email
        item["platform_url"] = None  # the detail's field: no web page per dataset yet
        items.append(item)
        total = row[-1]
    if total is None:  # no rows: none at all, or a page past the end
        count = select(func.count()).select_from(Dataset)
        total = (
            connection.scalar(count.where(Dataset.workspace_id == workspace.id)) if offset else 0
        )
    return Page(items, int(total or 0), offset)


def get_dataset(session: Session, workspace: WorkspaceAccess, name_or_id: str) -> Dataset:
    """A dataset by id, else the newest dataset of that name (404 if neither)."""
    found = session.scalar(
        select(Dataset).where(Dataset.workspace_id == workspace.id, Dataset.id == name_or_id)
    )
    if found is None:
        found = session.scalar(
            select(Dataset)
            .where(Dataset.workspace_id == workspace.id, Dataset.file_name == name_or_id)
            .order_by(Dataset.created_at.desc(), Dataset.id.desc())
            .limit(1)
        )
    if found is None:
        raise DatasetNotFoundError(
            f"No dataset {name_or_id!r} in workspace {workspace.name!r}; list them with "
            "osmosis dataset list"
        )
    return found


def dataset_for_run(session: Session, workspace: WorkspaceAccess, name: str) -> Dataset:
    """The newest ``uploaded`` dataset of ``name``: what a run config's dataset name means."""
    found = session.scalar(
        select(Dataset)
        .where(
            Dataset.workspace_id == workspace.id,
            Dataset.file_name == name,
            Dataset.status == "uploaded",
        )
        .order_by(Dataset.created_at.desc(), Dataset.id.desc())
        .limit(1)
    )
    if found is None:
        raise DatasetNotFoundError(
            f"No ready dataset named {name!r} in workspace {workspace.name!r}: upload it with "
            "osmosis dataset upload, and wait until its status is uploaded",
            field="dataset",
        )
    return found


@dataclass(frozen=True)
class Download:
    presigned_url: str
    expires_in: int
    file_name: str


def download_dataset(
    session: Session,
    workspace: WorkspaceAccess,
    name_or_id: str,
    *,
    signer: UrlSigner,
    base_url: str,
) -> Download:
    dataset = get_dataset(session, workspace, name_or_id)
    if dataset.status != "uploaded":
        raise ConflictError(
            f"dataset {dataset.file_name!r} is {dataset.status}: only an uploaded dataset can "
            "be downloaded",
            code="DATASET_NOT_READY",
        )
    name = stored_file_name(dataset)
    key = dataset.object_key or object_key(dataset)
    url = signer.url(base_url, "get", key, {"name": name}, expires_in=DEFAULT_EXPIRES_IN)
    return Download(url, DEFAULT_EXPIRES_IN, name)


def dataset_logs(
    session: Session,
    workspace: WorkspaceAccess,
    name_or_id: str,
    *,
    limit: int,
    direction: str,
    cursor: str | None,
) -> CursorPage[DatasetLog]:
    dataset = get_dataset(session, workspace, name_or_id)
    query = select(DatasetLog).where(DatasetLog.dataset_id == dataset.id)
    return cursor_page(
        session, query, DatasetLog.id, limit=limit, direction=direction, cursor=cursor
    )


def creator_names(session: Session, datasets: Sequence[Dataset]) -> dict[str, str]:
    """Display names (name, else email) of the datasets' creators, by user id."""
    return display_names(session, (d.creator_id for d in datasets))


# --- internals ---------------------------------------------------------------------------


def _by_id(session: Session, workspace_id: str, dataset_id: str) -> Dataset:
    dataset = session.scalar(
        select(Dataset).where(Dataset.workspace_id == workspace_id, Dataset.id == dataset_id)
    )
    if dataset is None:
        raise DatasetNotFoundError(f"No dataset with id {dataset_id!r} in this workspace")
    return dataset


def _current_by_name(session: Session, workspace_id: str, name: str) -> Dataset | None:
    return session.scalar(
        select(Dataset)
        .where(
            Dataset.workspace_id == workspace_id,
            Dataset.file_name == name,
            Dataset.status != "cancelled",
        )
        .order_by(Dataset.created_at.desc(), Dataset.id.desc())
        .limit(1)
    )


def _latest_upload(session: Session, dataset: Dataset) -> Upload | None:
    return session.scalar(
        select(Upload)
        .where(Upload.dataset_id == dataset.id)
        .order_by(Upload.created_at.desc())
        .limit(1)
    )


def _log(
    session: Session,
    dataset: Dataset,
    now: dt.datetime,
    step: str,
    message: str,
    *,
    level: str = "info",
    details: dict[str, object] | None = None,
) -> None:
    session.add(
        DatasetLog(
            dataset_id=dataset.id,
            timestamp=now,
            level=level,
            step=step,
            message=message,
            details=details,
        )
    )


def _preview_row(row: dict[str, object]) -> dict[str, object]:
    """A row as JSON values, long strings cut, so the preview stays small and serialisable."""
    return {str(key): _preview_value(value) for key, value in row.items()}


def _preview_value(value: object) -> object:
    if isinstance(value, str):
        if len(value) > PREVIEW_VALUE_CHARS:
            return value[:PREVIEW_VALUE_CHARS] + "…"
        return value
    if value is None or isinstance(value, bool | int):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {str(k): _preview_value(v) for k, v in value.items()}  # pyright: ignore[reportUnknownVariableType]
    if isinstance(value, list | tuple):
        return [_preview_value(item) for item in value]  # pyright: ignore[reportUnknownVariableType]
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return str(value)
    return value
