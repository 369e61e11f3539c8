"""``/device``: where a person approves the code ``osmosis auth login`` printed.

Signing in takes the account's email and one of its existing tokens (handed out by an admin
with ``osmosis platform token create``); the browser then holds a signed, HttpOnly,
SameSite=Strict session cookie for an hour. Every form carries a CSRF token bound to a
separate HttpOnly cookie, and a cross-origin ``Origin`` is refused.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from html import escape
from urllib.parse import parse_qs, quote, urlsplit

from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from sqlalchemy.orm import Session

from osmosis_ai.platform.api.deps import Platform, PlatformDep
from osmosis_ai.platform.auth import Principal, authenticate
from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.services import device
from osmosis_ai.platform.store.orm import Token, User
from osmosis_ai.platform.web.session import session_key

router = APIRouter(include_in_schema=False)

SESSION_COOKIE = "osmosis_device_session"
CSRF_COOKIE = "osmosis_csrf"
SESSION_LIFETIME = timedelta(hours=1)
MAX_FORM_BYTES = 16_384
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


@dataclass(frozen=True)
class _Session:
    user_id: str
    token_id: str
    email: str


# --- routes ----------------------------------------------------------------------------------


@router.get("/device")
def device_page(request: Request, platform: PlatformDep) -> Response:
    csrf = request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)
    user_code = request.query_params.get("user_code", "").strip()
    session = _current_session(request, platform)
    if session is None:
        page = _sign_in_page(platform, csrf, user_code)
    elif not user_code:
        page = _code_entry_page(platform, csrf, session)
    else:
        try:
            with platform.read() as db:
                pending = device.pending_request(db, user_code, now=platform.now())
        except PlatformError as exc:
            page = _page("Code not found", _p(exc.message) + _code_form(), exc.status_code)
        else:
            page = _approval_page(platform, csrf, session, pending)
    _set_cookie(page, platform, CSRF_COOKIE, csrf, max_age=None)
    return page


@router.post("/device/session")
async def sign_in(request: Request, platform: PlatformDep) -> Response:
    form = await _form(request, platform)
    user_code = form.get("user_code", "")
    email = form.get("email", "").strip().lower()
    raw = form.get("token", "").strip()
    try:
        with platform.transaction() as db:
            principal = authenticate(
                db, raw, platform_url=platform.settings.public_url, now=platform.now()
            )
    except PlatformError as exc:
        return _page("Sign-in failed", _p(exc.message) + _back(user_code), status=401)
    if principal.email != email:
        return _page(
            "Sign-in failed",
            _p("That token does not belong to that email address.") + _back(user_code),
            status=401,
        )
    target = f"/device?user_code={quote(user_code)}" if user_code else "/device"
    answer = RedirectResponse(target, status_code=303, headers=_HEADERS)
    _set_cookie(
        answer,
        platform,
        SESSION_COOKIE,
        _sign_session(platform, principal),
        max_age=int(SESSION_LIFETIME.total_seconds()),
    )
    return answer


@router.post("/device/decision")
async def decision(request: Request, platform: PlatformDep) -> Response:
    form = await _form(request, platform)
    session = _current_session(request, platform)
    user_code = form.get("user_code", "")
    if session is None:
        return _page("Signed out", _p("Sign in again to approve the code.") + _back(user_code), 401)
    approve = form.get("decision") == "approve"
    try:
        with platform.transaction() as db:
            decided = device.decide(
                db, user_code, user_id=session.user_id, approve=approve, now=platform.now()
            )
    except PlatformError as exc:
        return _page("Code not found", _p(exc.message) + _code_form(), status=exc.status_code)
    if approve:
        return _page(
            "Device approved",
            _p(f"{decided.device_name} is now signed in as {session.email}.")
            + _p("You can close this page and return to your terminal."),
        )
    return _page("Login denied", _p(f"The login from {decided.device_name} was denied."))


@router.post("/device/signout")
async def sign_out(request: Request, platform: PlatformDep) -> Response:
    await _form(request, platform)
    answer = RedirectResponse("/device", status_code=303, headers=_HEADERS)
    answer.delete_cookie(SESSION_COOKIE, path="/device", httponly=True, samesite="strict")
    return answer


# --- sessions and CSRF -----------------------------------------------------------------------


class _Rejected(PlatformError):
    status_code = 403
    default_code = "FORBIDDEN"


def _mac(platform: Platform, purpose: str, value: str) -> str:
    message = f"{purpose}:{value}".encode()
    return hmac.new(session_key(platform), message, hashlib.sha256).hexdigest()


def csrf_token(platform: Platform, cookie: str) -> str:
    """The form token that goes with CSRF cookie ``cookie``."""
    return _mac(platform, "csrf", cookie)


def _sign_session(platform: Platform, principal: Principal) -> str:
    expires = min(platform.now() + SESSION_LIFETIME, principal.expires_at)
    payload = {"u": principal.user_id, "t": principal.token_id, "e": int(expires.timestamp())}
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"{body}.{_mac(platform, 'session', body)}"


def _current_session(request: Request, platform: Platform) -> _Session | None:
    cookie = request.cookies.get(SESSION_COOKIE, "")
    body, _, mac = cookie.partition(".")
    # Bytes, not str: compare_digest raises TypeError on non-ASCII text from the client.
    if not body or not hmac.compare_digest(mac.encode(), _mac(platform, "session", body).encode()):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        user_id, token_id, expires = str(payload["u"]), str(payload["t"]), int(payload["e"])
    except (ValueError, KeyError, TypeError):
        return None
    now = platform.now()
    if expires <= now.timestamp():
        return None
    with platform.read() as db:  # only reads: no write lock for a page view
        return _still_valid(db, user_id, token_id, now)


def _still_valid(db: Session, user_id: str, token_id: str, now: datetime) -> _Session | None:
    """The session's token must still be live: revoking it signs the browser out too."""
    token = db.get(Token, token_id)
    if token is None or token.user_id != user_id or token.revoked_at is not None:
        return None
    if token.expires_at <= now:
        return None
    user = db.get(User, user_id)
    return None if user is None else _Session(user_id=user.id, token_id=token.id, email=user.email)


async def _form(request: Request, platform: Platform) -> dict[str, str]:
    """The urlencoded form of a POST, after the origin and CSRF checks."""
    origin = request.headers.get("origin")
    if origin is not None and origin.rstrip("/") != _origin(platform.settings.public_url):
        raise _Rejected(f"Cross-origin form post from {origin!r} refused.", code="CSRF_ORIGIN")
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise _Rejected("Form too large.", code="FORM_TOO_LARGE")
    fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items() if v}
    cookie = request.cookies.get(CSRF_COOKIE, "")
    sent = fields.get("csrf", "")
    expected = csrf_token(platform, cookie).encode()
    if not cookie or not sent or not hmac.compare_digest(sent.encode(), expected):
        raise _Rejected(
            "The form's security token is missing or stale: reload the page and try again.",
            code="CSRF_INVALID",
        )
    return fields


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"


def _set_cookie(
    response: Response, platform: Platform, name: str, value: str, *, max_age: int | None
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/device",
        httponly=True,
        samesite="strict",
        secure=platform.settings.public_url.startswith("https://"),
    )


# --- pages -----------------------------------------------------------------------------------


def _sign_in_page(platform: Platform, csrf: str, user_code: str) -> HTMLResponse:
    token = escape(csrf_token(platform, csrf))
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


def _code_entry_page(platform: Platform, csrf: str, session: _Session) -> HTMLResponse:
    body = _p(f"Signed in as {session.email}.") + _code_form() + _sign_out(platform, csrf)
    return _page("Enter your code", body)


def _approval_page(
    platform: Platform, csrf: str, session: _Session, pending: device.DeviceRequest
) -> HTMLResponse:
    token = escape(csrf_token(platform, csrf))
    code = escape(pending.user_code)
    body = (
        _p(f"Signed in as {session.email}.")
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
    token = escape(csrf_token(platform, csrf))
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
