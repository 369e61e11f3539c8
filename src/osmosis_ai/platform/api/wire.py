"""Wire models several routers share (pydantic, apart from the ORM). A resource's own request
and answer models live in its router module."""

from __future__ import annotations

import json
from datetime import datetime

from pydantic import BaseModel, ConfigDict


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


def json_bytes(payload: object) -> bytes:
    """``payload`` (JSON values and aware datetimes) as the bytes pydantic would answer with.

    For hot list routes that build plain rows instead of one model per item.
    """
    return json.dumps(
        payload, default=_json_default, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def _json_default(value: object) -> object:
    if isinstance(value, datetime):
        return value.isoformat().replace("+00:00", "Z")
    raise TypeError(f"{type(value).__name__} is not JSON serializable")
