"""``osmosis auth login [--token TOKEN]``: log in to the platform and save the login.

Without ``--token``: the device-code flow (rich output only) shows a URL and a code to
approve in a browser, then polls until approved. With ``--token``: a personal access
token verified through ``/api/cli/verify``. The new login replaces the saved one for
this platform; the old token is revoked afterwards.
"""

from __future__ import annotations

import argparse
from datetime import UTC, datetime

from osmosis_ai.cli.commands.auth_logout import revoke_token
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result
from osmosis_ai.cli.platform_session import credential_store, platform_target
from osmosis_ai.platform.client import (
    PlatformClient,
    PlatformClientError,
    default_expiry,
    parse_timestamp,
)
from osmosis_ai.platform.client.credentials import Credentials, CredentialStore

TOKEN_MESSAGES = {
    "TOKEN_EXPIRED": "The token has expired.",
    "TOKEN_REVOKED": "The token has been revoked.",
    "TOKEN_INVALID": "The token is not valid on this platform.",
    "TOKEN_MISSING": "No token was sent.",
}


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
    store = credential_store(ctx, target)
    previous = _previous_login(ctx, store)
    client = PlatformClient(target.platform_url, token, warn=ctx.warn)
    try:
        credentials = _verify_token(client, token) if token else _device_login(ctx, client)
        try:
            token_store = store.save(credentials)
        except BaseException:
            if token is None and credentials.token_id:  # do not strand a fresh device token
                PlatformClient(target.platform_url, credentials.access_token, warn=ctx.warn).revoke(
                    credentials.token_id
                )
            raise
    except PlatformClientError as exc:
        raise _login_error(exc) from exc
    finally:
        client.close()
    if previous is not None and not previous.is_expired():
        _revoke_previous(ctx, target.platform_url, previous, credentials)
    user = credentials.user
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
            "token_store": token_store,
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


def _previous_login(ctx: Context, store: CredentialStore) -> Credentials | None:
    """The saved login this one replaces; unreadable logins are replaced, not revoked."""
    try:
        return store.load()
    except PlatformClientError as exc:
        if exc.code == "KEYRING_UNAVAILABLE":
            ctx.warn(
                "TOKEN_REVOKE_FAILED",
                "The previous login could not be read from the OS keyring, so it will not be "
                "revoked.",
            )
        elif exc.code not in ("CREDENTIALS_PARSE_FAILED", "CREDENTIALS_VERSION_CHANGED"):
            raise
        return None


def _verify_token(client: PlatformClient, token: str) -> Credentials:
    verified = client.verify()
    return Credentials(
        access_token=token,
        user=verified.user,
        expires_at=parse_timestamp(verified.expires_at, default=default_expiry()),
        created_at=datetime.now(UTC),
        token_id=verified.token_id,
    )


def _device_login(ctx: Context, client: PlatformClient) -> Credentials:
    import sys

    from osmosis_ai.cli import console

    code = client.device_authorize()
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
    grant = client.device_poll(code)
    expires_at = parse_timestamp(grant.expires_at, default=default_expiry())
    if expires_at <= datetime.now(UTC):
        raise CLIError(
            CLIErrorCode.AUTH_REQUIRED,
            "The platform issued a token that has already expired; check the system clock.",
        )
    return Credentials(
        access_token=grant.token,
        user=grant.user,
        expires_at=expires_at,
        created_at=datetime.now(UTC),
        token_id=grant.token_id,
    )


def _revoke_previous(
    ctx: Context, platform_url: str, previous: Credentials, current: Credentials
) -> None:
    if previous.access_token == current.access_token or (
        previous.token_id is not None and previous.token_id == current.token_id
    ):
        return
    failure = revoke_token(ctx, platform_url, previous)
    if failure is not None:
        ctx.warn(
            "TOKEN_REVOKE_FAILED",
            f"The new login is active, but the previous one could not be revoked: {failure}.",
        )


def _login_error(exc: PlatformClientError) -> CLIError:
    """Login errors speak of the token being tried, not of a saved session."""
    code, message = exc.code, exc.message
    if code == "AUTH_REQUIRED" and exc.status_code == 401:
        reason = TOKEN_MESSAGES.get(exc.platform_code or "", "The platform refused the token.")
        message = f"{reason} Create a new token, or log in without --token."
    elif code == "NOT_FOUND":  # no login endpoint: the URL is not an Osmosis platform
        code = "PLATFORM_ERROR"
        message = (
            f"{message} (the platform has no login endpoint there: check OSMOSIS_PLATFORM_URL)"
        )
    return CLIError(code, message, dict(exc.details))
