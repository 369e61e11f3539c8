"""Browser sign-in and CSRF for the platform's pages: who the browser is, and whether a form
came from us. The dashboard (``/``) and the device-login page (``/device``) are two
:class:`CookieSession` s of one policy; only their cookie names, path and lifetime differ.

Signing in takes an account's email and one of its live API tokens. The browser then holds a
signed session cookie (``HttpOnly``, ``SameSite=Strict``, ``Secure`` when the public URL is
https) naming the user, the token and the token's session generation; revoking or expiring
the token signs the browser out at its next request, and so does signing out of either page:
it raises the generation, so a copy of the cookie kept from before is refused on the server
(every browser session of that token ends with it). Cookies are signed with the data dir's
``session.key``, under a purpose per page.

Every state-changing request carries a CSRF token: ``HMAC(key, cookie)`` of a random value in
a separate cookie of the same attributes, sent as the form field ``csrf`` or the
``X-CSRF-Token`` header (the upload's ``fetch``). A request whose ``Origin`` is not the public
URL's is refused (403 ``CSRF_ORIGIN``); forms are at most 16 KiB.
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
from osmosis_ai.platform.auth import Principal, authenticate
from osmosis_ai.platform.crypto import load_or_create_key
from osmosis_ai.platform.errors import PlatformError
from osmosis_ai.platform.store.orm import Token, User

CSRF_HEADER = "x-csrf-token"
MAX_FORM_BYTES = 16 * 1024
_KEY = "session_key"  # the extras slot the key is kept in


@dataclass(frozen=True)
class Viewer:
    """The signed-in person."""

    user_id: str
    token_id: str
    email: str
    name: str


class CsrfRejectedError(PlatformError):
    status_code = 403
    default_code = "CSRF_INVALID"


class SignInRefusedError(PlatformError):
    status_code = 401
    default_code = "SIGN_IN_REFUSED"


def session_key(platform: Platform) -> bytes:
    """The data dir's key that signs browser sessions and CSRF tokens (made on first use)."""
    key = platform.extras.get(_KEY)
    if not isinstance(key, bytes):
        key = load_or_create_key(platform.settings.key_dir / "session.key")
        platform.extras[_KEY] = key
    return key


@dataclass(frozen=True)
class CookieSession:
    """One page family's session and CSRF cookies, scoped to ``path``."""

    purpose: str  # keeps one page's signatures from being accepted by another
    session_name: str
    csrf_name: str
    path: str
    lifetime: timedelta

    def _mac(self, platform: Platform, kind: str, value: str) -> str:
        message = f"{self.purpose}-{kind}:{value}".encode()
        return hmac.new(session_key(platform), message, hashlib.sha256).hexdigest()

    # --- the session cookie ----------------------------------------------------------------

    def sign_in(self, platform: Platform, email: str, raw_token: str) -> tuple[str, int]:
        """The session cookie value and max-age for ``email`` signing in with ``raw_token``;
        :class:`PlatformError` (401) when the token is not live or not that email's."""
        with platform.transaction() as db:
            principal = authenticate(
                db, raw_token, platform_url=platform.settings.public_url, now=platform.now()
            )
            generation = session_generation(db, principal.token_id)
        if principal.email != email.strip().lower():
            raise SignInRefusedError("That token does not belong to that email address.")
        return self.session_cookie(platform, principal, generation=generation)

    def session_cookie(
        self, platform: Platform, principal: Principal, *, generation: int
    ) -> tuple[str, int]:
        """The signed cookie value for ``principal`` (its token at session ``generation``) and
        its max-age in seconds."""
        now = platform.now()
        expires = min(now + self.lifetime, principal.expires_at)
        payload = {
            "u": principal.user_id,
            "t": principal.token_id,
            "e": int(expires.timestamp()),
            "g": generation,
        }
        body = base64.urlsafe_b64encode(json.dumps(payload).encode()).decode().rstrip("=")
        value = f"{body}.{self._mac(platform, 'session', body)}"
        return value, max(1, int((expires - now).total_seconds()))

    def current_viewer(self, request: Request, platform: Platform) -> Viewer | None:
        """Who the session cookie names, if it is genuine, unexpired and its token live."""
        cookie = request.cookies.get(self.session_name, "")
        body, _, mac = cookie.partition(".")
        # Bytes: compare_digest refuses non-ASCII text, which a client may send.
        expected = self._mac(platform, "session", body).encode()
        if not body or not hmac.compare_digest(mac.encode(), expected):
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
        with platform.read() as db:  # only reads: no write lock for a page view
            return _live(db, user_id, token_id, generation, now)

    def sign_out(self, request: Request, platform: Platform, response: Response) -> None:
        """End the browser's session on the server (a copy of the cookie no longer works,
        nor does any other browser session of its token) and clear the cookie."""
        viewer = self.current_viewer(request, platform)
        if viewer is not None:
            with platform.transaction() as db:
                end_sessions(db, viewer.token_id)
        self.clear_session(response, platform)

    def set_cookie(
        self, response: Response, platform: Platform, name: str, value: str, *, max_age: int | None
    ) -> None:
        response.set_cookie(
            name,
            value,
            max_age=max_age,
            path=self.path,
            httponly=True,
            samesite="strict",
            secure=platform.settings.public_url.startswith("https://"),
        )

    def clear_session(self, response: Response, platform: Platform) -> None:
        response.delete_cookie(
            self.session_name,
            path=self.path,
            httponly=True,
            samesite="strict",
            secure=platform.settings.public_url.startswith("https://"),
        )

    # --- CSRF ------------------------------------------------------------------------------

    def csrf_cookie(self, request: Request) -> str:
        """The browser's CSRF cookie, or a new random one (the page then sets it)."""
        return request.cookies.get(self.csrf_name) or secrets.token_urlsafe(32)

    def csrf_token(self, platform: Platform, cookie: str) -> str:
        """The token forms carry alongside CSRF cookie ``cookie``."""
        return self._mac(platform, "csrf", cookie)

    def check_csrf(self, request: Request, platform: Platform, sent: str | None) -> None:
        """Refuse (403) a state change whose CSRF token is missing, stale or cross-origin;
        ``sent`` is the form's token (None: the ``X-CSRF-Token`` header's)."""
        origin = request.headers.get("origin")
        # Older browsers send no Origin on same-origin posts: then the token decides.
        if origin is not None and origin.rstrip("/") != _origin(platform.settings.public_url):
            raise CsrfRejectedError(
                f"Cross-origin request from {origin!r} refused.", code="CSRF_ORIGIN"
            )
        cookie = request.cookies.get(self.csrf_name, "")
        value = sent if sent is not None else request.headers.get(CSRF_HEADER, "")
        expected = self.csrf_token(platform, cookie).encode()
        if not cookie or not value or not hmac.compare_digest(value.encode(), expected):
            raise CsrfRejectedError(
                "The form's security token is missing or stale: reload the page and try again."
            )

    async def read_form(self, request: Request, platform: Platform) -> dict[str, str]:
        """The urlencoded form of a POST, after the origin and CSRF checks."""
        body = await request.body()
        if len(body) > MAX_FORM_BYTES:
            raise CsrfRejectedError("Form too large.", code="FORM_TOO_LARGE")
        fields = {k: v[0] for k, v in parse_qs(body.decode("utf-8", "replace")).items() if v}
        self.check_csrf(request, platform, fields.get("csrf", ""))
        return fields


DASHBOARD = CookieSession(
    purpose="dashboard",
    session_name="osmosis_session",
    csrf_name="osmosis_dashboard_csrf",
    path="/",
    lifetime=timedelta(hours=12),
)
# The device page approves one login: a short session, its cookies sent to /device only.
DEVICE = CookieSession(
    purpose="device",
    session_name="osmosis_device_session",
    csrf_name="osmosis_csrf",
    path="/device",
    lifetime=timedelta(hours=1),
)

# The dashboard's session, under the names its pages use.
SESSION_COOKIE = DASHBOARD.session_name
CSRF_COOKIE = DASHBOARD.csrf_name
current_viewer = DASHBOARD.current_viewer
set_cookie = DASHBOARD.set_cookie
csrf_cookie = DASHBOARD.csrf_cookie
csrf_token = DASHBOARD.csrf_token
check_csrf = DASHBOARD.check_csrf
read_form = DASHBOARD.read_form


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


def _origin(url: str) -> str:
    parts = urlsplit(url)
    return f"{parts.scheme}://{parts.netloc}"
