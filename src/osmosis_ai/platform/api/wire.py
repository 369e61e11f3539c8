"""Wire models several routers share (pydantic, apart from the ORM). A resource's own request
and answer models live in its router module."""

from __future__ import annotations

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
