"""The bubblewrap sandbox as a Harbor environment: real bwrap, real overlay mounts, as root."""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import pytest
from harbor_support import harbor_missing_reason

if _reason := harbor_missing_reason():
    pytest.skip(_reason, allow_module_level=True)

from harbor.environments.factory import EnvironmentFactory
from harbor.models.task.config import NetworkMode, NetworkPolicy
from harbor.models.task.task import Task
from harbor.models.trial.config import EnvironmentConfig as TrialEnvironmentConfig
from harbor.models.trial.paths import TrialPaths

from osmosis_ai.rollout.backend.harbor import sandbox as sandbox_module
from osmosis_ai.rollout.backend.harbor.sandbox import (
    SANDBOX_IMPORT_PATH,
    LocalSandboxEnvironment,
    SandboxTimeoutError,
    UnsupportedDockerfileError,
)

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

PROBE_PY = (
    "import socket,sys\n"
    "try:\n"
    "    s=socket.create_connection((sys.argv[1],int(sys.argv[2])),timeout=3)\n"
    "    s.sendall(b'ping'); print(s.recv(100).decode() or 'closed')\n"
    "except OSError as e:\n"
    "    print('unreachable', type(e).__name__)\n"
)


class Sandboxes:
    """Builds sandboxes for tasks under tmp_path and stops whatever a test left running."""

    def __init__(self, tmp_path: Path, task_builder: Callable[..., Path]) -> None:
        self.tmp_path = tmp_path
        self.task_builder = task_builder
        self.started: list[LocalSandboxEnvironment] = []

    def make(
        self, name: str = "task", *, env_kwargs: dict[str, Any] | None = None, **task_options: Any
    ):
        task = Task(self.task_builder(name, **task_options))
        paths = TrialPaths(self.tmp_path / "trials" / f"{name}-{uuid.uuid4().hex[:6]}")
        paths.mkdir()
        kwargs = dict(env_kwargs or {})
        kwargs.setdefault("state_dir", self.tmp_path / "state")
        env = LocalSandboxEnvironment(
            environment_dir=task.paths.environment_dir,
            environment_name=name,
            session_id=f"{name}__{uuid.uuid4().hex[:6]}__env",
            trial_paths=paths,
            task_env_config=task.config.environment,
            **kwargs,
        )
        self.started.append(env)
        return env, paths


# A folder inside the trial for transfers (its root is an overlay of the host's, so nothing
# written there reaches the host).
IN_TRIAL = "/srv/trial-io"


@pytest.fixture
async def sandboxes(tmp_path: Path, task_builder: Callable[..., Path]) -> AsyncIterator[Sandboxes]:
    made = Sandboxes(tmp_path, task_builder)
    yield made
    for env in made.started:
        await env.stop(delete=True)


async def echo_server() -> tuple[asyncio.Server, int]:
    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        data = await reader.read(100)
        writer.write(b"pong:" + data)
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", 0)
    return server, server.sockets[0].getsockname()[1]


async def probe(env: LocalSandboxEnvironment, host: str, port: int) -> str:
    result = await env.exec(f"python3 -c {_quote(PROBE_PY)} {host} {port}", timeout_sec=20)
    assert result.return_code == 0, result
    return (result.stdout or "").strip()


def _quote(text: str) -> str:
    import shlex

    return shlex.quote(text)


def mounts_mentioning(fragment: str) -> list[str]:
    return [
        line for line in Path("/proc/self/mountinfo").read_text().splitlines() if fragment in line
    ]


def processes_with(marker: str) -> list[int]:
    found: list[int] = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.append(int(entry.name))
    return found


async def eventually(check: Callable[[], Any], attempts: int = 500) -> Any:
    """The first truthy result of ``check``, polled every 20 ms; the last result otherwise."""
    result = check()
    for _ in range(attempts):
        if result:
            break
        await asyncio.sleep(0.02)
        result = check()
    return result


async def test_start_exec_stop_returns_harbors_exec_result(sandboxes: Sandboxes):
    env, _ = sandboxes.make()
    await env.start(force_build=False)

    ok = await env.exec(
        "echo out; echo err >&2; echo $GREETING; pwd", env={"GREETING": "hi"}, cwd="/etc"
    )
    failed = await env.exec("exit 3")

    assert (ok.return_code, ok.stdout, ok.stderr) == (0, "out\nhi\n/etc\n", "err\n")
    assert failed.return_code == 3
    assert await env.is_dir("/logs/verifier")
    await env.stop(delete=True)


async def test_the_dockerfile_subset_is_applied_at_start(sandboxes: Sandboxes):
    dockerfile = (
        "FROM ubuntu:24.04\n"
        "ARG GREETING=hello\n"
        'ENV APP_MODE=test LABEL_TEXT="$GREETING world"\n'
        "WORKDIR /srv/app\n"
        "COPY data.txt ./\n"
        "COPY conf/ /srv/conf/\n"
        'RUN echo "$APP_MODE" > built.txt \\\n'
        "    && echo second >> built.txt\n"
        "LABEL purpose=test\n"
        'CMD ["sleep", "infinity"]\n'
    )
    env, _ = sandboxes.make(
        dockerfile=dockerfile,
        environment_files={"data.txt": "data\n", "conf/a.ini": "a=1\n", "conf/sub/b.ini": "b=2\n"},
    )
    await env.start(force_build=False)

    result = await env.exec(
        "pwd; echo $APP_MODE; echo $LABEL_TEXT; cat data.txt built.txt /srv/conf/a.ini /srv/conf/sub/b.ini"
    )

    assert result.stdout == "/srv/app\ntest\nhello world\ndata\ntest\nsecond\na=1\nb=2\n"


@pytest.mark.parametrize(
    ("line", "named"),
    [
        ('ENTRYPOINT ["/start.sh"]', "ENTRYPOINT"),
        ('SHELL ["/bin/zsh", "-c"]', "SHELL"),
        ("FROM alpine AS second", "multi-stage"),
        ("COPY --from=builder /x /y", "--from"),
    ],
)
def test_unsupported_dockerfile_instructions_are_refused_by_name(
    sandboxes: Sandboxes, line: str, named: str
):
    with pytest.raises(UnsupportedDockerfileError, match=named):
        sandboxes.make(dockerfile=f"FROM ubuntu\n{line}\n")


async def test_a_failing_run_step_fails_start_with_its_line_and_output(
    sandboxes: Sandboxes, tmp_path: Path
):
    env, _ = sandboxes.make(dockerfile="FROM ubuntu\nRUN echo broken >&2; exit 7\n")

    with pytest.raises(Exception, match=r"line 2.*exit code 7.*broken"):
        await env.start(force_build=False)
    assert not mounts_mentioning(str(tmp_path / "state"))
    assert list((tmp_path / "state").iterdir()) == []


async def test_writes_inside_leave_the_host_untouched_and_stop_leaves_nothing(
    sandboxes: Sandboxes, tmp_path: Path
):
    marker = f"osmosis-probe-{uuid.uuid4().hex}"
    host_file = Path("/etc") / marker
    env, _ = sandboxes.make()
    await env.start(force_build=False)
    # a background process that outlives its exec, as a tmux server would
    await env.exec(
        f"echo inside > {host_file}; rm -f /etc/hostname.probe; (exec -a {marker} sleep 300) > /dev/null 2>&1 &"
    )

    seen_inside = await env.exec(f"cat {host_file}")
    assert seen_inside.stdout == "inside\n"
    assert not host_file.exists()
    assert await eventually(lambda: processes_with(marker)), (
        "the background process should outlive its exec"
    )

    await env.stop(delete=True)

    assert not host_file.exists()
    assert processes_with(marker) == []
    assert mounts_mentioning(str(tmp_path / "state")) == []
    assert list((tmp_path / "state").iterdir()) == []


async def test_log_folders_are_the_trials_host_folders(sandboxes: Sandboxes):
    env, paths = sandboxes.make()
    await env.start(force_build=False)

    await env.exec("echo 1 > /logs/verifier/reward.txt; echo log > /logs/agent/agent.log")

    assert (paths.verifier_dir / "reward.txt").read_text() == "1\n"
    assert (paths.agent_dir / "agent.log").read_text() == "log\n"
    if hasattr(env, "is_path_mounted"):  # Harbor >= 0.25 asks before copying logs out
        assert env.is_path_mounted("/logs/verifier", paths.verifier_dir)


async def test_upload_and_download_round_trip(sandboxes: Sandboxes, tmp_path: Path):
    source = tmp_path / "src"
    (source / "nested").mkdir(parents=True)
    (source / "a.txt").write_text("A")
    (source / "nested" / "b.txt").write_text("B")
    single = tmp_path / "single.txt"
    single.write_text("single")
    env, _ = sandboxes.make()
    await env.start(force_build=False)

    await env.upload_dir(source, f"{IN_TRIAL}/in")
    await env.upload_file(single, f"{IN_TRIAL}/one/renamed.txt")
    listing = await env.exec(
        f"cat {IN_TRIAL}/in/a.txt {IN_TRIAL}/in/nested/b.txt {IN_TRIAL}/one/renamed.txt"
    )
    out_dir = tmp_path / "out"
    await env.download_dir(f"{IN_TRIAL}/in", out_dir)
    await env.download_file(f"{IN_TRIAL}/one/renamed.txt", tmp_path / "back.txt")

    assert listing.stdout == "ABsingle"
    assert (out_dir / "nested" / "b.txt").read_text() == "B"
    assert (tmp_path / "back.txt").read_text() == "single"
    with pytest.raises(FileNotFoundError, match=f"{IN_TRIAL}/missing"):
        await env.download_file(f"{IN_TRIAL}/missing", tmp_path / "nothing.txt")


async def test_symlinks_in_transfers_never_reach_host_files(sandboxes: Sandboxes, tmp_path: Path):
    secret = tmp_path / "host-secret.txt"
    secret.write_text("original")
    source = tmp_path / "upload"
    source.mkdir()
    (source / "link").symlink_to(secret)
    env, _ = sandboxes.make()
    await env.start(force_build=False)

    await env.upload_dir(source, f"{IN_TRIAL}/up")
    kind = await env.exec(f"test -L {IN_TRIAL}/up/link && echo symlink")
    # writing through the uploaded link lands in the sandbox's copy-on-write layer
    await env.exec(f"echo overwritten > {IN_TRIAL}/up/link")
    # a link the agent leaves pointing out of the folder is dropped on download
    await env.exec(
        f"mkdir -p {IN_TRIAL}/down && ln -s {secret} {IN_TRIAL}/down/escape"
        f" && echo ok > {IN_TRIAL}/down/plain"
    )
    await env.download_dir(f"{IN_TRIAL}/down", tmp_path / "down")

    assert kind.stdout == "symlink\n"
    assert secret.read_text() == "original"
    assert (tmp_path / "down" / "plain").read_text() == "ok\n"
    assert not (tmp_path / "down" / "escape").exists()
    assert not (tmp_path / "down" / "escape").is_symlink()


async def test_a_command_past_its_timeout_is_killed_with_its_children(sandboxes: Sandboxes):
    env, _ = sandboxes.make()
    await env.start(force_build=False)

    with pytest.raises(SandboxTimeoutError, match="timed out after 1 seconds"):
        await env.exec("sleep 300 & echo $! > /tmp/child.pid; sleep 300", timeout_sec=1)
    alive = await env.exec("kill -0 $(cat /tmp/child.pid) 2>/dev/null && echo alive || echo gone")

    assert alive.stdout == "gone\n"


async def test_commands_run_as_a_named_user(sandboxes: Sandboxes):
    env, _ = sandboxes.make()
    await env.start(force_build=False)

    result = await env.exec("id -un; echo $HOME", user="nobody")

    assert result.stdout == "nobody\n/nonexistent\n"


async def test_no_network_blocks_host_ports_but_forwards_the_named_endpoint(sandboxes: Sandboxes):
    forwarded, forwarded_port = await echo_server()
    other, other_port = await echo_server()
    try:
        env, _ = sandboxes.make(
            network_mode="no-network",
            env_kwargs={
                "network_policy": NetworkPolicy(network_mode=NetworkMode.NO_NETWORK),
                "forward_endpoints": [f"http://127.0.0.1:{forwarded_port}/v1/chat/completions"],
            },
        )
        await env.start(force_build=False)

        assert await probe(env, "127.0.0.1", forwarded_port) == "pong:ping"
        assert (await probe(env, "127.0.0.1", other_port)).startswith("unreachable")
    finally:
        forwarded.close()
        other.close()


async def test_public_network_shares_the_hosts_loopback(sandboxes: Sandboxes):
    server, port = await echo_server()
    try:
        env, _ = sandboxes.make()
        await env.start(force_build=False)

        assert await probe(env, "127.0.0.1", port) == "pong:ping"
    finally:
        server.close()


async def test_allowlist_reaches_only_allowed_hosts_and_forwarded_endpoints(sandboxes: Sandboxes):
    forwarded, forwarded_port = await echo_server()
    other, other_port = await echo_server()
    try:
        policy = NetworkPolicy(
            network_mode=NetworkMode.ALLOWLIST, allowed_hosts=["models.example.test"]
        )
        env, _ = sandboxes.make(
            network_mode="allowlist",
            allowed_hosts=["models.example.test"],
            env_kwargs={
                "network_policy": policy,
                "forward_endpoints": [("127.0.0.1", forwarded_port)],
            },
        )
        await env.start(force_build=False)

        resolved = await env.exec("getent hosts models.example.test")
        unlisted = await env.exec("getent hosts other.example.test")
        # the allowed host's port 443 is a listener relaying to the real host (which does
        # not exist here: the relay closes the connection rather than refusing it)
        allowed_443 = await probe(env, "models.example.test", 443)

        assert resolved.stdout is not None and resolved.stdout.startswith("127.0.100.")
        assert unlisted.return_code != 0
        assert allowed_443 == "closed"
        assert await probe(env, "127.0.0.1", forwarded_port) == "pong:ping"
        assert (await probe(env, "127.0.0.1", other_port)).startswith("unreachable")
    finally:
        forwarded.close()
        other.close()


async def test_eight_sandboxes_run_side_by_side_in_isolation(sandboxes: Sandboxes, tmp_path: Path):
    envs = [sandboxes.make(f"task{i}")[0] for i in range(8)]
    await asyncio.gather(*(env.start(force_build=False) for env in envs))

    await asyncio.gather(
        *(env.exec(f"echo {i} > /etc/which-sandbox") for i, env in enumerate(envs))
    )
    seen = await asyncio.gather(
        *(env.exec("cat /etc/which-sandbox; ls /proc | grep -c '^[0-9]'") for env in envs)
    )
    await asyncio.gather(*(env.stop(delete=True) for env in envs))

    assert [r.stdout.split()[0] for r in seen if r.stdout] == [str(i) for i in range(8)]
    assert mounts_mentioning(str(tmp_path / "state")) == []
    assert list((tmp_path / "state").iterdir()) == []


def test_harbor_loads_the_sandbox_by_import_path(tmp_path: Path, task_builder: Callable[..., Path]):
    task = Task(task_builder())
    paths = TrialPaths(tmp_path / "trial")
    paths.mkdir()
    config = TrialEnvironmentConfig(
        import_path=SANDBOX_IMPORT_PATH, kwargs={"forward_endpoints": ["127.0.0.1:9"]}
    )

    env = EnvironmentFactory.create_environment_from_config(
        config,
        environment_dir=task.paths.environment_dir,
        environment_name="task",
        session_id="task__x__env",
        trial_paths=paths,
        task_env_config=task.config.environment,
    )

    assert isinstance(env, LocalSandboxEnvironment)
    assert env.capabilities.disable_internet and env.capabilities.network_allowlist


def test_default_environment_config_picks_docker_only_where_an_engine_answers():
    config = sandbox_module.default_environment_config(forward_endpoints=["127.0.0.1:9"])

    if sandbox_module.docker_engine_answers():
        assert config.type is not None and config.type.value == "docker"
    else:
        assert config.import_path == SANDBOX_IMPORT_PATH
        assert config.kwargs == {"forward_endpoints": ["127.0.0.1:9"]}


async def test_shared_paths_show_a_host_folder_under_tmp_read_only(
    sandboxes: Sandboxes, tmp_path: Path
):
    """/tmp is the trial's own, so a host folder there (an agent's install prefix in a
    checkout under /tmp) is absent unless shared; shared, it is there and read-only, at the
    path it was named by and at its real path, which its own files name (a venv's shebangs)."""
    prefix = tmp_path / "prefix"
    (prefix / "bin").mkdir(parents=True)
    (prefix / "share").mkdir()
    (prefix / "share" / "greeting").write_text("from the host prefix\n")
    (prefix / "bin" / "tool").write_text(f"#!/bin/sh\ncat {prefix}/share/greeting\n")
    (prefix / "bin" / "tool").chmod(0o755)
    link = tmp_path / "prefix-link"
    link.symlink_to(prefix)
    alone, _ = sandboxes.make("alone")
    shared, _ = sandboxes.make("shared", env_kwargs={"shared_paths": [str(link)]})
    for env in (alone, shared):
        await env.start(force_build=False)

    unseen = await alone.exec(f"test -e {prefix} || echo absent")
    ran = await shared.exec(f"{link}/bin/tool")
    write = await shared.exec(f"touch {link}/bin/new", user="root")

    assert unseen.stdout == "absent\n"
    assert (ran.return_code, ran.stdout) == (0, "from the host prefix\n")
    assert write.return_code != 0 and not (prefix / "bin" / "new").exists()


def test_a_shared_path_that_is_no_folder_is_refused_by_value(tmp_path: Path):
    with pytest.raises(sandbox_module.SandboxError, match="nowhere"):
        sandbox_module.LocalSandboxEnvironment(shared_paths=[str(tmp_path / "nowhere")])


def test_bad_forward_endpoints_are_refused_by_value():
    with pytest.raises(ValueError, match="not-an-endpoint"):
        sandbox_module.parse_endpoint("not-an-endpoint")
    with pytest.raises(ValueError, match="1-65535"):
        sandbox_module.parse_endpoint(("127.0.0.1", 70000))


@pytest.mark.parametrize(("answer", "reward"), [("42", 1.0), ("41", 0.0)])
async def test_a_harbor_oracle_trial_runs_in_the_sandbox(
    tmp_path: Path, task_builder: Callable[..., Path], answer: str, reward: float
):
    from harbor.models.trial.config import AgentConfig, TaskConfig, TrialConfig
    from harbor.trial.trial import Trial

    task = task_builder(
        solve_sh=f"#!/bin/bash\necho {answer} > /app/answer.txt\n", network_mode="no-network"
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

    assert result.exception_info is None
    assert result.verifier_result is not None
    assert result.verifier_result.rewards == {"reward": reward}
    assert list((tmp_path / "state").iterdir()) == []
