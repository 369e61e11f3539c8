"""Help screens of the root and of command groups, drawn as panels from the command table.

Standard library only: ``osmosis --help`` must not import rich or any command module.
"""

from __future__ import annotations

from osmosis_ai.cli import registry
from osmosis_ai.cli.registry import Command, Group

ROOT_DESCRIPTION = """\
Build, evaluate and train LLM agents with reinforcement learning.

Rich output is the default for humans. For AI agents, CI and scripts pass --json
or --plain anywhere on the line, e.g. `osmosis dataset validate data/x.jsonl --json`."""

ROOT_OPTIONS = (
    ("--json", "Emit one JSON envelope on stdout (agents, CI)."),
    ("--plain", "Emit low-noise text for shell pipelines."),
    ("--env-file PATH", "Load this .env file (default: nearest .env upward)."),
    ("--platform URL", "Platform URL for this call (OSMOSIS_PLATFORM_URL)."),
    ("-V, --version", "Show the version and exit."),
    ("-h, --help", "Show this message and exit."),
)

PLATFORM_NOTE = "need a platform"
FOOTER = """\
Serve a rollout:  python rollouts/<name>/main.py  (port $_OSMOSIS_ROLLOUT_PORT, default 8000)
Command help:     osmosis COMMAND --help"""


def root_help(encoding: str | None) -> str:
    panels: list[tuple[str, list[tuple[str, str]]]] = [("Options", list(ROOT_OPTIONS))]
    for panel in registry.PANELS:
        rows = [
            (entry.path[-1], _entry_help(entry))
            for entry in registry.children(())
            if entry.panel == panel
        ]
        title = f"{panel} ({PLATFORM_NOTE})" if panel == registry.PLATFORM else panel
        panels.append((title, rows))
    usage = "Usage: osmosis [OPTIONS] COMMAND [ARGS]..."
    return _screen(usage, ROOT_DESCRIPTION, panels, encoding, footer=FOOTER)


def group_help(group: Group, encoding: str | None) -> str:
    name = " ".join(group.path)
    rows = [(entry.path[-1], _entry_help(entry)) for entry in registry.children(group.path)]
    panels = [("Options", [("-h, --help", "Show this message and exit.")]), ("Commands", rows)]
    usage = f"Usage: osmosis {name} [OPTIONS] COMMAND [ARGS]..."
    return _screen(usage, group.help, panels, encoding)


def _entry_help(entry: Group | Command) -> str:
    if isinstance(entry, Group) or entry.panel == registry.PLATFORM:
        return entry.help
    if entry.module == registry.NEEDS_PLATFORM:
        return f"{entry.help} [needs a platform]"
    if entry.module == registry.PENDING:
        return f"{entry.help} [not available yet]"
    return entry.help


def _screen(
    usage: str,
    description: str,
    panels: list[tuple[str, list[tuple[str, str]]]],
    encoding: str | None,
    *,
    footer: str = "",
) -> str:
    lines = [usage, ""]
    lines.extend(f"  {line}" if line else "" for line in description.splitlines())
    lines.append("")
    bodies = [(title, _rows(rows)) for title, rows in panels]
    width = max(max((len(line) for line in body), default=0) for _, body in bodies)
    width = max(width, *(len(title) + 3 for title, _ in bodies))
    box = _box_chars(encoding)
    for title, body in bodies:
        lines.extend(_panel(title, body, width, box))
    if footer:
        lines.extend(["", *footer.splitlines()])
    return "\n".join(lines) + "\n"


def _rows(rows: list[tuple[str, str]]) -> list[str]:
    name_width = max((len(name) for name, _ in rows), default=0)
    return [f"{name.ljust(name_width)}  {text}" for name, text in rows]


def _panel(title: str, body: list[str], width: int, box: str) -> list[str]:
    top_left, top_right, bottom_left, bottom_right, horizontal, vertical = box
    head = f"{top_left}{horizontal} {title} "
    lines = [head + horizontal * (width + 4 - len(head) - 1) + top_right]
    lines.extend(f"{vertical} {line.ljust(width)} {vertical}" for line in body)
    lines.append(bottom_left + horizontal * (width + 2) + bottom_right)
    return lines


def _box_chars(encoding: str | None) -> str:
    fancy = "╭╮╰╯─│"
    try:
        fancy.encode(encoding or "utf-8")
    except (LookupError, UnicodeEncodeError):
        return "++++-|"
    return fancy
