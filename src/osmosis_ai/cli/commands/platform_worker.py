"""``osmosis platform worker``: execute submitted eval and training runs on this machine."""

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

MAX_SLOTS = 64


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{parser.description} A worker needs the platform's database and its data dir (the "
        "object store, Git mirrors and keys): run it on the platform's machine, or where the "
        "data dir is shared, with the same --data-dir and --database-url as the server. "
        "'osmosis platform serve' starts one by itself (--workers). Stop it with Ctrl-C or "
        "SIGTERM: its runs are handed back for another worker to resume."
    )
    add_store_options(parser)
    add_isolation_options(parser)
    parser.add_argument(
        "--slots",
        type=int,
        default=1,
        metavar="N",
        help="how many runs it executes at once (default 1)",
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform.worker.runner import Worker, configure_logging

    if not 1 <= args.slots <= MAX_SLOTS:
        raise CLIUsageError(
            f"--slots {args.slots} is out of range: give 1 to {MAX_SLOTS} runs at once.",
            prog="osmosis platform worker",
        )
    settings = settings_from(args)
    configure_logging()
    with platform_errors():
        Worker(settings, slots=args.slots).run()
    return OperationResult(
        operation="platform.worker",
        status="success",
        resource={
            "data_dir": str(settings.data_dir),
            "slots": args.slots,
            "isolation": settings.isolation,
        },
        message="The worker stopped; its runs were handed back.",
    )
