"""The platform's database: one engine, a session factory, and migrations run on opening.

SQLite (the default, a file under the data dir) runs in WAL mode with a busy timeout and
foreign keys on, and every transaction takes the write lock up front (``BEGIN IMMEDIATE``)
so two writers wait for each other instead of failing mid-transaction. PostgreSQL is used
when the database URL says so (``postgresql+psycopg://``).
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from osmosis_ai.platform.errors import DatabaseError
from osmosis_ai.platform.settings import PlatformSettings, redact_database_url

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 30_000


class Database:
    """An engine and its sessions. ``transaction()`` is the unit of work service calls use."""

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)

    @contextmanager
    def transaction(self) -> Generator[Session]:
        """A session in one transaction: committed on success, rolled back on an error."""
        with self.sessions() as session, session.begin():
            yield session

    def dispose(self) -> None:
        self.engine.dispose()


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url`` with the connection settings the platform relies on."""
    if database_url.startswith("sqlite"):
        path = sqlite_path(database_url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        engine = create_engine(
            database_url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
        )
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    return create_engine(database_url, pool_pre_ping=True)


def open_database(settings: PlatformSettings, *, migrate: bool = True) -> Database:
    """The platform's database, migrated to this release's schema (under a lock) first."""
    from sqlalchemy.exc import InterfaceError, OperationalError

    from osmosis_ai.platform.store.migrate import upgrade

    engine = make_engine(settings.database_url)
    try:
        if migrate:
            upgrade(engine)
    except (OperationalError, InterfaceError) as exc:
        engine.dispose()
        where = redact_database_url(settings.database_url)
        reason = str(exc.orig).strip().splitlines()[0] if exc.orig is not None else str(exc)
        raise DatabaseError(
            f"Cannot open the platform database at {where}: {reason}. Check that the database "
            "server is running and the URL (--database-url) is right.",
            code="DATABASE_UNAVAILABLE",
            details={"database_url": where},
        ) from None
    except BaseException:
        engine.dispose()
        raise
    return Database(engine)


def sqlite_path(database_url: str) -> Path | None:
    """The file of a SQLite URL (``None`` for an in-memory database)."""
    from sqlalchemy.engine import make_url

    database = make_url(database_url).database
    if not database or database == ":memory:":
        return None
    return Path(database)


def _sqlite_connect(dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
    # Transactions are begun explicitly in _sqlite_begin, not by the driver.
    dbapi_connection.isolation_level = None  # type: ignore[attr-defined]
    cursor = dbapi_connection.cursor()
    cursor.execute("PRAGMA journal_mode=WAL")
    cursor.execute(f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT_MS}")
    cursor.execute("PRAGMA foreign_keys=ON")
    cursor.execute("PRAGMA synchronous=NORMAL")
    cursor.close()


def _sqlite_begin(connection: object) -> None:
    from sqlalchemy import Connection

    assert isinstance(connection, Connection)
    connection.exec_driver_sql("BEGIN IMMEDIATE")
