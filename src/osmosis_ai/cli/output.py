"""What commands return and the one renderer that prints it: rich, ``--plain`` or ``--json``.

Commands never print: they return a result type from this module. JSON mode writes exactly one
envelope (``schema_version: 1``) on stdout; warnings and errors go to stderr, as JSON Lines in
JSON mode. Rich rendering lives in :mod:`osmosis_ai.cli.console`, imported only when used.
"""

from __future__ import annotations

import contextvars
import json
import sys
from dataclasses import dataclass, field
from datetime import date, datetime
from enum import Enum
from pathlib import PurePath
from typing import Literal, TextIO

from osmosis_ai.cli.errors import CLIError, CLIErrorCode
from osmosis_ai.consts import PACKAGE_VERSION

Format = Literal["rich", "plain", "json"]
SCHEMA_VERSION = 1


# --- result types ---------------------------------------------------------------------------


@dataclass(kw_only=True)
class Result:
    """Base of every result; a non-zero ``exit_code`` ends the process with it after rendering."""

    exit_code: int = 0


@dataclass(frozen=True)
class Column:
    """A column of a list: the item key it shows and its header."""

    key: str
    label: str


@dataclass(kw_only=True)
class ListResult(Result):
    """A page of items. ``columns`` picks what rich and plain show (default: every key)."""

    items: list[dict[str, object]]
    total_count: int | None = None  # None: len(items)
    has_more: bool = False
    next_offset: int | None = None
    title: str = ""
    columns: list[Column] = field(default_factory=list[Column])
    extra: dict[str, object] = field(default_factory=dict[str, object])


@dataclass(kw_only=True)
class SectionedListResult(Result):
    """Independently paginated lists under one envelope, one key per section."""

    sections: dict[str, ListResult]
    title: str = ""


@dataclass(kw_only=True)
class DetailResult(Result):
    """One resource. ``fields`` are the (label, value) rows humans see (default: ``data``)."""

    data: dict[str, object]
    title: str = ""
    fields: list[tuple[str, object]] | None = None


@dataclass(kw_only=True)
class OperationResult(Result):
    """The outcome of a mutation: ``operation`` (``doctor``, ``dataset.upload``) and ``status``."""

    operation: str
    status: str
    resource: dict[str, object] | None = None
    message: str | None = None
    next_steps: list[str] = field(default_factory=list[str])  # shown to humans only
    next_steps_structured: list[dict[str, object]] = field(default_factory=list[dict[str, object]])
    extra: dict[str, object] = field(default_factory=dict[str, object])


@dataclass(kw_only=True)
class MessageResult(Result):
    """A free-form message."""

    message: str
    extra: dict[str, object] = field(default_factory=dict[str, object])


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
        return {"schema_version": SCHEMA_VERSION, **sections}
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


def encode(value: object) -> str:
    """Strict JSON (no NaN/Infinity); paths, dates and enums become strings."""
    return json.dumps(value, allow_nan=False, ensure_ascii=False, default=_json_default)


def _json_default(value: object) -> object:
    if isinstance(value, PurePath):
        return str(value)
    if isinstance(value, datetime | date):
        return value.isoformat()
    if isinstance(value, Enum):
        return value.value
    if isinstance(value, set | frozenset | tuple):
        return list(value)  # pyright: ignore[reportUnknownArgumentType]
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


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


def list_columns(result: ListResult) -> list[Column]:
    if result.columns:
        return result.columns
    keys: dict[str, None] = {}
    for item in result.items:
        keys.update(dict.fromkeys(item))
    return [Column(key, label_of(key)) for key in keys]


def detail_fields(result: DetailResult) -> list[tuple[str, object]]:
    if result.fields is not None:
        return result.fields
    return [(label_of(key), value) for key, value in result.data.items()]


def label_of(key: str) -> str:
    return key.replace("_", " ").capitalize()


def plain_value(value: object) -> str:
    """One line of text for a value: scalars as text, lists joined, objects as JSON."""
    if value is None:
        text = ""
    elif isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list | tuple) and all(
        not isinstance(item, dict | list | tuple)
        for item in value  # pyright: ignore[reportUnknownVariableType]
    ):
        text = ", ".join(plain_value(item) for item in value)  # pyright: ignore[reportUnknownVariableType]
    elif isinstance(value, dict | list | tuple):
        try:
            text = encode(value)
        except (TypeError, ValueError):
            text = str(value)  # pyright: ignore[reportUnknownArgumentType]
    else:
        text = str(value)
    return text.replace("\t", " ").replace("\r", " ").replace("\n", " ")


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
