"""The in-environment runner on the host: ``agent`` runs a workflow from container_input.json
and writes container_result.json; ``grade`` grades it from osmosis_grader.json and writes
reward.json, or grader_error.txt and no reward."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from osmosis_ai.rollout.container.files import ContainerInput, GraderSpec

MODULE = textwrap.dedent(
    """
    from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowConfig, Grader, GraderConfig

    CONFIG = AgentWorkflowConfig(name="echo", suffix="!")
    GRADER_CONFIG = GraderConfig(name="exact")


    class Echo(AgentWorkflow):
        async def run(self, ctx):
            if ctx.metadata and ctx.metadata.get("fail"):
                raise ValueError("asked to fail")
            if ctx.artifacts_dir:
                (ctx.artifacts_dir / "seen.txt").write_text(ctx.prompt[-1]["content"])
            reply = ctx.prompt[-1]["content"] + self.config.suffix
            return [*ctx.prompt, {"role": "assistant", "content": reply}]


    class Exact(Grader):
        async def grade(self, ctx):
            if ctx.label == "none":
                return
            ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)
    """
)


@pytest.fixture
def dirs(tmp_path: Path) -> dict[str, Path]:
    code = tmp_path / "code"
    code.mkdir()
    (code / "echo_flow.py").write_text(MODULE)
    return {name: tmp_path / name for name in ("code", "agent", "verifier", "tests", "artifacts")}


def runner(mode: str, dirs: dict[str, Path]) -> subprocess.CompletedProcess[str]:
    env = {
        "OSMOSIS_CONTAINER_AGENT_DIR": str(dirs["agent"]),
        "OSMOSIS_CONTAINER_VERIFIER_DIR": str(dirs["verifier"]),
        "OSMOSIS_CONTAINER_TESTS_DIR": str(dirs["tests"]),
        "OSMOSIS_CONTAINER_ARTIFACTS_DIR": str(dirs["artifacts"]),
        "PATH": "/usr/bin:/bin",
    }
    return subprocess.run(
        [sys.executable, "-m", "osmosis_ai.rollout.container.runner", mode],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def write_input(dirs: dict[str, Path], **metadata: object) -> None:
    dirs["agent"].mkdir(exist_ok=True)
    spec = ContainerInput(
        rollout_id="r1",
        prompt=[{"role": "user", "content": "hi"}],
        metadata=metadata or None,
        workflow="echo_flow:Echo",
        workflow_config="echo_flow:CONFIG",
        python_path=[str(dirs["code"])],
    )
    (dirs["agent"] / "container_input.json").write_text(spec.model_dump_json())


def write_grader(dirs: dict[str, Path], label: str) -> None:
    dirs["tests"].mkdir(exist_ok=True)
    spec = GraderSpec(
        grader="echo_flow:Exact",
        grader_config="echo_flow:GRADER_CONFIG",
        label=label,
        python_path=[str(dirs["code"])],
    )
    (dirs["tests"] / "osmosis_grader.json").write_text(spec.model_dump_json())


def test_agent_then_grade_writes_the_result_and_the_reward(dirs):
    write_input(dirs)
    assert runner("agent", dirs).returncode == 0
    result = json.loads((dirs["agent"] / "container_result.json").read_text())
    assert result["status"] == "success"
    assert result["sample"]["messages"][-1] == {"role": "assistant", "content": "hi!"}
    assert (dirs["artifacts"] / "seen.txt").read_text() == "hi"
    write_grader(dirs, "hi!")
    done = runner("grade", dirs)
    assert done.returncode == 0, done.stderr
    assert json.loads((dirs["verifier"] / "reward.json").read_text()) == {"reward": 1.0}
    graded = json.loads((dirs["verifier"] / "graded_sample.json").read_text())
    assert graded["label"] == "hi!" and graded["reward"] == 1.0


def test_a_failing_workflow_is_reported_in_the_result_and_not_graded(dirs):
    write_input(dirs, fail=True)
    assert runner("agent", dirs).returncode == 0
    result = json.loads((dirs["agent"] / "container_result.json").read_text())
    assert result["status"] == "failure"
    assert result["err_message"] == "asked to fail"
    assert result["err_category"] == "validation_error"
    write_grader(dirs, "hi!")
    assert runner("grade", dirs).returncode == 1
    assert not (dirs["verifier"] / "reward.json").exists()
    assert "the workflow failed" in (dirs["verifier"] / "grader_error.txt").read_text()


def test_a_grader_that_sets_no_reward_writes_no_reward(dirs):
    write_input(dirs)
    runner("agent", dirs)
    write_grader(dirs, "none")
    assert runner("grade", dirs).returncode == 1
    assert not (dirs["verifier"] / "reward.json").exists()
    assert "no reward" in (dirs["verifier"] / "grader_error.txt").read_text()


def test_a_missing_input_is_a_failure_result(dirs):
    dirs["agent"].mkdir()
    assert runner("agent", dirs).returncode == 0
    result = json.loads((dirs["agent"] / "container_result.json").read_text())
    assert result["status"] == "failure" and "container_input.json" in result["err_message"]
    assert runner("bogus", dirs).returncode == 2
