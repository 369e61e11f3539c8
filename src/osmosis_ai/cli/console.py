"""Rich rendering: result tables, coloured stderr lines and the confirmation prompt.

The only module that imports rich, and only :mod:`osmosis_ai.cli.output` and
:mod:`osmosis_ai.cli.confirm` import it, when rich output is actually printed. It reads the
result types from :mod:`osmosis_ai.cli.results`, never from the output module that calls it.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.prompt import Confirm
from rich.table import Table
from rich.text import Text

from osmosis_ai.cli.results import (
    DetailResult,
    ListResult,
    MessageResult,
    OperationResult,
    Result,
    SectionedListResult,
    detail_fields,
    list_columns,
    plain_value,
)


def _stdout() -> Console:
    return Console(file=sys.stdout, highlight=False)


def print_stderr(message: str, *, style: str | None = None) -> None:
    err = Console(file=sys.stderr, highlight=False)
    err.print(Text(message, style=style or ""), soft_wrap=True)


def render(result: Result) -> None:
    out = _stdout()
    if isinstance(result, ListResult):
        _list(out, result)
    elif isinstance(result, SectionedListResult):
        for name, section in result.sections.items():
            _list(out, section, default_title=name)
    elif isinstance(result, DetailResult):
        if result.title:
            out.print(Text(result.title, style="bold"))
        out.print(_grid(detail_fields(result)))
    elif isinstance(result, OperationResult):
        style = {"success": "green", "failed": "red"}.get(result.status, "yellow")
        out.print(
            Text(result.message or f"{result.operation}: {result.status}", style=style),
            soft_wrap=True,
        )
        for step in result.next_steps:
            out.print(Text(step, style="dim"), soft_wrap=True)
    elif isinstance(result, MessageResult):
        out.print(Text(result.message), soft_wrap=True)
    else:
        raise TypeError(f"not a CLI result: {type(result).__name__}")


def _list(out: Console, result: ListResult, *, default_title: str = "") -> None:
    title = result.title or default_title
    if title:
        out.print(Text(title, style="bold"))
    if not result.items:
        out.print(Text("Nothing to show.", style="dim"))
        return
    table = Table(header_style="bold")
    columns = list_columns(result)
    for column in columns:  # folded, never cut: a name or id in a cell is what you type next
        table.add_column(column.label, overflow="fold")
    for item in result.items:
        table.add_row(*(_value(item.get(column.key)) for column in columns))
    out.print(table)
    if result.has_more:
        total = len(result.items) if result.total_count is None else result.total_count
        hint = f"Showing {len(result.items)} of {total}. Use --all for all, or --limit to adjust."
        out.print(Text(hint, style="dim"))


def _grid(rows: Sequence[tuple[str, object]]) -> Table:
    grid = Table.grid(padding=(0, 2))
    grid.add_column(style="bold cyan", no_wrap=True)
    grid.add_column(overflow="fold")
    for label, value in rows:
        grid.add_row(Text(label), _value(value))
    return grid


def _value(value: object) -> Text:
    if value is None or value == []:
        return Text("-", style="dim")
    if isinstance(value, bool):
        return Text("yes" if value else "no")
    if isinstance(value, list | tuple):
        return Text("\n".join(plain_value(item) for item in value))  # pyright: ignore[reportUnknownVariableType]
    return Text(plain_value(value))


def ask(
    prompt: str,
    *,
    summary: Mapping[str, object],
    notes: Sequence[str],
    warnings: Sequence[str],
) -> bool:
    """Show what is about to happen and ask; anything but yes (or end of input) declines."""
    out = _stdout()
    if summary:
        out.print(_grid(list(summary.items())))
    for note in notes:
        out.print(Text(note, style="dim"))
    for warning in warnings:
        out.print(Text(f"Warning: {warning}", style="yellow"))
    try:
        return Confirm.ask(Text(prompt), default=False, console=out)
    except EOFError:
        return False
