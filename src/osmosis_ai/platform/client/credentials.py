"""Which platform the CLI talks to, and with which token (reference §3.1).

The platform is ``OSMOSIS_PLATFORM_URL`` (default ``https://platform.osmosis.ai``). A token
comes from ``OSMOSIS_TOKEN`` first (bound to a platform by ``OSMOSIS_TOKEN_PLATFORM_URL``,
required for any platform but the default), else from the saved login for that platform.
Saved logins live in ``~/.config/osmosis/credentials.json`` (format version 2, keyed by
platform URL, owner-only) with the token itself in the OS keyring (service ``osmosis-cli``)
when one works, else in the file. ``OSMOSIS_TOKEN_STORE=keyring|file`` pins the store.
The ``keyring`` package is optional and imported only when a login is read or written.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal, Protocol

from osmosis_ai.platform.client.api import (
    DEFAULT_PLATFORM_URL,
    User,
    is_insecure_url,
    normalize_platform_url,
    parse_timestamp,
)
from osmosis_ai.platform.client.errors import PlatformClientError
from osmosis_ai.rundir.durable import atomic_write_bytes

CREDENTIALS_VERSION = 2
KEYRING_SERVICE = "osmosis-cli"
KEYRING_LEGACY_ACCOUNT = "default"
KEYRING_PREFIX = "platform:"
STORE_ENV = "OSMOSIS_TOKEN_STORE"

Store = Literal["keyring", "file"]
Source = Literal["environment", "keyring", "file"]
Warn = Callable[[str, str], None]


class KeyringBackend(Protocol):
    """The part of the ``keyring`` package's API the store uses."""

    def get_password(self, service_name: str, username: str) -> str | None: ...

    def set_password(self, service_name: str, username: str, password: str) -> None: ...

    def delete_password(self, service_name: str, username: str) -> None: ...


def _error(code: str, message: str, **details: object) -> PlatformClientError:
    return PlatformClientError(code, message, details=dict(details))


# --- where: the platform URL and the environment token --------------------------------------


@dataclass(frozen=True)
class Target:
    """The platform of this invocation and the environment token meant for it, if any."""

    platform_url: str
    env_token: str | None
    insecure: bool  # plaintext to a non-loopback host, and allowed


def resolve_target(
    environ: Mapping[str, str] | None = None, *, check_env_token: bool = True
) -> Target:
    """Read the platform and token variables; refuse what §3.1 refuses.

    Raises ``PlatformClientError`` with ``VALIDATION`` (insecure URL not allowed),
    ``ENV_TOKEN_PLATFORM_MISMATCH`` or ``ENV_TOKEN_PLATFORM_REQUIRED``; the token checks
    are skipped (and no token returned) with ``check_env_token=False``.
    """
    env = os.environ if environ is None else environ
    platform_url = normalize_platform_url(env.get("OSMOSIS_PLATFORM_URL") or None)
    insecure = is_insecure_url(platform_url)
    if insecure and env.get("OSMOSIS_ALLOW_INSECURE_PLATFORM_URL") != "1":
        raise _error(
            "VALIDATION",
            f"Refusing the non-HTTPS platform URL {platform_url}: tokens would travel in "
            "plaintext. Use https://, a loopback address, or set "
            "OSMOSIS_ALLOW_INSECURE_PLATFORM_URL=1 to override.",
            platform_url=platform_url,
        )
    token = (env.get("OSMOSIS_TOKEN") or None) if check_env_token else None
    if token is not None:
        bound = env.get("OSMOSIS_TOKEN_PLATFORM_URL") or None
        if bound is not None:
            bound_url = normalize_platform_url(bound)
            if bound_url != platform_url:
                raise _error(
                    "ENV_TOKEN_PLATFORM_MISMATCH",
                    f"OSMOSIS_TOKEN is bound to {bound_url}, but the platform is "
                    f"{platform_url}: refusing to send the token to another platform. Fix "
                    "OSMOSIS_TOKEN_PLATFORM_URL or OSMOSIS_PLATFORM_URL.",
                    platform_url=platform_url,
                    token_platform_url=bound_url,
                )
        elif platform_url != normalize_platform_url(DEFAULT_PLATFORM_URL):
            raise _error(
                "ENV_TOKEN_PLATFORM_REQUIRED",
                f"OSMOSIS_TOKEN must be bound to this platform: set "
                f"OSMOSIS_TOKEN_PLATFORM_URL={platform_url}.",
                platform_url=platform_url,
            )
    return Target(platform_url, token, insecure)


# --- what: a saved login --------------------------------------------------------------------


@dataclass
class Credentials:
    """A token and who it belongs to; ``source`` says where it was read from."""

    access_token: str
    user: User
    expires_at: datetime
    created_at: datetime
    token_id: str | None = None
    token_type: str = "Bearer"
    source: Source | None = None

    def is_expired(self, now: datetime | None = None) -> bool:
        return (now or datetime.now(UTC)) >= self.expires_at

    def entry(self, platform_url: str) -> dict[str, Any]:
        """The metadata entry of this login, without the token."""
        entry: dict[str, Any] = {
            "version": CREDENTIALS_VERSION,
            "token_type": self.token_type,
            "expires_at": self.expires_at.isoformat(),
            "created_at": self.created_at.isoformat(),
            "user": self.user.model_dump(),
            "platform_url": platform_url,
        }
        if self.token_id:
            entry["token_id"] = self.token_id
        return entry


def credentials_path() -> Path:
    return Path.home() / ".config" / "osmosis" / "credentials.json"


def keyring_prefix(platform_url: str) -> str:
    """The keyring account prefix of a platform: ``platform:<sha256(url)[:24]>``."""
    digest = hashlib.sha256(normalize_platform_url(platform_url).encode()).hexdigest()[:24]
    return f"{KEYRING_PREFIX}{digest}"


def load_keyring() -> KeyringBackend | None:
    """The OS keyring, or ``None`` when the package is missing or only a fail/null backend."""
    try:
        import keyring  # pyright: ignore[reportMissingImports]
    except ImportError:
        return None
    try:
        backend: Any = keyring.get_keyring()  # pyright: ignore[reportUnknownMemberType]
    except Exception:  # a broken keyring configuration is an unavailable keyring
        return None
    module = type(backend).__module__
    if module.startswith(("keyring.backends.fail", "keyring.backends.null")):
        return None
    if getattr(backend, "priority", 1) <= 0:
        return None
    return backend


class CredentialStore:
    """Saved logins of one platform: read, save, delete (see the module docstring).

    ``keyring`` is the backend to use (``"auto"``: the OS keyring when one works);
    ``warn(code, message)`` receives the non-fatal problems.
    """

    def __init__(
        self,
        platform_url: str,
        *,
        path: Path | None = None,
        keyring: KeyringBackend | Literal["auto"] | None = "auto",
        warn: Warn | None = None,
        environ: Mapping[str, str] | None = None,
    ) -> None:
        self.platform_url = normalize_platform_url(platform_url)
        self.path = path or credentials_path()
        self._keyring_choice = keyring
        self._keyring_loaded = False
        self._keyring: KeyringBackend | None = None
        self.warn: Warn = warn or (lambda code, message: None)
        env = os.environ if environ is None else environ
        preference = (env.get(STORE_ENV) or "auto").strip().lower()
        if preference not in ("auto", "keyring", "file"):
            raise _error(
                "VALIDATION",
                f"Invalid {STORE_ENV}={preference!r}: use auto, keyring or file.",
                token_store=preference,
            )
        self.preference = preference

    @property
    def keyring(self) -> KeyringBackend | None:
        if not self._keyring_loaded:
            choice = self._keyring_choice
            self._keyring = load_keyring() if isinstance(choice, str) else choice
            self._keyring_loaded = True
        return self._keyring

    # --- metadata file --------------------------------------------------------------------

    def read(self) -> dict[str, Any] | None:
        """The metadata file, or ``None`` when absent; raises on a file it cannot use."""
        try:
            text = self.path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _error(
                "CREDENTIALS_UNAVAILABLE",
                f"Cannot read {self.path}: {exc.strerror or exc}. Check its permissions.",
                path=str(self.path),
            ) from exc
        try:
            data = json.loads(text)
        except ValueError:
            data = None
        if isinstance(data, dict) and data.get("version") != CREDENTIALS_VERSION:
            raise _error(
                "CREDENTIALS_VERSION_CHANGED",
                f"The saved logins in {self.path} use format version {data.get('version')!r}, "
                f"this CLI reads version {CREDENTIALS_VERSION}; they were left unchanged.",
                path=str(self.path),
                version=data.get("version"),
            )
        if not isinstance(data, dict) or not _valid_registry(data):
            raise _error(
                "CREDENTIALS_PARSE_FAILED",
                f"The saved logins in {self.path} are not valid; they were left unchanged. "
                "Repair or move the file, then log in again.",
                path=str(self.path),
            )
        return data

    def _read_or_recover(self) -> dict[str, Any] | None:
        """For writes: an unusable file is moved aside (with a warning) instead of failing."""
        try:
            return self.read()
        except PlatformClientError as exc:
            if exc.code not in ("CREDENTIALS_PARSE_FAILED", "CREDENTIALS_VERSION_CHANGED"):
                raise
        backup = self.path.with_name(f"{self.path.name}.bak")
        n = 0
        while backup.exists():
            n += 1
            backup = self.path.with_name(f"{self.path.name}.bak.{n}")
        self.path.replace(backup)
        self.warn(
            "CREDENTIALS_METADATA_BACKED_UP",
            f"The unreadable saved logins were moved to {backup}.",
        )
        return None

    def _entry(self, data: dict[str, Any] | None) -> tuple[str | None, dict[str, Any] | None]:
        """The key and entry of this platform (a v2 file without ``platforms`` is the default)."""
        if data is None:
            return None, None
        platforms = data.get("platforms")
        if not isinstance(platforms, dict):
            default = normalize_platform_url(DEFAULT_PLATFORM_URL)
            return (default, data) if self.platform_url == default else (None, None)
        for key, entry in platforms.items():
            try:
                url = normalize_platform_url(entry.get("platform_url") or key)
            except PlatformClientError:
                continue  # an entry for a URL this CLI cannot read is never this platform's
            if url == self.platform_url:
                return key, entry
        return None, None

    def _write(self, data: dict[str, Any]) -> None:
        directory = self.path.parent
        directory.mkdir(parents=True, exist_ok=True, mode=0o700)
        with contextlib.suppress(OSError):
            if directory.stat().st_mode & 0o077:
                directory.chmod(0o700)
        atomic_write_bytes(self.path, json.dumps(data, indent=2).encode("utf-8"))

    # --- the keyring ----------------------------------------------------------------------

    def _accounts(self, entry: dict[str, Any] | None) -> list[str]:
        """Keyring accounts that may hold this platform's token, most specific first."""
        prefix = keyring_prefix(self.platform_url)
        default = self.platform_url == normalize_platform_url(DEFAULT_PLATFORM_URL)
        accounts: list[str] = []
        if entry is not None:
            account = entry.get("keyring_account")
            if isinstance(account, str) and (
                account == prefix
                or account.startswith(f"{prefix}:")
                or (default and account == KEYRING_LEGACY_ACCOUNT)
            ):
                accounts.append(account)
        accounts.append(prefix)
        if default:
            accounts.append(KEYRING_LEGACY_ACCOUNT)
        return list(dict.fromkeys(accounts))

    def _keyring_get(self, account: str) -> str | None:
        backend = self.keyring
        if backend is None:
            raise _error(
                "KEYRING_UNAVAILABLE",
                "The saved login's token is in the OS keyring, and no keyring is available "
                "here. Unlock or install one, set OSMOSIS_TOKEN, or log in again.",
            )
        try:
            return backend.get_password(KEYRING_SERVICE, account)
        except Exception as exc:  # keyring backends raise their own error types
            raise _error(
                "KEYRING_UNAVAILABLE",
                f"Could not read the token from the OS keyring ({type(exc).__name__}). Unlock "
                "or repair the keyring, then try again.",
            ) from exc

    def _keyring_delete(self, account: str) -> bool:
        backend = self.keyring
        if backend is None:
            return False
        try:
            backend.delete_password(KEYRING_SERVICE, account)
        except Exception as exc:
            # A missing entry is already clean; the package names that PasswordDeleteError.
            return type(exc).__name__ == "PasswordDeleteError"
        return True

    # --- logins ---------------------------------------------------------------------------

    def load(self) -> Credentials | None:
        """The saved login of this platform, or ``None`` (warns when its token is lost)."""
        _, entry = self._entry(self.read())
        if entry is None:
            return None
        store = entry.get("token_store", "file")
        if store == "keyring":
            token = next(
                (t for a in self._accounts(entry) if (t := self._keyring_get(a)) is not None),
                None,
            )
        else:
            token = entry.get("access_token")
        if not isinstance(token, str) or not token:
            self.warn(
                "TOKEN_NOT_FOUND",
                f"The saved login for {self.platform_url} has lost its token. Run "
                "'osmosis auth login' again.",
            )
            return None
        try:
            user = User.model_validate(entry["user"])
            expires_at = parse_timestamp(entry["expires_at"])
            created_at = parse_timestamp(entry.get("created_at"), default=datetime.now(UTC))
        except (KeyError, ValueError, TypeError) as exc:
            raise _error(
                "CREDENTIALS_PARSE_FAILED",
                f"The saved login for {self.platform_url} in {self.path} is not valid; it "
                "was left unchanged. Log in again to replace it.",
                path=str(self.path),
            ) from exc
        token_id = entry.get("token_id")
        return Credentials(
            access_token=token,
            user=user,
            expires_at=expires_at,
            created_at=created_at,
            token_id=token_id if isinstance(token_id, str) else None,
            token_type=str(entry.get("token_type") or "Bearer"),
            source="keyring" if store == "keyring" else "file",
        )

    def stored_in(self) -> Store | None:
        """Where this platform's saved login keeps its token, without reading the token."""
        _, entry = self._entry(self.read())
        if entry is None:
            return None
        return "keyring" if entry.get("token_store") == "keyring" else "file"

    def save(self, credentials: Credentials) -> Store:
        """Save a login for this platform, replacing the previous one; returns the store used.

        The token goes into the keyring before the metadata changes, so a failed save
        leaves the previous login usable.
        """
        data = self._read_or_recover()
        old_key, old_entry = self._entry(data)
        entry = credentials.entry(self.platform_url)
        stored: Store = "file"
        account = self._account_for(credentials)
        if self.preference != "file":
            stored = self._try_keyring(account, credentials.access_token)
        if stored == "keyring":
            entry["token_store"] = "keyring"
            entry["keyring_account"] = account
        else:
            entry["token_store"] = "file"
            entry["access_token"] = credentials.access_token
        registry = _as_registry(data)
        if old_key is not None:
            registry["platforms"].pop(old_key, None)
        registry["platforms"][self.platform_url] = entry
        try:
            self._write(registry)
        except OSError as exc:
            if stored == "keyring":
                self._keyring_delete(account)
            raise _error(
                "CREDENTIALS_UNAVAILABLE",
                f"Cannot write {self.path}: {exc.strerror or exc}.",
                path=str(self.path),
            ) from exc
        for old_account in self._accounts(old_entry):
            if old_account != account or stored == "file":
                self._keyring_delete(old_account)
        return stored

    def _account_for(self, credentials: Credentials) -> str:
        suffix = (
            hashlib.sha256(credentials.token_id.encode()).hexdigest()[:24]
            if credentials.token_id
            else uuid.uuid4().hex[:24]
        )
        return f"{keyring_prefix(self.platform_url)}:{suffix}"

    def _try_keyring(self, account: str, token: str) -> Store:
        backend = self.keyring
        failure = "no OS keyring is available"
        if backend is not None:
            try:
                backend.set_password(KEYRING_SERVICE, account, token)
            except Exception as exc:
                failure = f"the OS keyring refused it ({type(exc).__name__})"
            else:
                return "keyring"
        if self.preference == "keyring":
            raise _error(
                "KEYRING_UNAVAILABLE",
                f"Cannot save the token: {failure}, and {STORE_ENV}=keyring requires it. "
                f"Set {STORE_ENV}=file to keep it in {self.path} (owner-only), or use "
                "OSMOSIS_TOKEN.",
            )
        self.warn(
            "KEYRING_UNAVAILABLE",
            f"The token was saved in {self.path} with owner-only permissions: {failure}.",
        )
        return "file"

    def delete(self) -> bool:
        """Forget this platform's saved login; ``True`` when there was one."""
        data = self._read_or_recover()
        key, entry = self._entry(data)
        if entry is not None and entry.get("token_store") == "keyring":
            cleaned = all(self._keyring_delete(a) for a in self._accounts(entry))
            if not cleaned:
                self.warn(
                    "KEYRING_CLEANUP_FAILED",
                    "The saved login was removed, but its token could not be removed from the "
                    "OS keyring.",
                )
        if data is None or key is None:
            return False
        registry = _as_registry(data)
        registry["platforms"].pop(key, None)
        if registry["platforms"]:
            self._write(registry)
        else:
            self.path.unlink(missing_ok=True)
        return True


def _as_registry(data: dict[str, Any] | None) -> dict[str, Any]:
    """The multi-platform form of the metadata (a single-platform file is the default's)."""
    if data is None:
        return {"version": CREDENTIALS_VERSION, "platforms": {}}
    if isinstance(data.get("platforms"), dict):
        return {**data, "platforms": dict(data["platforms"])}
    entry = {k: v for k, v in data.items() if k not in ("platforms", "active_platform_url")}
    default = normalize_platform_url(DEFAULT_PLATFORM_URL)
    entry["platform_url"] = default
    if entry.get("token_store") == "keyring":
        entry.setdefault("keyring_account", KEYRING_LEGACY_ACCOUNT)
    return {"version": CREDENTIALS_VERSION, "platforms": {default: entry}}


def _valid_registry(data: dict[str, Any]) -> bool:
    platforms = data.get("platforms", {"": data})
    if not isinstance(platforms, dict):
        return False
    for entry in platforms.values():
        if not isinstance(entry, dict):
            return False
        if entry.get("token_store", "file") not in ("file", "keyring"):
            return False
        url = entry.get("platform_url")
        if url is not None and not isinstance(url, str):
            return False
    return True
