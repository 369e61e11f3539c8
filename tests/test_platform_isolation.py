"""Workspace code runs contained: a managed run whose rollout attacks the platform from inside.

``osmosis platform serve --workers 1`` (real processes, SQLite data dir) runs an eval of the
``multiply-local-openai`` template whose ``main.py`` first runs a probe: it tries to read the
key files, the database and another workspace's objects, every ``/proc/*/environ`` and
``/proc/*/root`` it can see, to find ``OSMOSIS_PLATFORM_*`` variables, to write into the data
dir, to signal the worker, and records what happened in its artifacts folder. Every attempt
must be refused and the run must still finish with all its samples.

Also: a worker refuses to start where bubblewrap is missing (naming the fix), and starts with
``--single-tenant``; ``/api/health`` says which isolation is in force.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("sqlalchemy")

from osmosis_ai.controller.containment import Containment, ContainmentError, check
from osmosis_ai.testing.model_server import ScriptedModelServer
from osmosis_ai.testing.serving import free_port
from osmosis_ai.workspace.templates import apply_template
from platform_support import git, wait_until_healthy
from test_platform_managed_e2e import Calculator

OSMOSIS = [sys.executable, "-m", "osmosis_ai.cli.main"]
TEMPLATE = "multiply-local-openai"
SECRET = "sk-isolation-5c0ffee"


def _containment_missing() -> str | None:
    if shutil.which("bwrap") is None:
        return "bubblewrap (bwrap) is not installed: apt-get install bubblewrap"
    try:
        home = os.path.expanduser("~")
        check(Containment(home="/tmp/osmosis-isolation-probe", hidden=(home,), uid=65534))
    except ContainmentError as exc:
        return f"user namespaces are not available to bubblewrap: {exc}"
    return None


MISSING = _containment_missing()
needs_containment = pytest.mark.skipif(MISSING is not None, reason=MISSING or "")

PROBE = """
import json as _json, os as _os, signal as _signal


def _probe():
    data = _os.environ.get("PROBE_DATA_DIR", "")
    seen = {"attempts": {}, "uid": _os.getuid()}
    tries = seen["attempts"]

    def attempt(name, action):
        try:
            result = action()
        except OSError as exc:
            tries[name] = "refused: " + type(exc).__name__
        else:
            tries[name] = "DONE: " + repr(result)[:200]

    for name in ("secrets.key", "signing.key", "session.key", "platform.db", "settings.json"):
        attempt("read " + name, lambda n=name: open(_os.path.join(data, n), "rb").read(8))
    attempt("list objects", lambda: _os.listdir(_os.path.join(data, "objects")))
    attempt("write data dir", lambda: open(_os.path.join(data, "pwned"), "w").write("x"))
    listings = seen["listings"] = {}
    for path in (data, _os.path.join(data, "work", "runs"), _os.path.join(data, "envs")):
        try:
            listings[path] = sorted(_os.listdir(path))
        except OSError as exc:
            listings[path] = type(exc).__name__
    here = _os.getcwd()
    while here != "/":  # walking up from the checkout
        here = _os.path.dirname(here)
        for name in ("secrets.key", "platform.db", "attempt-1.json"):
            path = _os.path.join(here, name)
            attempt("read " + path, lambda p=path: open(p, "rb").read(8))
    pids = [p for p in _os.listdir("/proc") if p.isdigit()]
    seen["pids"] = pids
    for pid in pids:
        if int(pid) == _os.getpid():
            continue
        def environ(pid=pid):
            text = open("/proc/%s/environ" % pid, "rb").read()
            if b"OSMOSIS_PLATFORM" in text or b"DATABASE" in text:
                return "platform settings"
            raise PermissionError("read, but nothing of the platform")
        attempt("environ of %s" % pid, environ)
        attempt("root of %s" % pid, lambda pid=pid: _os.listdir("/proc/%s/root%s" % (pid, data)))
    seen["platform_env"] = sorted(k for k in _os.environ if k.startswith("OSMOSIS_PLATFORM"))
    seen["env"] = sorted(_os.environ)
    worker = int(_os.environ["PROBE_WORKER_PID"])
    if worker > 1:
        attempt("signal worker", lambda: _os.kill(worker, _signal.SIGTERM))
    attempt("signal parent", lambda: _os.kill(_os.getppid(), _signal.SIGTERM))
    status = open("/proc/self/status").read()
    seen["capeff_zero"] = "CapEff:\\t0000000000000000" in status
    seen["no_new_privs"] = "NoNewPrivs:\\t1" in status
    root = _os.environ["_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"]
    _os.makedirs(root, exist_ok=True)
    with open(_os.path.join(root, "probe.json"), "w") as handle:
        _json.dump(seen, handle)


if _os.environ.get("_OSMOSIS_ROLLOUT_ARTIFACT_ROOT"):  # started as the run's rollout server
    _probe()
"""


class Deployment:
    """A platform data dir with its server and one worker, and a workspace whose rollout
    probes its containment."""

    def __init__(self, root: Path, model_url: str) -> None:
        self.root = root
        self.data_dir = root / "platform"
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.server: subprocess.Popen[str] | None = None
        self.env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS", "OPENAI"))}
        self.env |= {"HOME": str(root / "home"), "NO_COLOR": "1"}
        self.bare = root / "git" / "acme" / "calc.git"
        self.bare.parent.mkdir(parents=True)
        git(root, "init", "-q", "--bare", "-b", "main", str(self.bare))
        self.model_url = model_url
        self.clone = self._workspace()
        self.secrets = root / "run.env"
        self.secrets.write_text(f"OPENAI_API_KEY={SECRET}\n")
        self.admin("user", "create", "alice@example.com", "--name", "Alice")
        for name, repo in (("Calc", "acme/calc"), ("Other", "acme/other")):
            self.admin("workspace", "create", name, "--repo", repo, "--clone-url", str(self.bare))
            self.admin("workspace", "add-member", name, "alice@example.com", "--role", "owner")
        token = self.admin(
            "token", "create", "--email", "alice@example.com", "--platform-url", self.url
        )["token"]
        self.env |= {
            "OSMOSIS_PLATFORM_URL": self.url,
            "OSMOSIS_TOKEN": token,
            "OSMOSIS_TOKEN_PLATFORM_URL": self.url,
        }

    def _workspace(self) -> Path:
        clone = self.root / "ws"
        clone.mkdir()
        git(clone, "init", "-q", "-b", "main")
        git(clone, "remote", "add", "origin", str(self.bare))
        apply_template(TEMPLATE, clone)
        main = clone / "rollouts" / TEMPLATE / "main.py"
        text = main.read_text()
        marker = "from __future__ import annotations\n"
        main.write_text(text.replace(marker, marker + PROBE, 1))
        source = (clone / "data" / "multiply.jsonl").read_text().splitlines()
        (clone / "data" / "calc.jsonl").write_text("".join(line + "\n" for line in source[:4]))
        git(clone, "add", "-A")
        git(clone, "commit", "-q", "-m", "probing template")
        git(clone, "push", "-q", "-u", "origin", "main")
        return clone

    def configure(self, worker_pid: int) -> None:
        config = self.clone / "configs" / "eval" / f"{TEMPLATE}.toml"
        text = config.read_text().replace('dataset = "multiply"', 'dataset = "calc"')
        text = text.replace("[evaluation]\n", "[evaluation]\nlimit = 4\n", 1)
        env = (
            f'[env]\nOPENAI_BASE_URL = "{self.model_url}"\n'
            f'PROBE_DATA_DIR = "{self.data_dir}"\nPROBE_WORKER_PID = "{worker_pid}"\n\n'
        )
        config.write_text(text.replace("[secrets]", env + "[secrets]"))
        git(self.clone, "commit", "-q", "-am", "config")
        git(self.clone, "push", "-q")

    def admin(self, *args: str) -> dict[str, Any]:
        return self.cli("platform", *args, "--data-dir", str(self.data_dir), cwd=self.root)

    def cli(self, *args: str, cwd: Path | None = None) -> dict[str, Any]:
        done = subprocess.run(
            [*OSMOSIS, "--json", *args],
            cwd=cwd or self.clone,
            env=self.env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        assert done.returncode == 0, (args, done.stderr[-4000:])
        text = done.stdout.strip()
        return json.loads(text.splitlines()[-1]) if text else {}

    def serve(self, *extra: str) -> None:
        command = [*OSMOSIS, "platform", "serve", "--data-dir", str(self.data_dir), *extra]
        command += ["--port", str(self.port), "--workers", "1", "--log-level", "info"]
        log = (self.root / "serve.log").open("a")
        self.server = subprocess.Popen(command, env=self.env, stdout=log, stderr=log, text=True)
        wait_until_healthy(self.server, self.url, (self.root / "serve.log").read_text)

    def worker_pid(self) -> int:
        import psutil

        assert self.server is not None
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            for child in psutil.Process(self.server.pid).children():
                if "osmosis_ai.platform.worker.runner" in " ".join(child.cmdline()):
                    return child.pid
            time.sleep(0.1)
        raise AssertionError("the server started no worker")

    def wait_run(self, name: str, *, timeout: float = 300) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while True:
            info = self.cli("eval", "info", name)["data"]
            run = info.get("eval_run", info)
            if run["status"] in ("finished", "failed", "stopped"):
                return info
            assert time.monotonic() < deadline, f"run {name} still {run['status']}"
            time.sleep(0.5)

    def close(self) -> None:
        if self.server is not None and self.server.poll() is None:
            self.server.send_signal(signal.SIGTERM)
            try:
                self.server.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.server.kill()
                self.server.wait()


@pytest.fixture
def deployment(tmp_path: Path) -> Iterator[Deployment]:
    with ScriptedModelServer(responder=Calculator(), latency_ms=5) as model:
        made = Deployment(tmp_path, model.base_url)
        yield made
        made.close()


@pytest.mark.slow
@pytest.mark.timeout(600)
@needs_containment
@pytest.mark.skipif(
    importlib.util.find_spec("agents") is None,
    reason="the template's agent framework (openai-agents) is not installed",
)
def test_a_contained_eval_run_is_refused_everything_and_still_finishes(deployment: Deployment):
    deployment.serve()
    health = httpx.get(f"{deployment.url}/api/health").json()
    assert health["isolation"] == "bubblewrap"
    worker = deployment.worker_pid()
    deployment.configure(worker)
    deployment.cli("dataset", "upload", "data/calc.jsonl", "-y")
    submitted = deployment.cli(
        "eval", "submit", f"configs/eval/{TEMPLATE}.toml", "-y",
        "--secrets-file", str(deployment.secrets),
    )  # fmt: skip
    name = submitted["resource"]["name"]
    info = deployment.wait_run(name)
    run = info.get("eval_run", info)
    assert run["status"] == "finished", info
    results = info.get("results") or run.get("results") or {}
    assert results.get("pass_rate") == 1.0, info

    probes = list((deployment.data_dir / "work" / "runs").rglob("probe.json"))
    assert len(probes) == 1, probes
    seen = json.loads(probes[0].read_text())
    done = {k: v for k, v in seen["attempts"].items() if not v.startswith("refused")}
    assert not done, done
    assert any(k.startswith("read ") and "secrets.key" in k for k in seen["attempts"])
    assert seen["attempts"]["signal worker"].startswith("refused")
    assert seen["platform_env"] == []
    assert seen["uid"] == 1000 and seen["capeff_zero"] and seen["no_new_privs"]
    # Its own PID namespace: only the sandbox's processes (bwrap's init and the server).
    assert all(int(pid) < 100 for pid in seen["pids"]), seen["pids"]
    assert not any(k.startswith(("OSMOSIS_PLATFORM", "VIRTUAL_ENV")) for k in seen["env"])
    assert "OPENAI_BASE_URL" in seen["env"] and "PROBE_DATA_DIR" in seen["env"]
    # What it can list of the data dir is the bare path to its own run's folders.
    listings = seen["listings"]
    assert listings[str(deployment.data_dir)] == ["work"], listings
    own = probes[0].relative_to(deployment.data_dir / "work" / "runs").parts[0]
    assert listings[str(deployment.data_dir / "work" / "runs")] == [own], listings
    assert listings[str(deployment.data_dir / "envs")] == "FileNotFoundError", listings
    assert not (deployment.data_dir / "pwned").exists()
    # The worker outlived the probe's signal, and the platform's files stayed owner-only.
    assert deployment.server is not None and deployment.server.poll() is None
    os.kill(worker, 0)
    assert (deployment.data_dir.stat().st_mode & 0o777) == 0o700
    assert (deployment.data_dir / "platform.db").stat().st_mode & 0o077 == 0


TRAINING = """\
[experiment]
rollout = "copy-digit"
entrypoint = "main.py"
model_path = "tiny"
dataset = "copy-digit"

[training]
lr = 1e-3
total_epochs = 2
n_samples_per_prompt = 4
rollout_batch_size = 8
max_prompt_length = 64
max_response_length = 4
agent_workflow_timeout_s = 60
grader_timeout_s = 30
loss_type = "dapo"
kl_coef = 0.0
seed = 0
no_signal_patience = 0  # about containment, not learning: two steps of an untrained model

[checkpoints]
eval_interval = 100
checkpoint_save_freq = 100

[warmup]
sft_steps = 0

[env]
PROBE_DATA_DIR = "{data_dir}"
PROBE_WORKER_PID = "{worker}"

[secrets]
required = []
"""


@pytest.mark.slow
@pytest.mark.timeout(900)
@needs_containment
def test_a_contained_training_run_is_refused_everything_and_still_trains(deployment: Deployment):
    pytest.importorskip("trl", reason="needs the 'train' extra")
    from osmosis_ai.train.demo import setup_workspace
    from osmosis_ai.train.tiny_model import build_tiny_model

    made = deployment
    setup_workspace(made.clone)
    main = made.clone / "rollouts" / "copy-digit" / "main.py"
    marker = "from __future__ import annotations\n"
    main.write_text(main.read_text().replace(marker, marker + PROBE, 1))
    tiny = build_tiny_model(made.root / "tiny")
    made.admin("model", "add", "tiny", "--path", str(tiny))
    made.serve()
    worker = made.worker_pid()
    config = made.clone / "configs" / "training" / "copy-digit.toml"
    config.write_text(TRAINING.format(data_dir=made.data_dir, worker=worker))
    git(made.clone, "add", "-A")
    git(made.clone, "commit", "-q", "-m", "probing copy-digit")
    git(made.clone, "push", "-q", "origin", "main")
    made.cli("dataset", "upload", "data/copy-digit.jsonl", "-y")
    name = made.cli("train", "submit", "configs/training/copy-digit.toml", "-y")["resource"]["name"]
    deadline = time.monotonic() + 800
    while True:
        info = made.cli("train", "info", name)
        run = info["data"].get("training_run", info["data"])
        if run["status"] not in ("pending", "queued", "running"):
            break
        assert time.monotonic() < deadline, f"training {name} still {run['status']}"
        time.sleep(1)
    assert run["status"] == "finished", made.cli("train", "logs", name, "--limit", "200")
    rewards = next(m for m in info["data"]["metrics"]["metrics"] if m["key"] == "training_reward")
    assert len(rewards["data"]) == 2  # 10 rows x 2 epochs / 8 prompts a step

    probes = list((made.data_dir / "work" / "runs").rglob("probe.json"))
    assert probes, "the contained rollout server wrote no probe"
    for probe in probes:
        seen = json.loads(probe.read_text())
        done = {k: v for k, v in seen["attempts"].items() if not v.startswith("refused")}
        assert not done, done
        assert seen["attempts"]["signal worker"].startswith("refused")
        assert seen["platform_env"] == [] and seen["uid"] == 1000
        assert seen["capeff_zero"] and seen["no_new_privs"]
        assert all(int(pid) < 100 for pid in seen["pids"]), seen["pids"]
    assert not (made.data_dir / "pwned").exists()
    os.kill(worker, 0)


def test_a_worker_without_bubblewrap_refuses_to_start_and_names_the_fix(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS")}
    env |= {"HOME": str(tmp_path / "home"), "OSMOSIS_PLATFORM_BWRAP": str(tmp_path / "no-bwrap")}
    command = [*OSMOSIS, "platform", "worker", "--data-dir", str(tmp_path / "platform")]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    said = done.stdout + done.stderr
    assert "bubblewrap" in said and "apt-get install bubblewrap" in said, said
    assert "--single-tenant" in said, said


def test_a_single_tenant_server_says_so_in_health(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS")}
    env |= {"HOME": str(tmp_path / "home"), "OSMOSIS_PLATFORM_BWRAP": str(tmp_path / "no-bwrap")}
    port = free_port()
    command = [*OSMOSIS, "platform", "serve", "--data-dir", str(tmp_path / "platform")]
    command += ["--port", str(port), "--workers", "1", "--single-tenant"]
    log_path = tmp_path / "serve.log"
    with log_path.open("w") as log:
        server = subprocess.Popen(command, env=env, stdout=log, stderr=log, text=True)
    try:
        url = f"http://127.0.0.1:{port}"
        wait_until_healthy(server, url, log_path.read_text)
        assert httpx.get(f"{url}/api/health").json()["isolation"] == "single-tenant (none)"
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(timeout=30)
    assert "Isolation: single-tenant (none)" in log_path.read_text()


def test_a_server_whose_workers_cannot_be_contained_refuses_to_start(tmp_path: Path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("OSMOSIS")}
    env |= {"HOME": str(tmp_path / "home"), "OSMOSIS_PLATFORM_BWRAP": str(tmp_path / "no-bwrap")}
    command = [*OSMOSIS, "platform", "serve", "--data-dir", str(tmp_path / "platform")]
    command += ["--port", str(free_port()), "--workers", "1"]
    done = subprocess.run(
        command, env=env, capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode != 0
    assert "apt-get install bubblewrap" in done.stdout + done.stderr


def test_the_run_config_is_never_written_through_a_symlink_the_workspace_committed(
    tmp_path: Path,
):
    from osmosis_ai.errors import ConfigError
    from osmosis_ai.platform.worker.checkout import write_in_checkout

    checkout, outside = tmp_path / "checkout", tmp_path / "outside"
    (checkout / "configs").mkdir(parents=True)
    outside.mkdir()
    (checkout / "configs" / "eval").symlink_to(outside)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_in_checkout(checkout, Path("configs") / "eval" / "run.toml", "x = 1\n")
    assert list(outside.iterdir()) == []
    (checkout / "configs" / "training").mkdir()
    target = outside / "victim"
    (checkout / "configs" / "training" / "run.toml").symlink_to(target)
    with pytest.raises(ConfigError, match="symbolic link"):
        write_in_checkout(checkout, Path("configs") / "training" / "run.toml", "x = 1\n")
    assert not target.exists()
    written = write_in_checkout(checkout, Path("configs") / "new" / "run.toml", "x = 1\n")
    assert written.read_text() == "x = 1\n"


def test_keys_can_live_outside_the_data_dir(tmp_path: Path):
    from osmosis_ai.platform.crypto import secret_key
    from osmosis_ai.platform.settings import KEYS_DIR_ENV, SINGLE_TENANT_ENV, load_settings

    settings = load_settings(data_dir=tmp_path / "data", keys_dir=tmp_path / "keys")
    assert settings.key_dir == tmp_path / "keys"
    secret_key(settings.key_dir, environ={})
    assert (tmp_path / "keys" / "secrets.key").is_file()
    assert not (tmp_path / "data" / "secrets.key").exists()
    env = {KEYS_DIR_ENV: str(tmp_path / "k2"), SINGLE_TENANT_ENV: "1"}
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        from_env = load_settings(data_dir=tmp_path / "data")
        assert from_env.key_dir == tmp_path / "k2"
        assert from_env.isolation == "single-tenant (none)"
        patch.setenv(SINGLE_TENANT_ENV, "maybe")
        with pytest.raises(Exception, match="OSMOSIS_PLATFORM_SINGLE_TENANT='maybe'"):
            load_settings(data_dir=tmp_path / "data")
    assert load_settings(data_dir=tmp_path / "data").isolation == "bubblewrap"


@needs_containment
def test_a_data_dir_inside_the_operators_home_stays_hidden_but_the_run_folders_show(
    tmp_path: Path,
):
    import tempfile

    from osmosis_ai.controller.containment import interpreter_paths

    # An operator's home outside /tmp (which the sandbox replaces whole), holding the data dir.
    home = Path(tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    data = home / ".osmosis" / "platform"
    run = data / "work" / "runs" / "r1"
    try:
        (run / "checkout").mkdir(parents=True)
        (run / "checkout" / "code.py").write_text("print('hi')\n")
        (data / "secrets.key").write_bytes(b"k" * 32)
        policy = Containment(
            home=str(run / "home"),
            hidden=(str(home), str(data), "/root"),
            read_only=(str(run / "checkout"),),
            uid=65534,
        )
        script = (
            "import os, sys; d = sys.argv[1]; print(sorted(os.listdir(d)), "
            "os.path.exists(os.path.join(d, 'secrets.key')), "
            "open(os.path.join(d, 'work/runs/r1/checkout/code.py')).read().strip())"
        )
        done = policy.run(
            [sys.executable, "-I", "-c", script, str(data)],
            cwd=run / "checkout",
            env=policy.environment(os.environ, {}),
            read_only=interpreter_paths(),
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout.strip() == "['work'] False print('hi')"
    finally:
        shutil.rmtree(home, ignore_errors=True)


@needs_containment
def test_an_environment_build_runs_contained_and_writes_only_its_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
):
    """``uv sync`` runs the workspace's build backends: it gets the same sandbox as the server,
    with its own environment folder as the one place it may write."""
    import tempfile

    from osmosis_ai.controller import containment as policy_module
    from osmosis_ai.controller.containment import interpreter_paths
    from osmosis_ai.controller.rollout_process import ENV_CACHE_ENV, RolloutServerProcess

    data = Path(tempfile.mkdtemp(dir="/var/tmp" if os.path.isdir("/var/tmp") else None))
    try:
        (data / "secrets.key").write_bytes(b"k" * 32)
        rollout = tmp_path / "rollouts" / "needy"
        rollout.mkdir(parents=True)
        (rollout / "main.py").write_text("print('never started')\n")
        (rollout / "pyproject.toml").write_text(
            '[project]\nname = "needy"\nversion = "0"\ndependencies = ["osmosis-absent-dep==1"]\n'
        )
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        uv = bin_dir / "uv"  # a build backend's view of the world, written where it may write
        uv.write_text(
            "#!/bin/sh\n"
            'out="$UV_PROJECT_ENVIRONMENT/probe.txt"\n'
            'echo "uid $(id -u)" > "$out"\n'
            'grep -E "^(CapEff|NoNewPrivs):" /proc/self/status >> "$out"\n'
            f'if cat "{data}/secrets.key" >/dev/null 2>&1; then echo "key read" >> "$out"; '
            'else echo "key refused" >> "$out"; fi\n'
            f'if touch "{data}/planted" 2>/dev/null; then echo "data dir written" >> "$out"; '
            'else echo "data dir refused" >> "$out"; fi\n'
            'env | grep -c "^OSMOSIS_PLATFORM_" | sed "s/^/platform variables /" >> "$out"\n'
            'echo "home $HOME" >> "$out"\n'
        )
        uv.chmod(0o755)
        home = tmp_path / "home"
        policy = policy_module.Containment(
            home=str(home),
            hidden=(str(data), "/root"),
            read_only=(str(rollout), str(bin_dir), *interpreter_paths()),
            uid=65534,
        )
        monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
        monkeypatch.setenv("OSMOSIS_PLATFORM_SECRET_KEY", "must-not-reach-the-build")
        monkeypatch.setenv(ENV_CACHE_ENV, str(tmp_path / "envs"))
        monkeypatch.setenv(policy_module.CONTAINMENT_ENV, policy.to_json())
        process = RolloutServerProcess(
            rollout_dir=rollout, entrypoint=rollout / "main.py", artifact_root=tmp_path / "art"
        )
        process.sync()
        assert process.isolated and process.uv_environment is not None
        report = (process.uv_environment / "probe.txt").read_text().splitlines()
        planted = (data / "planted").exists()
    finally:
        shutil.rmtree(data, ignore_errors=True)
    assert report[0] == f"uid {policy_module.SANDBOX_ID}", report
    assert "CapEff:\t0000000000000000" in report and "NoNewPrivs:\t1" in report, report
    assert "key refused" in report and "data dir refused" in report and not planted, report
    assert "platform variables 0" in report, report
    assert f"home {home}" in report, report
