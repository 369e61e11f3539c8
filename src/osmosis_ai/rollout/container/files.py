"""The file contract between a backend on the host and the in-environment runner.

The backend writes ``container_input.json`` into ``/logs/agent``; the runner runs the
workflow and writes ``container_result.json`` beside it. For grading, the backend places
``osmosis_grader.json`` (grader, its config and the label, which the agent never sees) in the
task's tests folder; the runner grades the agent's sample and writes the reward to
``/logs/verifier/reward.json`` as ``{"reward": x}``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path, PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from osmosis_ai.rundir.durable import atomic_write_bytes

VERSION = 1
AGENT_DIR = PurePosixPath("/logs/agent")
VERIFIER_DIR = PurePosixPath("/logs/verifier")
ARTIFACTS_DIR = PurePosixPath("/logs/artifacts")
TESTS_DIR = PurePosixPath("/tests")
INPUT_NAME = "container_input.json"
RESULT_NAME = "container_result.json"
GRADER_SPEC_NAME = "osmosis_grader.json"
GRADED_SAMPLE_NAME = "graded_sample.json"
REWARD_JSON_NAME = "reward.json"
GRADER_ERROR_NAME = "grader_error.txt"

ENV_AGENT_DIR = "OSMOSIS_CONTAINER_AGENT_DIR"
ENV_VERIFIER_DIR = "OSMOSIS_CONTAINER_VERIFIER_DIR"
ENV_TESTS_DIR = "OSMOSIS_CONTAINER_TESTS_DIR"
ENV_ARTIFACTS_DIR = "OSMOSIS_CONTAINER_ARTIFACTS_DIR"


class ContainerInput(BaseModel):
    """What the runner needs to run one workflow. ``label`` is withheld (``None``) here: the
    label travels only to the grader, in :class:`GraderSpec`."""

    model_config = ConfigDict(extra="forbid")

    version: int = VERSION
    rollout_id: str
    prompt: list[dict[str, Any]]
    label: str | None = None
    metadata: dict[str, Any] | None = None
    chat_completions_url: str = ""
    api_key: str | None = None
    workflow: str
    workflow_config: str | None = None
    python_path: list[str] = Field(default_factory=list)


class ContainerResult(BaseModel):
    """What the runner reports: ``status`` is ``success`` or ``failure``; ``sample`` is the
    sample as a JSON object (``RolloutSample.model_dump``) or ``None``."""

    model_config = ConfigDict(extra="forbid")

    version: int = VERSION
    status: str
    output: dict[str, Any] | None = None
    sample: dict[str, Any] | None = None
    err_message: str | None = None
    err_category: str | None = None


class GraderSpec(BaseModel):
    """What the grading runner needs besides the agent's result."""

    model_config = ConfigDict(extra="forbid")

    version: int = VERSION
    grader: str
    grader_config: str | None = None
    label: str | None = None
    metadata: dict[str, Any] | None = None
    python_path: list[str] = Field(default_factory=list)


def env_dir(name: str, default: PurePosixPath) -> Path:
    """A fixed in-environment folder, overridable by ``name`` (for running the runner on a
    host, as tests do)."""
    return Path(os.environ.get(name) or str(default))


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Write ``data`` as JSON to ``path``, whole or not at all (the run-directory policy of
    :func:`~osmosis_ai.rundir.durable.atomic_write_bytes`)."""
    atomic_write_bytes(path, json.dumps(data).encode("utf-8"))
