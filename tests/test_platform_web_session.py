"""The dashboard (``/login``) and the device page (``/device``) keep one browser-session
policy: the same cookie attributes, the same refusal of a cross-origin or oversized POST, and
sign-out ending the session on the server, through the real app."""

from __future__ import annotations

import re

import pytest

from platform_support import Harness

CSRF = re.compile(r'name="csrf" value="([^"]+)"')

# Each page: where its sign-in form is, where it posts, its cookies' path and session cookie.
PAGES = {
    "dashboard": ("/login", "/login", "/", "osmosis_session"),
    "device": ("/device", "/device/session", "/device", "osmosis_device_session"),
}


def csrf_of(page: str) -> str:
    found = CSRF.search(page)
    assert found, page[:500]
    return found.group(1)


def attributes(set_cookie: str) -> set[str]:
    """A Set-Cookie header's attributes other than its value and max-age."""
    parts = [p.strip().lower() for p in set_cookie.split(";")[1:]]
    return {p for p in parts if not p.startswith("max-age=")}


@pytest.fixture(params=["http://127.0.0.1:8480", "https://platform.example"])
def public(request, tmp_path):
    made = Harness(tmp_path / "data", f"sqlite:///{tmp_path / 'p.db'}", public_url=request.param)
    yield made
    made.close()


async def sign_in(client, page: str, account) -> tuple[str, str]:
    """Sign in on ``page``; its CSRF cookie's and session cookie's Set-Cookie headers."""
    form_url, post_url, _, _ = PAGES[page]
    form = await client.get(form_url)
    answer = await client.post(
        post_url,
        data={"csrf": csrf_of(form.text), "email": account.email, "token": account.token},
    )
    assert answer.status_code == 303, answer.text
    return form.headers["set-cookie"], answer.headers["set-cookie"]


async def test_both_pages_set_the_same_cookie_attributes(public):
    alice = public.account("alice@example.com")
    secure = {"secure"} if public.settings.public_url.startswith("https") else set()
    for page, (_, _, path, session_name) in PAGES.items():
        async with public.client() as client:
            csrf_cookie, session_cookie = await sign_in(client, page, alice)
        assert session_cookie.startswith(session_name + "=")
        expected = {"httponly", "samesite=strict", f"path={path}"} | secure
        assert attributes(csrf_cookie) == expected, page
        assert attributes(session_cookie) == expected, page


@pytest.mark.parametrize("page", PAGES)
async def test_a_post_from_any_origin_but_the_public_urls_is_refused(harness, page):
    """Not even the origin the request itself was addressed to: only the public URL's."""
    alice = harness.account("alice@example.com")
    form_url, post_url, _, _ = PAGES[page]
    async with harness.client() as client:
        form = await client.get(form_url)
        fields = {"csrf": csrf_of(form.text), "email": alice.email, "token": alice.token}
        cookie = "; ".join(f"{k}={v}" for k, v in client.cookies.items())
        for origin in ("https://evil.example", "http://alias.example", "null"):
            answer = await client.post(
                f"http://alias.example{post_url}",
                data=fields,
                headers={"Origin": origin, "Cookie": cookie},
            )
            assert answer.status_code == 403, (origin, answer.text)
            assert answer.json()["code"] == "CSRF_ORIGIN"
        same = await client.post(
            post_url, data=fields, headers={"Origin": harness.settings.public_url}
        )
        assert same.status_code == 303


@pytest.mark.parametrize("page", PAGES)
async def test_an_oversized_form_is_refused_on_both_pages(harness, page):
    form_url, post_url, _, _ = PAGES[page]
    async with harness.client() as client:
        form = await client.get(form_url)
        answer = await client.post(
            post_url, data={"csrf": csrf_of(form.text), "email": "a" * 20_000}
        )
        assert answer.status_code == 403 and answer.json()["code"] == "FORM_TOO_LARGE"


async def test_signing_out_of_the_device_page_refuses_a_copy_of_its_cookie(harness):
    alice = harness.account("alice@example.com")
    async with harness.client() as browser, harness.client() as thief:
        await sign_in(browser, "device", alice)
        session = browser.cookies["osmosis_device_session"]
        thief.cookies.set("osmosis_device_session", session, path="/device")
        assert "Signed in as" in (await thief.get("/device")).text
        page = await browser.get("/device")
        out = await browser.post("/device/signout", data={"csrf": csrf_of(page.text)})
        assert out.status_code == 303
        copied = await thief.get("/device")
        assert "Signed in as" not in copied.text and "Sign in" in copied.text
