"""The platform database: migrations on SQLite and PostgreSQL, the lock, the refusal of a
schema newer than the code, and the guarantees the schema itself gives."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta, timezone

import pytest
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import text
from sqlalchemy.exc import IntegrityError

from osmosis_ai.platform.errors import SchemaTooNewError
from osmosis_ai.platform.services.accounts import create_user, create_workspace
from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.store.database import Database, make_engine, open_database
from osmosis_ai.platform.store.migrate import current_revision, head_revision, upgrade
from osmosis_ai.platform.store.orm import Base, Secret, Token


def test_migrations_build_exactly_the_orm_schema(database_url):
    engine = make_engine(database_url)
    try:
        upgrade(engine)
        with engine.connect() as connection:
            assert current_revision(connection) == head_revision() is not None
            context = MigrationContext.configure(connection, opts={"compare_type": True})
            assert compare_metadata(context, Base.metadata) == []
        upgrade(engine)  # a second start finds nothing to do
    finally:
        engine.dispose()


def test_a_database_from_a_newer_release_is_refused_with_both_revisions(tmp_path, database_url):
    settings = load_settings(data_dir=tmp_path, database_url=database_url)
    open_database(settings).dispose()
    engine = make_engine(database_url)
    with engine.begin() as connection:
        connection.execute(text("UPDATE alembic_version SET version_num = '0099_future'"))
    engine.dispose()
    with pytest.raises(SchemaTooNewError) as caught:
        open_database(settings)
    message = str(caught.value)
    assert "'0099_future'" in message
    assert repr(head_revision()) in message
    assert 'pip install -U "osmosis-ai[platform]"' in message
    assert caught.value.details == {
        "database_revision": "0099_future",
        "code_revision": head_revision(),
    }


def test_processes_starting_together_migrate_once(database_url):
    engines = [make_engine(database_url) for _ in range(4)]
    errors: list[BaseException] = []
    start = threading.Barrier(len(engines))

    def migrate(engine):
        start.wait()
        try:
            upgrade(engine)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=migrate, args=(engine,)) for engine in engines]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    try:
        assert errors == []
        with engines[0].connect() as connection:
            assert current_revision(connection) == head_revision()
    finally:
        for engine in engines:
            engine.dispose()


def test_sqlite_runs_in_wal_mode_with_foreign_keys_and_a_busy_timeout(tmp_path):
    engine = make_engine(f"sqlite:///{tmp_path / 'p.db'}")
    try:
        with engine.connect() as connection:
            pragma = connection.exec_driver_sql
            assert pragma("PRAGMA journal_mode").scalar() == "wal"
            assert pragma("PRAGMA foreign_keys").scalar() == 1
            assert pragma("PRAGMA busy_timeout").scalar() == 30_000
    finally:
        engine.dispose()


@pytest.fixture
def database(database_url):
    engine = make_engine(database_url)
    upgrade(engine)
    db = Database(engine)
    yield db
    db.dispose()


def test_times_come_back_as_aware_utc(database):
    moment = datetime(2031, 5, 6, 7, 8, 9, tzinfo=timezone(timedelta(hours=2)))
    with database.transaction() as session:
        user_id = create_user(session, "a@example.com").id
        session.add(
            Token(
                user_id=user_id,
                token_hash="0" * 64,
                platform_url="http://x",
                name="t",
                expires_at=moment,
            )
        )
    with database.transaction() as session:
        token = session.query(Token).one()
        assert token.expires_at == moment
        assert token.expires_at.tzinfo == UTC
        assert token.created_at.tzinfo == UTC


def test_a_secret_name_is_unique_per_scope_and_owner(database):
    with database.transaction() as session:
        alice = create_user(session, "alice@example.com").id
        bob = create_user(session, "bob@example.com").id
        workspace = create_workspace(session, "team", repo="acme/agents", clone_url="/x").id

    def add(scope: str, owner: str | None) -> None:
        with database.transaction() as session:
            session.add(
                Secret(
                    workspace_id=workspace,
                    scope=scope,
                    owner_user_id=owner,
                    name="API_KEY",
                    encrypted_value="v1.x.y",
                )
            )

    add("workspace", None)
    add("user", alice)
    add("user", bob)  # each person has their own
    with pytest.raises(IntegrityError):
        add("workspace", None)
    with pytest.raises(IntegrityError):
        add("user", alice)
    with pytest.raises(IntegrityError):  # a personal secret needs its owner
        add("user", None)


def test_deleting_a_user_takes_their_tokens_and_memberships(database):
    from osmosis_ai.platform.auth import issue_token
    from osmosis_ai.platform.services.accounts import add_member
    from osmosis_ai.platform.store.orm import Membership, User

    now = datetime(2030, 1, 1, tzinfo=UTC)
    with database.transaction() as session:
        user = create_user(session, "gone@example.com")
        workspace = create_workspace(session, "team", repo="acme/agents", clone_url="/x")
        add_member(session, workspace, user, role="admin")
        issue_token(session, user, platform_url="http://x", name="t", now=now)
    with database.transaction() as session:
        session.delete(session.get(User, user.id))
    with database.transaction() as session:
        assert session.query(Token).count() == 0
        assert session.query(Membership).count() == 0


def test_an_unreachable_database_is_a_named_error_without_its_password(tmp_path):
    from osmosis_ai.platform.errors import DatabaseError
    from osmosis_ai.testing.serving import free_port

    url = f"postgresql+psycopg://admin:pa55word-secret@127.0.0.1:{free_port()}/platform"
    settings = load_settings(data_dir=tmp_path, database_url=url)
    with pytest.raises(DatabaseError) as caught:
        open_database(settings)
    assert caught.value.code == "DATABASE_UNAVAILABLE"
    assert "pa55word-secret" not in str(caught.value)
    assert "admin:***@127.0.0.1" in str(caught.value)
