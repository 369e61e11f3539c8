"""The platform API's contract: token auth with distinct 401 codes, workspace scope from the
Git identity (another workspace answers 404, never data), the error envelope, and CLI
version signalling. Real databases on both dialects, through httpx.ASGITransport."""

from __future__ import annotations

import pytest
from packaging.version import Version
from sqlalchemy import select, text

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.platform.api.version import MIN_SUPPORTED_CLI_VERSION, classify
from osmosis_ai.platform.auth import hash_token
from osmosis_ai.platform.store.orm import Token

REPO = "acme/agents"


def assert_envelope(body: dict, code: str) -> None:
    assert body["code"] == code
    assert isinstance(body["message"], str) and body["message"]
    assert body["error"] == body["message"]


async def test_verify_answers_the_user_and_the_workspace_of_the_repository(harness):
    harness.workspace("Team", repo="Acme/Agents")
    alice = harness.account("alice@example.com", workspace="Team", role="admin")
    async with harness.client() as client:
        plain = await client.get("/api/cli/verify", headers=alice.headers())
        scoped = await client.get("/api/cli/verify", headers=alice.headers(repo="ACME/agents"))
    assert plain.status_code == 200
    body = plain.json()
    assert body["token_id"] == alice.token_id
    assert body["user"] == {"id": alice.user_id, "email": "alice@example.com", "name": "alice"}
    assert body["expires_at"].endswith("Z")
    assert body["workspace"] is None
    assert scoped.json()["workspace"]["name"] == "Team"
    assert scoped.json()["workspace"]["role"] == "admin"


async def test_the_raw_token_is_never_stored(harness, database_url):
    alice = harness.account("alice@example.com")
    with harness.platform.transaction() as session:
        token = session.scalar(select(Token).where(Token.id == alice.token_id))
        assert token is not None
        assert token.token_hash == hash_token(alice.token) != alice.token
        rows = session.execute(text("SELECT * FROM tokens")).all()
    assert all(alice.token not in str(value) for row in rows for value in row)
    if database_url.startswith("sqlite"):
        harness.platform.database.dispose()  # checkpoint nothing away: read every file
        files = list(harness.settings.data_dir.parent.rglob("*.db*"))
        assert files
        assert all(alice.token.encode() not in path.read_bytes() for path in files)


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        ("missing", "TOKEN_MISSING"),
        ("unknown", "TOKEN_INVALID"),
        ("malformed_header", "TOKEN_MISSING"),
        ("revoked", "TOKEN_REVOKED"),
        ("expired", "TOKEN_EXPIRED"),
        ("other_platform", "TOKEN_PLATFORM_MISMATCH"),
    ],
)
async def test_a_refused_token_gets_401_with_a_code_that_says_why(harness, mutate, code):
    alice = harness.account("alice@example.com")
    headers = alice.headers()
    if mutate == "missing":
        headers = {}
    elif mutate == "unknown":
        headers = {"Authorization": "Bearer osm_not-a-real-token"}
    elif mutate == "malformed_header":
        headers = {"Authorization": alice.token}
    elif mutate == "expired":
        harness.clock.advance(days=91)
    elif mutate == "other_platform":
        headers = harness.account(
            "bob@example.com", platform_url="https://elsewhere.example"
        ).headers()
    async with harness.client() as client:
        if mutate == "revoked":
            gone = await client.delete(f"/api/cli/tokens/{alice.token_id}", headers=headers)
            assert gone.status_code == 204
        answer = await client.get("/api/cli/verify", headers=headers)
    assert answer.status_code == 401
    assert answer.headers["www-authenticate"] == "Bearer"
    assert_envelope(answer.json(), code)


async def test_a_token_is_valid_until_the_moment_it_expires(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as client:
        harness.clock.advance(days=90, seconds=-1)
        assert (await client.get("/api/cli/verify", headers=alice.headers())).status_code == 200
        harness.clock.advance(seconds=1)
        assert (await client.get("/api/cli/verify", headers=alice.headers())).status_code == 401


async def test_revoking_is_for_your_own_tokens_and_repeats_as_401(harness):
    alice = harness.account("alice@example.com")
    bob = harness.account("bob@example.com")
    async with harness.client() as client:
        other = await client.delete(f"/api/cli/tokens/{alice.token_id}", headers=bob.headers())
        assert other.status_code == 404
        assert_envelope(other.json(), "TOKEN_NOT_FOUND")
        assert (await client.get("/api/cli/verify", headers=alice.headers())).status_code == 200
        own = await client.delete(f"/api/cli/tokens/{alice.token_id}", headers=alice.headers())
        assert own.status_code == 204
        again = await client.delete(f"/api/cli/tokens/{alice.token_id}", headers=alice.headers())
        assert again.status_code == 401  # the CLI reads this as "already gone"


async def test_another_workspace_answers_404_and_says_nothing_about_it(harness):
    harness.workspace("Secret Team", repo="acme/secret", clone_url="/srv/secret.git")
    harness.workspace("Team", repo=REPO)
    harness.account("owner@example.com", workspace="Secret Team", role="owner")
    alice = harness.account("alice@example.com", workspace="Team")
    async with harness.client() as client:
        foreign = await client.get("/api/cli/rollouts", headers=alice.headers(repo="acme/secret"))
        missing = await client.get("/api/cli/rollouts", headers=alice.headers(repo="acme/none"))
        listed = await client.get("/api/cli/workspaces", headers=alice.headers())
    assert foreign.status_code == missing.status_code == 404
    assert_envelope(foreign.json(), "GIT_SCOPE_HEADER_ACCESS_DENIED")
    # Not connected and not a member read the same, apart from the name the caller sent.
    assert foreign.json()["message"].replace("acme/secret", "X") == missing.json()[
        "message"
    ].replace("acme/none", "X")
    assert "Secret Team" not in foreign.text and "/srv/secret.git" not in foreign.text
    assert [w["name"] for w in listed.json()["workspaces"]] == ["Team"]
    assert listed.json()["workspaces"][0]["connected_repo_full_name"] == REPO


async def test_repo_scoped_calls_need_a_well_formed_git_identity(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as client:
        none = await client.get("/api/cli/rollouts", headers=alice.headers())
        bad = await client.get("/api/cli/rollouts", headers=alice.headers(repo="not a repo"))
    assert none.status_code == bad.status_code == 400
    assert_envelope(none.json(), "GIT_SCOPE_HEADER_REQUIRED")
    assert_envelope(bad.json(), "GIT_SCOPE_HEADER_INVALID")
    assert bad.json()["field"] == "X-Osmosis-Git"


async def test_every_error_is_the_envelope(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as client:
        unknown = await client.get("/api/cli/nothing-here", headers=alice.headers())
        method = await client.put("/api/cli/verify", headers=alice.headers())
        invalid = await client.post("/api/cli/device/token", json={"device_code": 12})
        not_json = await client.post(
            "/api/cli/device/token",
            content=b"{",
            headers={"Content-Type": "application/json"},
        )
    assert unknown.status_code == 404
    assert_envelope(unknown.json(), "NOT_FOUND")
    assert method.status_code == 405
    assert_envelope(method.json(), "METHOD_NOT_ALLOWED")
    assert invalid.status_code == 400  # FastAPI's 422 is the CLI's 400 VALIDATION
    body = invalid.json()
    assert_envelope(body, "VALIDATION")
    assert body["field"] == "device_code"
    assert body["issues"][0]["key"] == "device_code"
    assert body["details"]["issues"] == body["issues"]
    assert not_json.status_code == 400
    assert_envelope(not_json.json(), "VALIDATION")


async def test_answers_carry_the_version_signal_of_the_calling_cli(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as client:
        current = await client.get(
            "/api/cli/verify", headers=alice.headers(**{"X-Osmosis-CLI-Version": PACKAGE_VERSION})
        )
        older = await client.get(
            "/api/cli/verify",
            headers=alice.headers(**{"X-Osmosis-CLI-Version": MIN_SUPPORTED_CLI_VERSION}),
        )
        silent = await client.get("/api/cli/verify", headers=alice.headers())
        error = await client.get(
            "/api/cli/verify", headers={"X-Osmosis-CLI-Version": MIN_SUPPORTED_CLI_VERSION}
        )
    assert current.headers["x-osmosis-version-status"] == "current"
    # this package's own version: an older CLI is told to upgrade only by a released server
    expected = "current" if Version(PACKAGE_VERSION).is_prerelease else "upgrade_available"
    assert older.status_code == 200
    assert older.headers["x-osmosis-version-status"] == expected
    assert "x-osmosis-version-status" not in silent.headers
    assert error.status_code == 401  # errors carry the signal too
    assert error.headers["x-osmosis-version-status"] == expected


async def test_a_cli_older_than_the_minimum_gets_426_before_any_route(harness):
    async with harness.client() as client:
        answer = await client.get("/api/cli/verify", headers={"X-Osmosis-CLI-Version": "0.2.9"})
    assert answer.status_code == 426
    body = answer.json()
    assert_envelope(body, "UPGRADE_REQUIRED")
    assert body["status"] == "unsupported"  # the 426 body carries the version signal
    assert body["details"]["min_version"] == MIN_SUPPORTED_CLI_VERSION
    assert answer.headers["x-osmosis-version-status"] == "unsupported"


def test_version_classification():
    assert classify("not a version") is None
    assert classify("0.2.0").status == "unsupported"
    assert classify(MIN_SUPPORTED_CLI_VERSION, server_version="9.0").status == "upgrade_available"
    assert classify("9.0", server_version="9.0").status == "current"
    assert classify("0.3.8", server_version="9.0.dev0").status == "current"
    assert "osmosis upgrade" in classify("0.3.8", server_version="9.0").message
    assert classify("10.0", server_version="9.0").status == "current"


async def test_only_api_paths_are_gated_by_the_cli_version(harness):
    async with harness.client() as client:
        health = await client.get("/api/health", headers={"X-Osmosis-CLI-Version": "0.1"})
        page = await client.get("/device", headers={"X-Osmosis-CLI-Version": "0.1"})
    assert health.status_code == 426  # /api/ is gated
    assert page.status_code == 200
