"""The client's errors: each names the CLI error code it is reported with (reference §3.3).

    PlatformClientError (OsmosisError)  a platform call, or a step around one, failed
    ├── LocalFileError        a local file to send is missing, unreadable or invalid
    ├── AlreadyExistsError    CONFLICT: the name is taken, or files are where a download goes
    ├── NotReadyError         VALIDATION: the resource cannot be fetched in its state
    ├── UnsafeAnswerError     PLATFORM_ERROR: the platform named a path outside the target
    └── NotCompletedError     PLATFORM_ERROR: the bytes went up, the platform was not told

``code`` is the CLI's error code; ``details`` carry ``platform_code``, ``field``, the
body's own details and ``status_code`` when the platform answered at all.
"""

from __future__ import annotations

from osmosis_ai.errors import OsmosisError


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


class LocalFileError(_CodedError):
    """A local file the command sends is missing (``NOT_FOUND``), unreadable or invalid."""

    default_code = "VALIDATION"


class AlreadyExistsError(_CodedError):
    """The name is taken on the platform, or files are already where a download goes."""

    default_code = "CONFLICT"


class NotReadyError(_CodedError):
    """The resource cannot be fetched in its present state (e.g. a dataset still processing)."""

    default_code = "VALIDATION"


class UnsafeAnswerError(_CodedError):
    """The platform named a file or path that would land outside the download's target."""

    default_code = "PLATFORM_ERROR"


class NotCompletedError(_CodedError):
    """An upload's bytes are stored, but the platform could not be told so."""

    default_code = "PLATFORM_ERROR"
