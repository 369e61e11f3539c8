"""What every platform command starts from: the platform, the caller's token, the workspace.

Workspace-scoped commands run in a workspace directory (reference §4.1): the Git worktree
of the working directory, holding the scaffold directories, whose ``origin`` names the
``owner/repo`` a platform workspace is connected to. That identity travels as
``X-Osmosis-Git`` on every scoped call; results carry it as ``git`` and
``workspace_directory``.
"""

from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from osmosis_ai.cli import records
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Column, Context, ListResult
from osmosis_ai.platform.client import (
    PAGE_LIMIT,
    PlatformClient,
    is_insecure_url,
    normalize_platform_url,
)
from osmosis_ai.platform.client.credentials import (
    Credentials,
    CredentialStore,
    Target,
    resolve_target,
)
from osmosis_ai.platform.client.local_repo import (
    WorkspaceDirectory,
    find_workspace_directory,
    require_workspace_directory,
)
from osmosis_ai.platform.client.login import current_login

__all__ = [
    "Session",
    "WorkspaceDirectory",
    "add_list_arguments",
    "add_log_arguments",
    "credential_store",
    "find_workspace_directory",
    "list_options",
    "logs_result",
    "open_session",
    "platform_target",
    "require_login",
    "require_workspace_directory",
]


def platform_target(ctx: Context, *, check_env_token: bool = True) -> Target:
    """The platform of this invocation; warns when its URL is plaintext (and allowed)."""
    url = normalize_platform_url(os.environ.get("OSMOSIS_PLATFORM_URL") or None)
    if is_insecure_url(url):  # warned whether or not it is allowed
        ctx.warn(
            "INSECURE_PLATFORM_URL",
            f"The platform URL {url} is not HTTPS: tokens would travel in plaintext.",
        )
    return resolve_target(check_env_token=check_env_token)


def credential_store(ctx: Context, target: Target) -> CredentialStore:
    return CredentialStore(target.platform_url, warn=ctx.warn)


def require_login(ctx: Context, target: Target) -> Credentials:
    """The token to call with: ``OSMOSIS_TOKEN``, else the saved, unexpired login."""
    return current_login(target, credential_store(ctx, target))


# --- the session ----------------------------------------------------------------------------


@dataclass
class Session:
    """One command's platform, credentials, workspace directory and client."""

    ctx: Context
    target: Target
    credentials: Credentials
    workspace: WorkspaceDirectory | None = None
    _client: PlatformClient | None = field(default=None, repr=False)

    @property
    def client(self) -> PlatformClient:
        if self._client is None:
            self._client = PlatformClient(
                self.target.platform_url,
                self.credentials.access_token,
                git_identity=self.workspace.identity if self.workspace else None,
                using_env_token=self.credentials.source == "environment",
                allow_insecure_transfers=self.target.insecure,
                warn=self.ctx.warn,
            )
        return self._client

    def result_context(self) -> dict[str, object]:
        return self.workspace.result_context() if self.workspace is not None else {}

    def close(self) -> None:
        if self._client is not None:
            self._client.close()

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def open_session(ctx: Context, *, workspace: bool = True) -> Session:
    """Resolve what a platform command needs, in the order the failures are reported:
    the platform URL, the workspace directory, then the login."""
    target = platform_target(ctx)
    directory = require_workspace_directory() if workspace else None
    return Session(ctx, target, require_login(ctx, target), directory)


# --- list options ---------------------------------------------------------------------------


def _bounded(maximum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"invalid int value: {text!r}") from None
        if not 1 <= value <= maximum:
            raise argparse.ArgumentTypeError(f"must be between 1 and {maximum}, got {value}")
        return value

    return parse


def add_list_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--limit",
        type=_bounded(PAGE_LIMIT),
        default=None,
        help=f"items per page (1-{PAGE_LIMIT}, default {PAGE_LIMIT})",
    )
    parser.add_argument("--all", action="store_true", help="fetch every page")


def list_options(args: argparse.Namespace) -> tuple[int, bool]:
    """``(limit, fetch_all)``; ``--all`` with a non-default ``--limit`` is refused."""
    limit: int | None = args.limit
    if args.all and limit is not None and limit != PAGE_LIMIT:
        raise CLIError(CLIErrorCode.VALIDATION, "--all and --limit are mutually exclusive.")
    return (limit or PAGE_LIMIT), bool(args.all)


def add_log_arguments(parser: argparse.ArgumentParser) -> None:
    from osmosis_ai.platform.client import LOG_PAGE_LIMIT

    parser.add_argument(
        "--limit",
        type=_bounded(LOG_PAGE_LIMIT),
        default=PAGE_LIMIT,
        help=f"log entries (1-{LOG_PAGE_LIMIT}, default {PAGE_LIMIT})",
    )
    parser.add_argument("--cursor", help="continue from a previous page's next_cursor")


def logs_result(ctx: Context, path: str, title: str, args: argparse.Namespace) -> ListResult:
    """One page of a resource's logs (``path``: its ``…/logs`` endpoint), as every ``logs``
    command shows it. Cursor pagination: no total; ``has_more`` says older entries lie beyond
    ``next_cursor``."""
    with open_session(ctx) as session:
        page = session.client.logs(path, limit=args.limit, cursor=args.cursor)
    items = [records.log_entry(entry) for entry in page.logs]
    return ListResult(
        title=title,
        items=items,
        total_count=len(items),
        has_more=page.next_cursor is not None,
        next_offset=None,
        columns=[
            Column("timestamp", "Time"),
            Column("level", "Level"),
            Column("step", "Step"),
            Column("message", "Message"),
        ],
        extra={"next_cursor": page.next_cursor, **session.result_context()},
    )
