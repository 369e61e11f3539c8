"""``serve(settings)``: run the platform on uvicorn until interrupted.

The database is opened and migrated before the port is bound, so a refused database (a newer
schema, a bad URL) stops the start with its own error; the public URL is recorded in the
data dir for admin commands run later.
"""

from __future__ import annotations

from osmosis_ai.errors import MissingExtraError
from osmosis_ai.platform.settings import PlatformSettings


def serve(settings: PlatformSettings, *, log_level: str = "info") -> None:
    try:
        import uvicorn
    except ModuleNotFoundError as exc:
        raise MissingExtraError("platform", "The platform server", exc.name) from exc
    from osmosis_ai.platform.api.app import create_platform_app

    app = create_platform_app(settings)
    settings.save()
    uvicorn.run(
        app,
        host=settings.host,
        port=settings.port,
        log_level=log_level,
        proxy_headers=False,
        server_header=False,
        timeout_graceful_shutdown=10,
    )
