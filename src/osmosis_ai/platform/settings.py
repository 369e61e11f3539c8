"""Where a self-hosted platform keeps its state, and the address it is reached at.

One data dir (default ``~/.osmosis/platform``, kept 0700) holds the SQLite database, the
object store, the Git mirrors, the keys (:mod:`osmosis_ai.platform.crypto`; ``keys_dir``
keeps them elsewhere) and ``settings.json`` (the public URL the server last ran at, so admin
commands scope tokens to it).
PostgreSQL replaces the SQLite file when a database URL is given. Standard library only.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from osmosis_ai.errors import ConfigError

DEFAULT_DATA_DIR = Path("~/.osmosis/platform")
DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8480
DATA_DIR_ENV = "OSMOSIS_PLATFORM_DATA_DIR"
DATABASE_URL_ENV = "OSMOSIS_PLATFORM_DATABASE_URL"
GIT_REFRESH_ENV = "OSMOSIS_PLATFORM_GIT_REFRESH_S"
MAX_BODY_ENV = "OSMOSIS_PLATFORM_MAX_BODY_BYTES"
QUOTA_ENV = "OSMOSIS_PLATFORM_WORKSPACE_QUOTA_BYTES"
SINGLE_TENANT_ENV = "OSMOSIS_PLATFORM_SINGLE_TENANT"
KEYS_DIR_ENV = "OSMOSIS_PLATFORM_KEYS_DIR"
SANDBOX_UID_ENV = "OSMOSIS_PLATFORM_SANDBOX_UID"
DEFAULT_SANDBOX_UID = 65534  # nobody: the uid workspace code runs as, for a root worker
KEY_FILES = ("secrets.key", "signing.key", "session.key", "serving.key")
# The largest request body the API and dashboard read (uploads go through signed URLs).
DEFAULT_MAX_BODY_BYTES = 1024 * 1024
MAX_BODY_RANGE = (1024, 1024**3)
# What one workspace may keep in the object store: its datasets and imported runs.
DEFAULT_WORKSPACE_QUOTA_BYTES = 100 * 1024**3
# How old a workspace's last Git fetch may be before a rollout listing fetches again.
DEFAULT_GIT_REFRESH_S = 5.0
SETTINGS_FILE = "settings.json"
SQLITE_FILE = "platform.db"


@dataclass(frozen=True)
class PlatformSettings:
    """How one platform runs. ``public_url`` is what clients use and tokens are scoped to."""

    data_dir: Path
    database_url: str
    public_url: str
    host: str = DEFAULT_HOST
    port: int = DEFAULT_PORT
    git_refresh_s: float = DEFAULT_GIT_REFRESH_S  # 0: every listing fetches
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    workspace_quota_bytes: int = DEFAULT_WORKSPACE_QUOTA_BYTES
    single_tenant: bool = False  # run workspace code uncontained (every workspace trusted)
    keys_dir: Path | None = None  # where the key files live, when not in the data dir
    sandbox_uid: int = DEFAULT_SANDBOX_UID

    @property
    def key_dir(self) -> Path:
        """The folder of ``secrets.key``, ``signing.key``, ``session.key``, ``serving.key``."""
        return self.keys_dir or self.data_dir

    @property
    def isolation(self) -> str:
        """What contains workspace code here, as ``serve`` prints and ``/api/health`` says."""
        return "single-tenant (none)" if self.single_tenant else "bubblewrap"

    @property
    def objects_dir(self) -> Path:
        return self.data_dir / "objects"

    @property
    def mirrors_dir(self) -> Path:
        return self.data_dir / "git"

    def save(self) -> None:
        """Record the public URL for admin commands run later on the same data dir."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        path = self.data_dir / SETTINGS_FILE
        temp = path.with_suffix(".tmp")
        fd = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps({"public_url": self.public_url}, indent=2) + "\n")
        temp.replace(path)

    def secure(self) -> None:
        """The data dir owner-only (0700), its database and settings files 0600."""
        self.data_dir.mkdir(parents=True, exist_ok=True)
        os.chmod(self.data_dir, 0o700)
        for name in (SQLITE_FILE, f"{SQLITE_FILE}-wal", f"{SQLITE_FILE}-shm", SETTINGS_FILE):
            path = self.data_dir / name
            if path.is_file():
                os.chmod(path, 0o600)


def load_settings(
    *,
    data_dir: str | Path | None = None,
    database_url: str | None = None,
    public_url: str | None = None,
    host: str = DEFAULT_HOST,
    port: int | None = None,
    use_saved_public_url: bool = True,
    git_refresh_s: float | None = None,
    max_body_bytes: int | None = None,
    workspace_quota_bytes: int | None = None,
    single_tenant: bool | None = None,
    keys_dir: str | Path | None = None,
) -> PlatformSettings:
    """Settings from arguments, then the environment, then the data dir's ``settings.json``.

    Without a public URL anywhere, it is ``http://HOST:PORT``. ``single_tenant`` and
    ``keys_dir`` fall back to :data:`SINGLE_TENANT_ENV` (``1``/``true``) and
    :data:`KEYS_DIR_ENV`. The server passes
    ``use_saved_public_url=False``: it is where it runs now, not where it ran last.
    """
    root = Path(data_dir or os.environ.get(DATA_DIR_ENV) or DEFAULT_DATA_DIR).expanduser()
    root = root.resolve()
    url = database_url or os.environ.get(DATABASE_URL_ENV) or f"sqlite:///{root / SQLITE_FILE}"
    url = normalize_database_url(url)
    chosen_port = DEFAULT_PORT if port is None else port
    if not 0 < chosen_port < 65536:
        raise ConfigError(f"Port {chosen_port} is out of range: pick one from 1 to 65535.")
    saved = _saved(root)
    public = public_url or (saved.get("public_url") if use_saved_public_url else None)
    if not public:
        public = f"http://{_url_host(host)}:{chosen_port}"
    return PlatformSettings(
        data_dir=root,
        database_url=url,
        public_url=normalize_url(public),
        host=host,
        port=chosen_port,
        git_refresh_s=_git_refresh(git_refresh_s),
        max_body_bytes=_byte_count(
            max_body_bytes, MAX_BODY_ENV, DEFAULT_MAX_BODY_BYTES, MAX_BODY_RANGE, "--max-body-bytes"
        ),
        workspace_quota_bytes=_byte_count(
            workspace_quota_bytes,
            QUOTA_ENV,
            DEFAULT_WORKSPACE_QUOTA_BYTES,
            (1, 1 << 60),
            "--workspace-quota-bytes",
        ),
        single_tenant=_single_tenant(single_tenant),
        keys_dir=_keys_dir(keys_dir),
        sandbox_uid=_sandbox_uid(),
    )


def _single_tenant(value: bool | None) -> bool:
    if value is not None:
        return value
    text = os.environ.get(SINGLE_TENANT_ENV, "").strip().lower()
    if text in ("", "0", "false", "no"):
        return False
    if text in ("1", "true", "yes"):
        return True
    raise ConfigError(f"{SINGLE_TENANT_ENV}={text!r} is not 1 or 0 (true or false).")


def _keys_dir(value: str | Path | None) -> Path | None:
    text = str(value) if value else os.environ.get(KEYS_DIR_ENV, "").strip()
    return Path(text).expanduser().resolve() if text else None


def _sandbox_uid() -> int:
    text = os.environ.get(SANDBOX_UID_ENV, "").strip()
    if not text:
        return DEFAULT_SANDBOX_UID
    if not text.isdigit() or int(text) == 0:
        raise ConfigError(
            f"{SANDBOX_UID_ENV}={text!r} is not an unprivileged uid: give a number above 0 "
            f"that no service runs as (default {DEFAULT_SANDBOX_UID}, nobody)."
        )
    return int(text)


def _byte_count(
    value: int | None, env: str, default: int, bounds: tuple[int, int], flag: str
) -> int:
    """A byte count from the argument, else ``env``, else ``default``; refused out of bounds."""
    if value is None:
        text = os.environ.get(env, "").strip()
        if not text:
            return default
        try:
            value = int(text)
        except ValueError:
            raise ConfigError(f"{env}={text!r} is not a whole number of bytes.") from None
    low, high = bounds
    if not low <= value <= high:
        raise ConfigError(
            f"{flag} {value} is out of range: give {low} to {high} bytes (default {default})."
        )
    return value


def _git_refresh(value: float | None) -> float:
    if value is None:
        text = os.environ.get(GIT_REFRESH_ENV, "").strip()
        if not text:
            return DEFAULT_GIT_REFRESH_S
        try:
            value = float(text)
        except ValueError:
            raise ConfigError(
                f"{GIT_REFRESH_ENV}={text!r} is not a number of seconds: give e.g. 5, or 0 "
                "to fetch on every rollout listing."
            ) from None
    if not 0 <= value <= 86_400:  # NaN fails too
        raise ConfigError(
            f"A Git refresh window of {value} s is out of range: give 0 to 86400 seconds."
        )
    return float(value)


def normalize_url(url: str) -> str:
    """``scheme://host[:port][/path]`` lower-cased where case does not matter, no trailing /."""
    parts = urlsplit(url.strip())
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(
            f"Not an http(s) URL: {url!r}. Give the full address, e.g. http://127.0.0.1:8480."
        )
    path = parts.path.rstrip("/")
    return urlunsplit((parts.scheme.lower(), parts.netloc.lower(), path, "", ""))


def normalize_database_url(url: str) -> str:
    """SQLAlchemy URL with a driver: ``postgresql://`` becomes ``postgresql+psycopg://``."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url.removeprefix(prefix)
    if url.startswith(("sqlite:", "postgresql+psycopg:")):
        return url
    raise ConfigError(
        f"Unsupported database URL {redact_database_url(url)!r}: use sqlite:///PATH or "
        "postgresql+psycopg://USER:PASSWORD@HOST:PORT/DB."
    )


def redact_database_url(url: str) -> str:
    """The URL with its password replaced by ``***``, for logs and errors."""
    parts = urlsplit(url)
    if parts.password is None:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit((parts.scheme, netloc, parts.path, parts.query, parts.fragment))


def _saved(root: Path) -> dict[str, str]:
    try:
        data: object = json.loads((root / SETTINGS_FILE).read_text())
    except (FileNotFoundError, ValueError):
        return {}
    if not isinstance(data, dict):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, str)}  # pyright: ignore[reportUnknownVariableType]


def _url_host(host: str) -> str:
    if host in ("0.0.0.0", "::", ""):
        return "127.0.0.1"
    return f"[{host}]" if ":" in host else host
