"""Reads beside writes: a read transaction never waits for (or takes) SQLite's write lock,
refuses to write, and the API authenticates and scopes requests with reads only (a token's
last use is written at most once a minute). SQLite and PostgreSQL, real databases."""

from __future__ import annotations

import asyncio
import subprocess
import threading

import pytest
from sqlalchemy import event, func, select, text
from sqlalchemy.exc import DBAPIError

from osmosis_ai.platform.services.accounts import create_user
from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.store.database import ReadOnlyTransactionError, open_database
from osmosis_ai.platform.store.orm import Token, User

REPO = "acme/agents"
# Long enough that a read which waited for the writer would finish after it, never a bound
# the test measures: the writer gives up waiting after this and the order of events fails.
WRITER_PATIENCE_S = 60.0


@pytest.fixture
def database(tmp_path, database_url):
    opened = open_database(load_settings(data_dir=tmp_path / "data", database_url=database_url))
    yield opened
    opened.dispose()


def hold_a_write(database, holding: threading.Event, release: threading.Event, order: list):
    """In a thread: open a write transaction that inserts a user, hold it until released."""

    def run() -> None:
        with database.transaction() as session:
            create_user(session, "writer@example.com")
            holding.set()
            release.wait(WRITER_PATIENCE_S)
            order.append("writer committed")

    thread = threading.Thread(target=run)
    thread.start()
    return thread


def test_a_read_runs_while_a_writer_holds_its_transaction(database):
    with database.transaction() as session:
        create_user(session, "first@example.com")
    holding, release, order = threading.Event(), threading.Event(), []
    writer = hold_a_write(database, holding, release, order)
    try:
        assert holding.wait(WRITER_PATIENCE_S)
        with database.read() as session:
            emails = session.scalars(select(User.email)).all()
        order.append("read done")
    finally:
        release.set()
        writer.join()
    assert order == ["read done", "writer committed"]
    assert emails == ["first@example.com"]  # the snapshot before the writer's insert
    with database.read() as session:
        assert session.scalar(select(func.count()).select_from(User)) == 2


def test_objects_a_read_loaded_stay_readable_after_it(database):
    with database.transaction() as session:
        create_user(session, "ada@example.com", name="Ada")
    with database.read() as session:
        user = session.scalars(select(User)).one()
    assert (user.email, user.name) == ("ada@example.com", "Ada")


def test_a_read_that_changes_a_row_is_refused_and_nothing_is_written(database):
    with database.transaction() as session:
        create_user(session, "ada@example.com", name="Ada")
    refused = pytest.raises(ReadOnlyTransactionError, match=r"Database\.transaction\(\)")
    with refused, database.read() as session:
        session.scalars(select(User)).one().name = "Changed"
    with pytest.raises(DBAPIError), database.read() as session:  # the database refuses too
        session.execute(text("UPDATE users SET name = 'Raw'"))
    with database.read() as session:
        assert session.scalars(select(User.name)).one() == "Ada"
    with database.transaction() as session:  # the connection is back to read-write
        create_user(session, "bob@example.com")
    with database.read() as session:
        assert session.scalar(select(func.count()).select_from(User)) == 2


def test_sqlite_writes_take_the_lock_up_front_and_reads_do_not(tmp_path):
    url = f"sqlite:///{tmp_path / 'p.db'}"
    database = open_database(load_settings(data_dir=tmp_path, database_url=url))
    statements: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        if statement.startswith(("BEGIN", "PRAGMA query_only")):
            statements.append(statement)

    event.listen(database.engine, "before_cursor_execute", record)
    try:
        with database.transaction() as session:
            create_user(session, "ada@example.com")
        with database.read() as session:
            session.scalars(select(User)).all()
    finally:
        database.dispose()
    assert statements == [
        "PRAGMA query_only=OFF",
        "BEGIN IMMEDIATE",
        "PRAGMA query_only=ON",
        "BEGIN",
    ]


@pytest.fixture
def origin(tmp_path):
    """A repository with one (empty) commit on main."""
    repo = tmp_path / "origin"
    repo.mkdir()
    for args in (("init", "-q", "-b", "main"), ("commit", "-q", "--allow-empty", "-m", "x")):
        subprocess.run(
            ["git", "-c", "user.name=A", "-c", "user.email=a@example.com", *args],
            cwd=repo,
            check=True,
        )
    return repo


async def test_api_reads_answer_while_a_writer_holds_the_database(harness, origin):
    harness.workspace("Team", repo=REPO, clone_url=str(origin))
    alice = harness.account("alice@example.com", workspace="Team")
    async with harness.client() as client:
        first = await client.get("/api/cli/rollouts", headers=alice.headers(REPO))
        assert first.status_code == 200  # the token's first use and a fetch are recorded
        holding, release, order = threading.Event(), threading.Event(), []
        writer = hold_a_write(harness.platform.database, holding, release, order)
        try:
            assert await asyncio.to_thread(holding.wait, WRITER_PATIENCE_S)
            paths = [
                "/api/cli/environment-secrets",
                "/api/cli/models/base",
                "/api/cli/models/lora",
                "/api/cli/verify",
                "/api/cli/rollouts",  # listed a moment ago: answered from that fetch
                "/api/cli/eval-runs",
                "/api/cli/training-runs",
                "/api/cli/datasets/nope/logs",  # 404, found out by reading
            ]
            paths += ["/api/cli/datasets"] * 50  # fifty clients listing datasets at once
            answers = await asyncio.gather(
                *(client.get(path, headers=alice.headers(REPO)) for path in paths)
            )
            order.append("reads done")
        finally:
            release.set()
            await asyncio.to_thread(writer.join)
    assert [a.status_code for a in answers] == [200] * (len(answers) - 51) + [404] + [200] * 50
    assert all(a.json()["total_count"] == 0 for a in answers[-50:])
    assert order == ["reads done", "writer committed"]
    workspaces = await list_workspaces(harness, alice)
    assert [w["name"] for w in workspaces] == ["Team"]


async def list_workspaces(harness, account):
    async with harness.client() as client:
        answer = await client.get("/api/cli/workspaces", headers=account.headers())
    assert answer.status_code == 200
    return answer.json()["workspaces"]


async def test_a_token_s_last_use_is_written_at_most_once_a_minute(harness):
    alice = harness.account("alice@example.com")

    def last_used():
        with harness.platform.read() as session:
            return session.scalar(select(Token.last_used_at).where(Token.id == alice.token_id))

    assert last_used() is None
    first_use = harness.clock.now
    await list_workspaces(harness, alice)
    assert last_used() == first_use
    harness.clock.advance(seconds=59)
    await list_workspaces(harness, alice)
    assert last_used() == first_use
    harness.clock.advance(seconds=1)
    await list_workspaces(harness, alice)
    assert last_used() == harness.clock.now
