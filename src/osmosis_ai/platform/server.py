"""``serve(settings)``: run the platform on uvicorn until interrupted.

The database is opened and migrated before the port is bound, so a refused database (a newer
schema, a bad URL) stops the start with its own error; the public URL is recorded in the
data dir for admin commands run later. Requests are parsed by h11 with a bound on the
request line and headers together (:data:`~osmosis_ai.platform.api.limits.MAX_HEADER_BYTES`;
past it the connection is answered 400 and closed), and the access log shows no query
string of a signed object URL (its signature is a credential).
"""

from __future__ import annotations

import contextlib
import logging
import re
from typing import TYPE_CHECKING

from osmosis_ai.errors import MissingExtraError
from osmosis_ai.platform.settings import PlatformSettings

if TYPE_CHECKING:
    from starlette.types import ASGIApp
    from uvicorn import Config

ACCESS_LOGGER = "uvicorn.access"
# A query that carries a signature: everything after the path is dropped from the log.
_SIGNED_QUERY = re.compile(r"\?[^\s\"]*\bsignature=[^\s\"]*")


def redact_signed(text: str) -> str:
    """``text`` with the query string of every signed URL in it replaced by ``?…``."""
    return _SIGNED_QUERY.sub("?[redacted]", text)


class SignedQueryFilter(logging.Filter):
    """Rewrites access-log records so a signed URL's query (its signature) is never written."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple):
            record.args = tuple(
                redact_signed(arg) if isinstance(arg, str) else arg for arg in record.args
            )
        elif isinstance(record.msg, str):
            record.msg = redact_signed(record.msg)
        return True


def serve(settings: PlatformSettings, *, log_level: str = "info") -> None:
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("platform", "The platform server", exc.name) from exc
    from osmosis_ai.platform.api.app import create_platform_app

    app = create_platform_app(settings)
    settings.save()
    settings.secure()  # the data dir 0700, the database and settings files 0600
    config = server_config(app, settings, log_level=log_level)
    # Which isolation runs get (also in /api/health), once at start.
    logging.getLogger("uvicorn.error").info("Isolation: %s", settings.isolation)
    # The server re-raises the SIGINT it shut down on; a Ctrl-C is a clean stop.
    with contextlib.suppress(KeyboardInterrupt):
        uvicorn.Server(config).run()


def server_config(app: ASGIApp, settings: PlatformSettings, *, log_level: str = "info") -> Config:
    """How uvicorn serves the platform ``app``: h11 with a bound on the request head, no
    proxy headers or server header, and an access log that shows no signature."""
    import uvicorn

    from osmosis_ai.platform.api.limits import MAX_HEADER_BYTES

    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=10,
        http="h11",
        h11_max_incomplete_event_size=MAX_HEADER_BYTES,
    )
    access = logging.getLogger(ACCESS_LOGGER)  # configured by uvicorn.Config above
    if not any(isinstance(f, SignedQueryFilter) for f in access.filters):
        access.addFilter(SignedQueryFilter())
    return config
