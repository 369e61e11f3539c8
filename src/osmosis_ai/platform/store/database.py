"""The platform's database: one engine, a session factory, and migrations run on opening.

SQLite (the default, a file under the data dir) runs in WAL mode with a busy timeout and
foreign keys on. A write transaction (``transaction()``) takes the write lock up front
(``BEGIN IMMEDIATE``) so two writers wait for each other instead of failing
mid-transaction; a read (``read()``) begins deferred, so in WAL mode it reads a snapshot
beside a writer instead of queueing for the lock, and is read-only (``PRAGMA query_only``)
so a stray write fails at once. PostgreSQL is used when the database URL says so
(``postgresql+psycopg://``); its reads run as ``READ ONLY`` transactions (begun so by the
driver, without a statement of their own), and a pooled connection is pinged before use only
after sitting idle (:func:`_ping_when_idle`).
"""

from __future__ import annotations

import time
from collections.abc import Generator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import InvalidatePoolError
from sqlalchemy.orm import Session, sessionmaker

from osmosis_ai.platform.errors import DatabaseError
from osmosis_ai.platform.settings import PlatformSettings, redact_database_url

if TYPE_CHECKING:
    from sqlalchemy.engine.interfaces import DBAPIConnection
    from sqlalchemy.pool import ConnectionPoolEntry

SQLITE_BUSY_TIMEOUT_MS = 30_000
# A PostgreSQL connection idle in the pool this long is pinged before it is used again.
PING_AFTER_IDLE_S = 1.0
_IDLE_SINCE = "osmosis_idle_since"
SQLITE_POOL_OVERFLOW = 64  # beyond the 5 kept open; anyio's thread pool has 40 workers
# The execution option that marks an engine's transactions read-only (see ``read()``).
READ_ONLY_OPTION = "osmosis_read_only"


class ReadOnlyTransactionError(DatabaseError):
    """Code holding a read transaction tried to write: it must use ``transaction()``."""

    default_code = "READ_ONLY_TRANSACTION"


class Database:
    """An engine and its sessions.

    ``transaction()`` is the unit of work of service calls that write; ``read()`` is the
    one of calls that only read, which never wait for (or hold) SQLite's write lock;
    ``read_statement()`` is for a hot read that is a single ``SELECT``.
    """

    def __init__(self, engine: Engine) -> None:
        self.engine = engine
        # A read of SQLite waits on no network and on no lock (WAL): a short one may run on
        # the event loop instead of paying a thread-pool hop (see api/datasets.py's list).
        self.local = engine.dialect.name == "sqlite"
        self.sessions = sessionmaker(engine, expire_on_commit=False)
        read_options: dict[str, object] = {READ_ONLY_OPTION: True}
        if engine.dialect.name == "postgresql":
            read_options["postgresql_readonly"] = True  # the driver sends BEGIN READ ONLY
        self.read_sessions = sessionmaker(
            engine.execution_options(**read_options),
            expire_on_commit=False,
            autoflush=False,
        )
        self._statement_engine = engine.execution_options(isolation_level="AUTOCOMMIT")

    @contextmanager
    def transaction(self) -> Generator[Session]:
        """A session in one transaction: committed on success, rolled back on an error."""
        with self.sessions() as session, session.begin():
            yield session

    @contextmanager
    def read(self) -> Generator[Session]:
        """A session in one read-only transaction (one consistent snapshot).

        Objects it loads stay readable after it ends. Changing one inside it is a
        :class:`ReadOnlyTransactionError` error, not a silent loss.
        """
        with self.read_sessions() as session, session.begin():
            yield session
            if session.new or session.dirty or session.deleted:
                raise ReadOnlyTransactionError(
                    "A read transaction changed rows; use Database.transaction() to write."
                )

    @contextmanager
    def read_statement(self) -> Generator[Connection]:
        """A connection for a read that is one ``SELECT``: a single statement reads one
        consistent snapshot by itself, so on PostgreSQL it runs outside a transaction and no
        BEGIN or COMMIT costs a round trip (nothing refuses a write there: anything but one
        ``SELECT`` uses :meth:`read`). On SQLite, where they cost no round trip, it runs in
        :meth:`read`'s read-only transaction.
        """
        if self.local:
            with self.read() as session:
                yield session.connection()
        else:
            with self._statement_engine.connect() as connection:
                yield connection

    def dispose(self) -> None:
        self.engine.dispose()


def make_engine(database_url: str) -> Engine:
    """An engine for ``database_url`` with the connection settings the platform relies on."""
    if database_url.startswith("sqlite"):
        path = sqlite_path(database_url)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
        # Connections to a file are cheap: enough for every thread-pool worker and the event
        # loop at once, so a read on the loop never queues behind the pool.
        pooling = {"max_overflow": SQLITE_POOL_OVERFLOW} if path is not None else {}
        engine = create_engine(
            database_url,
            connect_args={"timeout": SQLITE_BUSY_TIMEOUT_MS / 1000, "check_same_thread": False},
            **pooling,
        )
        event.listen(engine, "connect", _sqlite_connect)
        event.listen(engine, "begin", _sqlite_begin)
        return engine
    engine = create_engine(database_url)
    _ping_when_idle(engine)
    return engine


def _ping_when_idle(engine: Engine) -> None:
    """Ping a pooled connection before use only when it sat idle past ``PING_AFTER_IDLE_S``.

    A server restarted while the platform was idle left dead connections in the pool: the
    ping finds them and the pool replaces them all. A connection handed back and reused at
    once, as under load, is not pinged: a ping on every checkout cost an eighth of a list
    call. A restart under load fails the requests in flight; the first failure then drops
    every older pooled connection.
    """
    dialect = engine.dialect

    def checkin(dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry) -> None:
        record.info[_IDLE_SINCE] = time.monotonic()

    def checkout(
        dbapi_connection: DBAPIConnection, record: ConnectionPoolEntry, proxy: object
    ) -> None:
        idle_since = record.info.pop(_IDLE_SINCE, None)
        if idle_since is None or time.monotonic() - idle_since < PING_AFTER_IDLE_S:
            return
        try:
            dialect.do_ping(dbapi_connection)
        except dialect.loaded_dbapi.Error as error:
            raise InvalidatePoolError(f"an idle pooled connection is gone: {error}") from error

    event.listen(engine, "checkin", checkin)
    event.listen(engine, "checkout", checkout)


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
