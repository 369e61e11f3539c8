"""The platform's keys and the encryption of secret values at rest.

Two keys live in the data dir, each made on first start with mode 0600 and never logged:

* ``signing.key`` signs the expiring object URLs (:mod:`osmosis_ai.platform.objects`);
* ``secrets.key`` encrypts environment-secret values (AES-256-GCM). It can instead come
  from ``OSMOSIS_PLATFORM_SECRET_KEY`` (32 bytes, urlsafe base64, as printed by
  :func:`new_key_text`), so the database alone never holds enough to read a value.

A stored value is ``v1.<nonce>.<ciphertext>`` (urlsafe base64), bound (as associated data)
to what the caller names: the platform binds a secret to its workspace, scope, owner and
name, so a ciphertext copied onto another secret does not decrypt.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import os
import secrets
import stat
from pathlib import Path

from osmosis_ai.errors import ConfigError, MissingExtraError

KEY_BYTES = 32
SECRET_KEY_ENV = "OSMOSIS_PLATFORM_SECRET_KEY"
_VERSION = "v1"
_NONCE_BYTES = 12


def new_key_text() -> str:
    """A fresh key in the text form :data:`SECRET_KEY_ENV` accepts."""
    return base64.urlsafe_b64encode(secrets.token_bytes(KEY_BYTES)).decode("ascii")


def load_or_create_key(path: Path) -> bytes:
    """The key stored at ``path``; made there (mode 0600, atomically) when absent.

    Two processes starting at once agree on one key: the file appears whole via a hard
    link that fails if another process linked first, and the loser reads the winner's key.
    """
    path = Path(path)
    try:
        return _read_key(path)
    except FileNotFoundError:
        pass
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{secrets.token_hex(8)}")
    fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(secrets.token_bytes(KEY_BYTES))
            handle.flush()
            os.fsync(handle.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temp, path)
    finally:
        temp.unlink(missing_ok=True)
    return _read_key(path)


def _read_key(path: Path) -> bytes:
    with path.open("rb") as handle:
        mode = os.fstat(handle.fileno()).st_mode
        key = handle.read(KEY_BYTES + 1)
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"the key file {path} holds {len(key)} bytes, not {KEY_BYTES}: it is damaged; "
            "restore it from a backup (values it protected cannot be read without it)"
        )
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        raise ConfigError(
            f"the key file {path} can be read by other users (mode {stat.S_IMODE(mode):o}): "
            f"run chmod 600 {path}"
        )
    return key


def secret_key(data_dir: Path, environ: dict[str, str] | None = None) -> bytes:
    """The key for secret values: from :data:`SECRET_KEY_ENV`, else ``<data_dir>/secrets.key``."""
    env = os.environ if environ is None else environ
    text = env.get(SECRET_KEY_ENV, "").strip()
    if not text:
        return load_or_create_key(Path(data_dir) / "secrets.key")
    try:
        key = base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        key = b""
    if len(key) != KEY_BYTES:
        raise ConfigError(
            f"{SECRET_KEY_ENV} must be {KEY_BYTES} bytes in urlsafe base64 (44 characters); "
            'make one with: python -c "from osmosis_ai.platform.crypto import new_key_text; '
            'print(new_key_text())"'
        )
    return key


class SecretBox:
    """Encrypts and decrypts secret values with one key (AES-256-GCM)."""

    def __init__(self, key: bytes) -> None:
        if len(key) != KEY_BYTES:
            raise ConfigError(f"a secret key must be {KEY_BYTES} bytes, got {len(key)}")
        try:
            from cryptography.hazmat.primitives.ciphers.aead import AESGCM
        except ModuleNotFoundError as exc:
            raise MissingExtraError("platform", "Encrypting secrets", exc.name) from exc
        self._aead = AESGCM(key)

    def encrypt(self, value: str, *, bound_to: str) -> str:
        """The stored form of ``value``; it decrypts only with the same ``bound_to``."""
        nonce = secrets.token_bytes(_NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, value.encode("utf-8"), bound_to.encode("utf-8"))
        return ".".join((_VERSION, _b64(nonce), _b64(sealed)))

    def decrypt(self, stored: str, *, bound_to: str) -> str:
        """The value of a stored secret; :class:`ConfigError` if it cannot be read."""
        from cryptography.exceptions import InvalidTag

        version, _, rest = stored.partition(".")
        nonce_text, _, sealed_text = rest.partition(".")
        if version != _VERSION or not nonce_text or not sealed_text:
            raise ConfigError("a stored secret is not in the v1 format; it cannot be read")
        try:
            nonce, sealed = _unb64(nonce_text), _unb64(sealed_text)
            plain = self._aead.decrypt(nonce, sealed, bound_to.encode("utf-8"))
        except (InvalidTag, binascii.Error, ValueError):
            raise ConfigError(
                "a stored secret does not decrypt with this platform's key: the key changed "
                f"({SECRET_KEY_ENV} or secrets.key in the data dir) or the row was altered; "
                "set the secret again"
            ) from None
        return plain.decode("utf-8")


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).decode("ascii").rstrip("=")


def _unb64(text: str) -> bytes:
    return base64.urlsafe_b64decode(text + "=" * (-len(text) % 4))
