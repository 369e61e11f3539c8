"""``osmosis auth login [--token TOKEN]``: log in to the platform and save the login.

Without ``--token``: the device-code flow (rich output only) shows a URL and a code to
approve in a browser, then polls until approved. With ``--token``: a personal access
token verified through ``/api/cli/verify``. The new login replaces the saved one for
this platform; the old token is revoked afterwards.
"""

from __future__ import annotations

import argparse

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import credential_store, platform_target
from osmosis_ai.platform.client import DeviceCode
from osmosis_ai.platform.client.login import login


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--token", help="a personal access token to verify and save")


def run(args: argparse.Namespace, ctx: Context) -> Result:
    target = platform_target(ctx)
    token: str | None = args.token
    if token is None:
        if target.env_token is not None:
            raise CLIError(
                CLIErrorCode.CONFLICT,
                "OSMOSIS_TOKEN is already set for this process: scripts and CI need no login. "
                "Unset it to log in interactively.",
            )
        if ctx.format != "rich":
            raise CLIError(
                CLIErrorCode.INTERACTIVE_REQUIRED,
                "Logging in with a browser needs rich output. Pass --token to save a personal "
                "access token, or set OSMOSIS_TOKEN for scripts and CI.",
                {"flags": ["--token"]},
            )
    done = login(
        target.platform_url,
        token,
        store=credential_store(ctx, target),
        show_code=lambda code: _show_code(ctx, code),
        warn=ctx.warn,
    )
    credentials, user = done.credentials, done.credentials.user
    return OperationResult(
        operation="auth.login",
        status="success",
        resource={
            "email": user.email,
            "name": user.name,
            "expires_at": credentials.expires_at.isoformat(),
            "platform_url": target.platform_url,
            "workspace": None,
            "source": "token" if token else "device",
            "verified": True,
            "saved": True,
            "token_store": done.token_store,
        },
        message=f"Logged in to {target.platform_url} as {user.email}.",
        next_steps=[_next_step()],
        next_steps_structured=[{"action": "doctor"}],
    )


def _next_step() -> str:
    """In a workspace clone: check it; elsewhere: say to clone one first."""
    from osmosis_ai.cli.platform_session import find_workspace_directory

    directory = find_workspace_directory()
    if directory is not None:
        return f"Check the workspace {directory.identity} here with `osmosis doctor`."
    return (
        "Clone the repository your platform workspace is connected to, then run "
        "`osmosis doctor` in it."
    )


def _show_code(ctx: Context, code: DeviceCode) -> None:
    """The device login's code and URL on stderr; the browser opened on a human's TTY."""
    import sys

    from osmosis_ai.cli import console

    url = code.verification_uri_complete or code.verification_uri
    console.print_stderr(f"Your one-time code: {code.user_code}", style="bold cyan")
    console.print_stderr(f"Open this URL in a browser and approve the login: {url}")
    console.print_stderr(
        f"The code expires in {max(1, code.expires_in // 60)} minutes. Waiting...", style="dim"
    )
    if ctx.interactive and sys.stdin.isatty():
        import contextlib
        import webbrowser

        with contextlib.suppress(Exception):
            webbrowser.open(url)
