"""Progress of a file transfer on stderr: a bar (rich), 10 % steps (plain), nothing (JSON)."""

from __future__ import annotations

import sys
from collections.abc import Generator
from contextlib import contextmanager

from osmosis_ai.cli.output import Context
from osmosis_ai.platform.client.api import Progress


@contextmanager
def transfer_progress(ctx: Context, total: int, description: str) -> Generator[Progress | None]:
    """A ``(done, total)`` callback for the transfer, or ``None`` when nothing is shown."""
    if ctx.format == "json":
        yield None
    elif ctx.format == "plain" or not sys.stderr.isatty():
        yield _steps(description)
    else:
        from rich.console import Console
        from rich.progress import BarColumn, DownloadColumn, Progress, TransferSpeedColumn

        bar = Progress(
            "{task.description}",
            BarColumn(),
            DownloadColumn(binary_units=True),
            TransferSpeedColumn(),
            console=Console(file=sys.stderr),
            transient=True,
        )
        task = bar.add_task(description, total=total or None)
        with bar:
            yield lambda done, size: bar.update(task, completed=done, total=size or None)


def _steps(description: str) -> Progress:
    shown = [0]

    def report(done: int, total: int) -> None:
        percent = 100 if total <= 0 or done >= total else done * 100 // total // 10 * 10
        if percent > shown[0]:
            shown[0] = percent
            sys.stderr.write(f"{description}: {percent}%\n")

    return report
