"""``/device``: where a person approves the code ``osmosis auth login`` printed.

Signing in takes the account's email and one of its existing tokens (handed out by an admin
with ``osmosis platform token create``); the browser then holds the one-hour session of
:data:`~osmosis_ai.platform.web.session.DEVICE`, under the dashboard's cookie and CSRF policy
(:mod:`osmosis_ai.platform.web.session`).
"""

from __future__ import annotations

from html import escape
from urllib.parse import quote

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from osmosis_ai.platform.api.deps import Platform, PlatformDep
from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.services import device
from osmosis_ai.platform.web.session import DEVICE, Viewer

router = APIRouter(include_in_schema=False)

_HEADERS = {
    "Content-Security-Policy": (
        "default-src 'none'; style-src 'unsafe-inline'; form-action 'self'; "
        "frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
    "Cache-Control": "no-store",
}


# --- routes ----------------------------------------------------------------------------------


@router.get("/device")
def device_page(request: Request, platform: PlatformDep) -> Response:
    csrf = DEVICE.csrf_cookie(request)
    user_code = request.query_params.get("user_code", "").strip()
    viewer = DEVICE.current_viewer(request, platform)
    if viewer is None:
        page = _sign_in_page(platform, csrf, user_code)
    elif not user_code:
        page = _code_entry_page(platform, csrf, viewer)
    else:
        try:
            with platform.read() as db:
                pending = device.pending_request(db, user_code, now=platform.now())
        except PlatformError as exc:
            page = _page("Code not found", _p(exc.message) + _code_form(), exc.status_code)
        else:
            page = _approval_page(platform, csrf, viewer, pending)
    DEVICE.set_cookie(page, platform, DEVICE.csrf_name, csrf, max_age=None)
    return page


@router.post("/device/session")
async def sign_in(request: Request, platform: PlatformDep) -> Response:
    form = await DEVICE.read_form(request, platform)
    user_code = form.get("user_code", "")
    try:
        value, max_age = DEVICE.sign_in(
            platform, form.get("email", ""), form.get("token", "").strip()
        )
    except PlatformError as exc:
        return _page("Sign-in failed", _p(exc.message) + _back(user_code), status=401)
    target = f"/device?user_code={quote(user_code)}" if user_code else "/device"
    answer = RedirectResponse(target, status_code=303, headers=_HEADERS)
    DEVICE.set_cookie(answer, platform, DEVICE.session_name, value, max_age=max_age)
    return answer


@router.post("/device/decision")
async def decision(request: Request, platform: PlatformDep) -> Response:
    form = await DEVICE.read_form(request, platform)
    viewer = DEVICE.current_viewer(request, platform)
    user_code = form.get("user_code", "")
    if viewer is None:
        return _page("Signed out", _p("Sign in again to approve the code.") + _back(user_code), 401)
    approve = form.get("decision") == "approve"
    try:
        with platform.transaction() as db:
            decided = device.decide(
                db, user_code, user_id=viewer.user_id, approve=approve, now=platform.now()
            )
    except PlatformError as exc:
        return _page("Code not found", _p(exc.message) + _code_form(), status=exc.status_code)
    if approve:
        return _page(
            "Device approved",
            _p(f"{decided.device_name} is now signed in as {viewer.email}.")
            + _p("You can close this page and return to your terminal."),
        )
    return _page("Login denied", _p(f"The login from {decided.device_name} was denied."))


@router.post("/device/signout")
async def sign_out(request: Request, platform: PlatformDep) -> Response:
    await DEVICE.read_form(request, platform)
    answer = RedirectResponse("/device", status_code=303, headers=_HEADERS)
    DEVICE.sign_out(request, platform, answer)
    return answer


# --- pages -----------------------------------------------------------------------------------


def _sign_in_page(platform: Platform, csrf: str, user_code: str) -> HTMLResponse:
    token = escape(DEVICE.csrf_token(platform, csrf))
    body = (
        _p("Sign in to approve the code shown in your terminal.")
        + '<form method="post" action="/device/session">'
        + f'<input type="hidden" name="csrf" value="{token}">'
        + '<label>Email <input type="email" name="email" required autocomplete="username"></label>'
        + '<label>Token <input type="password" name="token" required '
        + 'autocomplete="current-password"></label>'
        + f'<label>Code <input name="user_code" value="{escape(user_code)}"></label>'
        + '<button type="submit">Sign in</button></form>'
        + _p("An admin gives you a token with 'osmosis platform token create --email EMAIL'.")
    )
    return _page("Sign in", body)


def _code_entry_page(platform: Platform, csrf: str, viewer: Viewer) -> HTMLResponse:
    body = _p(f"Signed in as {viewer.email}.") + _code_form() + _sign_out(platform, csrf)
    return _page("Enter your code", body)


def _approval_page(
    platform: Platform, csrf: str, viewer: Viewer, pending: device.DeviceRequest
) -> HTMLResponse:
    token = escape(DEVICE.csrf_token(platform, csrf))
    code = escape(pending.user_code)
    body = (
        _p(f"Signed in as {viewer.email}.")
        + _p(f"{pending.device_name} asks to sign in to this platform as you.")
        + f'<p class="code">{code}</p>'
        + _p("Approve only if this is the code your terminal shows.")
        + '<form method="post" action="/device/decision">'
        + f'<input type="hidden" name="csrf" value="{token}">'
        + f'<input type="hidden" name="user_code" value="{code}">'
        + '<button type="submit" name="decision" value="approve">Approve</button> '
        + '<button type="submit" name="decision" value="deny">Deny</button></form>'
        + _sign_out(platform, csrf)
    )
    return _page("Approve device", body)


def _code_form() -> str:
    return (
        '<form method="get" action="/device"><label>Code '
        '<input name="user_code" placeholder="BCDF-GHJK" required></label>'
        '<button type="submit">Continue</button></form>'
    )


def _sign_out(platform: Platform, csrf: str) -> str:
    token = escape(DEVICE.csrf_token(platform, csrf))
    return (
        '<form method="post" action="/device/signout">'
        f'<input type="hidden" name="csrf" value="{token}">'
        '<button type="submit" class="link">Sign out</button></form>'
    )


def _back(user_code: str) -> str:
    target = f"/device?user_code={quote(user_code)}" if user_code else "/device"
    return f'<p><a href="{escape(target)}">Try again</a></p>'


def _p(text: str) -> str:
    return f"<p>{escape(text)}</p>"


_STYLE = (
    "body{font-family:system-ui,sans-serif;max-width:32rem;margin:3rem auto;padding:0 1rem}"
    "label{display:block;margin:.6rem 0}input{display:block;width:100%;padding:.4rem}"
    "button{margin-top:.8rem;padding:.4rem 1rem}.code{font:700 2rem monospace}"
    ".link{background:none;border:none;color:#06c;padding:0}"
)


def _page(title: str, body: str, status: int = 200) -> HTMLResponse:
    html = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        f"<title>{escape(title)} · Osmosis</title><style>{_STYLE}</style></head>"
        f"<body><h1>{escape(title)}</h1>{body}</body></html>"
    )
    return HTMLResponse(html, status_code=status, headers=_HEADERS)
