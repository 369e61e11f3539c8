"""Alembic's entry point: migrate the connection the platform hands over (never a URL here)."""

from __future__ import annotations

from alembic import context
from sqlalchemy import Connection

from osmosis_ai.platform.store.orm import Base

connection = context.config.attributes.get("connection")
if not isinstance(connection, Connection):
    raise RuntimeError(
        "Platform migrations run through osmosis_ai.platform.store.migrate.upgrade(), "
        "which passes a connection."
    )
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
    compare_type=True,
)
with context.begin_transaction():
    context.run_migrations()
