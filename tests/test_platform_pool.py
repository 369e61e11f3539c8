"""PostgreSQL's pooled connections: one idle past ``PING_AFTER_IDLE_S`` is pinged before use,
so a connection the server dropped meanwhile (a restart) is replaced instead of failing a
request; one reused at once is not pinged, and a connection that dies under it fails that
request only. A statement read runs outside a transaction and leaves its connection as
reads and writes expect it. Real PostgreSQL; the idle threshold is set by the test, nothing
sleeps."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import text
from sqlalchemy.exc import DBAPIError, OperationalError

from osmosis_ai.platform.store import database as store
from osmosis_ai.platform.store.database import Database, make_engine

pytestmark = pytest.mark.postgres


def backend(engine) -> int:
    with engine.connect() as connection:
        return int(connection.exec_driver_sql("SELECT pg_backend_pid()").scalar_one())


def terminate(server, pid: int) -> None:
    """End one server process the way a restart would, and wait until it is gone."""
    dsn = f"host=127.0.0.1 port={server.port} user=postgres dbname=postgres"
    with psycopg.connect(dsn, autocommit=True) as admin:
        ended = admin.execute("SELECT pg_terminate_backend(%s, 10000)", (pid,)).fetchone()
    assert ended == (True,)


@pytest.fixture
def engine(postgres_server):
    made = make_engine(postgres_server.create_database())
    yield made
    made.dispose()


def test_an_idle_connection_the_server_dropped_is_replaced_before_use(
    engine, postgres_server, monkeypatch
):
    first = backend(engine)
    terminate(postgres_server, first)
    monkeypatch.setattr(store, "PING_AFTER_IDLE_S", 0.0)  # every pooled connection is "idle"
    second = backend(engine)
    assert second != first
    assert backend(engine) == second  # the new connection is pooled and reused


def test_a_connection_reused_at_once_is_not_pinged_and_its_death_fails_one_use(
    engine, postgres_server, monkeypatch
):
    monkeypatch.setattr(store, "PING_AFTER_IDLE_S", 3600.0)  # never idle long enough
    first = backend(engine)
    terminate(postgres_server, first)
    with pytest.raises(OperationalError):
        backend(engine)
    assert backend(engine) != first  # the failure dropped it; the next use reconnects


PROBE_SET = "SELECT set_config('osmosis.probe', 'set', true)"  # lasts until the transaction ends
PROBE = "SELECT current_setting('osmosis.probe', true)"


def test_a_statement_read_runs_outside_a_transaction_and_a_read_after_it_is_read_only(engine):
    database = Database(engine)
    with database.read_statement() as connection:
        connection.exec_driver_sql(PROBE_SET)
        assert connection.exec_driver_sql(PROBE).scalar() in ("", None)  # each its own
    with database.read() as session:
        session.execute(text(PROBE_SET))
        assert session.execute(text(PROBE)).scalar() == "set"  # one transaction
    with pytest.raises(DBAPIError, match="read-only transaction"), database.read() as session:
        session.execute(text("CREATE TABLE t (x integer)"))  # the pooled connection again
    with database.transaction() as session:
        session.execute(text("CREATE TABLE t (x integer)"))
