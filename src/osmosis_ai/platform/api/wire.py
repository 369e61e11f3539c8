"""Wire models several routers share (pydantic, apart from the ORM). A resource's own request
and answer models live in its router module."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import BaseModel, ConfigDict
from pydantic_core import to_json

from osmosis_ai.platform.services.paging import CursorPage, Page
from osmosis_ai.platform.store.orm import DatasetLog, RunLog


class WireModel(BaseModel):
    """Base of answers: unknown fields are ignored on input, never invented on output."""

    model_config = ConfigDict(extra="ignore")


class UserOut(WireModel):
    id: str
    email: str
    name: str | None = None


class WorkspaceRoleOut(WireModel):
    id: str
    name: str
    role: str


class LogOut(WireModel):
    timestamp: datetime
    level: str
    step: str
    message: str
    details: dict[str, Any] | None = None


class LogsOut(WireModel):
    logs: list[LogOut]
    next_cursor: str | None = None


def logs_out(page: CursorPage[DatasetLog] | CursorPage[RunLog]) -> LogsOut:
    """A page of a dataset's or a run's log as the ``.../logs`` routes answer it."""
    return LogsOut(
        logs=[
            LogOut(
                timestamp=entry.timestamp,
                level=entry.level,
                step=entry.step,
                message=entry.message,
                details=entry.details,
            )
            for entry in page.items
        ],
        next_cursor=page.next_cursor,
    )


def page_fields(page: Page[Any]) -> dict[str, Any]:
    """The paging fields of a list answer, for its model (which fixes their place in it)."""
    return {
        "total_count": page.total_count,
        "has_more": page.has_more,
        "next_offset": page.next_offset,
    }


def json_bytes(payload: object) -> bytes:
    """``payload`` (JSON values and aware datetimes) as the bytes pydantic would answer with.

    For hot list routes that build plain rows instead of one model per item: pydantic's own
    encoder, without a model, is a quarter of the cost of ``json.dumps`` with a default hook.
    """
    return to_json(payload)
