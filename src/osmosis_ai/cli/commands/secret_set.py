"""``osmosis secret set NAME [--scope personal|workspace] [--env VAR]``: create or update.

The value comes from a hidden prompt or the named environment variable, never from the
command line; it is sent once and never printed, stored, or echoed in an error.
"""

from __future__ import annotations

import argparse
import os

from osmosis_ai.cli import records
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import open_session
from osmosis_ai.cli.secret_values import check_secret_name, prompt_hidden, redacted
from osmosis_ai.platform.client import PlatformClientError

SCOPES = records.SECRET_SCOPES


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("name", metavar="NAME", help="secret name, e.g. OPENAI_API_KEY")
    parser.add_argument(
        "--scope", choices=tuple(SCOPES), default="personal", help="default: personal"
    )
    parser.add_argument("--env", metavar="VAR", help="read the value from this env variable")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    check_secret_name(args.name)
    if args.env is None and not ctx.interactive:
        raise CLIError(
            CLIErrorCode.INTERACTIVE_REQUIRED,
            "A secret value is needed: run in a terminal to type it at a hidden prompt, or pass "
            "--env VARNAME to read it from an environment variable.",
            {"flags": ["--env"]},
        )
    with open_session(ctx) as session:
        value = _value(args.env)
        try:
            record = session.client.call(
                "POST",
                "/api/cli/environment-secrets",
                json={"name": args.name, "value": value, "scope": SCOPES[args.scope]},
            )
        except PlatformClientError as exc:
            raise redacted(exc, [value]) from None
        finally:
            del value
        resource = {**records.secret(record), **session.result_context()}
        url = record.get("platform_url")
        return OperationResult(
            operation="secret.set",
            status="success",
            resource=resource,
            message=f'Secret "{args.name}" saved in {args.scope} scope.',
            next_steps=[f"View secrets: {url}"] if url else [],
            next_steps_structured=[{"action": "view_secrets", "url": url}] if url else [],
            extra={"platform_url": url} if url else {},
        )


def _value(env: str | None) -> str:
    if env is not None:
        if not env.strip():
            raise CLIError(CLIErrorCode.VALIDATION, "--env needs an environment variable name.")
        value = os.environ.get(env)
        if value is None:
            raise CLIError(CLIErrorCode.VALIDATION, f"Environment variable {env} is not set.")
        if value == "":
            raise CLIError(CLIErrorCode.VALIDATION, f"Environment variable {env} is empty.")
        return value
    value = prompt_hidden("Secret value (input hidden): ")
    if not value:
        raise CLIError(CLIErrorCode.VALIDATION, "The secret value must not be empty.")
    return value
