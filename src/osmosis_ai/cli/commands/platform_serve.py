"""``osmosis platform serve``: run a self-hosted platform (API, device login page) here, with
``--workers`` worker processes beside it that execute submitted runs."""

from __future__ import annotations

import argparse

from osmosis_ai.cli.errors import CLIUsageError
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import (
    add_isolation_options,
    add_store_options,
    platform_errors,
    settings_from,
)

LOOPBACK = ("127.0.0.1", "localhost", "::1")
MAX_WORKERS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    add_store_options(parser)
    add_isolation_options(parser)
    parser.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    parser.add_argument("--port", type=int, default=None, help="port to bind (default 8480)")
    parser.add_argument(
        "--public-url",
        metavar="URL",
        help="the address clients use and tokens are scoped to (default http://HOST:PORT)",
    )
    parser.add_argument(
        "--log-level",
        default="info",
        choices=("critical", "error", "warning", "info", "debug"),
        help="server log level (default info)",
    )
    parser.add_argument(
        "--max-body-bytes",
        type=int,
        default=None,
        metavar="N",
        help="the largest request body the API and dashboard read, refused with 413 before "
        "anything else (default 1048576, or $OSMOSIS_PLATFORM_MAX_BODY_BYTES; files go "
        "through upload URLs, capped at their declared size)",
    )
    parser.add_argument(
        "--workspace-quota-bytes",
        type=int,
        default=None,
        metavar="N",
        help="what one workspace may keep (datasets and imported eval runs, by declared "
        "size); an upload past it is refused before it starts (default 100 GiB, or "
        "$OSMOSIS_PLATFORM_WORKSPACE_QUOTA_BYTES)",
    )
    parser.add_argument(
        "--workers",
        type=int,
        default=1,
        metavar="N",
        help="worker processes to start beside the server, stopped with it (default 1; 0 for "
        "none, when 'osmosis platform worker' runs elsewhere on the same database and data dir)",
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform.server import serve
    from osmosis_ai.platform.worker.runner import WorkerProcesses

    if not 0 <= args.workers <= MAX_WORKERS:
        raise CLIUsageError(
            f"--workers {args.workers} is out of range: give 0 to {MAX_WORKERS}.",
            prog="osmosis platform serve",
        )

    settings = settings_from(
        args,
        host=args.host,
        port=args.port,
        public_url=args.public_url,
        use_saved_public_url=False,
        max_body_bytes=args.max_body_bytes,
        workspace_quota_bytes=args.workspace_quota_bytes,
    )
    if settings.host not in LOOPBACK:
        ctx.warn(
            "PLATFORM_EXPOSED",
            f"Serving on {settings.host} over plain HTTP: tokens cross the network in clear "
            "text. Put a TLS proxy in front and pass its address as --public-url.",
        )
    if settings.single_tenant:
        ctx.warn(
            "PLATFORM_SINGLE_TENANT",
            "Isolation: single-tenant (none): workspace code runs with the workers' user and "
            "environment, and can read the keys and the database. Only for trusted workspaces.",
        )
    with platform_errors():
        if args.workers:  # a refused database stops the start before any worker is started
            from osmosis_ai.platform.store.database import open_database
            from osmosis_ai.platform.worker.runner import Worker

            open_database(settings).dispose()
            if not settings.single_tenant:
                Worker(settings).check_isolation()  # refused here, naming the fix
        with WorkerProcesses(settings, args.workers):
            serve(settings, log_level=args.log_level)
    return OperationResult(
        operation="platform.serve",
        status="success",
        resource={
            "public_url": settings.public_url,
            "data_dir": str(settings.data_dir),
            "workers": args.workers,
            "isolation": settings.isolation,
        },
        message=f"The platform at {settings.public_url} stopped.",
    )
