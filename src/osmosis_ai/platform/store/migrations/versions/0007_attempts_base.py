"""A retried run starts counting lost attempts afresh: ``runs.attempts_base`` is the attempt
its current execution began after, while ``attempt`` keeps growing (it fences every write).

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.add_column(
            sa.Column("attempts_base", sa.Integer(), nullable=False, server_default=sa.text("0"))
        )
    with op.batch_alter_table("runs") as batch:
        batch.alter_column("attempts_base", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("runs") as batch:
        batch.drop_column("attempts_base")
