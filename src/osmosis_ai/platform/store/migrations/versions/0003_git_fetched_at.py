"""When each workspace's repository was last fetched, so listings can reuse a fresh fetch.

Revision ID: 0003
Revises: 0002
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column(
        "workspaces", sa.Column("git_fetched_at", sa.DateTime(timezone=True), nullable=True)
    )


def downgrade() -> None:
    with op.batch_alter_table("workspaces") as batch:
        batch.drop_column("git_fetched_at")
