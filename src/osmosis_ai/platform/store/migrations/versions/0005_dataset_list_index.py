"""Datasets are listed newest first per workspace: an index in that order, so a page is read
from the index instead of sorting every dataset of the workspace.

Revision ID: 0005
Revises: 0004
Create Date: 2026-12-02
"""

from __future__ import annotations

from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index(
        op.f("ix_datasets_workspace_id_created_at_id"),
        "datasets",
        ["workspace_id", "created_at", "id"],
        unique=False,
    )


def downgrade() -> None:
    op.drop_index(op.f("ix_datasets_workspace_id_created_at_id"), table_name="datasets")
