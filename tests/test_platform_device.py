"""Device-code login end to end: the CLI's calls, the browser's approval page (sign-in, CSRF,
escaping), and the RFC 8628 answers while the CLI waits."""

from __future__ import annotations

import re

import pytest
from sqlalchemy import select

from osmosis_ai.platform.store.orm import Token

CSRF = re.compile(r'name="csrf" value="([^"]+)"')


def csrf_of(page: str) -> str:
    found = CSRF.search(page)
    assert found, page
    return found.group(1)


async def start_login(client, name: str = "laptop") -> dict:
    answer = await client.post("/api/cli/device/authorize", json={"deviceName": name})
    assert answer.status_code == 200
    return answer.json()


async def poll(client, started: dict):
    return await client.post("/api/cli/device/token", json={"device_code": started["device_code"]})


async def sign_in(browser, account, user_code: str):
    page = await browser.get("/device", params={"user_code": user_code})
    assert page.status_code == 200
    form = {
        "csrf": csrf_of(page.text),
        "email": account.email.upper(),
        "token": account.token,
        "user_code": user_code,
    }
    return await browser.post("/device/session", data=form)


async def test_a_login_approved_in_the_browser_hands_the_cli_a_token_once(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as cli, harness.client() as browser:
        started = await start_login(cli)
        assert re.fullmatch(r"[B-Z]{4}-[B-Z]{4}", started["user_code"])
        assert started["verification_uri"] == f"{harness.settings.public_url}/device"
        assert started["verification_uri_complete"].endswith(started["user_code"])
        assert started["interval"] == 5 and started["expires_in"] == 900

        waiting = await poll(cli, started)
        assert waiting.status_code == 400
        assert waiting.json()["error"] == "authorization_pending"

        page = await browser.get("/device", params={"user_code": started["user_code"]})
        cookie = page.headers["set-cookie"].lower()
        assert "httponly" in cookie and "samesite=strict" in cookie and "path=/device" in cookie
        assert "Sign in" in page.text

        signed_in = await sign_in(browser, alice, started["user_code"])
        assert signed_in.status_code == 303
        assert "httponly" in signed_in.headers["set-cookie"].lower()
        approval = await browser.get("/device", params={"user_code": started["user_code"]})
        assert started["user_code"] in approval.text and "laptop" in approval.text
        decided = await browser.post(
            "/device/decision",
            data={
                "csrf": csrf_of(approval.text),
                "user_code": started["user_code"],
                "decision": "approve",
            },
        )
        assert decided.status_code == 200 and "Device approved" in decided.text

        harness.clock.advance(seconds=5)
        granted = await poll(cli, started)
        assert granted.status_code == 200
        body = granted.json()
        assert body["user"]["email"] == "alice@example.com"
        verified = await cli.get(
            "/api/cli/verify", headers={"Authorization": f"Bearer {body['token']}"}
        )
        assert verified.json()["token_id"] == body["token_id"]

        harness.clock.advance(seconds=5)
        reused = await poll(cli, started)
        assert reused.status_code == 400 and reused.json()["error"] == "expired_token"
    with harness.platform.transaction() as session:
        token = session.scalar(select(Token).where(Token.id == body["token_id"]))
        assert token is not None
        assert token.name == "device: laptop"
        assert token.platform_url == harness.settings.public_url


async def test_polling_faster_than_the_interval_is_told_to_slow_down(harness):
    async with harness.client() as cli:
        started = await start_login(cli)
        assert (await poll(cli, started)).json()["error"] == "authorization_pending"
        harness.clock.advance(seconds=1)
        fast = await poll(cli, started)
        assert fast.status_code == 400
        assert fast.json()["error"] == "slow_down"
        assert fast.json()["details"]["interval"] == 10
        harness.clock.advance(seconds=10)
        assert (await poll(cli, started)).json()["error"] == "authorization_pending"


async def test_a_denied_login_and_an_expired_code_end_the_wait(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as cli, harness.client() as browser:
        denied = await start_login(cli)
        expired = await start_login(cli, "old laptop")
        await sign_in(browser, alice, denied["user_code"])
        page = await browser.get("/device", params={"user_code": denied["user_code"]})
        await browser.post(
            "/device/decision",
            data={"csrf": csrf_of(page.text), "user_code": denied["user_code"], "decision": "deny"},
        )
        assert (await poll(cli, denied)).json()["error"] == "access_denied"

        harness.clock.advance(minutes=15)
        assert (await poll(cli, expired)).json()["error"] == "expired_token"
        late = await browser.get("/device", params={"user_code": expired["user_code"]})
        assert late.status_code == 404
        unknown = await cli.post("/api/cli/device/token", json={"device_code": "nope"})
        assert unknown.json()["error"] == "invalid_grant"


@pytest.mark.parametrize(
    "attack", ["no_token", "token_of_another_cookie", "non_ascii_token", "cross_origin"]
)
async def test_forms_refuse_requests_forged_from_elsewhere(harness, attack):
    alice = harness.account("alice@example.com")
    async with harness.client() as cli, harness.client() as browser, harness.client() as other:
        started = await start_login(cli)
        await sign_in(browser, alice, started["user_code"])
        page = await browser.get("/device", params={"user_code": started["user_code"]})
        form = {
            "csrf": csrf_of(page.text),
            "user_code": started["user_code"],
            "decision": "approve",
        }
        headers = {}
        if attack == "no_token":
            del form["csrf"]
        elif attack == "token_of_another_cookie":
            form["csrf"] = csrf_of((await other.get("/device")).text)
        elif attack == "non_ascii_token":
            form["csrf"] = "é" * len(form["csrf"])
        else:
            headers["Origin"] = "https://evil.example"
        answer = await browser.post("/device/decision", data=form, headers=headers)
        assert answer.status_code == 403
        assert answer.json()["code"] in ("CSRF_INVALID", "CSRF_ORIGIN")
        assert (await poll(cli, started)).json()["error"] == "authorization_pending"


async def test_sign_in_needs_the_tokens_own_email_and_a_live_token(harness):
    alice = harness.account("alice@example.com")
    bob = harness.account("bob@example.com")
    async with harness.client() as cli, harness.client() as browser:
        started = await start_login(cli)
        page = await browser.get("/device")
        wrong = await browser.post(
            "/device/session",
            data={"csrf": csrf_of(page.text), "email": bob.email, "token": alice.token},
        )
        assert wrong.status_code == 401 and "does not belong" in wrong.text
        assert "osmosis_device_session" not in wrong.headers.get("set-cookie", "")

        assert (await sign_in(browser, alice, started["user_code"])).status_code == 303
        await cli.delete(f"/api/cli/tokens/{alice.token_id}", headers=alice.headers())
        # Revoking the token signs the browser out as well.
        page = await browser.get("/device", params={"user_code": started["user_code"]})
        assert "Sign in" in page.text and "Approve" not in page.text


async def test_everything_a_page_shows_is_escaped(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as cli, harness.client() as browser:
        started = await start_login(cli, '<script>alert("x")</script>')
        await sign_in(browser, alice, started["user_code"])
        page = await browser.get("/device", params={"user_code": started["user_code"]})
        assert "<script>" not in page.text
        assert "&lt;script&gt;" in page.text
        assert "default-src 'none'" in page.headers["content-security-policy"]
        tricky = await browser.get("/device", params={"user_code": '"><img src=x>'})
        assert "<img" not in tricky.text
