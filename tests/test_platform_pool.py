"""PostgreSQL's pooled connections: one idle past ``PING_AFTER_IDLE_S`` is pinged before use,
so a connection the server dropped meanwhile (a restart) is replaced instead of failing a
request; one reused at once is not pinged, and a connection that dies under it fails that
request only. Real PostgreSQL; the idle threshold is set by the test, nothing sleeps."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy.exc import OperationalError

from osmosis_ai.platform.store import database as store
from osmosis_ai.platform.store.database import make_engine

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
