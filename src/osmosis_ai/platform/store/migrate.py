"""Schema migrations, run programmatically at start: no ``alembic.ini`` for users to keep.

``upgrade(engine)`` takes a lock first (a file lock beside a SQLite database,
``pg_advisory_lock`` on PostgreSQL) so servers and admin commands starting together migrate
once, then refuses a database whose revision this release does not know (it was migrated by a
newer osmosis-ai) before upgrading to head.
"""

from __future__ import annotations

import contextlib
import fcntl
from collections.abc import Generator
from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, Engine, text

from osmosis_ai.platform.errors import SchemaTooNewError

MIGRATIONS_DIR = Path(__file__).resolve().parent / "migrations"
# Any fixed 64-bit number: the key all osmosis platforms lock their migrations under.
PG_LOCK_KEY = 0x05A1_5A1_0000_0001


def alembic_config(connection: Connection | None = None) -> Config:
    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    if connection is not None:
        config.attributes["connection"] = connection
    return config


def script_directory() -> ScriptDirectory:
    return ScriptDirectory.from_config(alembic_config())


def head_revision() -> str | None:
    return script_directory().get_current_head()


def current_revision(connection: Connection) -> str | None:
    return MigrationContext.configure(connection).get_current_revision()


def upgrade(engine: Engine, revision: str = "head") -> None:
    """Migrate the database of ``engine`` to ``revision`` (head), holding the migration lock."""
    with _migration_lock(engine) as connection:
        check_revision(connection)
        command.upgrade(alembic_config(connection), revision)
        connection.commit()


def check_revision(connection: Connection) -> None:
    """Raise ``SchemaTooNewError`` when the database is at a revision this code lacks."""
    current = current_revision(connection)
    connection.commit()
    if current is None:
        return
    known = {script.revision for script in script_directory().walk_revisions()}
    if current not in known:
        raise SchemaTooNewError(current, head_revision())


@contextlib.contextmanager
def _migration_lock(engine: Engine) -> Generator[Connection]:
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            connection.execute(text("SELECT pg_advisory_lock(:key)"), {"key": PG_LOCK_KEY})
            connection.commit()
            try:
                yield connection
            finally:
                connection.rollback()
                connection.execute(text("SELECT pg_advisory_unlock(:key)"), {"key": PG_LOCK_KEY})
                connection.commit()
        return
    database = engine.url.database
    if engine.dialect.name != "sqlite" or not database or database == ":memory:":
        with engine.connect() as connection:
            yield connection
        return
    lock_path = Path(database).with_name(Path(database).name + ".migrate.lock")
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with lock_path.open("a") as lock_file:
        fcntl.flock(lock_file.fileno(), fcntl.LOCK_EX)
        try:
            with engine.connect() as connection:
                yield connection
        finally:
            fcntl.flock(lock_file.fileno(), fcntl.LOCK_UN)
