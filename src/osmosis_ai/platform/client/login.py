"""Logging in and out of a platform: a token verified or a device login approved, saved
for the platform, and the login it replaces revoked; a logout revokes and forgets.

Revoking is best effort: a token that could not be revoked is a warning (code
``TOKEN_REVOKE_FAILED``), never a failed login or logout.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

from osmosis_ai.platform.client.api import (
    SESSION_EXPIRED,
    DeviceCode,
    PlatformClient,
    User,
    Warn,
    default_expiry,
    parse_timestamp,
)
from osmosis_ai.platform.client.credentials import Credentials, CredentialStore, Target
from osmosis_ai.platform.client.errors import LoginError, PlatformClientError

NOT_LOGGED_IN = "Not logged in. Run 'osmosis auth login' first, or set OSMOSIS_TOKEN."
UNREADABLE = ("CREDENTIALS_PARSE_FAILED", "CREDENTIALS_VERSION_CHANGED")
TOKEN_MESSAGES = {
    "TOKEN_EXPIRED": "The token has expired.",
    "TOKEN_REVOKED": "The token has been revoked.",
    "TOKEN_INVALID": "The token is not valid on this platform.",
    "TOKEN_MISSING": "No token was sent.",
}

ShowCode = Callable[[DeviceCode], None]
"""Shows the user the device code and where to approve it, before the wait."""


@dataclass(frozen=True)
class Login:
    credentials: Credentials
    token_store: str  # where the token was saved: "keyring" or "file"


def login(
    platform_url: str,
    token: str | None = None,
    *,
    store: CredentialStore,
    show_code: ShowCode | None = None,
    warn: Warn | None = None,
) -> Login:
    """Verify ``token``, or (without one) run the device login showing its code through
    ``show_code``; save the login in ``store`` and revoke the one it replaces."""
    previous = _previous_login(store, warn)
    client = PlatformClient(platform_url, token, warn=warn)
    try:
        credentials = _verify_token(client, token) if token else _device_login(client, show_code)
        try:
            token_store = store.save(credentials)
        except BaseException:
            if token is None and credentials.token_id:  # do not strand a fresh device token
                PlatformClient(platform_url, credentials.access_token, warn=warn).revoke(
                    credentials.token_id
                )
            raise
    except PlatformClientError as exc:
        raise _login_error(exc) from exc
    finally:
        client.close()
    if previous is not None and not previous.is_expired():
        _revoke_previous(platform_url, previous, credentials, warn)
    return Login(credentials, token_store)


def _previous_login(store: CredentialStore, warn: Warn | None) -> Credentials | None:
    """The saved login this one replaces; unreadable logins are replaced, not revoked."""
    try:
        return store.load()
    except PlatformClientError as exc:
        if exc.code == "KEYRING_UNAVAILABLE":
            if warn is not None:
                warn(
                    "TOKEN_REVOKE_FAILED",
                    "The previous login could not be read from the OS keyring, so it will not "
                    "be revoked.",
                )
        elif exc.code not in UNREADABLE:
            raise
        return None


def _verify_token(client: PlatformClient, token: str) -> Credentials:
    verified = client.verify()
    return Credentials(
        access_token=token,
        user=verified.user,
        expires_at=parse_timestamp(verified.expires_at, default=default_expiry()),
        created_at=datetime.now(UTC),
        token_id=verified.token_id,
    )


def _device_login(client: PlatformClient, show_code: ShowCode | None) -> Credentials:
    code = client.device_authorize()
    if show_code is not None:
        show_code(code)
    grant = client.device_poll(code)
    expires_at = parse_timestamp(grant.expires_at, default=default_expiry())
    if expires_at <= datetime.now(UTC):
        raise PlatformClientError(
            "AUTH_REQUIRED",
            "The platform issued a token that has already expired; check the system clock.",
        )
    return Credentials(
        access_token=grant.token,
        user=grant.user,
        expires_at=expires_at,
        created_at=datetime.now(UTC),
        token_id=grant.token_id,
    )


def _revoke_previous(
    platform_url: str, previous: Credentials, current: Credentials, warn: Warn | None
) -> None:
    if previous.access_token == current.access_token or (
        previous.token_id is not None and previous.token_id == current.token_id
    ):
        return
    failure = revoke_token(platform_url, previous, warn=warn)
    if failure is not None and warn is not None:
        warn(
            "TOKEN_REVOKE_FAILED",
            f"The new login is active, but the previous one could not be revoked: {failure}.",
        )


def _login_error(exc: PlatformClientError) -> LoginError:
    code, message = exc.code, exc.message
    if code == "AUTH_REQUIRED" and exc.status_code == 401:
        reason = TOKEN_MESSAGES.get(exc.platform_code or "", "The platform refused the token.")
        message = f"{reason} Create a new token, or log in without --token."
    elif code == "NOT_FOUND":  # no login endpoint: the URL is not an Osmosis platform
        code = "PLATFORM_ERROR"
        message = (
            f"{message} (the platform has no login endpoint there: check OSMOSIS_PLATFORM_URL)"
        )
    return LoginError(code, message, status_code=exc.status_code, details=dict(exc.details))


# --- the login in effect -------------------------------------------------------------------


def env_credentials(token: str) -> Credentials:
    """An ``OSMOSIS_TOKEN``: its owner is unknown until the platform verifies it."""
    return Credentials(
        access_token=token,
        user=User(id="", email="", name=None),
        expires_at=datetime.max.replace(tzinfo=UTC),
        created_at=datetime.now(UTC),
        source="environment",
    )


def current_login(target: Target, store: CredentialStore) -> Credentials:
    """The token to call ``target`` with: ``OSMOSIS_TOKEN``, else the saved, unexpired login
    in ``store``; ``AUTH_REQUIRED`` when there is neither."""
    if target.env_token is not None:
        return env_credentials(target.env_token)
    credentials = store.load()
    if credentials is None:
        raise PlatformClientError(
            "AUTH_REQUIRED", NOT_LOGGED_IN, details={"platform_url": target.platform_url}
        )
    if credentials.is_expired():
        raise PlatformClientError(
            "AUTH_REQUIRED",
            SESSION_EXPIRED,
            details={"platform_url": target.platform_url, "expires_at": credentials.expires_at},
        )
    return credentials


# --- out ------------------------------------------------------------------------------------


def saved_login_store(store: CredentialStore) -> str | None:
    """Where the platform's login is saved (``"unknown"`` when it cannot be read), or None."""
    try:
        return store.stored_in()
    except PlatformClientError as exc:
        if exc.code not in UNREADABLE:
            raise
        return "unknown"


def logout(platform_url: str, *, store: CredentialStore, warn: Warn | None = None) -> bool:
    """Revoke the saved login's token (best effort) and forget the login; whether the
    platform revoked it."""
    credentials = _saved_login(store, warn)
    revoked = False
    if credentials is not None and not credentials.is_expired():
        failure = revoke_token(platform_url, credentials, warn=warn)
        if failure is not None and warn is not None:
            warn(
                "TOKEN_REVOKE_FAILED", f"The token could not be revoked on the platform: {failure}"
            )
        revoked = failure is None
    store.delete()
    return revoked


def _saved_login(store: CredentialStore, warn: Warn | None) -> Credentials | None:
    try:
        return store.load()
    except PlatformClientError as exc:
        if exc.code == "KEYRING_UNAVAILABLE" or exc.code in UNREADABLE:
            if warn is not None:
                warn(
                    "TOKEN_REVOKE_FAILED",
                    f"The saved token could not be read ({exc.message}), so it was not revoked.",
                )
            return None
        raise


def revoke_token(
    platform_url: str, credentials: Credentials, *, warn: Warn | None = None
) -> str | None:
    """Revoke the token of ``credentials`` on the platform, asking the platform for its id
    when the login did not save one. None once it is revoked or already unknown there;
    otherwise why it could not be revoked."""
    with PlatformClient(platform_url, credentials.access_token, warn=warn) as client:
        token_id = credentials.token_id
        if token_id is None:
            try:
                token_id = client.verify().token_id
            except PlatformClientError as exc:
                if exc.code == "AUTH_REQUIRED":
                    return None  # the platform no longer knows the token: nothing to revoke
                return exc.message
            if not token_id:
                return "the platform did not say which token it is"
        return client.revoke(token_id)
