"""What a workspace keeps in the object store, and the limits a new upload is held to.

An upload is checked before any URL is signed for it: each file against
:data:`MAX_FILE_BYTES`, and the workspace's declared total (its datasets that were not
cancelled, its eval imports that did not expire or fail) plus the new upload against the
server's ``workspace_quota_bytes``. Sizes are the ones declared when the uploads were opened:
a URL is signed for exactly that many bytes, so nothing can store more.
"""

from __future__ import annotations

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import InvalidRequestError, PlatformError
from osmosis_ai.platform.store.orm import Dataset, EvalImport
from osmosis_ai.workspace.dataset import MAX_FILE_SIZE

MAX_FILE_BYTES = MAX_FILE_SIZE  # 5 GiB: one dataset, or one file of an imported run
HELD_IMPORTS = ("uploading", "finalized")


class QuotaExceededError(PlatformError):
    status_code = 413
    default_code = "STORAGE_QUOTA_EXCEEDED"


def check_file_size(size: int, *, name: str, field: str) -> None:
    """400 unless ``size`` (bytes declared for ``name``) fits one file's limit."""
    if not 0 <= size <= MAX_FILE_BYTES:
        raise InvalidRequestError(
            f"{name} declares {size} bytes; one file may hold 0 to {MAX_FILE_BYTES} bytes (5 GiB)",
            field=field,
            code="FILE_TOO_LARGE",
        )


def workspace_usage(session: Session, workspace_id: str) -> int:
    """Bytes the workspace holds or has been promised, by declared size."""
    datasets = session.scalar(
        select(func.coalesce(func.sum(Dataset.file_size), 0)).where(
            Dataset.workspace_id == workspace_id, Dataset.status != "cancelled"
        )
    )
    imports = session.scalars(
        select(EvalImport.files).where(
            EvalImport.workspace_id == workspace_id, EvalImport.status.in_(HELD_IMPORTS)
        )
    )
    imported = sum(int(item.get("size") or 0) for files in imports for item in files)  # pyright: ignore[reportArgumentType]
    return int(datasets or 0) + imported


def check_room(session: Session, workspace_id: str, adding: int, *, quota_bytes: int) -> None:
    """413 unless the workspace can take ``adding`` more bytes within ``quota_bytes``."""
    used = workspace_usage(session, workspace_id)
    if used + adding > quota_bytes:
        raise QuotaExceededError(
            f"This upload of {adding} bytes would take the workspace to {used + adding} bytes, "
            f"over its quota of {quota_bytes} ({used} in use). Delete or overwrite old "
            "datasets, or ask the platform admin to raise --workspace-quota-bytes.",
            details={"used_bytes": used, "adding_bytes": adding, "quota_bytes": quota_bytes},
        )
