"""The Harbor releases the ``harbor`` extra accepts (``>=0.20,<0.27``) and what each can run.

Every release in that range runs the task format's core: per-phase network policies,
multi-step tasks, a separate verifier environment, healthchecks and per-task artifacts.
Later parts of the format arrived in later releases; a task that uses one on an older Harbor
is refused by name before anything runs (an older Harbor would drop the setting silently, or
fail on it deep inside a trial), with :class:`HarborFeatureUnsupportedError` naming the
feature and the release it needs.
"""

from __future__ import annotations

import functools
import importlib.metadata
import tomllib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.backend.harbor.errors import HarborFeatureUnsupportedError

__all__ = ["FEATURES", "HARBOR_SUPPORTED", "Feature", "check_task", "harbor_version"]

HARBOR_SUPPORTED = ">=0.20,<0.27"


@dataclass(frozen=True)
class Feature:
    """A part of the task format: its name, the first Harbor that runs it, and whether a
    parsed ``task.toml`` uses it."""

    name: str
    since: tuple[int, int]
    used_by: Callable[[dict[str, Any]], bool]


def _section(config: dict[str, Any], name: str) -> dict[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}  # pyright: ignore[reportUnknownVariableType]


def _schema(config: dict[str, Any]) -> tuple[int, ...]:
    # ``version`` at the top is the older spelling of ``schema_version``
    text = str(config.get("schema_version") or config.get("version") or "1.0")
    try:
        return tuple(int(part) for part in text.split("."))
    except ValueError:
        return (1, 0)


def _fractional_cpus(config: dict[str, Any]) -> bool:
    environments = [
        _section(config, "environment"),
        _section(_section(config, "verifier"), "environment"),
    ]
    for step in config.get("steps") or []:
        if isinstance(step, dict):
            environments.append(_section(step, "environment"))  # pyright: ignore[reportUnknownArgumentType]
    return any(
        isinstance(env.get("cpus"), float) and not float(env["cpus"]).is_integer()
        for env in environments
    )


def _mcp_headers(config: dict[str, Any]) -> bool:
    servers = _section(config, "environment").get("mcp_servers") or []
    return any(isinstance(server, dict) and server.get("headers") for server in servers)  # pyright: ignore[reportUnknownMemberType]


FEATURES: tuple[Feature, ...] = (
    Feature('task schema 1.4 (schema_version = "1.4")', (0, 21), lambda c: _schema(c) >= (1, 4)),
    Feature(
        "a task package version ([task] version)",
        (0, 21),
        lambda c: "version" in _section(c, "task"),
    ),
    Feature("fractional CPUs ([environment] cpus = 0.5)", (0, 25), _fractional_cpus),
    Feature("MCP server headers ([[environment.mcp_servers]] headers)", (0, 25), _mcp_headers),
)


@functools.cache
def harbor_version() -> tuple[int, int, int]:
    """The installed Harbor's version, ``(major, minor, patch)``."""
    text = importlib.metadata.version("harbor")
    parts = [int("".join(ch for ch in part if ch.isdigit()) or 0) for part in text.split(".")[:3]]
    major, minor, patch = [*parts, 0, 0, 0][:3]
    return major, minor, patch


def check_task(task_dir: Path, version: tuple[int, int, int] | None = None) -> None:
    """Refuse the task at ``task_dir`` when it uses a feature the installed Harbor (or
    ``version``) lacks; a task.toml that does not parse is left to Harbor to report."""
    try:
        config = tomllib.loads((task_dir / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return
    if version is None:
        try:
            version = harbor_version()
        except importlib.metadata.PackageNotFoundError:
            # No Harbor here: the backend refuses to start naming the extra
            # (HarborUnavailableError), which says more than a version check could.
            return
    installed = version
    missing = [f for f in FEATURES if installed[:2] < f.since and f.used_by(config)]
    if missing:
        have = ".".join(map(str, installed))
        needs = "; ".join(f"{f.name} needs Harbor >= {f.since[0]}.{f.since[1]}" for f in missing)
        raise HarborFeatureUnsupportedError(
            f"task {task_dir.name} cannot run on the installed Harbor {have}: {needs}. "
            f"Upgrade Harbor (the harbor extra accepts {HARBOR_SUPPORTED})"
        )
