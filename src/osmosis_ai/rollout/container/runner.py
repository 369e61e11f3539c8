"""The in-environment runner: ``python -m osmosis_ai.rollout.container.runner agent|grade``.

``agent`` reads ``container_input.json`` from the agent logs folder, runs the workflow inside
a :class:`RolloutContext` bound to the rollout's model endpoint and writes
``container_result.json``; it exits 0 whenever it could write that file, so the backend reads
the workflow's outcome from the file and not from an exit code. ``grade`` runs the grader on
the agent's sample, as the task's verifier, and writes ``reward.json``; when it cannot
grade it writes ``grader_error.txt``, no reward, and exits 1.
"""

from __future__ import annotations

import asyncio
import copy
import json
import sys
import traceback
from pathlib import Path
from typing import Any

from osmosis_ai.rollout.agent_workflow import AgentWorkflow
from osmosis_ai.rollout.container.files import (
    AGENT_DIR,
    ARTIFACTS_DIR,
    ENV_AGENT_DIR,
    ENV_ARTIFACTS_DIR,
    ENV_TESTS_DIR,
    ENV_VERIFIER_DIR,
    GRADED_SAMPLE_NAME,
    GRADER_ERROR_NAME,
    GRADER_SPEC_NAME,
    INPUT_NAME,
    RESULT_NAME,
    REWARD_JSON_NAME,
    TESTS_DIR,
    VERIFIER_DIR,
    ContainerInput,
    ContainerResult,
    GraderSpec,
    env_dir,
    write_json_atomic,
)
from osmosis_ai.rollout.context import AgentWorkflowContext, GraderContext, RolloutContext
from osmosis_ai.rollout.grader import Grader
from osmosis_ai.rollout.imports import resolve_object
from osmosis_ai.rollout.output import coerce_output
from osmosis_ai.rollout.sample import RolloutSample
from osmosis_ai.rollout.status import RolloutStatus, categorize_exception

USAGE = "usage: python -m osmosis_ai.rollout.container.runner agent|grade"


def sample_to_json(sample: RolloutSample) -> dict[str, Any]:
    """A JSON object of ``sample`` (values JSON cannot hold become strings)."""
    dumped = sample.json_safe_copy().model_dump()
    return json.loads(json.dumps(dumped, default=str))


def _extend_path(entries: list[str]) -> None:
    for entry in reversed(entries):
        if entry and entry not in sys.path:
            sys.path.insert(0, entry)


def _artifacts_dir() -> Path | None:
    target = env_dir(ENV_ARTIFACTS_DIR, ARTIFACTS_DIR)
    try:
        target.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    return target


def _load_config(path: str | None) -> Any:
    return None if path is None else copy.deepcopy(resolve_object(path))


async def run_workflow(spec: ContainerInput) -> ContainerResult:
    """Run the workflow ``spec`` names; every failure becomes a FAILURE result."""
    try:
        _extend_path(spec.python_path)
        workflow_cls = resolve_object(spec.workflow)
        if not (isinstance(workflow_cls, type) and issubclass(workflow_cls, AgentWorkflow)):
            raise TypeError(f"{spec.workflow!r} is not an AgentWorkflow subclass")
        config = _load_config(spec.workflow_config)
        workflow = workflow_cls(config)
        with RolloutContext(
            chat_completions_url=spec.chat_completions_url,
            api_key=spec.api_key,
            rollout_id=spec.rollout_id,
        ) as rctx:
            ctx: AgentWorkflowContext[Any] = AgentWorkflowContext(
                prompt=copy.deepcopy(spec.prompt),
                config=config,
                metadata=copy.deepcopy(spec.metadata),
                artifacts_dir=_artifacts_dir(),
            )
            output = coerce_output(await workflow.run(ctx))
            if output is None:
                sample = await rctx.get_sample()
            elif output.messages is None:
                sample = None
            else:
                sample = RolloutSample(messages=output.messages, metrics=output.metrics)
        return ContainerResult(
            status=RolloutStatus.SUCCESS.value,
            output=None if output is None else {"metrics": output.metrics},
            sample=None if sample is None else sample_to_json(sample),
        )
    except Exception as exc:
        traceback.print_exc()
        return ContainerResult(
            status=RolloutStatus.FAILURE.value,
            err_message=str(exc) or type(exc).__name__,
            err_category=categorize_exception(exc).value,
        )


async def grade_sample(spec: GraderSpec, result: ContainerResult) -> RolloutSample:
    """Grade the agent's sample with the grader ``spec`` names; the graded sample.

    Raises ``ValueError`` when there is nothing to grade or the grader set no reward."""
    if result.status != RolloutStatus.SUCCESS.value:
        raise ValueError(f"the workflow failed, nothing to grade: {result.err_message}")
    if result.sample is None:
        raise ValueError(
            "the workflow produced no sample: return messages from run() or register a "
            "sample source"
        )
    _extend_path(spec.python_path)
    grader_cls = resolve_object(spec.grader)
    if not (isinstance(grader_cls, type) and issubclass(grader_cls, Grader)):
        raise TypeError(f"{spec.grader!r} is not a Grader subclass")
    sample = RolloutSample.model_validate(result.sample)
    sample.label = spec.label
    grader = grader_cls(_load_config(spec.grader_config))
    ctx = GraderContext(
        label=spec.label,
        sample=sample,
        metadata=copy.deepcopy(spec.metadata),
        artifacts_dir=_artifacts_dir(),
    )
    await grader.grade(ctx)
    if sample.reward is None and not sample.remove_sample:
        raise ValueError("Sample has no reward after grading: call ctx.set_reward(x) in grade()")
    return sample


def _agent_main() -> int:
    agent_dir = env_dir(ENV_AGENT_DIR, AGENT_DIR)
    try:
        spec = ContainerInput.model_validate_json((agent_dir / INPUT_NAME).read_bytes())
    except Exception as exc:
        result = ContainerResult(
            status=RolloutStatus.FAILURE.value,
            err_message=f"cannot read {INPUT_NAME}: {exc}",
            err_category="validation_error",
        )
    else:
        result = asyncio.run(run_workflow(spec))
    write_json_atomic(agent_dir / RESULT_NAME, result.model_dump())
    return 0


def _grade_main() -> int:
    agent_dir = env_dir(ENV_AGENT_DIR, AGENT_DIR)
    verifier_dir = env_dir(ENV_VERIFIER_DIR, VERIFIER_DIR)
    tests_dir = env_dir(ENV_TESTS_DIR, TESTS_DIR)
    verifier_dir.mkdir(parents=True, exist_ok=True)
    try:
        spec = GraderSpec.model_validate_json((tests_dir / GRADER_SPEC_NAME).read_bytes())
        result_path = agent_dir / RESULT_NAME
        if not result_path.is_file():
            raise ValueError(f"no {RESULT_NAME}: the workflow runner did not finish")
        result = ContainerResult.model_validate_json(result_path.read_bytes())
        graded = asyncio.run(grade_sample(spec, result))
    except Exception as exc:
        traceback.print_exc()
        (verifier_dir / GRADER_ERROR_NAME).write_text(
            f"{type(exc).__name__}: {exc}\n", encoding="utf-8"
        )
        return 1
    write_json_atomic(verifier_dir / GRADED_SAMPLE_NAME, sample_to_json(graded))
    reward = graded.reward if graded.reward is not None else 0.0
    write_json_atomic(verifier_dir / REWARD_JSON_NAME, {"reward": reward})
    return 0


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if args == ["agent"]:
        return _agent_main()
    if args == ["grade"]:
        return _grade_main()
    print(USAGE, file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
