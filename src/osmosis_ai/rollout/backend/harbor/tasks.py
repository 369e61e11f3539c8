"""Picking and preparing the Harbor task of one rollout, without importing Harbor.

Every local task is copied per rollout (task folders holding symlinks are refused, so a task
cannot point outside itself). Template mode rewrites the copy's ``instruction.md`` with the
request's prompt; a grader becomes the copy's verifier when the task has no
``tests/test.sh``.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from osmosis_ai.errors import OsmosisError
from osmosis_ai.rollout.backend.harbor.compat import check_task
from osmosis_ai.rollout.backend.harbor.errors import HarborFeatureUnsupportedError
from osmosis_ai.rollout.container.files import GRADER_SPEC_NAME, GraderSpec

_PACKAGE = re.compile(r"^[A-Za-z0-9][\w.-]*/[\w.-]+(@[\w.:-]+)?$")
_IGNORED = shutil.ignore_patterns("__pycache__", ".DS_Store")


class TaskSelectionError(OsmosisError, ValueError):
    """The request names no usable task; the rollout fails with this message."""


@dataclass
class TaskSource:
    """Where a rollout's task comes from: a local folder, or what Harbor downloads
    (``remote``: the fields of Harbor's ``TaskConfig``)."""

    local: Path | None = None
    remote: dict[str, Any] = field(default_factory=dict)

    @property
    def label(self) -> str:
        if self.local is not None:
            return str(self.local)
        return str(self.remote.get("name") or self.remote.get("git_url") or self.remote)


def is_task_dir(path: Path) -> bool:
    return (path / "task.toml").is_file()


def find_symlink(root: Path) -> Path | None:
    """The first symlink at or under ``root`` (never following links), or ``None``."""
    if root.is_symlink():
        return root
    for current, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            candidate = Path(current) / name
            if candidate.is_symlink():
                return candidate
    return None


def check_task_dir(path: Path) -> Path:
    """``path`` when it is a task folder without symlinks whose features the installed Harbor
    runs, else :class:`TaskSelectionError`."""
    if not path.is_dir() or not is_task_dir(path):
        raise TaskSelectionError(f"{path} is not a Harbor task folder (no task.toml)")
    link = find_symlink(path)
    if link is not None:
        raise TaskSelectionError(
            f"task folder {path} contains a symlink ({link}); task folders may not contain "
            "symlinks: copy the file in instead"
        )
    try:
        check_task(path)
    except HarborFeatureUnsupportedError as exc:
        raise TaskSelectionError(str(exc)) from None
    return path


def dataset_task(tasks_dir: Path, task_id: object) -> Path:
    """The folder ``tasks_dir/<task_id>``; ids that escape ``tasks_dir`` are refused."""
    if not isinstance(task_id, str) or not task_id.strip():
        raise TaskSelectionError(
            f"unknown harbor task id {task_id!r}: dataset mode needs "
            'metadata["harbor_task_id"] naming a folder under the tasks dir'
        )
    root = tasks_dir.resolve()
    candidate = tasks_dir / task_id
    resolved = candidate.resolve()
    if resolved == root or root not in resolved.parents or candidate.is_symlink():
        raise TaskSelectionError(
            f"unknown harbor task id {task_id!r}: it does not name a folder inside {tasks_dir}"
        )
    if not is_task_dir(resolved):
        raise TaskSelectionError(f"unknown harbor task id {task_id!r}: no task.toml in {resolved}")
    return check_task_dir(resolved)


def override_source(metadata: dict[str, Any]) -> TaskSource | None:
    """The task ``metadata["harbor_task"]`` names: a local path (``./``, ``/``, ``~``), a
    git task (with ``metadata["git_url"]``) or a registry package ``org/name[@ref]``."""
    spec = metadata.get("harbor_task")
    if spec is None:
        return None
    if not isinstance(spec, str) or not spec.strip():
        raise TaskSelectionError(
            f'metadata["harbor_task"] must be a non-empty string, got {spec!r}'
        )
    git_url = metadata.get("git_url")
    if git_url is not None:
        remote: dict[str, Any] = {"path": spec, "git_url": str(git_url)}
        commit = metadata.get("git_commit_id")
        if commit:
            remote["git_commit_id"] = str(commit)
        return TaskSource(remote=remote)
    if spec.startswith(("./", "/", "~", "../")):
        return TaskSource(local=check_task_dir(Path(spec).expanduser().resolve()))
    if _PACKAGE.match(spec):
        name, _, ref = spec.partition("@")
        return TaskSource(remote={"name": name, "ref": ref or None})
    raise TaskSelectionError(
        f'metadata["harbor_task"]={spec!r} is neither a local path (./, /, ~), a registry '
        'package "org/name[@ref]", nor a git task (add metadata["git_url"])'
    )


def copy_task(source: Path, dest: Path) -> Path:
    """Copy the task folder ``source`` to ``dest`` (which must not exist)."""
    check_task_dir(source)
    shutil.copytree(source, dest, symlinks=True, ignore=_IGNORED)
    return dest


def write_instruction(task: Path, prompt: list[dict[str, Any]]) -> None:
    """Template mode: the request's messages, as JSON, become the task's instruction."""
    (task / "instruction.md").write_text(json.dumps(prompt, ensure_ascii=False), encoding="utf-8")


def has_tests(task: Path) -> bool:
    return (task / "tests" / "test.sh").is_file()


def install_grader_verifier(task: Path, spec: GraderSpec, python: str) -> None:
    """Make the runner's ``grade`` command the task's verifier (``tests/test.sh``)."""
    tests = task / "tests"
    tests.mkdir(exist_ok=True)
    (tests / GRADER_SPEC_NAME).write_text(spec.model_dump_json(), encoding="utf-8")
    path = ":".join(shlex.quote(entry) for entry in spec.python_path)
    script = (
        "#!/bin/sh\n"
        "# Generated by HarborBackend: the rollout's Grader is this task's verifier.\n"
        "mkdir -p /logs/verifier\n"
        f"PYTHONPATH={path}${{PYTHONPATH:+:$PYTHONPATH}} exec {shlex.quote(python)} "
        "-m osmosis_ai.rollout.container.runner grade\n"
    )
    test_sh = tests / "test.sh"
    test_sh.write_text(script, encoding="utf-8")
    test_sh.chmod(0o755)


def network_modes(task: Path) -> tuple[str, str]:
    """``(environment, agent phase)`` network modes of a task (``public`` when unset)."""
    try:
        data = tomllib.loads((task / "task.toml").read_text(encoding="utf-8"))
    except (OSError, tomllib.TOMLDecodeError):
        return "public", "public"
    env_section = data.get("environment")
    agent_section = data.get("agent")
    env_mode = "public"
    if isinstance(env_section, dict):
        env_mode = str(env_section.get("network_mode") or env_mode)  # type: ignore[union-attr]
    agent_mode = env_mode
    if isinstance(agent_section, dict):
        agent_mode = str(agent_section.get("network_mode") or env_mode)  # type: ignore[union-attr]
    return env_mode, agent_mode


def patch_dockerfile(task: Path, python_path: list[str], sdk_dir: Path, stage: str) -> bool:
    """Copy the SDK core into the task's build context and append the lines that put it
    (and the user's code folders) on ``PYTHONPATH``; ``False`` when there is no
    Dockerfile to patch."""
    dockerfile = task / "environment" / "Dockerfile"
    if not dockerfile.is_file():
        return False
    context = task / "environment" / stage
    shutil.copytree(sdk_dir, context / "osmosis_ai", ignore=_IGNORED, dirs_exist_ok=True)
    entries = ":".join(["/opt/osmosis/sdk", *python_path])
    lines = (
        "\n# Added by HarborBackend: the osmosis-ai SDK core for the in-task runner.\n"
        f"COPY {stage}/ /opt/osmosis/sdk/\n"
        "RUN python3 -m pip install --no-cache-dir 'pydantic>=2.7,<3' 'httpx>=0.27,<1' "
        "|| true\n"
        f"ENV PYTHONPATH={entries}\n"
    )
    with dockerfile.open("a", encoding="utf-8") as handle:
        handle.write(lines)
    return True
