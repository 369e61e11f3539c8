"""``create_platform_app(settings)``: the platform's FastAPI app.

Opening the app opens the database and migrates it (under a lock) before the first request;
the version middleware answers unsupported CLIs with 426 before any route; every error is
the platform's envelope (:mod:`osmosis_ai.platform.api.errors`). Resource routers are listed
in :data:`ROUTERS` (module paths, each with a ``router``).
"""

from __future__ import annotations

import asyncio
import importlib
from collections.abc import AsyncGenerator, Callable
from contextlib import asynccontextmanager
from datetime import datetime

from osmosis_ai.errors import MissingExtraError

try:
    from fastapi import APIRouter, FastAPI
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtraError("platform", "The platform server", exc.name) from exc
try:
    import sqlalchemy  # noqa: F401  # pyright: ignore[reportUnusedImport]
except ModuleNotFoundError as exc:  # pragma: no cover - depends on the installed extras
    raise MissingExtraError("platform", "The platform server", exc.name) from exc

from osmosis_ai.consts import PACKAGE_VERSION
from osmosis_ai.platform.api.datasets import resume_processing
from osmosis_ai.platform.api.deps import Platform
from osmosis_ai.platform.api.errors import install_error_handlers
from osmosis_ai.platform.api.inference import start_serving, stop_serving
from osmosis_ai.platform.api.limits import RequestLimitMiddleware
from osmosis_ai.platform.api.objects import mount_objects
from osmosis_ai.platform.api.sweep import SWEEP_INTERVAL_S, sweep_forever
from osmosis_ai.platform.api.version import VersionSignalMiddleware
from osmosis_ai.platform.settings import PlatformSettings
from osmosis_ai.platform.store.database import Database, open_database
from osmosis_ai.platform.store.orm import utcnow

# One module per resource; each defines ``router``. Order is the order of the OpenAPI doc.
ROUTERS: tuple[str, ...] = (
    "osmosis_ai.platform.api.tokens",
    "osmosis_ai.platform.api.device",
    "osmosis_ai.platform.api.workspaces",
    "osmosis_ai.platform.api.rollouts",
    "osmosis_ai.platform.api.datasets",
    "osmosis_ai.platform.api.secrets",
    "osmosis_ai.platform.api.models",
    "osmosis_ai.platform.api.runs",
    "osmosis_ai.platform.api.eval_results",
    "osmosis_ai.platform.api.training_results",
    "osmosis_ai.platform.api.inference",
    "osmosis_ai.platform.web.device",
    "osmosis_ai.platform.web.render",  # /static: the dashboard's CSS, JS and vendored uPlot
    "osmosis_ai.platform.web.dashboard",  # /, /login, /logout, the runs of a workspace
    "osmosis_ai.platform.web.training",
    "osmosis_ai.platform.web.evaluation",
    "osmosis_ai.platform.web.resources",
)


def create_platform_app(
    settings: PlatformSettings,
    *,
    database: Database | None = None,
    clock: Callable[[], datetime] = utcnow,
    sweep_interval_s: float = SWEEP_INTERVAL_S,
) -> FastAPI:
    """The platform app for ``settings``; opens (and migrates) its database unless given one.

    A database the app opened is closed when the app shuts down. While it runs, abandoned
    uploads, imports and device logins are swept every ``sweep_interval_s`` seconds.
    """
    owned = database is None
    db = open_database(settings) if database is None else database
    platform = Platform(settings=settings, database=db, clock=clock)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncGenerator[None]:
        # Datasets a stopped server left half-processed finish in a thread, not at start-up.
        resumed = asyncio.get_running_loop().run_in_executor(None, resume_processing, platform)
        await start_serving(platform)  # servers of the models still deployed start again
        sweeping = asyncio.create_task(sweep_forever(platform, sweep_interval_s))
        try:
            yield
        finally:
            sweeping.cancel()
            await asyncio.gather(sweeping, return_exceptions=True)
            await stop_serving(platform)
            await resumed
            if owned:
                db.dispose()

    app = FastAPI(
        title="Osmosis platform",
        version=PACKAGE_VERSION,
        lifespan=lifespan,
        docs_url="/api/docs",
        redoc_url=None,
        openapi_url="/api/openapi.json",
    )
    app.state.platform = platform
    install_error_handlers(app)
    app.add_middleware(VersionSignalMiddleware)
    # Outermost: an oversized body is refused before the version check, auth or parsing.
    app.add_middleware(RequestLimitMiddleware, max_body_bytes=settings.max_body_bytes)

    @app.get("/api/health", include_in_schema=False)
    def health() -> dict[str, str]:  # pyright: ignore[reportUnusedFunction]
        return {"status": "ok", "version": PACKAGE_VERSION, "isolation": settings.isolation}

    for module in ROUTERS:
        router = importlib.import_module(module).router
        assert isinstance(router, APIRouter)
        app.include_router(router)
    mount_objects(app, platform)  # the signed upload/download URLs, at /objects
    return app
