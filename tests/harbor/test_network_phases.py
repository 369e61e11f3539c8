"""Per-phase network policy in the bubblewrap sandbox: a public set-up and a restricted agent
phase in one sandbox, switched by Harbor between phases (real bwrap, real namespaces)."""

from __future__ import annotations

import asyncio
import shlex
import time
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import pytest
from harbor_support import harbor_missing_reason

if _reason := harbor_missing_reason():
    pytest.skip(_reason, allow_module_level=True)

from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from osmosis_ai.rollout.backend.harbor.errors import SandboxError
from osmosis_ai.rollout.backend.harbor.sandbox import (
    SANDBOX_IMPORT_PATH,
    LocalSandboxEnvironment,
)

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

PUBLIC = NetworkPolicy(network_mode=NetworkMode.PUBLIC)
NO_NETWORK = NetworkPolicy(network_mode=NetworkMode.NO_NETWORK)

# argv: host port. Prints "reached" or "unreachable <error>".
PROBE_PY = (
    "import socket,sys\n"
    "try:\n"
    "    s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3)\n"
    "    s.sendall(b'ping'); print('reached' if s.recv(100) else 'closed')\n"
    "except OSError as e:\n"
    "    print('unreachable', type(e).__name__)\n"
)


def probe_command(port: int) -> str:
    return f"python3 -c {shlex.quote(PROBE_PY)} 127.0.0.1 {port}"


@pytest.fixture
async def host_port() -> AsyncIterator[int]:
    """A server on the host's loopback: reachable with the host's network only."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"pong")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    yield server.sockets[0].getsockname()[1]
    server.close()


@pytest.fixture
async def environments() -> AsyncIterator[list[LocalSandboxEnvironment]]:
    made: list[LocalSandboxEnvironment] = []
    yield made
    for env in made:
        await env.stop(delete=True)


def make_env(
    tmp_path: Path,
    task_builder: Callable[..., Path],
    made: list[LocalSandboxEnvironment],
    *,
    network_policy: NetworkPolicy,
    phases: list[NetworkPolicy],
) -> LocalSandboxEnvironment:
    task = Task(task_builder(f"task-{uuid.uuid4().hex[:6]}"))
    paths = TrialPaths(tmp_path / "trials" / uuid.uuid4().hex[:6])
    paths.mkdir()
    env = LocalSandboxEnvironment(
        environment_dir=task.paths.environment_dir,
        environment_name="task",
        session_id=f"task__{uuid.uuid4().hex[:6]}__env",
        trial_paths=paths,
        task_env_config=task.config.environment,
        network_policy=network_policy,
        phase_network_policies=phases,
        state_dir=tmp_path / "state",
    )
    made.append(env)
    return env


async def reach(env: LocalSandboxEnvironment, port: int) -> str:
    result = await env.exec(probe_command(port), timeout_sec=20)
    assert result.return_code == 0, result
    return (result.stdout or "").strip()


async def test_the_sandbox_advertises_a_dynamic_network_policy(
    tmp_path: Path, task_builder: Callable[..., Path], environments: list[LocalSandboxEnvironment]
):
    env = make_env(tmp_path, task_builder, environments, network_policy=PUBLIC, phases=[])
    assert env.capabilities.dynamic_network_policy is True


async def test_a_public_sandbox_switches_to_no_network_and_back(
    tmp_path: Path,
    task_builder: Callable[..., Path],
    environments: list[LocalSandboxEnvironment],
    host_port: int,
):
    env = make_env(tmp_path, task_builder, environments, network_policy=PUBLIC, phases=[NO_NETWORK])
    await env.start(force_build=False)
    assert await reach(env, host_port) == "reached"
    # a process the public phase leaves running (a tmux server, say) holds the host's network
    started = await env.exec("sleep 600 >/dev/null 2>&1 & echo $!", timeout_sec=10)
    assert started.return_code == 0

    await env.set_network_policy(NO_NETWORK)

    assert (await reach(env, host_port)).startswith("unreachable")
    left = await env.exec("pgrep -x sleep || echo none", timeout_sec=10)
    assert (left.stdout or "").strip() == "none"
    # a process started under the restricted policy keeps running when it widens again
    await env.exec("sleep 600 >/dev/null 2>&1 &", timeout_sec=10)

    await env.set_network_policy(PUBLIC)

    assert await reach(env, host_port) == "reached"
    still = await env.exec("pgrep -x sleep | wc -l", timeout_sec=10)
    assert (still.stdout or "").strip() == "1"


async def test_a_phase_switch_takes_well_under_50ms(
    tmp_path: Path, task_builder: Callable[..., Path], environments: list[LocalSandboxEnvironment]
):
    env = make_env(tmp_path, task_builder, environments, network_policy=PUBLIC, phases=[NO_NETWORK])
    await env.start(force_build=False)
    took: list[float] = []
    for policy in [NO_NETWORK, PUBLIC] * 5:
        began = time.perf_counter()
        await env.set_network_policy(policy)
        took.append(time.perf_counter() - began)
    took.sort()
    assert took[len(took) // 2] < 0.05, took


async def test_a_sandbox_started_public_only_refuses_to_restrict_later(
    tmp_path: Path, task_builder: Callable[..., Path], environments: list[LocalSandboxEnvironment]
):
    env = make_env(tmp_path, task_builder, environments, network_policy=PUBLIC, phases=[])
    await env.start(force_build=False)

    with pytest.raises(SandboxError, match="cannot switch to 'no-network'"):
        await env.set_network_policy(NO_NETWORK)
    assert env.network_policy == PUBLIC


async def test_a_trial_with_a_public_setup_and_an_offline_agent_runs(
    tmp_path: Path, task_builder: Callable[..., Path], host_port: int
):
    """The usual shape of a benchmark task: the environment's set-up (Dockerfile RUN) is
    public, ``[agent] network_mode = "no-network"`` takes the network away from the agent,
    and the verifier, which declares nothing, runs with the environment's policy again."""
    from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    probe = f"python3 /opt/probe.py 127.0.0.1 {host_port}"
    task = task_builder(
        "offline-agent",
        network_mode="public",
        agent_network_mode="no-network",
        dockerfile=(
            "FROM ubuntu:24.04\nWORKDIR /app\nCOPY probe.py /opt/probe.py\n"
            f"RUN {probe} > /app/setup.txt\n"
            "RUN (sleep 600 >/dev/null 2>&1 &)\n"
        ),
        environment_files={"probe.py": PROBE_PY},
        solve_sh=(
            f"#!/bin/bash\n{probe} > /app/agent.txt\n"
            "(pgrep -x sleep || echo none) > /app/agent-sleep.txt\n"
        ),
        test_sh=(
            "#!/bin/bash\n"
            f"{probe} > /app/verifier.txt\n"
            'if [ "$(cat /app/setup.txt)" = reached ] '
            "&& grep -q '^unreachable' /app/agent.txt "
            '&& [ "$(cat /app/agent-sleep.txt)" = none ] '
            '&& [ "$(cat /app/verifier.txt)" = reached ]; then\n'
            "  echo 1 > /logs/verifier/reward.txt\n"
            "else\n"
            "  head /app/*.txt > /logs/verifier/why.txt; echo 0 > /logs/verifier/reward.txt\n"
            "fi\n"
        ),
    )
    config = TrialConfig(
        task=TaskConfig(path=task),
        agent=AgentConfig(name="oracle"),
        environment=TrialEnvironmentConfig(
            import_path=SANDBOX_IMPORT_PATH, kwargs={"state_dir": str(tmp_path / "state")}
        ),
        trials_dir=tmp_path / "trials",
    )

    result = await (await Trial.create(config)).run()

    assert result.exception_info is None, result.exception_info
    assert result.verifier_result is not None
    why = list((tmp_path / "trials").glob("*/verifier/why.txt"))
    assert result.verifier_result.rewards == {"reward": 1.0}, why and why[0].read_text()


async def test_an_allowlisted_cidr_range_is_reachable_on_its_web_ports_and_nothing_else(
    tmp_path: Path, task_builder: Callable[..., Path], environments: list[LocalSandboxEnvironment]
):
    """``allowed_hosts = ["127.0.55.0/24"]``: any address of the range is reachable on ports
    80 and 443 (relayed from the host), beside an allowlisted host name; an address outside
    it is not, nor another port."""

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(100)
        writer.write(b"pong")
        await writer.drain()
        writer.close()

    inside = await asyncio.start_server(handle, "127.0.55.7", 80)
    outside = await asyncio.start_server(handle, "127.0.56.7", 80)
    other_port = await asyncio.start_server(handle, "127.0.55.7", 0)
    port = other_port.sockets[0].getsockname()[1]
    allowlist = NetworkPolicy(
        network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["127.0.55.0/24", "example.com"]
    )
    try:
        env = make_env(
            tmp_path, task_builder, environments, network_policy=PUBLIC, phases=[allowlist]
        )
        assert env.capabilities.network_allowlist_ipv4_cidrs is True
        await env.start(force_build=False)
        await env.set_network_policy(allowlist)

        async def probe(host: str, port: int) -> str:
            command = f"python3 -c {shlex.quote(PROBE_PY)} {host} {port}"
            result = await env.exec(command, timeout_sec=20)
            return (result.stdout or "").strip()

        assert await probe("127.0.55.7", 80) == "reached"
        assert (await probe("127.0.56.7", 80)).startswith("unreachable")
        assert (await probe("127.0.55.7", port)).startswith("unreachable")
        hosts = await env.exec("getent hosts example.com", timeout_sec=10)
        assert (hosts.stdout or "").startswith("127.0.100."), hosts
    finally:
        for server in (inside, outside, other_port):
            server.close()
