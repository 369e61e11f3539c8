"""The platform's database: one engine, a session factory, and migrations run on opening.

SQLite (the default, a file under the data dir) runs in WAL mode with a busy timeout and
foreign keys on. A write transaction (``transaction()``) takes the write lock up front
(``BEGIN IMMEDIATE``) so two writers wait for each other instead of failing
mid-transaction; a read (``read()``) begins deferred, so in WAL mode it reads a snapshot
beside a writer instead of queueing for the lock, and is read-only (``PRAGMA query_only``)
so a stray write fails at once. PostgreSQL is used when the database URL says so
(``postgresql+psycopg://``); its reads run as ``READ ONLY`` transactions.
"""

from __future__ import annotations

from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.orm import Session, sessionmaker

from osmosis_ai.platform.errors import DatabaseError
from osmosis_ai.platform.settings import PlatformSettings, redact_database_url

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 30_000
# The execution option that marks an engine's transactions read-only (see ``read()``).
READ_ONLY_OPTION = "osmosis_read_only"


class ReadOnlyTransaction(DatabaseError):
    """Code holding a read transaction tried to write: it must use ``transaction()``."""

    default_code = "READ_ONLY_TRANSACTION"


class Database:
    """An engine and its sessions.

    ``transaction()`` is the unit of work of service calls that write; ``read()`` is the
    one of calls that only read, which never wait for (or hold) SQLite's write lock.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        self.read_sessions = sessionmaker(
            engine.execution_options(**{READ_ONLY_OPTION: True}),
            expire_on_commit=False,
            autoflush=False,
        )

    @contextmanager
    def transaction(self) -> Generator[Session]:
        """A session in one transaction: committed on success, rolled back on an error."""
        with self.sessions() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Generator[Session]:
        """A session in one read-only transaction (one consistent snapshot).

        Objects it loads stay readable after it ends. Changing one inside it is a
        :class:`ReadOnlyTransaction` error, not a silent loss.
        """
        with self.read_sessions() as session, session.begin():
            yield session
            if session.new or session.dirty or session.deleted:
                raise ReadOnlyTransaction(
                    "A read transaction changed rows; use Database.transaction() to write."
                )

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
    engine = create_engine(database_url, pool_pre_ping=True)
    event.listen(engine, "begin", _postgresql_begin)
    return engine


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


def _read_only(connection: Connection) -> bool:
    return bool(connection.get_execution_options().get(READ_ONLY_OPTION))


def _sqlite_begin(connection: Connection) -> None:
    # query_only is a setting of the connection, so every transaction sets it both ways.
    if _read_only(connection):
        connection.exec_driver_sql("PRAGMA query_only=ON")
        connection.exec_driver_sql("BEGIN")
    else:
        connection.exec_driver_sql("PRAGMA query_only=OFF")
        connection.exec_driver_sql("BEGIN IMMEDIATE")


def _postgresql_begin(connection: Connection) -> None:
    # The driver begins the transaction with the first statement, so this one sets it.
    if _read_only(connection):
        connection.exec_driver_sql("SET TRANSACTION READ ONLY")
