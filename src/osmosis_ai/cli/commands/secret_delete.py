"""``osmosis secret delete NAME [--scope personal|workspace] [-y]``: delete in one scope."""

from __future__ import annotations

import argparse

from osmosis_ai.cli import records
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import Session, open_session
from osmosis_ai.cli.secret_values import check_secret_name
from osmosis_ai.platform.client import PlatformClientError

SCOPES = records.SECRET_SCOPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="secret name")
    parser.add_argument(
        "--scope", choices=tuple(SCOPES), default="personal", help="default: personal"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    check_secret_name(args.name)
    name, scope = args.name, args.scope
    with open_session(ctx) as session:
        existing = _names(session, SCOPES[scope])
        if existing is not None and name not in existing:  # say so before asking
            other = "workspace" if scope == "personal" else "personal"
            hint = ""
            if name in (_names(session, SCOPES[other]) or set()):
                hint = f" It exists in {other} scope: osmosis secret delete {name} --scope {other}"
            raise CLIError(
                CLIErrorCode.NOT_FOUND,
                f'Secret "{name}" not found in {scope} scope.{hint}',
                {"name": name, "scope": scope},
            )
        confirm(
            f'Delete the {scope} secret "{name}"? This cannot be undone.',
            yes=args.yes,
            summary={"Name": name, "Scope": scope},
        )
        session.client.call(
            "DELETE",
            "/api/cli/environment-secrets",
            json={"name": name, "scope": SCOPES[scope]},
        )
        return OperationResult(
            operation="secret.delete",
            status="success",
            resource={"name": name, "scope": scope, **session.result_context()},
            message=f'Secret "{name}" deleted from {scope} scope.',
        )


def _names(session: Session, wire_scope: str) -> set[str] | None:
    """Names stored in a scope; ``None`` when the lookup fails (the platform then decides)."""
    try:
        page = session.client.fetch(
            "/api/cli/environment-secrets",
            "environment_secrets",
            fetch_all=True,
            params={"scope": wire_scope},
        )
    except PlatformClientError as exc:
        if exc.code == "AUTH_REQUIRED":
            raise
        return None
    return {str(item.get("name")) for item in page.items}
