"""What commands return and the one renderer that prints it: rich, ``--plain`` or ``--json``.

Commands never print: they return a result type from this module (defined in
:mod:`osmosis_ai.cli.results`). JSON mode writes exactly one envelope (``schema_version: 1``)
on stdout; warnings and errors go to stderr, as JSON Lines in JSON mode. Rich rendering lives
in :mod:`osmosis_ai.cli.console`, imported only when used.
"""

from __future__ import annotations

import contextvars
import sys
from dataclasses import dataclass
from typing import Literal, TextIO

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.cli.results import (
    Column,
    DetailResult,
    ListResult,
    MessageResult,
    OperationResult,
    Result,
    SectionedListResult,
    detail_fields,
    encode,
    list_columns,
    plain_value,
)
from osmosis_ai.consts import PACKAGE_VERSION

__all__ = [  # the result types are re-exported: commands import everything from here
    "Column",
    "Context",
    "DetailResult",
    "Format",
    "ListResult",
    "MessageResult",
    "OperationResult",
    "Result",
    "SectionedListResult",
    "current",
    "emit_error",
    "emit_warning",
    "encode",
    "envelope",
    "error_envelope",
    "install",
    "plain_lines",
    "render",
    "uninstall",
]

Format = Literal["rich", "plain", "json"]
SCHEMA_VERSION = 1


# --- the invocation's output context --------------------------------------------------------


@dataclass
class Context:
    """How this invocation prints; handed to every command's ``run(args, ctx)``."""

    command: str = "<root>"
    format: Format = "rich"
    interactive: bool = False

    def warn(self, code: str, message: str) -> None:
        """Report a non-fatal problem now (stderr), with a stable ``code``."""
        emit_warning(self, code, message)


_current: contextvars.ContextVar[Context | None] = contextvars.ContextVar("osmosis_cli_context")


def install(ctx: Context) -> contextvars.Token[Context | None]:
    return _current.set(ctx)


def uninstall(token: contextvars.Token[Context | None]) -> None:
    _current.reset(token)


def current() -> Context:
    """The context of the running invocation (a rich, non-interactive default outside one)."""
    return _current.get(None) or Context()


# --- JSON -----------------------------------------------------------------------------------


def envelope(result: Result) -> dict[str, object]:
    """The JSON envelope of ``result`` (§3.3 of the reference)."""
    if isinstance(result, ListResult):
        return {"schema_version": SCHEMA_VERSION, **_page(result)}
    if isinstance(result, SectionedListResult):
        sections = {name: _page(section) for name, section in result.sections.items()}
        return {**result.extra, "schema_version": SCHEMA_VERSION, **sections}
    if isinstance(result, DetailResult):
        return {"schema_version": SCHEMA_VERSION, "data": result.data}
    if isinstance(result, OperationResult):
        data: dict[str, object] = {
            "schema_version": SCHEMA_VERSION,
            "status": result.status,
            "operation": result.operation,
        }
        if result.resource is not None:
            data["resource"] = result.resource
        if result.message is not None:
            data["message"] = result.message
        if result.next_steps_structured:
            data["next_steps_structured"] = result.next_steps_structured
        return {**data, **result.extra}
    if isinstance(result, MessageResult):
        return {"schema_version": SCHEMA_VERSION, "message": result.message, **result.extra}
    raise TypeError(f"not a CLI result: {type(result).__name__}")


def _page(result: ListResult) -> dict[str, object]:
    total = len(result.items) if result.total_count is None else result.total_count
    return {
        "items": result.items,
        "total_count": total,
        "has_more": result.has_more,
        "next_offset": result.next_offset,
        **result.extra,
    }


# --- rendering ------------------------------------------------------------------------------


def render(result: Result, ctx: Context) -> None:
    """Print ``result`` in the invocation's format."""
    if ctx.format == "json":
        try:
            text = encode(envelope(result))
        except (TypeError, ValueError) as exc:
            raise CLIError(
                CLIErrorCode.INTERNAL, f"The result could not be encoded as JSON: {exc}"
            ) from exc
        _write(sys.stdout, text)
    elif ctx.format == "plain":
        for line in plain_lines(result):
            _write(sys.stdout, line)
    else:
        from osmosis_ai.cli import console

        console.render(result)


def plain_lines(result: Result) -> list[str]:
    """``--plain``: tab-separated rows, ``Label: value`` lines, or one message line."""
    if isinstance(result, ListResult):
        return _plain_rows(result)
    if isinstance(result, SectionedListResult):
        lines: list[str] = []
        for name, section in result.sections.items():
            lines.append(f"# {section.title or name}")
            lines.extend(_plain_rows(section))
        return lines
    if isinstance(result, DetailResult):
        return [f"{label}: {plain_value(value)}" for label, value in detail_fields(result)]
    if isinstance(result, OperationResult):
        head = result.message or f"{result.operation}: {result.status}"
        return [plain_value(head), *(plain_value(step) for step in result.next_steps)]
    if isinstance(result, MessageResult):
        return [plain_value(result.message)]
    raise TypeError(f"not a CLI result: {type(result).__name__}")


def _plain_rows(result: ListResult) -> list[str]:
    columns = list_columns(result)
    return ["\t".join(plain_value(item.get(c.key)) for c in columns) for item in result.items]


# --- warnings and errors (stderr) -----------------------------------------------------------


def emit_warning(ctx: Context, code: str, message: str) -> None:
    """A warning envelope (JSON Lines) in JSON mode, a yellow ``Warning: ...`` line otherwise."""
    if ctx.format == "json":
        data = {
            "schema_version": SCHEMA_VERSION,
            "cli_version": PACKAGE_VERSION,
            "warning": {"code": code, "message": message},
        }
        _write(sys.stderr, encode(data))
    elif ctx.format == "plain":
        _write(sys.stderr, f"Warning: {message}")
    else:
        from osmosis_ai.cli import console

        console.print_stderr(f"Warning: {message}", style="yellow")


def emit_error(ctx: Context, error: CLIError) -> None:
    """The error envelope on stderr in JSON mode; ``Error: <message>`` (and context) otherwise."""
    if ctx.format == "json":
        _write(sys.stderr, encode(error_envelope(ctx.command, error)))
        return
    extra = _interaction_context(error) if error.code is CLIErrorCode.INTERACTIVE_REQUIRED else []
    if ctx.format == "plain":
        for line in (f"Error: {error.message}", *extra):
            _write(sys.stderr, line)
    else:
        from osmosis_ai.cli import console

        console.print_stderr(f"Error: {error.message}", style="red")
        for line in extra:
            console.print_stderr(line)


def error_envelope(command: str, error: CLIError) -> dict[str, object]:
    body: dict[str, object] = {
        "code": error.code.value,
        "message": error.message,
        "details": error.details,
    }
    data: dict[str, object] = {
        "schema_version": SCHEMA_VERSION,
        "command": command,
        "cli_version": PACKAGE_VERSION,
        "error": body,
    }
    try:
        encode(data)
    except (TypeError, ValueError) as exc:
        body["details"] = {"details_omitted": type(exc).__name__}
    return data


def _interaction_context(error: CLIError) -> list[str]:
    """What a non-interactive caller needs to decide on ``--yes``: summary, notes, warnings."""
    lines: list[str] = []
    summary = error.details.get("summary")
    if isinstance(summary, dict) and summary:
        lines.append("Summary:")
        lines.extend(f"  {key}: {plain_value(value)}" for key, value in summary.items())  # pyright: ignore[reportUnknownVariableType]
    for title in ("notes", "warnings"):
        entries = error.details.get(title)
        if isinstance(entries, list) and entries:
            lines.append(f"{title.capitalize()}:")
            lines.extend(f"  - {plain_value(entry)}" for entry in entries)  # pyright: ignore[reportUnknownVariableType]
    return lines


def _write(stream: TextIO, line: str) -> None:
    stream.write(line + "\n")
