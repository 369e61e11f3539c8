"""The client's errors: each names the CLI error code it is reported with (reference §3.3).

    PlatformClientError (OsmosisError)  a platform call, or a step around one, failed
    ├── NotAWorkspaceError    WORKSPACE_REQUIRED (or VALIDATION): no workspace directory here
    ├── LocalFileError        a local file to send is missing, unreadable or invalid
    ├── LocalRunBusyError     CONFLICT: a local run is locked, or changed while it was sent
    ├── AlreadyExistsError    CONFLICT: the name is taken, or files are where a download goes
    ├── NotReadyError         VALIDATION: the resource cannot be fetched in its state
    ├── SubmitRefusedError    VALIDATION: the run's config cannot run on the platform as it is
    ├── LoginError            the login failed (its message speaks of the token being tried)
    ├── UnsafeAnswerError     PLATFORM_ERROR: the platform named a path outside the target
    └── NotCompletedError     PLATFORM_ERROR: the bytes went up, the platform was not told

``code`` is the CLI's error code; ``details`` carry ``platform_code``, ``field``, the
body's own details and ``status_code`` when the platform answered at all.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable

from osmosis_ai.errors import OsmosisError
from osmosis_ai.rundir.logs import REDACTED, Redactor


class PlatformClientError(OsmosisError):
    """A platform call failed; ``code`` is the CLI error code it reports (§3.3).

    ``details`` carry ``platform_code``, ``field``, the body's own details and
    ``status_code`` when the platform answered at all.
    """

    def __init__(
        self,
        code: str,
        message: str,
        *,
        status_code: int | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.status_code = status_code
        self.details: dict[str, object] = details if details is not None else {}

    @property
    def platform_code(self) -> str | None:
        code = self.details.get("platform_code")
        return code if isinstance(code, str) else None


def redact(value: object, redactor: Redactor) -> object:
    """``value`` with the redactor's secrets replaced, and every ``value``/``secret`` key's
    value."""
    if isinstance(value, str):
        return redactor.redact(value)
    if isinstance(value, dict):
        return {
            redact(k, redactor): REDACTED
            if str(k).lower() in ("value", "secret", "secret_value")
            else redact(v, redactor)
            for k, v in value.items()
        }
    if isinstance(value, list):
        return [redact(item, redactor) for item in value]
    return value


def redacted(exc: PlatformClientError, values: Iterable[str]) -> PlatformClientError:
    """A copy of ``exc`` with every value (longest first) replaced by ``[REDACTED]``: a
    platform error that repeats a secret value the CLI sent is shown without it."""
    redactor = Redactor(values)
    clean = copy.copy(exc)
    message = redact(exc.message, redactor)
    clean.message = message if isinstance(message, str) else exc.message
    clean.args = (clean.message,)
    details = redact(exc.details, redactor)
    clean.details = details if isinstance(details, dict) else {}
    return clean


class LoginError(PlatformClientError):
    """The login failed; its message speaks of the token being tried, not of a saved session."""


class _CodedError(PlatformClientError):
    """A subclass whose CLI code is fixed by its kind (``default_code``) unless given."""

    default_code = "PLATFORM_ERROR"

    def __init__(
        self,
        message: str,
        details: dict[str, object] | None = None,
        *,
        code: str | None = None,
        status_code: int | None = None,
    ) -> None:
        super().__init__(
            code or self.default_code, message, status_code=status_code, details=details
        )


class NotAWorkspaceError(_CodedError):
    """No workspace directory here: not a Git clone, no ``origin``, or (``VALIDATION``) its
    scaffold directories are missing."""

    default_code = "WORKSPACE_REQUIRED"


class LocalFileError(_CodedError):
    """A local file the command sends is missing (``NOT_FOUND``), unreadable or invalid."""

    default_code = "VALIDATION"


class LocalRunBusyError(_CodedError):
    """A local run is held by another process, or one of its files changed while it was sent."""

    default_code = "CONFLICT"


class AlreadyExistsError(_CodedError):
    """The name is taken on the platform, or files are already where a download goes."""

    default_code = "CONFLICT"


class NotReadyError(_CodedError):
    """The resource cannot be fetched in its present state (e.g. a dataset still processing)."""

    default_code = "VALIDATION"


class SubmitRefusedError(_CodedError):
    """The run's config cannot run on the platform as it is (a local model folder, a pinned
    commit the repository does not have)."""

    default_code = "VALIDATION"


class UnsafeAnswerError(_CodedError):
    """The platform named a file or path that would land outside the download's target."""

    default_code = "PLATFORM_ERROR"


class NotCompletedError(_CodedError):
    """An upload's bytes are stored, but the platform could not be told so."""

    default_code = "PLATFORM_ERROR"
