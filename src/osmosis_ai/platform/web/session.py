"""The dashboard's sign-in and CSRF: who the browser is, and whether a form came from us.

Signing in takes an account's email and one of its live API tokens, as ``/device`` does. The
browser then holds a signed session cookie (``HttpOnly``, ``SameSite=Lax``, ``Secure`` when
the public URL is https, path ``/``) naming the user, the token and the token's session
generation; revoking or expiring the token signs the browser out at its next request, and so
does signing out: it raises the generation, so a copy of the cookie kept from before is
refused on the server (every browser session of that token ends with it). The cookie is
signed with the data dir's ``session.key`` (the key ``/device`` uses), under its own purpose.

Every state-changing request carries a CSRF token: ``HMAC(key, cookie)`` of a random value in
a separate ``HttpOnly`` cookie, sent as the form field ``csrf`` or the ``X-CSRF-Token``
header (the upload's ``fetch``); a cross-origin ``Origin`` is refused as well.
"""

from __future__ import annotations

import base64
import hashlib
import hmac
import json
import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import parse_qs, urlsplit

from fastapi import Request
from fastapi.responses import Response
from sqlalchemy.orm import Session

from osmosis_ai.platform.api.deps import Platform
from osmosis_ai.platform.auth import Principal
from osmosis_ai.platform.crypto import load_or_create_key
from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.store.orm import Token, User

SESSION_COOKIE = "osmosis_session"
CSRF_COOKIE = "osmosis_dashboard_csrf"
CSRF_HEADER = "x-csrf-token"
SESSION_LIFETIME = timedelta(hours=12)
MAX_FORM_BYTES = 64 * 1024
_KEY = "session_key"  # the extras slot the key is kept in (web/device.py signs with it too)


@dataclass(frozen=True)
class Viewer:
    """The signed-in person."""

    user_id: str
    token_id: str
    email: str
    name: str


class CsrfRejected(PlatformError):
    status_code = 403
    default_code = "CSRF_INVALID"


def session_key(platform: Platform) -> bytes:
    """The data dir's key that signs browser sessions and CSRF tokens (made on first use)."""
    key = platform.extras.get(_KEY)
    if not isinstance(key, bytes):
        key = load_or_create_key(platform.settings.key_dir / "session.key")
        platform.extras[_KEY] = key
    return key


def _mac(platform: Platform, purpose: str, value: str) -> str:
    message = f"dashboard-{purpose}:{value}".encode()
    return hmac.new(session_key(platform), message, hashlib.sha256).hexdigest()


# --- the session cookie ------------------------------------------------------------------------


def session_cookie(platform: Platform, principal: Principal, *, generation: int) -> tuple[str, int]:
    """The signed cookie value for ``principal`` (its token at session ``generation``) and
    its max-age in seconds."""
    now = platform.now()
    expires = min(now + SESSION_LIFETIME, principal.expires_at)
    payload = {
        "u": principal.user_id,
        "t": principal.token_id,
        "e": int(expires.timestamp()),
        "g": generation,
    }
    body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
    return f"{body}.{_mac(platform, 'session', body)}", max(1, int((expires - now).total_seconds()))


def current_viewer(request: Request, platform: Platform) -> Viewer | None:
    """Who the session cookie names, if it is genuine, unexpired and its token still live."""
    cookie = request.cookies.get(SESSION_COOKIE, "")
    body, _, mac = cookie.partition(".")
    # Bytes: compare_digest refuses non-ASCII text, which a client may send.
    if not body or not hmac.compare_digest(mac.encode(), _mac(platform, "session", body).encode()):
        return None
    try:
        payload = json.loads(base64.urlsafe_b64decode(body + "=" * (-len(body) % 4)))
        user_id, token_id, expires = str(payload["u"]), str(payload["t"]), int(payload["e"])
        generation = int(payload["g"])
    except (ValueError, KeyError, TypeError):
        return None
    now = platform.now()
    if expires <= now.timestamp():
        return None
    with platform.read() as db:
        return _live(db, user_id, token_id, generation, now)


def _live(
    db: Session, user_id: str, token_id: str, generation: int, now: datetime
) -> Viewer | None:
    token = db.get(Token, token_id)
    if token is None or token.user_id != user_id or token.revoked_at is not None:
        return None
    if token.session_generation != generation:  # signed out since this cookie was made
        return None
    if token.expires_at <= now:
        return None
    user = db.get(User, user_id)
    if user is None:
        return None
    return Viewer(
        user_id=user.id, token_id=token.id, email=user.email, name=user.name or user.email
    )


def session_generation(db: Session, token_id: str) -> int:
    """The token's current session generation (what a new cookie carries)."""
    token = db.get(Token, token_id)
    return token.session_generation if token is not None else 0


def end_sessions(db: Session, token_id: str) -> None:
    """Sign every browser session of the token out: cookies minted before now are refused."""
    token = db.get(Token, token_id)
    if token is not None:
        token.session_generation += 1


def set_cookie(
    response: Response, platform: Platform, name: str, value: str, *, max_age: int | None
) -> None:
    response.set_cookie(
        name,
        value,
        max_age=max_age,
        path="/",
        httponly=True,
        samesite="lax",
        secure=platform.settings.public_url.startswith("https://"),
    )


def clear_session(response: Response, platform: Platform) -> None:
    response.delete_cookie(
        SESSION_COOKIE,
        path="/",
        httponly=True,
        samesite="lax",
        secure=platform.settings.public_url.startswith("https://"),
    )


# --- CSRF --------------------------------------------------------------------------------------


def csrf_cookie(request: Request) -> str:
    """The browser's CSRF cookie, or a new random one (the page then sets it)."""
    return request.cookies.get(CSRF_COOKIE) or secrets.token_urlsafe(32)


def csrf_token(platform: Platform, cookie: str) -> str:
    """The token forms carry alongside CSRF cookie ``cookie``."""
    return _mac(platform, "csrf", cookie)


def _check_origin(request: Request, platform: Platform) -> None:
    origin = request.headers.get("origin")
    if origin is None:  # not sent by older browsers on same-origin posts; the token decides
        return
    allowed = {_origin(platform.settings.public_url), _origin(str(request.base_url))}
    if origin.rstrip("/") not in allowed:
        raise CsrfRejected(f"Cross-origin request from {origin!r} refused.", code="CSRF_ORIGIN")


def check_csrf(request: Request, platform: Platform, sent: str | None) -> None:
    """Refuse (403) a state change whose CSRF token is missing, stale or cross-origin."""
    _check_origin(request, platform)
    cookie = request.cookies.get(CSRF_COOKIE, "")
    value = sent if sent is not None else request.headers.get(CSRF_HEADER, "")
    expected = csrf_token(platform, cookie).encode()
    if not cookie or not value or not hmac.compare_digest(value.encode(), expected):
        raise CsrfRejected(
            "The form's security token is missing or stale: reload the page and try again."
        )


async def read_form(request: Request, platform: Platform) -> dict[str, str]:
    """The urlencoded form of a POST, after the origin and CSRF checks."""
    body = await request.body()
    if len(body) > MAX_FORM_BYTES:
        raise CsrfRejected("Form too large.", code="FORM_TOO_LARGE")
    fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items() if v}
    check_csrf(request, platform, fields.get("csrf", ""))
    return fields


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
