"""The client's errors: each names the CLI error code it is reported with (reference §3.3).

    PlatformClientError (OsmosisError)   a platform call or a client-side step failed
    ├── ...

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
