"""Device-code login (RFC 8628): a CLI asks for a code, a person approves it in the browser,
the CLI's next poll gets a token.

Only hashes of device codes are stored, and the token is minted on the first poll after
approval, so no raw token is ever written down. Polling answers the RFC's errors
(``authorization_pending``, ``slow_down``, ``expired_token``, ``access_denied``) in the
envelope's ``error`` field, with status 400.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime, timedelta

from sqlalchemy import delete, select
from sqlalchemy.orm import Session

from osmosis_ai.platform.auth import IssuedToken, hash_token, issue_token
from osmosis_ai.platform.errors import InvalidRequestError, NotFoundError, PlatformError
from osmosis_ai.platform.store.orm import DeviceAuthorization, User

USER_CODE_ALPHABET = "BCDFGHJKLMNPQRSTVWXZ"  # no vowels (no words), no look-alikes
USER_CODE_LENGTH = 8
DEVICE_CODE_TTL = timedelta(minutes=15)
POLL_INTERVAL_S = 5
SLOW_DOWN_STEP_S = 5
# How long an expired login is kept, so a late poll still hears ``expired_token``.
EXPIRED_KEPT = timedelta(hours=1)


class DeviceFlowError(PlatformError):
    """A poll that gets no token yet; ``error`` is the RFC 8628 code clients switch on."""

    status_code = 400

    def envelope(self) -> dict[str, object]:
        return {**super().envelope(), "error": self.code}


@dataclass(frozen=True)
class DeviceStart:
    device_code: str  # raw; only its hash is stored
    user_code: str  # formatted ABCD-EFGH
    expires_in: int
    interval: int


@dataclass(frozen=True)
class DeviceRequest:
    """A pending login as the approval page shows it."""

    id: str
    user_code: str
    device_name: str
    created_at: datetime
    expires_at: datetime

    @classmethod
    def of(cls, found: DeviceAuthorization) -> DeviceRequest:
        return cls(
            id=found.id,
            user_code=format_user_code(found.user_code),
            device_name=found.device_name,
            created_at=found.created_at,
            expires_at=found.expires_at,
        )


def format_user_code(code: str) -> str:
    half = len(code) // 2
    return f"{code[:half]}-{code[half:]}"


def normalize_user_code(text: str) -> str:
    code = "".join(ch for ch in text.upper() if ch.isalnum())
    if len(code) != USER_CODE_LENGTH or any(ch not in USER_CODE_ALPHABET for ch in code):
        raise InvalidRequestError(
            f"Not a login code: {text!r}. Copy the code the CLI printed (like BCDF-GHJK).",
            field="user_code",
        )
    return code


def start(session: Session, *, device_name: str, now: datetime) -> DeviceStart:
    device_code = secrets.token_urlsafe(32)
    user_code = "".join(secrets.choice(USER_CODE_ALPHABET) for _ in range(USER_CODE_LENGTH))
    session.add(
        DeviceAuthorization(
            device_code_hash=hash_token(device_code),
            user_code=user_code,
            device_name=(device_name.strip() or "unknown device")[:200],
            status="pending",
            created_at=now,
            expires_at=now + DEVICE_CODE_TTL,
            interval_s=POLL_INTERVAL_S,
        )
    )
    session.flush()
    return DeviceStart(
        device_code=device_code,
        user_code=format_user_code(user_code),
        expires_in=int(DEVICE_CODE_TTL.total_seconds()),
        interval=POLL_INTERVAL_S,
    )


def pending_request(session: Session, user_code: str, *, now: datetime) -> DeviceRequest:
    """The login waiting for approval under ``user_code``; 404 if none (or it expired)."""
    found = _pending(session, normalize_user_code(user_code), now=now)
    return DeviceRequest.of(found)


def decide(
    session: Session, user_code: str, *, user_id: str, approve: bool, now: datetime
) -> DeviceRequest:
    """Approve (or deny) the pending login ``user_code`` as ``user_id``."""
    found = _pending(session, normalize_user_code(user_code), now=now)
    found.status = "approved" if approve else "denied"
    found.user_id = user_id
    return DeviceRequest.of(found)


def poll(
    session: Session, device_code: str, *, platform_url: str, now: datetime
) -> tuple[IssuedToken, User] | DeviceFlowError:
    """The token of an approved login (once); until then the error to answer with.

    The error is returned, not raised: the poll's bookkeeping (``last_polled_at``, a slowed
    interval) must be committed with it.
    """
    found = session.scalar(
        select(DeviceAuthorization).where(
            DeviceAuthorization.device_code_hash == hash_token(device_code)
        )
    )
    if found is None:
        return DeviceFlowError("Unknown device code: start the login again.", code="invalid_grant")
    if found.status == "consumed":
        return DeviceFlowError(
            "This device code was used already: start the login again.", code="expired_token"
        )
    if found.status == "denied":
        return DeviceFlowError("The login was denied in the browser.", code="access_denied")
    if found.expires_at <= now:
        return DeviceFlowError(
            "The device code expired before it was approved: start the login again.",
            code="expired_token",
        )
    if found.status == "pending":
        last, found.last_polled_at = found.last_polled_at, now
        if last is not None and now - last < timedelta(seconds=found.interval_s):
            found.interval_s += SLOW_DOWN_STEP_S
            return DeviceFlowError(
                f"Polling too fast: wait {found.interval_s} s between polls.",
                code="slow_down",
                details={"interval": found.interval_s},
            )
        return DeviceFlowError(
            "Waiting for the code to be approved in the browser.", code="authorization_pending"
        )
    user = session.get(User, found.user_id) if found.user_id else None
    if user is None:
        return DeviceFlowError("The approving user no longer exists.", code="access_denied")
    issued = issue_token(
        session, user, platform_url=platform_url, name=f"device: {found.device_name}", now=now
    )
    found.status = "consumed"
    found.token_id = issued.id
    return issued, user


def _pending(session: Session, code: str, *, now: datetime) -> DeviceAuthorization:
    found = session.scalar(
        select(DeviceAuthorization)
        .where(
            DeviceAuthorization.user_code == code,
            DeviceAuthorization.status == "pending",
            DeviceAuthorization.expires_at > now,
        )
        .order_by(DeviceAuthorization.created_at.desc())
    )
    if found is None:
        raise NotFoundError(
            f"No login is waiting for code {format_user_code(code)}: it expired, was "
            "already decided, or was mistyped. Start 'osmosis auth login' again.",
            code="DEVICE_CODE_NOT_FOUND",
        )
    return found


def delete_expired(session: Session, *, now: datetime) -> int:
    """Delete logins that expired over :data:`EXPIRED_KEPT` ago (decided or not); how many."""
    done = session.execute(
        delete(DeviceAuthorization).where(DeviceAuthorization.expires_at < now - EXPIRED_KEPT)
    )
    return int(getattr(done, "rowcount", 0) or 0)
