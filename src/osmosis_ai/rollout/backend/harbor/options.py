"""What ``HarborBackend`` accepts, checked without importing Harbor: task modes, agent
names, the keywords of older releases, and the check that Harbor itself is installed."""

from __future__ import annotations

import importlib.util
import os
import sys
from enum import StrEnum
from typing import Any

from osmosis_ai.errors import MissingExtraError

MIGRATION_GUIDE = "https://docs.osmosis.ai/migration-guides/v0-3"

NATIVE_AGENTS = ("terminus-2", "mini-swe-agent", "claude-code", "opencode", "oracle")
"""Harbor's own agents a rollout may use; any other name without a ``:`` is refused."""

PREFIX_COMMANDS = {"mini-swe-agent": "mini-swe-agent", "claude-code": "claude"}
"""The native agents that can run from a host install prefix (``agent_prefix``), each with
the program Harbor's class runs."""

UNTRAINABLE_AGENTS = frozenset({"oracle"})

LEGACY_KEYWORDS: dict[str, str] = {
    "task_dir": "tasks_dir",
    "user_code_dir": "code_dir",
    "workflow": "agent",
    "custom_tests_dir": "a tests/test.sh in the task, or grader=",
    "prebuild_local_image": "prewarm()",
    "symlink_environment": "nothing (task folders are copied, never linked)",
    "_sdk_source_dir": "patch_dockerfile_with_sdk",
}
"""Keywords of the 0.2 constructor, each with what replaced it."""


class TaskMode(StrEnum):
    """How a request picks its Harbor task.

    ``template``: every rollout runs the one task in ``tasks_dir`` with the request's
    prompt as its instruction. ``dataset``: ``metadata["harbor_task_id"]`` picks a task
    folder under ``tasks_dir``, which keeps its own instruction and verifier.
    """

    TEMPLATE = "template"
    DATASET = "dataset"


class HarborUnavailableError(MissingExtraError):
    """Harbor is not installed (or this Python is older than Harbor needs)."""

    def __init__(self, missing: str | None = None) -> None:
        super().__init__("harbor", "HarborBackend", missing)
        running = ".".join(str(part) for part in sys.version_info[:3])
        message = (
            "HarborBackend needs the 'harbor' extra, which needs Python >= 3.12 (this is "
            f'Python {running}): run pip install "osmosis-ai[harbor]" under Python 3.12+'
        )
        if missing:
            message += f" (module {missing!r} not found)"
        self.args = (message,)
        self.msg = message  # what ImportError's str() shows


def harbor_available() -> bool:
    """Whether Harbor can be imported here."""
    return sys.version_info >= (3, 12) and importlib.util.find_spec("harbor") is not None


def require_harbor() -> None:
    """Raise :class:`HarborUnavailableError` unless Harbor can be imported."""
    if not harbor_available():
        raise HarborUnavailableError("harbor")


def reject_legacy_keywords(extra: dict[str, Any]) -> None:
    """``TypeError`` for keywords this constructor does not take, naming their successors."""
    if not extra:
        return
    legacy = [name for name in extra if name in LEGACY_KEYWORDS]
    if legacy:
        hints = "; ".join(f"{name} -> {LEGACY_KEYWORDS[name]}" for name in legacy)
        raise TypeError(
            f"HarborBackend no longer takes {', '.join(legacy)} (removed in 0.3: {hints}). "
            f"See the v0.2 -> v0.3 migration guide: {MIGRATION_GUIDE}"
        )
    raise TypeError(f"HarborBackend got unexpected keyword argument(s): {', '.join(sorted(extra))}")


def parse_task_mode(value: TaskMode | str) -> TaskMode:
    """``value`` as a :class:`TaskMode`, or ``ValueError`` naming the accepted values."""
    try:
        return TaskMode(value)
    except ValueError:
        raise ValueError(
            f"task_mode must be 'template' or 'dataset' (or a TaskMode), got {value!r}"
        ) from None


def check_native_agent(name: str) -> str:
    """``name`` when it is a native agent we can wire to the rollout's model endpoint."""
    if name not in NATIVE_AGENTS:
        raise ValueError(
            f"agent={name!r} is not a Harbor agent HarborBackend can run: use one of "
            f"{', '.join(NATIVE_AGENTS)}, or an AgentWorkflow subclass (or its "
            "'module:Class' path) to run your own workflow in the task environment"
        )
    return name


def check_queue_depth(value: object) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"max_queue_depth must be an int >= 1 or None, got {value!r}")
    return value


def check_timeout(name: str, value: object) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
        raise ValueError(f"{name} must be a positive number of seconds or None, got {value!r}")
    return float(value)


def check_agent_prefix(agent: str | None, prefix: object) -> str | None:
    """``prefix`` as an absolute folder path for an agent that can run from one, or
    ``ValueError`` naming what is wrong."""
    if prefix is None:
        return None
    if agent not in PREFIX_COMMANDS:
        raise ValueError(
            f"agent_prefix applies to the native agents {', '.join(PREFIX_COMMANDS)}, "
            f"not agent={agent!r}"
        )
    path = os.path.abspath(os.path.expanduser(os.fspath(prefix)))  # type: ignore[arg-type]
    if not os.path.isdir(path):
        raise ValueError(f"agent_prefix {path} is not a folder (the {agent} install prefix)")
    return path
