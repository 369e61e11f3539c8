"""Signing out of the dashboard ends its sessions on the server: ``tokens.session_generation``
is written into each session cookie and raised by sign-out, so a cookie minted before it
(a copy kept elsewhere) is refused afterwards.

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-02
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.add_column(
            sa.Column(
                "session_generation", sa.Integer(), nullable=False, server_default=sa.text("0")
            )
        )
    with op.batch_alter_table("tokens") as batch:
        batch.alter_column("session_generation", server_default=None)


def downgrade() -> None:
    with op.batch_alter_table("tokens") as batch:
        batch.drop_column("session_generation")
