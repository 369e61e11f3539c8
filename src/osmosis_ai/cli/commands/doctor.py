"""``osmosis doctor [PATH] [--fix]``: check the workspace scaffold, or create what is missing."""

from __future__ import annotations

import argparse
from pathlib import Path

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.output import Context, OperationResult, Result


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "path",
        metavar="PATH",
        nargs="?",
        type=Path,
        help="workspace directory (default: the workspace holding the current directory)",
    )
    parser.add_argument(
        "--fix", action="store_true", help="create missing directories and files (never overwrites)"
    )


def run(args: argparse.Namespace, ctx: Context) -> Result:
    from osmosis_ai.workspace import check_scaffold, fix_scaffold
    from osmosis_ai.workspace.templates import install_skills

    root = _root(args.path)
    created: list[str] = []
    if args.fix:  # the scaffold, then the agent skills; nothing existing is overwritten
        created = [path.relative_to(root).as_posix() for path in fix_scaffold(root)]
        created += [path.relative_to(root).as_posix() for path in install_skills(root)]
    report = check_scaffold(root)
    if not report.ok:
        missing = ", ".join(report.missing)
        raise CLIError(
            CLIErrorCode.VALIDATION,
            f"The workspace at {root} is missing: {missing}. "
            "Run `osmosis doctor --fix` to create them.",
            report.to_dict(),
        )
    resource: dict[str, object] = report.to_dict()
    if args.fix:
        resource["created"] = created
        message = (
            f"Created {len(created)} missing path(s) under {root}: {', '.join(created)}."
            if created
            else f"Nothing to fix: the workspace scaffold at {root} is complete."
        )
    else:
        message = f"The workspace scaffold at {root} is complete."
    return OperationResult(operation="doctor", status="success", resource=resource, message=message)


def _root(path: Path | None) -> Path:
    """The directory to check: ``path``, else the enclosing workspace, else the cwd."""
    from osmosis_ai.workspace import WorkspaceNotFoundError, find_workspace

    if path is not None:
        root = path.expanduser().resolve()
        if not root.is_dir():
            raise CLIError(CLIErrorCode.NOT_FOUND, f"Not a directory: {path}", {"path": str(path)})
        return root
    try:
        return find_workspace().root
    except WorkspaceNotFoundError:
        return Path.cwd().resolve()  # a new workspace: --fix creates the scaffold here
