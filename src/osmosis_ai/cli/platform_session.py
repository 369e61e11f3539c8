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
from datetime import UTC, datetime
from pathlib import Path

from osmosis_ai.cli import records
from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Column, Context, ListResult
from osmosis_ai.platform.client import (
    PAGE_LIMIT,
    SESSION_EXPIRED,
    PlatformClient,
    User,
    is_insecure_url,
    normalize_platform_url,
)
from osmosis_ai.platform.client.credentials import (
    Credentials,
    CredentialStore,
    Target,
    resolve_target,
)

NOT_LOGGED_IN = "Not logged in. Run 'osmosis auth login' first, or set OSMOSIS_TOKEN."
SCAFFOLD_DIRS = ("rollouts", "configs/training", "configs/eval", "data")


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


def env_credentials(token: str) -> Credentials:
    """An ``OSMOSIS_TOKEN``: its owner is unknown until the platform verifies it."""
    return Credentials(
        access_token=token,
        user=User(id="", email="", name=None),
        expires_at=datetime.max.replace(tzinfo=UTC),
        created_at=datetime.now(UTC),
        source="environment",
    )


def require_login(ctx: Context, target: Target) -> Credentials:
    """The token to call with: ``OSMOSIS_TOKEN``, else the saved, unexpired login."""
    if target.env_token is not None:
        return env_credentials(target.env_token)
    credentials = credential_store(ctx, target).load()
    if credentials is None:
        raise CLIError(
            CLIErrorCode.AUTH_REQUIRED, NOT_LOGGED_IN, {"platform_url": target.platform_url}
        )
    if credentials.is_expired():
        raise CLIError(
            CLIErrorCode.AUTH_REQUIRED,
            SESSION_EXPIRED,
            {"platform_url": target.platform_url, "expires_at": credentials.expires_at},
        )
    return credentials


# --- the workspace directory ----------------------------------------------------------------


@dataclass(frozen=True)
class WorkspaceDirectory:
    """A local clone of a workspace repository and the identity its ``origin`` names."""

    root: Path
    identity: str
    remote_url: str

    def result_context(self) -> dict[str, object]:
        return {
            "git": {"identity": self.identity, "remote_url": self.remote_url},
            "workspace_directory": str(self.root),
        }


def find_workspace_directory(start: Path | None = None) -> WorkspaceDirectory | None:
    """The workspace directory at ``start`` (default: cwd), or ``None`` when there is none."""
    try:
        return require_workspace_directory(start)
    except CLIError:
        return None


def require_workspace_directory(start: Path | None = None) -> WorkspaceDirectory:
    from osmosis_ai.platform.client.local_repo import identity_of, origin_url, worktree_root

    here = (start or Path.cwd()).resolve()
    root = worktree_root(here)
    if root is None:
        raise CLIError(
            CLIErrorCode.WORKSPACE_REQUIRED,
            f"{here} is not inside a workspace directory: run this command in a Git clone of "
            "the repository your platform workspace is connected to.",
            {"start": str(here)},
        )
    missing = [d for d in SCAFFOLD_DIRS if not (root / d).is_dir()]
    if missing:
        raise CLIError(
            CLIErrorCode.VALIDATION,
            f"The workspace directory {root} is missing {', '.join(d + '/' for d in missing)}. "
            "Run `osmosis doctor --fix` to restore the scaffold.",
            {"workspace_directory": str(root), "missing": missing},
        )
    url = origin_url(root)
    if url is None:
        raise CLIError(
            CLIErrorCode.WORKSPACE_REQUIRED,
            f"The Git repository at {root} has no 'origin' remote. Set it to the repository "
            "your platform workspace is connected to (git remote add origin URL).",
            {"workspace_directory": str(root)},
        )
    repo = identity_of(url)
    return WorkspaceDirectory(root, repo.identity, repo.remote_url)


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
