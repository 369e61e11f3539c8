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
    "deadlines": {"errors"},
    "rundir": {"errors", "consts"},
    "rollout": {"lazy", "rundir", "deadlines", "errors", "consts"},
    "workspace": {"lazy", "rundir", "errors", "consts"},
    "tracking": {"errors"},
    "controller": {"lazy", "rollout", "rundir", "deadlines", "errors", "consts"},
    "distributed": {"lazy", "controller", "rollout", "deadlines", "errors", "consts"},
    "eval": {
        "lazy",
        "distributed",
        "controller",
        "rollout",
        "workspace",
        "events",
        "tracking",
        "rundir",
        "deadlines",
        "errors",
        "consts",
    },
    "train": {
        "lazy",
        "distributed",
        "controller",
        "rollout",
        "workspace",
        "events",
        "tracking",
        "rundir",
        "deadlines",
        "errors",
        "consts",
    },
    "platform": {
        "lazy",
        "eval",
        "train",
        "controller",
        "rollout",
        "workspace",
        "rundir",
        "deadlines",
        "errors",
        "consts",
    },
    "testing": {"lazy", "rollout", "controller", "deadlines", "errors", "consts"},
    "cli": {
        "platform",
        "eval",
        "train",
        "distributed",
        "controller",
        "rollout",
        "workspace",
        "testing",
        "rundir",
        "deadlines",
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


# The platform's client (what the CLI talks to a platform with) stays light: no server code
# of the platform, none of the server's libraries.
CLIENT = PACKAGE / "platform" / "client"
SERVER_LIBRARIES = {"fastapi", "starlette", "uvicorn", "sqlalchemy", "alembic", "jinja2"}


def imported_names(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


@pytest.mark.parametrize(
    "path", sorted(CLIENT.rglob("*.py")), ids=lambda p: str(p.relative_to(PACKAGE))
)
def test_the_platform_client_imports_no_server_code(path: Path):
    names = imported_names(path)
    server = {
        name
        for name in names
        if name.startswith("osmosis_ai.platform.")
        and not name.startswith("osmosis_ai.platform.client.")
    }
    libraries = {name for name in names if name.split(".")[0] in SERVER_LIBRARIES}
    assert not server | libraries, (
        f"{path.relative_to(PACKAGE)} imports {sorted(server | libraries)}"
    )


def test_the_client_check_sees_the_client():
    assert (CLIENT / "api.py").is_file() and (CLIENT / "__init__.py").is_file()


# --- no import cycles ------------------------------------------------------------------------


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in SOURCES}


def enclosing_module(dotted: str) -> str | None:
    """``dotted`` if it is one of the package's modules, else the nearest one above it."""
    while dotted and dotted not in MODULES:
        dotted = dotted.rpartition(".")[0]
    return dotted or None


def imported_modules(name: str) -> set[str]:
    """The package's modules that module ``name`` imports anywhere: at the top, inside
    functions (a lazy import still runs) and under ``TYPE_CHECKING`` (two modules that name
    each other are tangled even if only the type checker sees it). ``from pkg import mod``
    imports ``pkg.mod``; the parent packages Python runs first are not counted, or every
    package whose ``__init__`` names a submodule would be a cycle."""
    path = MODULES[name]
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        targets: list[str] = []
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            targets = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in MODULES else base
                for alias in node.names
            ]
        for target in targets:
            module = enclosing_module(target)
            if module is not None and module != name:
                found.add(module)
    return found


def strongly_connected(graph: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of ``graph``."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component: list[str] = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            components.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return components


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}, "e": set()}
    assert sorted(strongly_connected(graph)) == [["a", "b", "c"], ["d"], ["e"]]
    assert "osmosis_ai.controller.upstream" in imported_modules("osmosis_ai.controller.upstreams")
    assert "osmosis_ai.rollout.asgi" in imported_modules("osmosis_ai.controller.policy.app")


def test_no_import_cycles():
    graph = {name: imported_modules(name) for name in MODULES}
    cycles = [c for c in strongly_connected(graph) if len(c) > 1]
    described = [
        ", ".join(f"{a} -> {b}" for a in cycle for b in sorted(graph[a] & set(cycle)))
        for cycle in cycles
    ]
    assert not cycles, "modules that import each other (cut the cycle):\n" + "\n".join(described)
