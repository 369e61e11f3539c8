"""The rest of the task format in the bubblewrap sandbox, each part a small fixture task
(tests/harbor/fixtures/tasks) run as a Harbor trial with the oracle agent: multi-step tasks,
a separate verifier environment (built from tests/Dockerfile, fed the task's artifacts),
healthchecks that pass and fail, per-task artifacts."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from harbor_support import harbor_missing_reason

if _reason := harbor_missing_reason():
    pytest.skip(_reason, allow_module_level=True)

from osmosis_ai.rollout.backend.harbor.sandbox import SANDBOX_IMPORT_PATH

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

FIXTURES = Path(__file__).parent / "fixtures" / "tasks"


async def run_trial(task: str, tmp_path: Path) -> Any:
    from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
    from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
    from harbor.trial.trial import Trial

    config = TrialConfig(
        task=TaskConfig(path=FIXTURES / task),
        agent=AgentConfig(name="oracle"),
        environment=TrialEnvironmentConfig(
            import_path=SANDBOX_IMPORT_PATH, kwargs={"state_dir": str(tmp_path / "state")}
        ),
        trials_dir=tmp_path / "trials",
    )
    result = await (await Trial.create(config)).run()
    assert list((tmp_path / "state").iterdir()) == [], "a sandbox was left behind"
    return result


async def test_a_multi_step_task_runs_each_step_and_grades_it(tmp_path: Path):
    result = await run_trial("multi-step", tmp_path)

    assert result.exception_info is None, result.exception_info
    steps = {step.step_name: step.verifier_result.rewards for step in result.step_results}
    assert steps == {"one": {"reward": 1.0}, "two": {"reward": 1.0}}
    assert result.verifier_result.rewards == {"reward": 1.0}


async def test_a_separate_verifier_environment_gets_the_artifacts_only(tmp_path: Path):
    """The verifier runs in a sandbox of its own built from tests/Dockerfile: it sees the
    task's declared artifact (/app/answer.txt) and nothing else the agent left."""
    result = await run_trial("separate-verifier", tmp_path)

    assert result.exception_info is None, result.exception_info
    assert result.verifier_result.rewards == {"reward": 1.0}
    (trial,) = (tmp_path / "trials").iterdir()
    assert (trial / "artifacts" / "app" / "answer.txt").read_text().strip() == "42"


async def test_a_passing_healthcheck_lets_the_trial_run(tmp_path: Path):
    result = await run_trial("healthcheck-passes", tmp_path)

    assert result.exception_info is None, result.exception_info
    assert result.verifier_result.rewards == {"reward": 1.0}


async def test_a_failing_healthcheck_fails_the_trial_before_the_agent(tmp_path: Path):
    result = await run_trial("healthcheck-fails", tmp_path)

    assert result.exception_info is not None
    assert result.exception_info.exception_type == "HealthcheckError"
    assert "test -f /app/never" in result.exception_info.exception_message
    assert result.verifier_result is None
