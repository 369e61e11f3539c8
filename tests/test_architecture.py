"""The dependency rule of docs/architecture.md, checked on the source."""

from __future__ import annotations

import ast
import builtins
import re
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
    "procs": set(),
    "rundir": {"errors", "consts"},
    "rollout": {"lazy", "rundir", "deadlines", "procs", "errors", "consts"},
    "workspace": {"lazy", "rundir", "errors", "consts"},
    "tracking": {"rundir", "errors"},
    "controller": {"lazy", "rollout", "rundir", "deadlines", "procs", "errors", "consts"},
    "distributed": {
        "lazy",
        "controller",
        "rollout",
        "rundir",
        "deadlines",
        "procs",
        "errors",
        "consts",
    },
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
        "procs",
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
        "procs",
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
        "procs",
        "errors",
        "consts",
    },
    "testing": {"lazy", "rollout", "controller", "deadlines", "procs", "errors", "consts"},
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
        "procs",
        "errors",
        "consts",
        "lazy",
    },
    "__init__": {"consts", "errors", "eval", "lazy"},  # eval: the lazy names of reference §1.2
}


def area_of(path: Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0].removesuffix(".py")


def _is_area(name: str) -> bool:
    return (PACKAGE / f"{name}.py").is_file() or (PACKAGE / name / "__init__.py").is_file()


def imported_areas(path: Path) -> set[str]:
    """The areas ``path`` imports; a bare ``import osmosis_ai`` (or ``from osmosis_ai import``
    a name that is no area) imports the root package, area ``__init__``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: set[str] = set()
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module == "osmosis_ai" and not node.level:
            names = [
                f"osmosis_ai.{a.name}" if _is_area(a.name) else "osmosis_ai" for a in node.names
            ]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            parts = name.split(".")
            if parts[0] == "osmosis_ai":
                found.add(parts[1] if len(parts) > 1 else "__init__")
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


def test_a_bare_import_of_the_package_counts(tmp_path: Path):
    module = tmp_path / "m.py"
    module.write_text("import osmosis_ai\nfrom osmosis_ai import tracking, __version__\n")
    assert imported_areas(module) == {"__init__", "tracking"}
    module.write_text("from osmosis_ai import tracking\nimport osmosis_ai.errors\n")
    assert imported_areas(module) == {"tracking", "errors"}


def test_every_area_is_documented():
    text = (PACKAGE.parents[1] / "docs" / "architecture.md").read_text()
    areas = {area_of(p) for p in SOURCES} - {"__init__"}
    missing = {a for a in areas if f"`{a}" not in text}
    assert not missing, f"docs/architecture.md does not describe {sorted(missing)}"


# --- the document agrees with the source -----------------------------------------------------

ARCHITECTURE = PACKAGE.parents[1] / "docs" / "architecture.md"


def doc_section(text: str, title: str) -> str:
    """The text of the ``## <title>…`` section of ``text``, its ``###`` subsections included."""
    match = re.search(rf"^## {re.escape(title)}.*?$(.*?)(?=^## |\Z)", text, re.M | re.S)
    assert match is not None, f"docs/architecture.md has no section '## {title}'"
    return match.group(1)


def named_paths(text: str) -> set[str]:
    """The module paths named in backticks, ``x.py`` and ``a/b.py`` (``tests/…`` is the
    repository's, not the package's)."""
    found = set(re.findall(r"`([A-Za-z_][\w/]*\.py)`", text))
    return {p for p in found if not p.startswith("tests/")}


def test_the_named_paths_check_sees_paths():
    text = "`eval/runner.py` in `eval/`, `tests/test_x.py`, `main.py` but not `<name>/main.py`"
    assert named_paths(text) == {"eval/runner.py", "main.py"}


def test_every_file_the_map_and_flows_name_exists():
    text = ARCHITECTURE.read_text()
    named = named_paths(doc_section(text, "Package map")) | named_paths(doc_section(text, "Flows"))
    assert {"eval/runner.py", "train/ray/driver.py", "platform/worker/eval_job.py"} <= named
    missing = sorted(p for p in named if not (PACKAGE / p).exists())
    assert not missing, (
        f"docs/architecture.md names files that are not under src/osmosis_ai/: {missing}"
    )


def documented_imports(text: str) -> dict[str, set[str]]:
    """The package map's "may import" column: area -> the areas it names (``nothing`` is
    none; a row whose cell is ``—``, package data, is left out)."""
    table: dict[str, set[str]] = {}
    for line in doc_section(text, "Package map").splitlines():
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if len(cells) != 3 or not cells[0].startswith("`"):
            continue
        area = cells[0].strip("`").removesuffix(".py").removesuffix("/")
        if cells[2] == "—":
            continue
        table[area] = set() if cells[2] == "nothing" else set(re.findall(r"`(\w+)`", cells[2]))
    return table


def test_the_table_parser_reads_rows():
    text = (
        "## Package map\n\n| area | owns | may import |\n|---|---|---|\n"
        "| `errors.py` | the root | nothing |\n| `rollout/` | rollouts | `errors`, `consts` |\n"
        "| `templates/` | data | — |\n\n## Next\n| `x/` | y | `z` |\n"
    )
    assert documented_imports(text) == {"errors": set(), "rollout": {"errors", "consts"}}


def test_the_dependency_table_is_allowed():
    """The package map's "may import" column is ALLOWED, row by row."""
    documented = documented_imports(ARCHITECTURE.read_text())
    differences = [
        f"{area}: the document says {sorted(documented.get(area, set()))}, "
        f"ALLOWED {sorted(ALLOWED.get(area, set()))}"
        for area in sorted(set(documented) | set(ALLOWED))
        if documented.get(area) != ALLOWED.get(area)
    ]
    assert not differences, "docs/architecture.md's package map disagrees:\n" + "\n".join(
        differences
    )


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


# --- one exception tree ----------------------------------------------------------------------

ROOT_ERROR = "osmosis_ai.errors.OsmosisError"
# Run by a bare interpreter as a program of its own (python -I -S): it cannot import the package.
STANDALONE = {"rollout/backend/harbor/sandbox_enter.py"}


def _bindings(name: str, tree: ast.Module) -> dict[str, str]:
    """The dotted name each name bound in module ``name`` stands for: its imports (also those
    inside functions and under ``TYPE_CHECKING``) and its own classes."""
    package = name if MODULES[name].name == "__init__.py" else name.rpartition(".")[0]
    bound: dict[str, str] = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                head = alias.name.partition(".")[0]
                bound[alias.asname or head] = alias.name if alias.asname else head
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                bound[alias.asname or alias.name] = f"{base}.{alias.name}"
        elif isinstance(node, ast.ClassDef):
            bound[node.name] = f"{name}.{node.name}"
    return bound


def _package_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class of the package: dotted name -> (``path:line``, its bases as dotted names)."""
    bindings: dict[str, dict[str, str]] = {}
    classes: dict[str, tuple[str, list[ast.expr]]] = {}
    for name, path in MODULES.items():
        tree = ast.parse(path.read_text(), filename=str(path))
        bindings[name] = _bindings(name, tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.ClassDef):
                where = f"{path.relative_to(PACKAGE)}:{node.lineno}"
                classes[f"{name}.{node.name}"] = (where, node.bases)

    def resolve(dotted: str) -> str:
        """Follow re-exports (``from a import B`` in module ``c``) to where ``B`` is defined."""
        for _ in range(10):
            if dotted in classes:
                break
            module, _, attr = dotted.rpartition(".")
            if attr not in bindings.get(module, {}):
                break
            dotted = bindings[module][attr]
        return dotted

    def dotted(module: str, base: ast.expr) -> str:
        parts: list[str] = []
        while isinstance(base, ast.Attribute):
            parts.insert(0, base.attr)
            base = base.value
        if not isinstance(base, ast.Name):
            return "?"
        head = bindings[module].get(base.id, f"builtins.{base.id}")
        return resolve(".".join([head, *parts]))

    return {
        name: (where, [dotted(name.rpartition(".")[0], base) for base in bases])
        for name, (where, bases) in classes.items()
    }


def _kind(base: str, classes: dict[str, tuple[str, list[str]]]) -> tuple[bool, bool]:
    """(is an exception class, derives from OsmosisError) for the class named ``base``."""
    if base == ROOT_ERROR:
        return True, True
    if base in classes:
        kinds = [_kind(parent, classes) for parent in classes[base][1]]
        return any(k[0] for k in kinds), any(k[1] for k in kinds)
    if base.startswith("builtins."):
        found = getattr(builtins, base.removeprefix("builtins."), None)
        if not (isinstance(found, type) and issubclass(found, BaseException)):
            return False, False
        return not issubclass(found, Warning), False
    # A class of another library: named as exceptions are.
    return base.rpartition(".")[2].endswith(("Error", "Exception")), False


def misnamed_or_rootless_errors() -> list[str]:
    classes = _package_classes()
    found = []
    for name, (where, _) in sorted(classes.items()):
        if where.partition(":")[0] in STANDALONE:
            continue
        is_error, rooted = _kind(name, classes)
        short = name.rpartition(".")[2]
        if is_error and (not short.endswith("Error") or not rooted):
            why = [] if rooted else ["not an OsmosisError"]
            why += [] if short.endswith("Error") else ["name does not end in Error"]
            found.append(f"{where} {short}: {', '.join(why)}")
    return found


def test_the_exception_walk_sees_bases_across_modules():
    classes = _package_classes()
    assert _kind("osmosis_ai.errors.MissingExtraError", classes) == (True, True)
    assert _kind("osmosis_ai.platform.errors.NotFoundError", classes) == (True, True)
    assert _kind("osmosis_ai.rollout.http1.WriteTimeoutError", classes) == (True, True)
    assert _kind("osmosis_ai.rollout.backend.base.ExecutionBackend", classes)[0] is False
    fake = {
        "m.Plain": ("m.py:1", ["builtins.ValueError"]),
        "m.Rooted": ("m.py:2", [ROOT_ERROR]),
        "m.Child": ("m.py:3", ["m.Rooted"]),
        "m.Library": ("m.py:4", ["httpx.HTTPError"]),
    }
    assert _kind("m.Plain", fake) == (True, False)
    assert _kind("m.Child", fake) == (True, True)
    assert _kind("m.Library", fake) == (True, False)


def test_every_exception_is_an_osmosis_error_named_error():
    """One root exception (docs/architecture.md, errors.py): every exception class of the
    package derives from OsmosisError, and its name ends in Error."""
    found = misnamed_or_rootless_errors()
    assert not found, "exception classes outside the tree:\n" + "\n".join(found)
