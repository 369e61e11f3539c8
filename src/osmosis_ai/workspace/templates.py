"""Bundled templates (a folder of ``osmosis_ai/templates/`` holding ``rollouts/`` and
``configs/``, optionally described by ``template.toml``): the catalog, ``template apply``, the
``rollout init`` scaffold and the workspace agent skills. Writes are all-or-nothing and never
replace a file with other content unless ``force`` is given.
"""

from __future__ import annotations

import ast
import tomllib
from dataclasses import dataclass
from importlib import resources
from importlib.resources.abc import Traversable
from pathlib import Path

from osmosis_ai.errors import ConfigError, UsageError
from osmosis_ai.workspace.layout import (
    Workspace,
    WorkspaceNotFoundError,
    find_workspace,
    fix_scaffold,
    validate_rollout_name,
)

MANIFEST = "template.toml"
RECIPE_DIRS = ("rollouts", "configs", "data")
SKILLS_DIRS = (".agents/skills", ".claude/skills")
PLACEHOLDER = "{{rollout}}"
# Folders of osmosis_ai/templates/ that hold other package data, never templates.
_RESERVED = frozenset({"scaffold", "skills"})
_SKIPPED = frozenset({"__pycache__", ".DS_Store"})


class TemplateNotFoundError(UsageError):
    """No bundled template has the requested name."""

    def __init__(self, name: str, available: list[str]) -> None:
        self.name = name
        self.available = available
        super().__init__(
            f"No template named {name!r}. Available: {', '.join(available) or 'none'} "
            "(see `osmosis template list`)."
        )


class FileConflictError(UsageError):
    """Files to be written already exist with other content; nothing was written."""

    def __init__(self, root: Path, paths: list[str]) -> None:
        self.root = root
        self.paths = paths
        shown = ", ".join(paths[:5]) + (f" and {len(paths) - 5} more" if len(paths) > 5 else "")
        super().__init__(
            f"{len(paths)} file(s) under {root} already exist with other content: {shown}. "
            "Nothing was written; pass --force to overwrite them."
        )


@dataclass(frozen=True)
class ConfigRef:
    """A config file of a template: its workspace-relative path and what it asks for."""

    path: str
    model_path: str | None
    secrets: tuple[str, ...]

    def to_dict(self) -> dict[str, object]:
        return {"path": self.path, "model_path": self.model_path, "secrets": list(self.secrets)}


@dataclass(frozen=True)
class TemplateInfo:
    """One catalog entry; paths are workspace-relative, POSIX style."""

    name: str
    description: str
    rollouts: tuple[str, ...]
    eval_configs: tuple[ConfigRef, ...]
    training_configs: tuple[ConfigRef, ...]
    datasets: tuple[str, ...]
    notes: tuple[str, ...] = ()  # the manifest's next_steps

    @property
    def training_ready(self) -> bool:
        """The template ships a training config for ``osmosis train run``."""
        return bool(self.training_configs)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "description": self.description,
            "rollouts": list(self.rollouts),
            "eval_configs": [config.path for config in self.eval_configs],
            "training_configs": [config.path for config in self.training_configs],
            "datasets": list(self.datasets),
            "training_ready": self.training_ready,
        }


@dataclass(frozen=True, kw_only=True)
class WriteReport:
    """What one apply or init wrote under ``root`` (workspace-relative POSIX paths)."""

    root: Path
    files_written: tuple[str, ...]
    files_unchanged: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class TemplateApplication(WriteReport):
    """The result of :func:`apply_template`; ``scaffold_created`` is empty in a workspace."""

    template: TemplateInfo
    scaffold_created: tuple[str, ...]
    skills_written: tuple[str, ...]


@dataclass(frozen=True, kw_only=True)
class RolloutScaffold(WriteReport):
    """The result of :func:`init_rollout`."""

    rollout: str
    eval_config: str
    training_config: str


# --- the catalog ------------------------------------------------------------------------------


def templates_root() -> Traversable:
    """``osmosis_ai/templates/`` as package data (works from a wheel or a checkout)."""
    return resources.files("osmosis_ai") / "templates"


def list_templates() -> list[TemplateInfo]:
    """Every bundled template, sorted by name."""
    found = [
        _info(node)
        for node in templates_root().iterdir()
        if node.is_dir() and node.name not in _RESERVED and _is_template(node)
    ]
    return sorted(found, key=lambda info: info.name)


def get_template(name: str) -> TemplateInfo:
    """The catalog entry ``name``, or :class:`TemplateNotFoundError`."""
    for info in list_templates():
        if info.name == name:
            return info
    raise TemplateNotFoundError(name, [info.name for info in list_templates()])


def _is_template(node: Traversable) -> bool:
    return (node / MANIFEST).is_file() or (
        (node / "rollouts").is_dir() and (node / "configs").is_dir()
    )


def _info(node: Traversable) -> TemplateInfo:
    manifest = _manifest(node)
    rollouts = _children(node / "rollouts", dirs=True)
    datasets = tuple(f"data/{name}" for name in _children(node / "data", dirs=False))
    description = manifest.get("description")
    if not isinstance(description, str) or not description:
        description = _docstring_line(node, rollouts)
    notes = manifest.get("next_steps", [])
    if not isinstance(notes, list) or not all(isinstance(n, str) for n in notes):
        raise ConfigError(f"{node.name}/{MANIFEST}: next_steps must be a list of strings")
    return TemplateInfo(
        name=node.name,
        description=description,
        rollouts=rollouts,
        eval_configs=_configs(node, "eval"),
        training_configs=_configs(node, "training"),
        datasets=datasets,
        notes=tuple(str(n) for n in notes),
    )


def _manifest(node: Traversable) -> dict[str, object]:
    path = node / MANIFEST
    if not path.is_file():
        return {}
    try:
        data = tomllib.loads(path.read_text(encoding="utf-8"))
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{node.name}/{MANIFEST} is not valid TOML: {exc}") from exc
    name = data.get("name", node.name)
    if name != node.name:
        raise ConfigError(f"{node.name}/{MANIFEST}: name {name!r} must match its folder")
    return data


def _children(node: Traversable, *, dirs: bool) -> tuple[str, ...]:
    if not node.is_dir():
        return ()
    names = [
        child.name
        for child in node.iterdir()
        if child.name not in _SKIPPED and (child.is_dir() if dirs else child.is_file())
    ]
    return tuple(sorted(names))


def _configs(node: Traversable, kind: str) -> tuple[ConfigRef, ...]:
    refs: list[ConfigRef] = []
    for name in _children(node / "configs" / kind, dirs=False):
        if not name.endswith(".toml"):
            continue
        data = tomllib.loads((node / "configs" / kind / name).read_text(encoding="utf-8"))
        experiment = data.get("experiment", {})
        model = experiment.get("model_path") if isinstance(experiment, dict) else None
        secrets = data.get("secrets", {})
        required = secrets.get("required", []) if isinstance(secrets, dict) else []
        refs.append(
            ConfigRef(
                path=f"configs/{kind}/{name}",
                model_path=model if isinstance(model, str) else None,
                secrets=tuple(str(s) for s in required) if isinstance(required, list) else (),
            )
        )
    return tuple(refs)


def _docstring_line(node: Traversable, rollouts: tuple[str, ...]) -> str:
    """A template without a manifest is described by its entrypoint's docstring."""
    for rollout in rollouts:
        main = node / "rollouts" / rollout / "main.py"
        if main.is_file():
            try:
                doc = ast.get_docstring(ast.parse(main.read_text(encoding="utf-8")))
            except SyntaxError:
                doc = None
            if doc:
                return doc.strip().splitlines()[0]
    return ""


# --- writing files ----------------------------------------------------------------------------


def _recipe_files(node: Traversable, prefix: str = "") -> list[tuple[str, bytes]]:
    """(relative path, content) of every file under ``node``, in a stable order."""
    files: list[tuple[str, bytes]] = []
    for child in sorted(node.iterdir(), key=lambda c: c.name):
        if child.name in _SKIPPED or child.name.endswith(".pyc"):
            continue
        rel = f"{prefix}{child.name}"
        if child.is_dir():
            files.extend(_recipe_files(child, f"{rel}/"))
        elif child.is_file():
            files.append((rel, child.read_bytes()))
    return files


def _plan(
    root: Path, files: list[tuple[str, bytes]], *, force: bool
) -> tuple[list[tuple[str, bytes]], list[str]]:
    """Split ``files`` into (to write, unchanged); raise :class:`FileConflictError` when any
    would replace a file with other content (unless ``force``) or a non-file."""
    to_write: list[tuple[str, bytes]] = []
    unchanged: list[str] = []
    conflicts: list[str] = []
    for rel, data in files:
        target = root / rel
        if target.is_symlink() or (target.exists() and not target.is_file()):
            conflicts.append(rel)  # a link or directory where a file belongs: never replaced
        elif not target.exists():
            to_write.append((rel, data))
        elif target.read_bytes() == data:
            unchanged.append(rel)
        elif force:
            to_write.append((rel, data))
        else:
            conflicts.append(rel)
    if conflicts:
        raise FileConflictError(root, conflicts)
    return to_write, unchanged


def _write(root: Path, files: list[tuple[str, bytes]]) -> tuple[str, ...]:
    for rel, data in files:
        target = root / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    return tuple(rel for rel, _ in files)


def install_skills(root: Path) -> list[Path]:
    """Write the bundled agent skills to ``.agents/skills/`` and ``.claude/skills/`` under
    ``root`` where missing; an existing file is never touched. Returns the files written."""
    written: list[Path] = []
    for rel, data in _recipe_files(templates_root() / "skills"):
        for base in SKILLS_DIRS:
            target = root / base / rel
            if target.exists() or target.is_symlink():
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            with target.open("xb") as handle:  # "x": never clobber, even in a race
                handle.write(data)
            written.append(target)
    return written


LOCAL_RUNS_IGNORE = ".osmosis/"


def ignore_local_runs(root: Path) -> tuple[str, ...]:
    """Have the workspace's ``.gitignore`` ignore ``.osmosis/`` (local runs, downloads,
    metrics exports): created, or the line appended. Returns ``(".gitignore",)`` when it
    changed, ``()`` when it already ignored it."""
    path = root / ".gitignore"
    if path.is_symlink() or (path.exists() and not path.is_file()):
        return ()
    text = path.read_text(encoding="utf-8") if path.exists() else ""
    if any(
        line.strip() in (".osmosis", ".osmosis/", "/.osmosis", "/.osmosis/")
        for line in text.splitlines()
    ):
        return ()
    if text and not text.endswith("\n"):
        text += "\n"
    path.write_text(
        f"{text}# osmosis: local runs, downloads and metrics exports\n{LOCAL_RUNS_IGNORE}\n"
    )
    return (".gitignore",)


def skill_names() -> list[str]:
    """The names of the bundled skills (``create-rollout``, ...)."""
    return list(_children(templates_root() / "skills", dirs=True))


def apply_template(
    name: str, start: Path | None = None, *, force: bool = False
) -> TemplateApplication:
    """Copy template ``name``'s recipe files (``rollouts/``, ``configs/``, ``data/``) into the
    workspace holding ``start`` (default: cwd). Without one, ``start`` becomes a workspace: its
    scaffold is created first. Missing agent skills are added; raises
    :class:`FileConflictError` (writing nothing) when a file differs, unless ``force``.
    """
    info = get_template(name)
    origin = (start if start is not None else Path.cwd()).expanduser().resolve()
    try:
        workspace = find_workspace(origin)
        new = False
    except WorkspaceNotFoundError:
        workspace, new = Workspace(origin), True
    node = templates_root() / name
    files = [
        (f"{folder}/{rel}", data)
        for folder in RECIPE_DIRS
        if (node / folder).is_dir()
        for rel, data in _recipe_files(node / folder)
    ]
    root = workspace.root
    to_write, unchanged = _plan(root, files, force=force)
    scaffold = [_rel(path, root) for path in fix_scaffold(root)] if new else []
    written = _write(root, to_write) + ignore_local_runs(root)
    skills = [_rel(path, root) for path in install_skills(root)]
    return TemplateApplication(
        root=root,
        files_written=written,
        files_unchanged=tuple(unchanged),
        template=info,
        scaffold_created=tuple(scaffold),
        skills_written=tuple(skills),
    )


def init_rollout(name: str, start: Path | None = None, *, force: bool = False) -> RolloutScaffold:
    """Scaffold ``rollouts/<name>/{main.py,pyproject.toml,README.md}``,
    ``configs/eval/<name>.toml`` and ``configs/training/<name>.toml`` in the workspace holding
    ``start`` (:class:`WorkspaceNotFoundError` outside one). Raises
    :class:`FileConflictError` (writing nothing) when a file differs, unless ``force``.
    """
    validate_rollout_name(name)
    workspace = find_workspace(start)
    scaffold = templates_root() / "scaffold"
    eval_config, training_config = f"configs/eval/{name}.toml", f"configs/training/{name}.toml"
    sources = [
        *((f"rollouts/{name}/{rel}", data) for rel, data in _recipe_files(scaffold / "rollout")),
        (eval_config, (scaffold / "configs" / "eval.toml").read_bytes()),
        (training_config, (scaffold / "configs" / "training.toml").read_bytes()),
    ]
    files = [(rel, data.replace(PLACEHOLDER.encode(), name.encode())) for rel, data in sources]
    to_write, unchanged = _plan(workspace.root, files, force=force)
    return RolloutScaffold(
        root=workspace.root,
        files_written=_write(workspace.root, to_write),
        files_unchanged=tuple(unchanged),
        rollout=name,
        eval_config=eval_config,
        training_config=training_config,
    )


def _rel(path: Path, root: Path) -> str:
    return path.relative_to(root).as_posix()
