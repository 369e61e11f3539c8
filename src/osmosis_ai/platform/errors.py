"""The platform's errors: each carries the HTTP status and the envelope fields it answers with.

Service functions raise these; the API turns every one into the error envelope
``{error, message, code?, field?, details?}`` of reference §6, and the CLI maps the status
to its error code (§3.3: 400 VALIDATION, 401 AUTH_REQUIRED, 404 NOT_FOUND, 409 CONFLICT,
426 UPGRADE_REQUIRED). Importing this module costs nothing: no server or database code.

    PlatformError (OsmosisError)
    ├── InvalidRequestError    400  the request is malformed or names a bad value
    ├── AuthenticationError    401  no token, or an unknown, expired, revoked or foreign one
    ├── PermissionDeniedError  403  authenticated, but the role does not allow it
    ├── NotFoundError          404  no such resource, or not visible to this token
    ├── ConflictError          409  the resource exists already
    ├── UpgradeRequiredError   426  the CLI is older than the oldest one supported
    └── DatabaseError          500  the database cannot be used (e.g. its schema is newer)

A subclass names its status and code in its class line
(``class NotFoundError(PlatformError, status=404, code="NOT_FOUND")``) or as the class
attributes ``status_code`` and ``default_code``.
"""

from __future__ import annotations

from osmosis_ai.errors import OsmosisError


class PlatformError(OsmosisError):
    """A failure the platform reports to its caller with an HTTP status and a stable code."""

    status_code = 400
    default_code = "PLATFORM_ERROR"

    def __init_subclass__(
        cls, *, status: int | None = None, code: str | None = None, **kwargs: object
    ) -> None:
        super().__init_subclass__(**kwargs)
        if status is not None:
            cls.status_code = status
        if code is not None:
            cls.default_code = code

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        field: str | None = None,
        details: dict[str, object] | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.code = code or self.default_code
        self.field = field
        self.details: dict[str, object] = details if details is not None else {}

    def envelope(self) -> dict[str, object]:
        """The JSON body of this error; ``error`` repeats the message (old clients read it)."""
        body: dict[str, object] = {"error": self.message, "message": self.message}
        body["code"] = self.code
        if self.field is not None:
            body["field"] = self.field
        if self.details:
            body["details"] = self.details
        return body


class InvalidRequestError(PlatformError, status=400, code="VALIDATION"):
    """The request is malformed or names a bad value."""


class AuthenticationError(PlatformError, status=401, code="TOKEN_INVALID"):
    """No token, or an unknown, expired, revoked or foreign one."""


class PermissionDeniedError(PlatformError, status=403, code="FORBIDDEN"):
    """Authenticated, but the role does not allow it."""


class NotFoundError(PlatformError, status=404, code="NOT_FOUND"):
    """No such resource, or not visible to this token."""


class ConflictError(PlatformError, status=409, code="CONFLICT"):
    """The resource exists already, or is in a state that forbids the change."""


class UpgradeRequiredError(PlatformError, status=426, code="UPGRADE_REQUIRED"):
    """The CLI is older than the oldest one supported."""


class DatabaseError(PlatformError, status=500, code="DATABASE_ERROR"):
    """The database cannot be used (e.g. its schema is newer than this code)."""


class SchemaTooNewError(DatabaseError):
    """The database was migrated by a newer osmosis-ai than this one."""

    default_code = "SCHEMA_TOO_NEW"

    def __init__(self, database_revision: str, code_revision: str | None) -> None:
        self.database_revision = database_revision
        self.code_revision = code_revision
        super().__init__(
            f"The platform database is at schema revision {database_revision!r}, which this "
            f"osmosis-ai does not know (its newest is {code_revision!r}): the database was "
            'migrated by a newer release. Upgrade with pip install -U "osmosis-ai[platform]" '
            "and start again.",
            details={"database_revision": database_revision, "code_revision": code_revision},
        )
