"""The dependency rule of docs/architecture.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "osmosis_ai"

# area -> areas it may import (besides itself). Leaves: errors, consts, lazy.
ALLOWED: dict[str, set[str]] = {
    "errors": set(),
    "events": set(),
    "consts": set(),
    "lazy": set(),
    "rollout": {"lazy", "errors", "consts"},
    "workspace": {"lazy", "errors", "consts"},
    "controller": {"lazy", "rollout", "errors", "consts"},
    "eval": {"lazy", "controller", "rollout", "workspace", "events", "errors", "consts"},
    "train": {"lazy", "controller", "rollout", "workspace", "events", "errors", "consts"},
    "platform": {"lazy", "eval", "train", "controller", "rollout", "workspace", "errors", "consts"},
    "testing": {"lazy", "rollout", "controller", "errors", "consts"},
    "cli": {
        "platform",
        "eval",
        "train",
        "controller",
        "rollout",
        "workspace",
        "testing",
        "errors",
        "consts",
        "lazy",
    },
    "__init__": {"consts", "errors", "eval", "lazy"},  # eval: the lazy names of reference §1.2
}


def area_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def imported_areas(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "osmosis_ai" and len(parts) > 1:
                found.add(parts[1])
    return found


# templates/ is package data: rollout code copied into workspaces, never imported here.
SOURCES = sorted(p for p in PACKAGE.rglob("*.py") if p.relative_to(PACKAGE).parts[0] != "templates")


@pytest.mark.parametrize("path", SOURCES, ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_flow_one_way(path: Path):
    area = area_of(path)
    assert area in ALLOWED, f"{area} is not in the package map of docs/architecture.md"
    illegal = imported_areas(path) - ALLOWED[area] - {area}
    assert not illegal, (
        f"{path.relative_to(PACKAGE)} imports {sorted(illegal)}, against the dependency rule"
    )


def test_every_area_is_documented():
    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    areas = {area_of(p) for p in SOURCES} - {"__init__"}
    missing = {a for a in areas if f"`{a}" not in text}
    assert not missing, f"docs/architecture.md does not describe {sorted(missing)}"
