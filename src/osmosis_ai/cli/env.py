"""Loading a ``.env`` file into the environment before a command runs.

The file is ``--env-file``, else ``$OSMOSIS_ENV_FILE``, else the nearest ``.env`` from the
working directory upward. Variables already set (non-empty) in the process win.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")


def find_env_file(start: Path) -> Path | None:
    """The nearest ``.env`` file at or above ``start``."""
    for directory in (start, *start.parents):
        candidate = directory / ".env"
        if candidate.is_file():
            return candidate
    return None


def parse_dotenv(text: str) -> dict[str, str]:
    """``KEY=VALUE`` lines; ``export`` prefixes, ``#`` comments and one pair of quotes allowed.

    Lines that are not assignments are skipped, as other dotenv readers do.
    """
    values: dict[str, str] = {}
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("export "):
            line = line[len("export ") :].lstrip()
        key, sep, value = line.partition("=")
        key = key.strip()
        if not sep or not _KEY.match(key):
            continue
        values[key] = _parse_value(value.strip())
    return values


def read_secrets_file(path: str | None) -> dict[str, str]:
    """The values of a ``--secrets-file`` (a dotenv file; ``-`` reads stdin); ``{}`` for none."""
    if path is None:
        return {}
    from osmosis_ai.cli.errors import CLIError, CLIErrorCode

    try:
        text = sys.stdin.read() if path == "-" else Path(path).read_text(encoding="utf-8-sig")
    except FileNotFoundError as exc:
        message = f"Secrets file not found: {path}"
        raise CLIError(CLIErrorCode.NOT_FOUND, message, {"path": path}) from exc
    except (OSError, UnicodeDecodeError) as exc:
        message = f"Cannot read the secrets file {path}: {exc}"
        raise CLIError(CLIErrorCode.VALIDATION, message, {"path": path}) from exc
    return parse_dotenv(text)


def _parse_value(value: str) -> str:
    if value[:1] in ("'", '"'):
        quote = value[0]
        end = value.find(quote, 1)
        if end != -1:  # anything after the closing quote is a comment
            inner = value[1:end]
            return inner.replace("\\n", "\n") if quote == '"' else inner
    comment = re.search(r"\s#", value)
    return value[: comment.start()].rstrip() if comment else value


def load_env(explicit: str | None, *, cwd: Path | None = None) -> Path | None:
    """Load the env file into ``os.environ`` without overriding non-empty values.

    Returns the file loaded, if any. An explicit file that does not exist raises
    ``FileNotFoundError``.
    """
    chosen = explicit or os.environ.get("OSMOSIS_ENV_FILE") or None
    if chosen is not None:
        path = Path(chosen).expanduser()
        if not path.is_file():
            raise FileNotFoundError(2, "env file not found", str(path))
    else:
        found = find_env_file(cwd if cwd is not None else Path.cwd())
        if found is None:
            return None
        path = found
    for key, value in parse_dotenv(path.read_text(encoding="utf-8-sig")).items():
        if not os.environ.get(key):
            os.environ[key] = value
    return path
