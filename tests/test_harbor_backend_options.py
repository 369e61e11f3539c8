"""HarborBackend's constructor checks that need no Harbor: old keywords, task modes, agent
names, queue depth, task folders, and the ImportError when Harbor itself is missing."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

from osmosis_ai.errors import MissingExtraError
from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowContext, Grader, GraderContext
from osmosis_ai.rollout.backend.harbor.options import (
    LEGACY_KEYWORDS,
    MIGRATION_GUIDE,
    HarborUnavailableError,
    TaskMode,
    check_agent_prefix,
    check_native_agent,
    harbor_available,
)


class EchoWorkflow(AgentWorkflow):
    async def run(self, ctx: AgentWorkflowContext) -> list:
        return ctx.prompt


class ZeroGrader(Grader):
    async def grade(self, ctx: GraderContext) -> None:
        ctx.set_reward(0.0)


def make_task(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    (root / "task.toml").write_text('version = "1.0"\n')
    (root / "instruction.md").write_text("do it\n")
    return root


def backend(**kwargs):
    from osmosis_ai.rollout.backend.harbor import HarborBackend

    return HarborBackend(**kwargs)


def test_importing_the_package_needs_no_harbor():
    module = importlib.import_module("osmosis_ai.rollout.backend.harbor")
    assert module.TaskMode is TaskMode
    assert "harbor" not in sys.modules or harbor_available()
    assert module.HarborBackendV2 is module.HarborBackend


@pytest.mark.parametrize("keyword", sorted(LEGACY_KEYWORDS))
def test_old_keywords_point_at_the_migration_guide(tmp_path, keyword):
    with pytest.raises(TypeError) as caught:
        backend(
            orchestrator=object(), tasks_dir=make_task(tmp_path), agent="oracle", **{keyword: 1}
        )
    message = str(caught.value)
    assert keyword in message and MIGRATION_GUIDE in message
    assert LEGACY_KEYWORDS[keyword] in message


def test_unknown_keywords_are_named(tmp_path):
    with pytest.raises(TypeError, match=r"unexpected keyword argument.*frobnicate"):
        backend(orchestrator=object(), tasks_dir=make_task(tmp_path), agent="oracle", frobnicate=1)


def test_task_mode_is_checked(tmp_path):
    with pytest.raises(ValueError, match=r"task_mode must be 'template' or 'dataset'.*'both'"):
        backend(
            orchestrator=object(), tasks_dir=make_task(tmp_path), agent="oracle", task_mode="both"
        )


@pytest.mark.parametrize("depth", [0, -1, 1.5, True, "3"])
def test_max_queue_depth_must_be_a_positive_int(tmp_path, depth):
    with pytest.raises(ValueError, match="max_queue_depth"):
        backend(
            orchestrator=object(),
            tasks_dir=make_task(tmp_path),
            agent="oracle",
            max_queue_depth=depth,
        )


SUPPORTED_AGENTS = ("terminus-2", "mini-swe-agent", "claude-code", "opencode", "oracle")


@pytest.mark.parametrize("name", SUPPORTED_AGENTS)
def test_the_supported_harbor_agents_pass_the_name_check(name):
    assert check_native_agent(name) == name


@pytest.mark.parametrize("name", ["nop", "claude", "codex", "terminus"])
def test_other_harbor_agents_are_refused(tmp_path, name):
    listed = ", ".join(SUPPORTED_AGENTS)
    with pytest.raises(ValueError, match=rf"agent='{name}'.*use one of {listed}, or"):
        backend(orchestrator=object(), tasks_dir=make_task(tmp_path), agent=name)


def test_required_arguments_are_named(tmp_path):
    with pytest.raises(ValueError, match="orchestrator is required"):
        backend(tasks_dir=make_task(tmp_path), agent="oracle")
    with pytest.raises(ValueError, match="tasks_dir is required"):
        backend(orchestrator=object(), agent="oracle")
    with pytest.raises(ValueError, match="agent is required"):
        backend(orchestrator=object(), tasks_dir=make_task(tmp_path))


def test_template_mode_needs_one_task_folder(tmp_path):
    with pytest.raises(ValueError, match="template mode needs tasks_dir to be one task folder"):
        backend(orchestrator=object(), tasks_dir=tmp_path, agent="oracle")
    with pytest.raises(ValueError, match="is not a folder"):
        backend(orchestrator=object(), tasks_dir=tmp_path / "missing", agent="oracle")


def test_a_template_task_with_a_symlink_is_refused(tmp_path):
    task = make_task(tmp_path / "task")
    (task / "link").symlink_to(tmp_path)
    with pytest.raises(ValueError, match="symlink"):
        backend(orchestrator=object(), tasks_dir=task, agent="oracle")


def test_grader_needs_a_workflow_agent(tmp_path):
    with pytest.raises(ValueError, match="grader= grades a workflow's sample"):
        backend(
            orchestrator=object(), tasks_dir=make_task(tmp_path), agent="oracle", grader=ZeroGrader
        )


def test_agent_class_must_be_a_workflow(tmp_path):
    with pytest.raises(TypeError, match="agent must be a AgentWorkflow subclass"):
        backend(orchestrator=object(), tasks_dir=make_task(tmp_path), agent=ZeroGrader)


def test_code_dir_and_bundle_are_exclusive(tmp_path):
    with pytest.raises(ValueError, match="code_dir or bundle, not both"):
        backend(
            orchestrator=object(),
            tasks_dir=make_task(tmp_path),
            agent=EchoWorkflow,
            code_dir=tmp_path,
            bundle=tmp_path / "x.whl",
        )


def test_a_config_object_must_be_importable(tmp_path):
    from osmosis_ai.rollout import AgentWorkflowConfig

    with pytest.raises(ValueError, match="workflow_config must be importable"):
        backend(
            orchestrator=object(),
            tasks_dir=make_task(tmp_path),
            agent=EchoWorkflow,
            workflow_config=AgentWorkflowConfig(name="local-only"),
        )


@pytest.mark.skipif(harbor_available(), reason="Harbor is installed in this Python")
def test_without_harbor_valid_arguments_raise_a_clear_import_error(tmp_path):
    with pytest.raises(ImportError) as caught:
        backend(
            orchestrator=object(),
            tasks_dir=make_task(tmp_path),
            agent=EchoWorkflow,
            code_dir=tmp_path,
        )
    error = caught.value
    assert isinstance(error, HarborUnavailableError) and isinstance(error, MissingExtraError)
    message = str(error)
    assert "osmosis-ai[harbor]" in message and "Python >= 3.12" in message
    assert ".".join(map(str, sys.version_info[:2])) in message


def test_agent_prefix_is_a_folder_for_an_agent_that_runs_from_one(tmp_path: Path):
    assert check_agent_prefix("claude-code", tmp_path) == str(tmp_path)
    assert check_agent_prefix("mini-swe-agent", str(tmp_path)) == str(tmp_path)
    assert check_agent_prefix("terminus-2", None) is None
    with pytest.raises(ValueError, match="applies to the native agents mini-swe-agent, claude"):
        check_agent_prefix("terminus-2", tmp_path)
    with pytest.raises(ValueError, match="is not a folder"):
        check_agent_prefix("mini-swe-agent", tmp_path / "missing")
