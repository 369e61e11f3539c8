"""``osmosis platform token revoke ID``: a revoked token stops working.

A running server refuses it within a second (it keeps a token it authenticated for at most
``ACCESS_CACHE_TTL_S``, :mod:`osmosis_ai.platform.api.access`); a token revoked through the
API (``osmosis auth logout``) is refused by the next request.
"""

from __future__ import annotations

import argparse

from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_admin import add_store_options, platform_errors, settings_from


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("token_id", metavar="ID", help="the token's id (not the token itself)")
    add_store_options(parser)


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.platform import admin

    with platform_errors():
        revoked = admin.revoke_token(settings_from(args), args.token_id)
    return OperationResult(
        operation="platform.token.revoke",
        status="success",
        resource=revoked,
        message=f"Token {revoked['id']} is revoked.",
    )
