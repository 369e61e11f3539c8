"""Secret values at the CLI's edge: names checked, values prompted hidden, never echoed.

A platform error that repeats a value the CLI sent is redacted before anyone sees it.
"""

from __future__ import annotations

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.platform.client.errors import redacted
from osmosis_ai.workspace.config import SECRET_NAME

__all__ = ["check_secret_name", "prompt_hidden", "redacted"]


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
