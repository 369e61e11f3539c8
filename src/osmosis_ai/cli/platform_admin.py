"""What the ``osmosis platform`` commands share: where the platform keeps its state, and how
a platform error becomes the CLI's error code.

Standard library at import; the platform's modules load when a command runs.
"""

from __future__ import annotations

import argparse
from collections.abc import Generator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from osmosis_ai.cli.errors import CLIError, CLIErrorCode

if TYPE_CHECKING:
    from osmosis_ai.platform.settings import PlatformSettings


def add_store_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--data-dir",
        metavar="DIR",
        help="the platform's data dir (default: $OSMOSIS_PLATFORM_DATA_DIR or ~/.osmosis/platform)",
    )
    parser.add_argument(
        "--database-url",
        metavar="URL",
        help="PostgreSQL instead of the data dir's SQLite file, e.g. "
        "postgresql+psycopg://USER:PASSWORD@HOST/DB (default: $OSMOSIS_PLATFORM_DATABASE_URL)",
    )


def add_isolation_options(parser: argparse.ArgumentParser) -> None:
    """``--single-tenant`` and ``--keys-dir``: for the commands that run or serve runs."""
    parser.add_argument(
        "--single-tenant",
        action="store_true",
        default=None,
        help="run workspace code uncontained, with the worker's user and environment: only "
        "when every workspace on this platform is trusted (default: contained in bubblewrap, "
        "refusing to start where that is not possible; or $OSMOSIS_PLATFORM_SINGLE_TENANT=1)",
    )
    parser.add_argument(
        "--keys-dir",
        metavar="DIR",
        help="where secrets.key, signing.key, session.key and serving.key live, outside the "
        "data dir (default: the data dir, or $OSMOSIS_PLATFORM_KEYS_DIR)",
    )


def settings_from(args: argparse.Namespace, **overrides: object) -> PlatformSettings:
    from osmosis_ai.platform.settings import load_settings

    if getattr(args, "single_tenant", None):
        overrides.setdefault("single_tenant", True)
    if getattr(args, "keys_dir", None):
        overrides.setdefault("keys_dir", args.keys_dir)
    return load_settings(
        data_dir=args.data_dir,
        database_url=args.database_url,
        **overrides,  # pyright: ignore[reportArgumentType]
    )


@contextmanager
def platform_errors() -> Generator[None]:
    """Report a platform error with the CLI code of its HTTP status (reference §3.3)."""
    from osmosis_ai.platform.errors import PlatformError

    try:
        yield
    except PlatformError as exc:
        from osmosis_ai.platform.client import error_code_for

        details: dict[str, object] = {"platform_code": exc.code, **exc.details}
        if exc.field is not None:
            details["field"] = exc.field
        code = CLIErrorCode(error_code_for(exc.status_code, exc.code, exc.message))
        raise CLIError(code, exc.message, details) from exc
