"""The platform's database: ``orm`` (every table), ``database`` (engine, sessions, opening),
``migrate`` (Alembic under a lock, run at start) and ``migrations/`` (the revisions)."""
