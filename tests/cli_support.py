"""Running the CLI in tests: in-process invocation, golden JSON files, and a fake command module.

The fake commands (``osmosis fake <name>``) exercise paths no real command reaches yet:
interrupts, crashes, prompts, every result type. ``register`` adds them to the command table.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.cli import registry
from osmosis_ai.cli.confirm import confirm
from osmosis_ai.cli.main import main
from osmosis_ai.cli.output import (
    Column,
    Context,
    DetailResult,
    ListResult,
    MessageResult,
    OperationResult,
    Result,
    SectionedListResult,
)
from osmosis_ai.consts import PACKAGE_VERSION

GOLDEN_DIR = Path(__file__).parent / "golden" / "cli"


@dataclass
class Outcome:
    code: int
    out: str
    err: str

    def json(self) -> Any:
        """The one JSON envelope on stdout."""
        return json.loads(self.out)

    def error(self) -> Any:
        """The JSON error envelope: the last line on stderr."""
        return json.loads(self.err.strip().splitlines()[-1])

    def stderr_lines(self) -> list[Any]:
        return [json.loads(line) for line in self.err.splitlines() if line.strip()]


def invoke(capsys: Any, *args: str) -> Outcome:
    capsys.readouterr()
    code = main(list(args))
    captured = capsys.readouterr()
    return Outcome(code, captured.out, captured.err)


# --- golden files -----------------------------------------------------------------------------


def normalise(outcome: Outcome, replacements: dict[str, str]) -> dict[str, Any]:
    """Exit code, stdout envelope and stderr JSON lines, with volatile strings replaced."""

    def clean(text: str) -> str:
        for old, new in sorted(replacements.items(), key=lambda kv: -len(kv[0])):
            text = text.replace(json.dumps(old)[1:-1], new)
        return text.replace(json.dumps(PACKAGE_VERSION), '"<VERSION>"')

    out = clean(outcome.out)
    err = clean(outcome.err)
    return {
        "exit_code": outcome.code,
        "stdout": json.loads(out) if out.strip() else None,
        "stderr": [json.loads(line) for line in err.splitlines() if line.strip()],
    }


def check_golden(name: str, data: dict[str, Any]) -> None:
    """Compare with ``golden/cli/<name>.json``; ``OSMOSIS_UPDATE_GOLDEN=1`` rewrites it."""
    path = GOLDEN_DIR / f"{name}.json"
    text = json.dumps(data, indent=2, sort_keys=True) + "\n"
    if os.environ.get("OSMOSIS_UPDATE_GOLDEN") == "1":
        GOLDEN_DIR.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        return
    assert path.exists(), f"missing {path}; create it with OSMOSIS_UPDATE_GOLDEN=1"
    expected = json.loads(path.read_text(encoding="utf-8"))
    assert data == expected, f"{path.name} differs; rerun with OSMOSIS_UPDATE_GOLDEN=1 if intended"


# --- the fake command module ------------------------------------------------------------------

FAKES = (
    "interrupt",
    "crash",
    "none",
    "confirm",
    "nan",
    "list",
    "sections",
    "detail",
    "operation",
    "message",
    "exit",
    "warn",
    "partial",
    "usage",
)
MODULE = "osmosis_ai.cli.commands.fake"


def register(setitem: Callable[[Any, Any, Any], None]) -> None:
    """Add ``osmosis fake <name>`` commands; ``setitem`` is ``monkeypatch.setitem`` in tests."""
    setitem(sys.modules, MODULE, sys.modules[__name__])
    group = registry.Group(("fake",), "Fake commands for tests.", registry.WORKFLOW, True)
    setitem(registry._GROUPS, ("fake",), group)
    for name in FAKES:
        command = registry.Command(("fake", name), f"Fake {name}.", "fake", registry.WORKFLOW)
        setitem(registry._COMMANDS, ("fake", name), command)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-y", "--yes", action="store_true")
    parser.add_argument("--count", type=int, default=2)


def run(args: argparse.Namespace, ctx: Context) -> Result | None:
    name = ctx.command.split()[-1]
    if name == "interrupt":
        raise KeyboardInterrupt
    if name == "crash":
        raise RuntimeError("boom")
    if name == "none":
        return None
    if name == "confirm":
        confirm(
            "Delete 2 runs?",
            yes=args.yes,
            summary={"runs": 2, "workspace": "demo"},
            notes=["This cannot be undone."],
            warnings=["One run is still running."],
        )
        return OperationResult(operation="fake.delete", status="success", message="Deleted.")
    if name == "nan":
        return DetailResult(data={"score": math.nan})
    if name == "list":
        items: list[dict[str, object]] = [
            {"id": f"r{i}", "name": f"run\t{i}", "tags": ["a", "b"]} for i in range(args.count)
        ]
        return ListResult(
            items=items,
            total_count=10,
            has_more=True,
            next_offset=args.count,
            title="Runs",
            columns=[Column("id", "ID"), Column("name", "Name"), Column("tags", "Tags")],
            extra={"next_cursor": "c2"},
        )
    if name == "sections":
        base = ListResult(items=[{"id": "b1"}], title="Base models")
        lora = ListResult(items=[], total_count=0, extra={"active_deployments": 0})
        return SectionedListResult(sections={"base_models": base, "lora_models": lora})
    if name == "detail":
        return DetailResult(
            title="Run r1",
            data={"id": "r1", "ok": True, "missing": None, "nested": {"a": 1}},
            fields=[("ID", "r1"), ("OK", True), ("Missing", None), ("Nested", {"a": 1})],
        )
    if name == "operation":
        return OperationResult(
            operation="fake.op",
            status="success",
            resource={"id": "r1"},
            message="Done.",
            next_steps=["Next: osmosis fake detail"],
            next_steps_structured=[{"action": "detail", "id": "r1"}],
            extra={"extra_key": 1},
        )
    if name == "message":
        return MessageResult(message="hello\nworld")
    if name == "exit":
        raise SystemExit(3)
    if name == "warn":
        ctx.warn("DEPRECATION", "fake is deprecated")
        return MessageResult(message="warned")
    if name == "partial":
        return OperationResult(operation="fake.run", status="partial", exit_code=1)
    if name == "usage":
        from osmosis_ai.errors import UsageError

        raise UsageError("wrong state for fake usage")
    raise AssertionError(name)
