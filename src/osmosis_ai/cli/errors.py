"""The CLI's errors: ``CLIError`` with a stable code, and how library exceptions map to one.

``CLIError`` ends a command with exit 1 and an error envelope; ``CLIUsageError`` is a
malformed command line (exit 2); ``PromptDeclinedError`` is a declined prompt (exit 0). All
three derive from ``OsmosisError``.
"""

from __future__ import annotations

from enum import StrEnum

from osmosis_ai.errors import OsmosisError


class CLIErrorCode(StrEnum):
    """The ``error.code`` vocabulary of the JSON error envelope."""

    VALIDATION = "VALIDATION"
    AUTH_REQUIRED = "AUTH_REQUIRED"
    NOT_FOUND = "NOT_FOUND"
    CONFLICT = "CONFLICT"
    UPGRADE_REQUIRED = "UPGRADE_REQUIRED"
    RATE_LIMITED = "RATE_LIMITED"
    PLATFORM_ERROR = "PLATFORM_ERROR"
    INTERNAL = "INTERNAL"
    INTERACTIVE_REQUIRED = "INTERACTIVE_REQUIRED"
    WORKSPACE_REQUIRED = "WORKSPACE_REQUIRED"
    NETWORK = "NETWORK"
    SUBSCRIPTION_REQUIRED = "SUBSCRIPTION_REQUIRED"
    BILLING_REQUIRED = "BILLING_REQUIRED"
    KEYRING_UNAVAILABLE = "KEYRING_UNAVAILABLE"
    CREDENTIALS_UNAVAILABLE = "CREDENTIALS_UNAVAILABLE"
    CREDENTIALS_PARSE_FAILED = "CREDENTIALS_PARSE_FAILED"
    CREDENTIALS_VERSION_CHANGED = "CREDENTIALS_VERSION_CHANGED"
    ENV_TOKEN_PLATFORM_REQUIRED = "ENV_TOKEN_PLATFORM_REQUIRED"
    ENV_TOKEN_PLATFORM_MISMATCH = "ENV_TOKEN_PLATFORM_MISMATCH"
    TOKEN_NOT_FOUND = "TOKEN_NOT_FOUND"
    KEYRING_CLEANUP_FAILED = "KEYRING_CLEANUP_FAILED"
    TOKEN_REVOKE_FAILED = "TOKEN_REVOKE_FAILED"


class CLIError(OsmosisError):
    """A handled failure of a command: exit 1, ``Error: <message>`` or a JSON envelope."""

    def __init__(
        self,
        code: CLIErrorCode | str,
        message: str,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = CLIErrorCode(code)
        self.message = message
        self.details: dict[str, object] = details if details is not None else {}


class CLIUsageError(OsmosisError):
    """The command line itself is wrong (unknown command, bad option): exit 2."""

    def __init__(self, message: str, *, prog: str = "osmosis", usage: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.prog = prog  # the command whose --help to suggest
        self.usage = usage


class PromptDeclinedError(OsmosisError):
    """The user declined a confirmation prompt: "Cancelled.", exit 0."""


def to_cli_error(exc: BaseException) -> CLIError:
    """The ``CLIError`` that reports ``exc``: library errors by kind, anything else INTERNAL."""
    if isinstance(exc, CLIError):
        return exc
    if isinstance(exc, OsmosisError):
        return _from_library_error(exc)
    if isinstance(exc, FileNotFoundError):
        path = exc.filename
        message = f"File not found: {path}" if path else str(exc)
        return CLIError(CLIErrorCode.NOT_FOUND, message, {"path": str(path)} if path else None)
    return CLIError(
        CLIErrorCode.INTERNAL,
        f"An unexpected internal error occurred ({type(exc).__name__}). "
        "Set OSMOSIS_DEBUG=1 to see the traceback.",
        {"exception_type": type(exc).__name__},
    )


def _from_library_error(exc: OsmosisError) -> CLIError:
    # Imported here: osmosis_ai.workspace is heavy, and only needed once something failed.
    from osmosis_ai.errors import ConfigError, DeadlineError, MissingExtraError, UsageError
    from osmosis_ai.workspace import ConfigValidationError, WorkspaceNotFoundError

    client_error = _platform_client_error(exc)
    if client_error is not None:
        return client_error
    if isinstance(exc, ConfigValidationError):
        return CLIError(CLIErrorCode.VALIDATION, str(exc), exc.details())
    if isinstance(exc, WorkspaceNotFoundError):
        return CLIError(CLIErrorCode.WORKSPACE_REQUIRED, str(exc), {"start": str(exc.start)})
    if isinstance(exc, MissingExtraError):
        install = f'pip install "osmosis-ai[{exc.extra}]"'
        return CLIError(CLIErrorCode.VALIDATION, str(exc), {"extra": exc.extra, "install": install})
    if isinstance(exc, UsageError | ConfigError):
        return CLIError(CLIErrorCode.VALIDATION, str(exc))
    if isinstance(exc, DeadlineError):  # a stall: which stage, its deadline, what changes it
        details: dict[str, object] = {
            "exception_type": type(exc).__name__,
            "stage": exc.stage,
            "deadline_s": exc.deadline_s,
            "setting": exc.setting,
        }
        return CLIError(CLIErrorCode.INTERNAL, str(exc), details)
    # A deliberate message from a failure outside the user's input (e.g. a protocol error).
    return CLIError(CLIErrorCode.INTERNAL, str(exc), {"exception_type": type(exc).__name__})


def _platform_client_error(exc: OsmosisError) -> CLIError | None:
    """A platform client failure already names its CLI code (reference §3.3)."""
    import sys

    # Only a platform command can raise one, and it has imported the client already.
    if "osmosis_ai.platform.client" not in sys.modules:
        return None
    from osmosis_ai.platform.client import PlatformClientError

    if not isinstance(exc, PlatformClientError):
        return None
    code = exc.code if exc.code in CLIErrorCode.__members__ else CLIErrorCode.PLATFORM_ERROR
    return CLIError(code, exc.message, dict(exc.details))
