"""The access cache: a token and its workspace are looked up once a second at most, a change
committed in the server's process applies to the next request, and one committed by another
process applies once the cached lookup is older than the TTL (an injected monotonic clock,
no sleeps). SQLite and PostgreSQL, real databases, the real app over ASGI."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import httpx
import pytest
from sqlalchemy import delete, event, select, update

from osmosis_ai.platform.api.access import (
    ACCESS_CACHE_TTL_S,
    MAX_ACCESS_CACHE_TTL_S,
    AccessCache,
    ChangeCounter,
)
from osmosis_ai.platform.api.app import create_platform_app
from osmosis_ai.platform.auth import revoke_token, touch_token
from osmosis_ai.platform.services.accounts import WorkspaceAccess, add_member, create_user
from osmosis_ai.platform.settings import load_settings
from osmosis_ai.platform.store.orm import Membership, Token, User, Workspace

REPO = "acme/agents"


class Seconds:
    """A monotonic clock for the cache: fixed until advanced."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def seconds(harness):
    clock = Seconds()
    harness.platform.access = AccessCache(clock=clock)
    return clock


@pytest.fixture
def statements(harness):
    """The SQL statements the app sends, as they are sent."""
    sent: list[str] = []

    def record(conn, cursor, statement, parameters, context, executemany):
        sent.append(statement)

    engine = harness.platform.database.engine
    event.listen(engine, "before_cursor_execute", record)
    yield sent
    event.remove(engine, "before_cursor_execute", record)


def reads_of(sent: list[str], table: str) -> int:
    return sum(1 for s in sent if s.lstrip().upper().startswith("SELECT") and f"FROM {table}" in s)


async def verify(harness, account, repo: str | None = REPO):
    async with harness.client() as client:
        return await client.get("/api/cli/verify", headers=account.headers(repo))


async def test_a_token_and_its_workspace_are_read_once_then_answered_from_the_cache(
    harness, seconds, statements
):
    harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team")
    statements.clear()
    first = await verify(harness, alice)
    assert first.status_code == 200 and first.json()["workspace"]["role"] == "member"
    assert reads_of(statements, "tokens") >= 1 and reads_of(statements, "workspaces") == 1
    statements.clear()
    async with harness.client() as client:
        answers = [
            await client.get("/api/cli/verify", headers=alice.headers(REPO)) for _ in range(5)
        ]
    assert [a.json() for a in answers] == [first.json()] * 5
    assert statements == []  # no transaction at all: verify reads nothing else
    seconds.now += ACCESS_CACHE_TTL_S
    assert (await verify(harness, alice)).status_code == 200
    assert reads_of(statements, "tokens") == 1 and reads_of(statements, "workspaces") == 1


async def test_requests_that_miss_at_once_share_one_lookup_and_one_last_use_write(
    harness, seconds, statements
):
    harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team")
    assert (await verify(harness, alice)).status_code == 200
    seconds.now += ACCESS_CACHE_TTL_S  # every entry expires
    harness.clock.advance(minutes=1)  # and the token's last use is due again
    statements.clear()
    async with harness.client() as client:
        answers = await asyncio.gather(
            *(client.get("/api/cli/verify", headers=alice.headers(REPO)) for _ in range(20))
        )
    assert [a.status_code for a in answers] == [200] * 20
    assert reads_of(statements, "workspaces") == 1
    token_reads = reads_of(statements, "tokens")
    assert token_reads == 2  # one lookup, and the write's own read of the row
    assert sum(1 for s in statements if s.startswith("UPDATE tokens")) == 1


async def test_a_revoke_through_the_api_refuses_the_next_request(harness, seconds):
    harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team")
    assert (await verify(harness, alice)).status_code == 200
    async with harness.client() as client:
        revoked = await client.delete(f"/api/cli/tokens/{alice.token_id}", headers=alice.headers())
    assert revoked.status_code == 204
    gone = await verify(harness, alice)  # the cache clock has not moved
    assert gone.status_code == 401 and gone.json()["code"] == "TOKEN_REVOKED"


async def test_changes_committed_in_this_process_apply_to_the_next_request(harness, seconds):
    team = harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team", role="admin")
    bob = harness.account("bob@example.com", workspace="Team")
    assert (await verify(harness, alice)).json()["workspace"]["role"] == "admin"
    assert (await verify(harness, bob)).status_code == 200

    with harness.platform.transaction() as session:  # a role change
        workspace = session.get(Workspace, team)
        user = session.get(User, alice.user_id)
        assert workspace is not None and user is not None
        add_member(session, workspace, user, role="member")
    assert (await verify(harness, alice)).json()["workspace"]["role"] == "member"

    with harness.platform.transaction() as session:  # a membership removed in bulk
        session.execute(delete(Membership).where(Membership.user_id == bob.user_id))
    removed = await verify(harness, bob)
    assert removed.status_code == 404
    assert removed.json()["code"] == "GIT_SCOPE_HEADER_ACCESS_DENIED"

    with harness.platform.transaction() as session:  # a revoke, as the admin command does
        revoke_token(session, alice.token_id, now=harness.clock())
    assert (await verify(harness, alice)).json()["code"] == "TOKEN_REVOKED"


async def test_a_revoke_by_another_process_applies_once_the_ttl_has_passed(harness, seconds):
    harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team")
    assert (await verify(harness, alice)).status_code == 200
    command = [
        sys.executable, "-m", "osmosis_ai.cli.main", "--json", "platform", "token", "revoke",
        alice.token_id, "--data-dir", str(harness.settings.data_dir),
        "--database-url", harness.settings.database_url,
    ]  # fmt: skip
    done = await asyncio.to_thread(
        subprocess.run, command, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, done.stderr
    seconds.now += ACCESS_CACHE_TTL_S / 2
    assert (await verify(harness, alice)).status_code == 200  # the bound, not a promise
    seconds.now += ACCESS_CACHE_TTL_S / 2
    gone = await verify(harness, alice)
    assert gone.status_code == 401 and gone.json()["code"] == "TOKEN_REVOKED"


async def test_a_membership_removed_outside_the_orm_applies_once_the_ttl_has_passed(
    harness, seconds
):
    harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team")
    assert (await verify(harness, alice)).status_code == 200
    # A plain connection fires none of this process's session events: another process's view.
    with harness.platform.database.engine.begin() as connection:
        connection.execute(delete(Membership).where(Membership.user_id == alice.user_id))
    seconds.now += ACCESS_CACHE_TTL_S / 2
    assert (await verify(harness, alice)).status_code == 200
    seconds.now += ACCESS_CACHE_TTL_S / 2
    assert (await verify(harness, alice)).status_code == 404


async def test_a_cached_token_still_expires_on_the_platform_clock(harness, seconds):
    alice = harness.account("alice@example.com")
    assert (await verify(harness, alice, repo=None)).status_code == 200
    harness.clock.advance(days=91)  # past the default 90-day lifetime; the cache clock stays
    expired = await verify(harness, alice, repo=None)
    assert expired.status_code == 401 and expired.json()["code"] == "TOKEN_EXPIRED"


async def test_another_user_gets_no_workspace_a_member_cached(harness, seconds):
    harness.workspace("Team", repo=REPO)
    alice = harness.account("alice@example.com", workspace="Team")
    mallory = harness.account("mallory@example.com")
    assert (await verify(harness, alice)).status_code == 200
    refused = await verify(harness, mallory)
    assert refused.status_code == 404 and refused.json()["code"] == "GIT_SCOPE_HEADER_ACCESS_DENIED"
    async with harness.client() as client:
        listed = await client.get("/api/cli/datasets", headers=mallory.headers(REPO))
    assert listed.status_code == 404


async def test_a_token_cached_by_one_platform_is_refused_by_one_at_another_url(harness, seconds):
    alice = harness.account("alice@example.com")
    assert (await verify(harness, alice, repo=None)).status_code == 200
    other = load_settings(
        data_dir=harness.settings.data_dir,
        database_url=harness.settings.database_url,
        public_url="http://127.0.0.1:9999",
    )
    app = create_platform_app(other, database=harness.platform.database, clock=harness.clock)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url=other.public_url) as client:
        answer = await client.get("/api/cli/verify", headers=alice.headers())
    assert answer.status_code == 401 and answer.json()["code"] == "TOKEN_PLATFORM_MISMATCH"


async def test_writing_a_token_s_last_use_keeps_the_cache(harness, seconds, statements):
    alice = harness.account("alice@example.com")
    assert (await verify(harness, alice, repo=None)).status_code == 200  # first use: written
    harness.clock.advance(minutes=1)
    assert (await verify(harness, alice, repo=None)).status_code == 200  # due again: written
    statements.clear()
    async with harness.client() as client:
        for _ in range(3):
            answer = await client.get("/api/cli/verify", headers=alice.headers())
            assert answer.status_code == 200
    assert statements == []  # neither read again nor written again
    with harness.platform.read() as session:
        assert session.scalar(select(Token.last_used_at)) == harness.clock()


def test_only_commits_that_change_access_are_counted(harness):
    from osmosis_ai.platform.api.access import ACCESS_CHANGES

    alice = harness.account("alice@example.com")
    database = harness.platform.database
    before = ACCESS_CHANGES.value
    with database.transaction() as session:
        touch_token(session, alice.token_id, now=harness.clock())
    assert ACCESS_CHANGES.value == before  # a token's last use
    with database.transaction() as session:
        revoke_token(session, alice.token_id, now=harness.clock())
        session.flush()
        assert ACCESS_CHANGES.value == before  # counted when committed, not before
    assert ACCESS_CHANGES.value == before + 1
    with database.sessions() as session:  # flushed, then rolled back
        session.begin()
        create_user(session, "rolled@example.com")
        session.flush()
        session.rollback()
    assert ACCESS_CHANGES.value == before + 1
    with database.transaction() as session:
        session.execute(update(User).values(name="Renamed"))
    assert ACCESS_CHANGES.value == before + 2


def test_a_lookup_read_across_a_change_is_not_kept():
    changes = ChangeCounter()
    cache = AccessCache(clock=Seconds(), changes=changes)
    access = WorkspaceAccess(id="w", name="Team", repo_full_name=REPO, role="member")
    generation = cache.generation()
    changes.bump()  # committed while the lookup read
    cache.workspaces.put(("u", "repo", REPO), access, generation)
    assert cache.workspaces.get(("u", "repo", REPO)) is None
    cache.workspaces.put(("u", "repo", REPO), access, cache.generation())
    assert cache.workspaces.get(("u", "repo", REPO)) == access
    changes.bump()
    assert cache.workspaces.get(("u", "repo", REPO)) is None


def test_a_ttl_longer_than_the_documented_bound_is_refused():
    with pytest.raises(ValueError, match=r"5\.0 s is out of range.*0 \(no cache\) to 2\.0 s"):
        AccessCache(5.0)
    assert AccessCache(MAX_ACCESS_CACHE_TTL_S).ttl_s == MAX_ACCESS_CACHE_TTL_S
    assert ACCESS_CACHE_TTL_S <= MAX_ACCESS_CACHE_TTL_S
