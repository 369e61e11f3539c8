"""``osmosis platform token create --email EMAIL``: a new API token, shown once.

The token is scoped to the platform's public URL (recorded by ``osmosis platform serve``,
or ``--platform-url``); with ``--json`` it is the envelope's ``token``.
"""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import add_store_options, platform_errors, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--email", required=True, help="whose token it is")
    parser.add_argument(
        "--expires-days", type=int, default=90, metavar="N", help="lifetime in days (default 90)"
    )
    parser.add_argument(
        "--platform-url",
        metavar="URL",
        help="the platform address the token is for (default: the one the server last ran at)",
    )
    add_store_options(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform import admin

    with platform_errors():
        created = admin.create_token(
            settings_from(args),
            args.email,
            expires_days=args.expires_days,
            platform_url=args.platform_url,
        )
    token = str(created.pop("token"))
    return OperationResult(
        operation="platform.token.create",
        status="success",
        resource=created,
        message=(
            f"Token {created['id']} for {created['email']} on {created['platform_url']} "
            f"(expires {created['expires_at']:%Y-%m-%d}). Copy it now; it is not shown again:"
        ),
        next_steps=[token],
        extra={"token": token},
    )
