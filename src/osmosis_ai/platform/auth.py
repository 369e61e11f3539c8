"""API tokens: minting, hashing, checking and revoking.

A token is ``osm_`` plus 32 random bytes (urlsafe base64). Only its SHA-256 is stored, with
the platform URL it was issued for: a token presented to a platform at another public URL is
refused, as are expired and revoked ones, each with its own 401 ``code`` (``TOKEN_EXPIRED``,
``TOKEN_REVOKED``, ``TOKEN_PLATFORM_MISMATCH``, ``TOKEN_INVALID``, ``TOKEN_MISSING``).
"""

from __future__ import annotations

import hashlib
import secrets
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from sqlalchemy import select
from sqlalchemy.orm import Session

from osmosis_ai.platform.errors import AuthenticationError, InvalidRequestError, NotFoundError
from osmosis_ai.platform.store.orm import Token, User

TOKEN_PREFIX = "osm_"
DEFAULT_TOKEN_DAYS = 90
MAX_TOKEN_DAYS = 3650
# Writing last_used_at on every request would make every read a write; once a minute is enough.
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True)
class Principal:
    """Who a request acts as: the user behind a valid token."""

    user_id: str
    email: str
    name: str | None
    token_id: str
    expires_at: datetime
    touch_due: bool = False  # last_used_at is older than LAST_USED_RESOLUTION (not updated)
    last_used_at: datetime | None = None  # as read when authenticated


@dataclass(frozen=True)
class IssuedToken:
    """A new token: ``raw`` is shown once and never stored."""

    raw: str
    id: str
    user_id: str
    platform_url: str
    expires_at: datetime


def hash_token(raw: str) -> str:
    return hashlib.sha256(raw.encode("utf-8")).hexdigest()


def new_raw_token() -> str:
    return TOKEN_PREFIX + secrets.token_urlsafe(32)


def token_lifetime(days: int) -> timedelta:
    if not 1 <= days <= MAX_TOKEN_DAYS:
        raise InvalidRequestError(
            f"A token lifetime of {days} days is out of range: pick 1 to {MAX_TOKEN_DAYS}.",
            field="expires_days",
        )
    return timedelta(days=days)


def issue_token(
    session: Session,
    user: User,
    *,
    platform_url: str,
    name: str,
    now: datetime,
    lifetime: timedelta = timedelta(days=DEFAULT_TOKEN_DAYS),
) -> IssuedToken:
    raw = new_raw_token()
    token = Token(
        user_id=user.id,
        token_hash=hash_token(raw),
        platform_url=platform_url,
        name=name[:200],
        created_at=now,
        expires_at=now + lifetime,
    )
    session.add(token)
    session.flush()
    return IssuedToken(
        raw=raw,
        id=token.id,
        user_id=user.id,
        platform_url=platform_url,
        expires_at=token.expires_at,
    )


def authenticate(
    session: Session, raw: str | None, *, platform_url: str, now: datetime, touch: bool = True
) -> Principal:
    """The principal of bearer token ``raw`` on the platform at ``platform_url``.

    With ``touch`` the token's ``last_used_at`` is brought up to date when it is due; without
    it nothing is written (for a read-only transaction) and ``touch_due`` says whether
    :func:`touch_token` should be called in a write transaction.
    """
    if not raw:
        raise AuthenticationError(
            "Authentication required: send Authorization: Bearer <token> "
            "(log in with 'osmosis auth login').",
            code="TOKEN_MISSING",
        )
    token = session.scalar(select(Token).where(Token.token_hash == hash_token(raw)))
    if token is None:
        raise AuthenticationError(
            "The token is not valid on this platform. Log in again with 'osmosis auth login'.",
            code="TOKEN_INVALID",
        )
    if token.revoked_at is not None:
        raise AuthenticationError(
            "The token was revoked. Log in again with 'osmosis auth login'.",
            code="TOKEN_REVOKED",
        )
    if token.expires_at <= now:
        raise _expired()
    if token.platform_url != platform_url:
        raise AuthenticationError(
            f"The token was issued for the platform at {token.platform_url}, not this one "
            f"({platform_url}). Log in to this platform with 'osmosis auth login'.",
            code="TOKEN_PLATFORM_MISMATCH",
        )
    user = session.get(User, token.user_id)
    if user is None:  # the foreign key cascades, so only a race with a deletion gets here
        raise AuthenticationError("The token's user no longer exists.", code="TOKEN_INVALID")
    due = _touch_due(token, now)
    if due and touch:
        token.last_used_at = now
    return Principal(
        user_id=user.id,
        email=user.email,
        name=user.name,
        token_id=token.id,
        expires_at=token.expires_at,
        touch_due=due and not touch,
        last_used_at=token.last_used_at,
    )


def recheck(principal: Principal, *, now: datetime) -> Principal:
    """A principal authenticated a moment ago, checked again at ``now`` (for a cached one).

    Its expiry is checked again, and ``touch_due`` says whether its last use should be
    written; revocation is not (the caller drops cached principals when tokens change).
    """
    if principal.expires_at <= now:
        raise _expired()
    due = last_use_due(principal.last_used_at, now)
    return principal if due == principal.touch_due else replace(principal, touch_due=due)


def _expired() -> AuthenticationError:
    return AuthenticationError(
        "The token expired. Log in again with 'osmosis auth login'.", code="TOKEN_EXPIRED"
    )


def last_use_due(last_used_at: datetime | None, now: datetime) -> bool:
    """Whether a token last used at ``last_used_at`` should have ``now`` written as its use."""
    return last_used_at is None or now - last_used_at >= LAST_USED_RESOLUTION


def _touch_due(token: Token, now: datetime) -> bool:
    return last_use_due(token.last_used_at, now)


def touch_token(session: Session, token_id: str, *, now: datetime) -> None:
    """Record that the token was used at ``now`` (at most once per LAST_USED_RESOLUTION)."""
    token = session.get(Token, token_id)
    if token is not None and _touch_due(token, now):
        token.last_used_at = now


def revoke_token(
    session: Session, token_id: str, *, now: datetime, user_id: str | None = None
) -> Token:
    """Revoke a token (idempotent); with ``user_id``, only one of that user's tokens."""
    token = session.get(Token, token_id)
    if token is None or (user_id is not None and token.user_id != user_id):
        raise NotFoundError(f"No token with id {token_id!r}.", code="TOKEN_NOT_FOUND")
    if token.revoked_at is None:
        token.revoked_at = now
    return token
