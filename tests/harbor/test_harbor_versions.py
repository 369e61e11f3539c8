"""Harbor releases the extra accepts (>=0.20,<0.27): a task that needs a newer Harbor than the
installed one is refused by name before anything runs. The tier runs on 0.20 (.venv-harbor-020,
``HARBOR_VERSION=0.20.0 scripts/setup_harbor.sh``) and on the newest (.venv-harbor)."""

from __future__ import annotations

import textwrap
import tomllib
import uuid
from collections.abc import Callable
from pathlib import Path

import pytest

from osmosis_ai.rollout.backend.harbor.compat import HARBOR_SUPPORTED, check_task
from osmosis_ai.rollout.backend.harbor.errors import HarborFeatureUnsupportedError

NEWER_TASK = textwrap.dedent(
    """\
    schema_version = "1.4"

    [task]
    name = "org/newer"
    version = "2.1.0"

    [environment]
    cpus = 0.5
    """
)


def test_a_task_of_schema_1_4_is_refused_on_harbor_0_20_naming_what_it_needs(
    task_builder: Callable[..., Path],
):
    task = task_builder("newer", task_toml=NEWER_TASK)

    with pytest.raises(HarborFeatureUnsupportedError) as caught:
        check_task(task, (0, 20, 0))

    message = str(caught.value)
    assert "installed Harbor 0.20.0" in message
    assert 'task schema 1.4 (schema_version = "1.4") needs Harbor >= 0.21' in message
    assert "a task package version ([task] version) needs Harbor >= 0.21" in message
    assert "fractional CPUs ([environment] cpus = 0.5) needs Harbor >= 0.25" in message


def test_only_what_the_installed_harbor_lacks_is_named(task_builder: Callable[..., Path]):
    task = task_builder("newer", task_toml=NEWER_TASK)

    with pytest.raises(HarborFeatureUnsupportedError) as caught:
        check_task(task, (0, 24, 0))
    assert "schema 1.4" not in str(caught.value)
    assert "fractional CPUs" in str(caught.value)

    check_task(task, (0, 26, 0))  # nothing missing


def test_the_shipped_tasks_run_on_every_supported_harbor():
    tasks = sorted(Path(__file__).parents[2].glob("examples/harbor-dataset/tasks/*/task.toml"))
    assert tasks
    for task_toml in tasks:
        tomllib.loads(task_toml.read_text())
        check_task(task_toml.parent, (0, 20, 0))


@pytest.mark.harbor
def test_the_installed_harbor_is_one_the_extra_accepts():
    from osmosis_ai.rollout.backend.harbor.compat import harbor_version

    assert (0, 20) <= harbor_version()[:2] < (0, 27), (harbor_version(), HARBOR_SUPPORTED)


@pytest.mark.harbor
@pytest.mark.usefixtures("sandbox_available")
def test_the_sandbox_refuses_a_task_newer_than_the_installed_harbor(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    from harbor.models.task.task import Task
    from harbor.models.trial.paths import TrialPaths

    from osmosis_ai.rollout.backend.harbor.compat import harbor_version
    from osmosis_ai.rollout.backend.harbor.sandbox import LocalSandboxEnvironment

    if harbor_version()[:2] >= (0, 21):
        pytest.skip(f"Harbor {harbor_version()} runs the whole format; .venv-harbor-020 runs this")
    toml = 'schema_version = "1.4"\n\n[task]\nname = "org/newer"\nversion = "2.1.0"\n'
    task_dir = task_builder("newer", task_toml=toml)
    task = Task(task_dir)
    paths = TrialPaths(tmp_path / "trials" / uuid.uuid4().hex[:6])
    paths.mkdir()

    with pytest.raises(HarborFeatureUnsupportedError, match=r"needs Harbor >= 0\.21"):
        LocalSandboxEnvironment(
            environment_dir=task.paths.environment_dir,
            environment_name="newer",
            session_id=f"newer__{uuid.uuid4().hex[:6]}__env",
            trial_paths=paths,
            task_env_config=task.config.environment,
            state_dir=tmp_path / "state",
        )


def test_the_harbor_extra_pins_the_supported_range():
    pyproject = tomllib.loads((Path(__file__).parents[2] / "pyproject.toml").read_text())
    (requirement,) = pyproject["project"]["optional-dependencies"]["harbor"]
    assert requirement.startswith(f"harbor{HARBOR_SUPPORTED};"), requirement
