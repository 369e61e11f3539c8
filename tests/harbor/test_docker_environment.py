"""The Docker tier: Harbor's own ``docker`` environment, with no registry pulls.

``scripts/docker_tier.sh`` makes a Docker engine answer (installing Debian's docker.io and
starting dockerd where it can) or says why none can; these tests skip with that reason. The
base image is imported from a tarball of the host's files (the system Python, the shared
libraries it loads, the SDK runner's dependencies), so no image is pulled. A Harbor trial
then runs on Harbor's ``docker`` environment with the SDK patched into the task's image and
the workflow track; Harbor drives it with ``docker compose`` (Compose V2), so that test also
needs the Compose plugin.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import tarfile
import textwrap
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.rollout.execution import ExecutionRequest
from osmosis_ai.rollout.status import RolloutStatus

pytestmark = [pytest.mark.harbor, pytest.mark.docker, pytest.mark.usefixtures("harbor_available")]

REPO = Path(__file__).resolve().parents[2]
BASE_IMAGE = "osmosis-harbor-base:test"
HOST_PYTHON = Path("/usr/bin/python3.11")
TOOLS = ("bash", "dash", "sh", "cat", "ls", "mkdir", "rm", "cp", "mv", "chmod", "echo",
         "env", "sleep", "tar", "true", "grep", "sed", "test", "tee", "id", "uname")  # fmt: skip
# What the SDK's in-environment runner imports beside the standard library.
RUNNER_PACKAGES = ("pydantic", "pydantic_core", "typing_extensions.py", "annotated_types",
                   "typing_inspection", "httpx", "httpcore", "anyio", "idna", "certifi",
                   "h11", "sniffio")  # fmt: skip
TRAINER_SITE = REPO / ".venv" / "lib" / "python3.11" / "site-packages"


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """``DOCKER_HOST`` of an engine that answers, started by the tier's script if need be.

    Only the tests that ask for :func:`docker_host` see it: set for the whole session it
    would make every later test's default environment Harbor's docker.
    """
    state = tmp_path_factory.mktemp("docker-tier")
    script = REPO / "scripts" / "docker_tier.sh"
    started = subprocess.run(
        [str(script), "start", str(state)], capture_output=True, text=True, check=False
    )
    line = (started.stdout.strip().splitlines() or [started.stderr.strip()])[-1]
    if started.returncode != 0 or not line.startswith("ready "):
        pytest.skip(f"no Docker engine: {line}")
    try:
        yield line.split(" ", 1)[1]
    finally:
        subprocess.run([str(script), "stop", str(state)], check=False)


@pytest.fixture
def docker_host(docker_engine: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The tier's engine as this test's ``DOCKER_HOST``; the environment probe is asked
    afresh inside the test and after it."""
    from osmosis_ai.rollout.backend.harbor import sandbox

    monkeypatch.setenv("DOCKER_HOST", docker_engine)
    sandbox._docker_checked.clear()
    yield docker_engine
    sandbox._docker_checked.clear()


def docker(*args: str, host: str, **kwargs: Any) -> subprocess.CompletedProcess[Any]:
    return subprocess.run(
        ["docker", *args],
        env={**os.environ, "DOCKER_HOST": host},
        capture_output=True,
        check=False,
        **kwargs,
    )


def shared_libraries(paths: list[Path]) -> set[Path]:
    found: set[Path] = set()
    for path in paths:
        out = subprocess.run(["ldd", str(path)], capture_output=True, text=True, check=False)
        for match in re.finditer(r"(/\S+) \(0x", out.stdout):
            found.add(Path(match.group(1)))
    return found


def rootfs_tarball() -> bytes:
    """A minimal root filesystem from the host: merged-/usr links, a few tools, the system
    Python with its standard library, the runner's packages, and every library they load."""
    import shutil

    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:

        def add_dir(name: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.mode = tarfile.DIRTYPE, 0o1777 if name == "tmp" else 0o755
            archive.addfile(info)

        def add_link(name: str, target: str) -> None:
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            archive.addfile(info)

        def add_text(name: str, text: str) -> None:
            data = text.encode()
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))

        for name in ("usr", "usr/bin", "usr/lib", "usr/lib64", "etc", "tmp", "root", "app"):
            add_dir(name)
        for link, target in (("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"),
                             ("sbin", "usr/bin")):  # fmt: skip
            add_link(link, target)
        add_text("etc/passwd", "root:x:0:0:root:/root:/bin/bash\n")
        add_text("etc/group", "root:x:0:\n")
        binaries = [HOST_PYTHON]
        for tool in TOOLS:
            where = shutil.which(tool, path="/usr/bin:/bin")
            if where:
                binaries.append(Path(where))
        stdlib = Path("/usr/lib/python3.11")
        skip = {"test", "idlelib", "tkinter", "ensurepip", "__pycache__", "turtledemo"}
        extensions = list((stdlib / "lib-dynload").glob("*.so"))
        for path in binaries:
            archive.add(path.resolve(), arcname=str(path).lstrip("/"))
        add_link("usr/bin/python3", "python3.11")
        archive.add(
            stdlib,
            arcname=str(stdlib).lstrip("/"),
            filter=lambda info: None if set(Path(info.name).parts) & skip else info,
        )
        site = "usr/lib/python3/dist-packages"
        for package in RUNNER_PACKAGES:
            source = TRAINER_SITE / package
            archive.add(
                source,
                arcname=f"{site}/{package}",
                filter=lambda info: None if "__pycache__" in info.name else info,
            )
            if source.is_dir():
                extensions += list(source.rglob("*.so"))
        for library in sorted(shared_libraries(binaries + extensions)):
            archive.add(library.resolve(), arcname=str(library).lstrip("/"))
    return buffer.getvalue()


@pytest.fixture(scope="session")
def base_image(docker_engine: str) -> str:
    missing = [p for p in RUNNER_PACKAGES if not (TRAINER_SITE / p).exists()]
    if not HOST_PYTHON.is_file() or missing:
        pytest.skip(
            f"the base image is built from {HOST_PYTHON} and the packages of {TRAINER_SITE} "
            f"(`make setup`); missing: {[str(HOST_PYTHON)] if not HOST_PYTHON.is_file() else missing}"
        )
    imported = docker(
        "import", "-", BASE_IMAGE, host=docker_engine, input=rootfs_tarball(), timeout=300
    )
    assert imported.returncode == 0, imported.stderr.decode()[-2000:]
    return BASE_IMAGE


@pytest.mark.timeout(400)
def test_the_base_image_is_built_from_host_files_and_runs_the_runner_dependencies(
    base_image: str, docker_engine: str
):
    probe = (
        "import sys, pydantic, httpx; "
        "print(sys.version_info[:2], pydantic.VERSION.split('.')[0], httpx.__name__)"
    )
    ran = docker(
        "run", "--rm", "--network", "none", base_image, "python3", "-c", probe,
        host=docker_engine, text=True, timeout=120,
    )  # fmt: skip
    assert ran.returncode == 0, ran.stderr[-2000:]
    assert ran.stdout.strip() == "(3, 11) 2 httpx"
    shell = docker(
        "run", "--rm", "--network", "none", base_image,
        "bash", "-c", "mkdir -p /app && echo 42 > /app/a && cat /app/a",
        host=docker_engine, text=True, timeout=120,
    )  # fmt: skip
    assert (shell.returncode, shell.stdout.strip()) == (0, "42"), shell.stderr


WORKFLOW = textwrap.dedent(
    """
    from pathlib import Path

    from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput


    class WriteAnswer(AgentWorkflow):
        async def run(self, ctx):
            Path("/app").mkdir(exist_ok=True)
            Path("/app/answer.txt").write_text("42")
            return AgentWorkflowOutput(
                messages=[*ctx.prompt, {"role": "assistant", "content": "42"}]
            )
    """
)


def compose_v2_missing(host: str) -> str | None:
    compose = docker("compose", "version", host=host, text=True)
    if compose.returncode == 0:
        return None
    detail = (compose.stderr or compose.stdout).strip().splitlines()[:1]
    return detail[0] if detail else "no output"


def test_the_default_environment_is_docker_only_with_compose_v2(docker_host: str):
    from osmosis_ai.rollout.backend.harbor import sandbox

    config = sandbox.default_environment_config()
    if compose_v2_missing(docker_host) is None:
        assert config.type is not None and config.type.value == "docker"
    else:
        # An engine without Compose V2 cannot run Harbor's docker environment.
        assert config.import_path == sandbox.SANDBOX_IMPORT_PATH


@pytest.fixture
def compose_v2(docker_host: str) -> None:
    missing = compose_v2_missing(docker_host)
    if missing is not None:
        pytest.skip(
            "Harbor's docker environment runs `docker compose` (Compose V2), which is not "
            f"installed here ({missing}); Debian 12 ships only docker-compose 1.29"
        )


@pytest.mark.timeout(600)
@pytest.mark.usefixtures("compose_v2")
async def test_a_workflow_trial_on_harbors_docker_environment(
    tmp_path: Path,
    base_image: str,
    task_builder: Callable[..., Path],
    monkeypatch: pytest.MonkeyPatch,
):
    from harbor.models.environment_type import EnvironmentType
    from harbor.models.trial.config import EnvironmentConfig
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend

    code = tmp_path / "code"
    code.mkdir()
    (code / "docker_flow.py").write_text(WORKFLOW)
    monkeypatch.syspath_prepend(str(code))
    sys.modules.pop("docker_flow", None)
    task = task_builder(dockerfile=f"FROM {base_image}\nWORKDIR /app\n", network_mode="no-network")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        backend = HarborBackend(
            orchestrator=TrialQueue(n_concurrent=1),
            tasks_dir=task,
            agent="docker_flow:WriteAnswer",
            code_dir=code,
            environment_config=EnvironmentConfig(type=EnvironmentType.DOCKER),
            patch_dockerfile_with_sdk=True,
            trials_dir=tmp_path / "trials",
            artifact_root=tmp_path / "artifacts",
        )
    request = ExecutionRequest(id="docker-1", prompt=[{"role": "user", "content": "go"}])
    try:
        outcome = await backend.execute(request)
    finally:
        await backend.shutdown()
    assert outcome.result.status == RolloutStatus.SUCCESS, outcome.result.err_message
    assert outcome.result.sample is not None and outcome.result.sample.reward == 1.0
