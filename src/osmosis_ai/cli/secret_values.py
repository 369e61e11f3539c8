"""Secret values at the CLI's edge: names checked, values prompted hidden, never echoed.

A platform error that repeats a value the CLI sent is redacted before anyone sees it.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.platform.client import PlatformClientError
from osmosis_ai.workspace.config import SECRET_NAME

REDACTED = "[REDACTED]"


def check_secret_name(name: str) -> None:
    if not 1 <= len(name) <= 255 or not SECRET_NAME.match(name):
        raise CLIError(
            CLIErrorCode.VALIDATION,
            f"Invalid secret name {name!r}: use uppercase letters, digits and '_', starting "
            "with a letter (e.g. OPENAI_API_KEY), at most 255 characters.",
            {"name": name},
        )


def prompt_hidden(prompt: str) -> str:
    """Read a value without echo; Ctrl-D (no input) reads as empty."""
    import getpass

    try:
        return getpass.getpass(prompt)
    except EOFError:
        return ""


def redact(value: object, secrets: list[str]) -> object:
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {
            redact(k, secrets): REDACTED
            if str(k).lower() in ("value", "secret", "secret_value")
            else redact(v, secrets)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(item, secrets) for item in value]
    return value


def redacted(exc: PlatformClientError, values: Iterable[str]) -> PlatformClientError:
    """A copy of ``exc`` with every value (longest first) replaced by ``[REDACTED]``."""
    secrets = sorted({v for v in values if v}, key=len, reverse=True)
    clean = copy.copy(exc)
    message = redact(exc.message, secrets)
    clean.message = message if isinstance(message, str) else exc.message
    clean.args = (clean.message,)
    details = redact(exc.details, secrets)
    clean.details = details if isinstance(details, dict) else {}
    return clean
