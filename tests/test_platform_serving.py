"""Deployed LoRA models: deploy/undeploy (idempotent, within the quota), the list and detail
fields, the platform's OpenAI-compatible ``/v1`` endpoint answering through a real model
server (the local policy server with a tiny model and a LoRA adapter materialized from the
object store), restart reconciliation, and ``osmosis eval run`` against a deployed model."""

from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

import platform_cli_support as support
from osmosis_ai.platform.objects import ObjectStore
from osmosis_ai.platform.services import deployments
from osmosis_ai.platform.services.models import register_base_model
from osmosis_ai.platform.store.database import Database
from osmosis_ai.platform.store.orm import Model, Run, utcnow
from osmosis_ai.platform.worker.report import checkpoint_prefix

TEAM = "acme/team"
OTHER = "acme/other"
home = support.home


# --- rows the way training registers them ------------------------------------------------------


def add_training_run(database: Database, workspace_id: str, name: str) -> str:
    with database.transaction() as session:
        run = Run(
            workspace_id=workspace_id,
            kind="training",
            name=name,
            status="finished",
            rollout_name="multiply",
            entrypoint="main.py",
            commit_sha="0" * 40,
            model_path="tiny-base",
            dataset_name="multiply",
            experiment_config={},
            required_secrets=[],
            secret_scopes={},
        )
        session.add(run)
        session.flush()
        return run.id


def add_lora(
    database: Database,
    workspace_id: str,
    name: str,
    *,
    run_id: str | None = None,
    step: int = 2,
    path: str | None = None,
) -> str:
    with database.transaction() as session:
        model = Model(
            kind="lora",
            workspace_id=workspace_id,
            name=name,
            path=path if path is not None else checkpoint_prefix(run_id or "none", step),
            base_model="tiny-base",
            training_run_id=run_id,
            checkpoint_step=step,
            reward=0.25,
            deployment_status="inactive",
        )
        session.add(model)
        session.flush()
        return model.id


# --- fast: the API on an in-process app (no model server starts) ------------------------------


async def test_lora_fields_deploy_undeploy_and_quota(harness, monkeypatch):
    monkeypatch.setenv(deployments.MAX_DEPLOYMENTS_ENV, "1")
    team = harness.workspace("team", TEAM)
    other = harness.workspace("other", OTHER)
    alice = harness.account("alice@example.com", workspace="team", role="owner")
    harness.account("alice@example.com", workspace="other", role="owner")
    db = harness.platform.database
    run_id = add_training_run(db, team, "grpo-1")
    add_lora(db, team, "grpo-1-step-2", run_id=run_id)
    add_lora(db, team, "grpo-1-step-4", run_id=run_id, step=4)
    add_lora(db, other, "elsewhere-step-1")
    headers = alice.headers(TEAM)
    async with harness.client(headers=headers) as client:
        page = (await client.get("/api/cli/models/lora")).json()
        assert (page["active_deployments"], page["max_active_deployments"]) == (0, 1)
        first = next(m for m in page["models"] if m["model_name"] == "grpo-1-step-2")
        assert first["training_run_name"] == "grpo-1"
        assert (first["checkpoint_step"], first["reward"]) == (2, 0.25)
        assert (first["deployment_status"], first["deployed_at"]) == ("inactive", None)

        answer = await client.post("/api/cli/models/grpo-1-step-2/deploy")
        assert answer.status_code == 200, answer.text
        assert answer.json() == {
            "id": first["id"],
            "model_name": "grpo-1-step-2",
            "status": "active",
        }
        detail = (await client.get("/api/cli/models/grpo-1-step-2")).json()
        assert detail["deployment_status"] == "active"
        assert detail["deployed_by"] == "alice"
        assert detail["inference_model"] == "grpo-1-step-2"
        assert detail["inference_base_url"] == f"{harness.settings.public_url}/v1"
        deployed_at = detail["deployed_at"]
        harness.clock.advance(minutes=5)
        again = await client.post("/api/cli/models/grpo-1-step-2/deploy")  # idempotent
        assert again.json()["status"] == "active"
        detail = (await client.get("/api/cli/models/grpo-1-step-2")).json()
        assert detail["deployed_at"] == deployed_at

        refused = await client.post("/api/cli/models/grpo-1-step-4/deploy")
        assert refused.status_code == 409
        body = refused.json()
        assert body["code"] == "DEPLOYMENT_QUOTA_EXCEEDED"
        assert "1 of its 1" in body["message"]
        assert "osmosis model undeploy grpo-1-step-2" in body["message"]
        assert body["details"]["deployed_models"] == ["grpo-1-step-2"]

        # the quota is per workspace
        other_deploy = await client.post(
            "/api/cli/models/elsewhere-step-1/deploy", headers={"X-Osmosis-Git": OTHER}
        )
        assert other_deploy.status_code == 200, other_deploy.text

        for _ in range(2):  # idempotent
            gone = await client.post("/api/cli/models/grpo-1-step-2/undeploy")
            assert gone.json()["status"] == "inactive"
        assert (await client.get("/api/cli/models/lora")).json()["active_deployments"] == 0
        assert (await client.post("/api/cli/models/grpo-1-step-4/deploy")).status_code == 200

        missing = await client.post("/api/cli/models/nope/deploy")
        assert missing.status_code == 404
        assert "osmosis model list --type lora" in missing.json()["message"]


async def test_resolve_deployed_and_serving_keys(harness):
    team = harness.workspace("team", TEAM)
    other = harness.workspace("other", OTHER)
    db = harness.platform.database
    add_lora(db, team, "served")
    settings = harness.settings
    with db.transaction() as session:
        assert (
            deployments.resolve_deployed(session, team, "openai/gpt-4o", settings=settings) is None
        )
        with pytest.raises(deployments.ModelNotDeployedError, match="osmosis model deploy served"):
            deployments.resolve_deployed(session, team, "openai/served", settings=settings)
        deployments.deploy(session, team, "served", user_id=None, now=utcnow(), limit=4)
    with db.read() as session:
        found = deployments.resolve_deployed(session, team, "openai/served", settings=settings)
        assert found is not None
        assert deployments.resolve_deployed(session, team, "served", settings=settings) is None
        assert (
            deployments.resolve_deployed(session, other, "openai/served", settings=settings) is None
        )
    assert found.base_url == f"{settings.public_url}/v1"
    assert found.model_path == "openai/served"
    assert found.environ() == {"OPENAI_BASE_URL": found.base_url, "OPENAI_API_KEY": found.api_key}
    assert deployments.serving_key_workspace(settings.data_dir, found.api_key) == team
    run_id = add_training_run(db, team, "eval-of-served")
    with db.transaction() as session:
        run = session.get(Run, run_id)
        assert run is not None
        run.kind, run.status, run.model_path = "eval", "pending", "openai/served"
    with db.read() as session:
        run = session.get(Run, run_id)
    assert deployments.eval_model_environment(db, run, settings) == found.environ()
    run.model_path = "openai/gpt-4o-mini"  # a provider's model: nothing to add
    assert deployments.eval_model_environment(db, run, settings) == {}
    forged = found.api_key.replace(team, other)
    assert deployments.serving_key_workspace(settings.data_dir, forged) is None
    assert deployments.serving_key_workspace(settings.data_dir, found.api_key[:-1] + "0") in (
        None,
        team,  # the last hex digit may already be 0
    )


async def test_v1_refuses_unknown_models_and_callers(harness):
    team = harness.workspace("team", TEAM)
    other = harness.workspace("other", OTHER)
    alice = harness.account("alice@example.com", workspace="team")
    db = harness.platform.database
    add_lora(db, team, "idle")
    add_lora(db, other, "theirs")
    with db.transaction() as session:
        deployments.deploy(session, other, "theirs", user_id=None, now=utcnow(), limit=4)
    request = {"model": "idle", "messages": [{"role": "user", "content": "hi"}]}
    async with harness.client() as client:
        anonymous = await client.post("/v1/chat/completions", json=request)
        assert anonymous.status_code == 401
        assert anonymous.json()["error"]["type"] == "authentication_error"
        bad_key = await client.post(
            "/v1/chat/completions",
            json=request,
            headers={"Authorization": f"Bearer {deployments.SERVING_KEY_PREFIX}{team}.00"},
        )
        assert bad_key.status_code == 401
        auth = {"Authorization": f"Bearer {alice.token}"}
        for name in ("idle", "missing", "theirs"):  # inactive, unknown, another workspace's
            answer = await client.post(
                "/v1/chat/completions", json={**request, "model": name}, headers=auth
            )
            assert answer.status_code == 404
            error = answer.json()["error"]
            assert (error["type"], error["code"]) == ("not_found_error", "model_not_found")
            assert f"osmosis model deploy {name}" in error["message"]
        nameless = await client.post("/v1/chat/completions", json={"messages": []}, headers=auth)
        assert nameless.status_code == 400
        assert (await client.get("/v1/models", headers=auth)).json()["data"] == []


def test_cli_model_commands_against_the_platform(capsys, tmp_path, home, monkeypatch):
    """``osmosis model list|info|deploy|undeploy`` read the fields this platform answers."""
    from cli_support import invoke
    from platform_world import running_world

    clone = support.make_workspace(tmp_path / "clone", origin="git@github.com:acme/team.git")
    monkeypatch.chdir(clone)
    with running_world(tmp_path / "data") as world:
        team = world.workspace_ids["team"]
        run_id = add_training_run(world.database, team, "grpo-cli")
        add_lora(world.database, team, "grpo-cli-step-3", run_id=run_id, step=3)
        monkeypatch.setenv("OSMOSIS_PLATFORM_URL", world.url)
        monkeypatch.setenv("OSMOSIS_TOKEN", world.tokens["alice"])
        monkeypatch.setenv("OSMOSIS_TOKEN_PLATFORM_URL", world.url)

        def ok(*args: str) -> dict:
            outcome = invoke(capsys, *args, "--json")
            assert outcome.code == 0, (args, outcome.err)
            return json.loads(outcome.out)

        listed = ok("model", "list", "--type", "lora")
        assert (listed["active_deployments"], listed["max_active_deployments"]) == (0, 4)
        (item,) = listed["items"]
        assert item["training_run_name"] == "grpo-cli"
        assert (item["checkpoint_step"], item["deployment_status"]) == (3, "inactive")

        deployed = ok("model", "deploy", "grpo-cli-step-3")
        assert deployed["operation"] == "model.deploy"
        assert deployed["resource"]["status"] == "active"
        assert ok("model", "deploy", "grpo-cli-step-3")["resource"]["status"] == "active"
        info = ok("model", "info", "grpo-cli-step-3")["data"]["lora_model"]
        assert info["deployment_status"] == "active" and info["deployed_by"] == "Alice"
        assert info["inference_model"] == "grpo-cli-step-3"
        assert info["inference_base_url"] == f"{world.url}/v1"
        sections = ok("model", "list")
        assert sections["active_deployments"] == 1
        assert sections["lora_models"]["items"][0]["deployment_status"] == "active"

        undeployed = ok("model", "undeploy", "grpo-cli-step-3")
        assert undeployed["resource"]["status"] == "inactive"
        missing = invoke(capsys, "model", "deploy", "nope", "--json")
        assert missing.code == 1
        assert json.loads(missing.err)["error"]["code"] == "NOT_FOUND"


def test_engine_choice(monkeypatch):
    from osmosis_ai.platform import serving

    assert serving.choose_engine({serving.ENGINE_ENV: "local"}) == "local"
    assert serving.choose_engine({serving.ENGINE_ENV: "vllm"}) == "vllm"
    monkeypatch.setattr(serving, "gpu_present", lambda: False)
    assert serving.choose_engine({}) == "local"
    with pytest.raises(serving.ModelServerError, match="auto, local or vllm"):
        serving.choose_engine({serving.ENGINE_ENV: "tpu"})


# --- slow: real uvicorn, a real model server process ------------------------------------------


@pytest.fixture(scope="module")
def tiny_models(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny base model and a LoRA adapter of it, saved as LoRA training saves one."""
    pytest.importorskip("peft")
    import torch
    from peft import LoraConfig, get_peft_model

    from osmosis_ai.train.tiny_model import build_tiny_model

    root = tmp_path_factory.mktemp("tiny")
    base = build_tiny_model(root / "base", max_position_embeddings=256)
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(base, local_files_only=True)
    tokenizer = transformers.AutoTokenizer.from_pretrained(base, local_files_only=True)
    peft_model = get_peft_model(
        model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"])
    )
    with torch.no_grad():  # a trained adapter: B is no longer zero
        for name, param in peft_model.named_parameters():
            if "lora_B" in name:
                param.fill_(0.01)
    adapter = root / "adapter"
    peft_model.save_pretrained(adapter)
    tokenizer.save_pretrained(adapter)
    return base, adapter


@dataclass
class Served:
    settings: object
    database: Database
    token: str
    team: str
    servers: list[object] = field(default_factory=list[object])

    @property
    def url(self) -> str:
        return self.settings.public_url  # type: ignore[attr-defined]

    def client(self, key: str | None = None) -> httpx.Client:
        headers = {"Authorization": f"Bearer {key or self.token}", "X-Osmosis-Git": TEAM}
        return httpx.Client(base_url=self.url, headers=headers, timeout=300)


@contextlib.contextmanager
def platform_up(served: Served) -> Iterator[object]:
    """The platform app on real uvicorn at the settings' port, until the block ends."""
    from osmosis_ai.platform.api.app import create_platform_app
    from osmosis_ai.testing.serving import ServerThread

    app = create_platform_app(served.settings, database=served.database)  # type: ignore[arg-type]
    port = int(served.url.rsplit(":", 1)[1])
    with ServerThread(app, port=port):
        yield app.state.platform


def manager_of(platform: object):
    from osmosis_ai.platform.api.inference import MANAGER_KEY

    return platform.extras[MANAGER_KEY]  # type: ignore[attr-defined]


def wait_for(predicate, what: str, limit_s: float = 240.0):
    deadline = time.monotonic() + limit_s
    while True:
        value = predicate()
        if value:
            return value
        assert time.monotonic() < deadline, f"gave up waiting for {what}"
        time.sleep(0.1)


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    with contextlib.suppress(FileNotFoundError):  # a zombie is gone for our purposes
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    return True


def chat(client: httpx.Client, model: str, **extra: object) -> httpx.Response:
    body = {
        "model": model,
        "messages": [{"role": "user", "content": "What is 6 times 7?"}],
        "max_tokens": 8,
        **extra,
    }
    return client.post("/v1/chat/completions", json=body)


@pytest.mark.timeout(900)
def test_deployed_lora_serves_reconciles_and_evaluates(tmp_path, tiny_models):
    from osmosis_ai.platform.auth import issue_token
    from osmosis_ai.platform.services.accounts import add_member, create_user, create_workspace
    from osmosis_ai.platform.settings import load_settings
    from osmosis_ai.platform.store.database import open_database
    from osmosis_ai.testing.serving import free_port

    base_dir, adapter_dir = tiny_models
    port = free_port()
    settings = load_settings(
        data_dir=tmp_path / "data", public_url=f"http://127.0.0.1:{port}", port=port
    )
    database = open_database(settings)
    with database.transaction() as session:
        user = create_user(session, "alice@example.com", name="Alice")
        team = create_workspace(session, "team", repo=TEAM, clone_url="/dev/null")
        add_member(session, team, user, role="owner")
        token = issue_token(
            session, user, platform_url=settings.public_url, name="t", now=utcnow()
        ).raw
        register_base_model(session, "tiny-base", base_dir)
        team_id = team.id
    run_id = add_training_run(database, team_id, "grpo-tiny")
    store = ObjectStore(settings.objects_dir)
    prefix = checkpoint_prefix(run_id, 2)
    for file in sorted(adapter_dir.rglob("*")):
        if file.is_file():
            store.put(f"{prefix}/{file.relative_to(adapter_dir).as_posix()}", file.read_bytes())
    name = "grpo-tiny-step-2"
    add_lora(database, team_id, name, run_id=run_id, step=2)
    served = Served(settings, database, token, team_id)
    try:
        with platform_up(served) as platform, served.client() as client:
            manager = manager_of(platform)
            assert chat(client, name).status_code == 404  # not deployed yet
            assert client.post(f"/api/cli/models/{name}/deploy").json()["status"] == "active"
            models = client.get("/v1/models").json()["data"]
            assert [m["id"] for m in models] == [name]

            answer = chat(client, name)  # waits for the server the deploy started
            assert answer.status_code == 200, answer.text
            completion = answer.json()
            assert completion["object"] == "chat.completion"
            assert completion["model"] == name
            assert completion["choices"][0]["message"]["role"] == "assistant"
            assert completion["usage"]["completion_tokens"] >= 1
            checkpoint = settings.data_dir / "deployments" / completion_model_id(database, name)
            assert (checkpoint / "checkpoint" / "adapter_config.json").is_file()

            with client.stream(
                "POST",
                "/v1/chat/completions",
                json={
                    "model": name,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 6,
                    "stream": True,
                },
            ) as stream:
                assert stream.status_code == 200
                assert stream.headers["content-type"].startswith("text/event-stream")
                lines = [line for line in stream.iter_lines() if line.startswith("data: ")]
            assert lines[-1] == "data: [DONE]"
            chunks = [json.loads(line.removeprefix("data: ")) for line in lines[:-1]]
            assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks)
            assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")

            key = deployments.workspace_serving_key(settings.data_dir, team_id)
            with served.client(key) as by_key:
                assert chat(by_key, name).status_code == 200

            envelope = eval_against(tmp_path, settings.public_url, token, name)
            metrics = envelope["resource"]["metrics"]
            assert metrics["total_samples"] == 2, envelope
            assert envelope["status"] in ("success", "partial")

            (pid,) = [s.process.pid for s in manager._servers.values()]
        assert not alive(pid)  # the platform stopped its model server on shutdown

        with platform_up(served) as platform, served.client() as client:
            manager = manager_of(platform)  # reconciled: the deployment's server comes back
            wait_for(manager.running, "the deployed model's server after a restart")
            (pid,) = [s.process.pid for s in manager._servers.values()]
            assert chat(client, name).status_code == 200

            for _ in range(2):  # idempotent
                gone = client.post(f"/api/cli/models/{name}/undeploy")
                assert gone.json() == {
                    "id": gone.json()["id"],
                    "model_name": name,
                    "status": "inactive",
                }
            refused = chat(client, name)
            assert refused.status_code == 404
            assert f"osmosis model deploy {name}" in refused.json()["error"]["message"]
            wait_for(lambda: not alive(pid), "the undeployed model's server to stop")
    finally:
        database.dispose()


def completion_model_id(database: Database, name: str) -> str:
    from sqlalchemy import select

    with database.read() as session:
        found = session.scalar(select(Model.id).where(Model.name == name))
    assert found is not None
    return found


def eval_against(tmp_path: Path, platform_url: str, token: str, name: str) -> dict[str, object]:
    """``osmosis eval run`` of the multiply template on two rows against deployed ``name``,
    reached as ``openai/<name>`` with OPENAI_BASE_URL=<platform>/v1 and the platform token."""
    workspace = tmp_path / "workspace"
    workspace.mkdir()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("OPENAI_", "OSMOSIS_", "_OSMOSIS_"))
    }
    env["NO_COLOR"] = "1"
    template = "multiply-local-openai"
    applied = osmosis(workspace, env, "template", "apply", template, "--json")
    assert applied.returncode == 0, applied.stderr
    config = workspace / "configs" / "eval" / f"{template}.toml"
    text = config.read_text().replace('"openai/gpt-5-mini"', f'"openai/{name}"')
    text = text.replace("agent_workflow_timeout_s = 450", "agent_workflow_timeout_s = 120")
    config.write_text(text)
    env |= {"OPENAI_BASE_URL": f"{platform_url}/v1", "OPENAI_API_KEY": token}
    done = osmosis(
        workspace,
        env,
        "eval",
        "run",
        str(config.relative_to(workspace)),
        "--rows",
        "0-1",
        "--json",
        "-y",
    )
    assert done.stdout.strip(), done.stderr
    assert token not in done.stdout + done.stderr
    return json.loads(done.stdout)


def osmosis(cwd: Path, env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "osmosis_ai.cli.main", *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=420,
        check=False,
    )


def _vllm_on_gpu() -> bool:
    from osmosis_ai.platform.serving import gpu_present

    return importlib.util.find_spec("vllm") is not None and gpu_present()


@pytest.mark.timeout(900)
@pytest.mark.skipif(not _vllm_on_gpu(), reason="needs an NVIDIA GPU and the vllm package")
def test_vllm_engine_serves_a_full_checkpoint_on_a_gpu(tmp_path, tiny_models):
    """On a machine with a GPU and vLLM, the manager picks vLLM and serves a deployment."""
    import asyncio

    from osmosis_ai.platform import serving
    from osmosis_ai.platform.settings import load_settings
    from osmosis_ai.platform.store.database import open_database

    base_dir, _ = tiny_models
    settings = load_settings(data_dir=tmp_path / "data")
    database = open_database(settings)
    assert serving.choose_engine() == "vllm"
    spec = serving.DeploymentSpec(
        model_id="m1",
        name="tiny-full",
        workspace_id="w",
        source=deployments.CheckpointSource(folder=base_dir),
        base_dir=None,
    )
    manager = serving.DeploymentManager(settings, database, ObjectStore(settings.objects_dir))

    async def scenario() -> dict:
        await manager.start()
        try:
            server = await manager._launch(spec)
            async with httpx.AsyncClient(timeout=120) as client:
                answer = await client.post(
                    f"{server.base_url}/chat/completions",
                    json={
                        "model": "tiny-full",
                        "messages": [{"role": "user", "content": "hi"}],
                        "max_tokens": 4,
                    },
                )
            return answer.json()
        finally:
            await manager.close()

    try:
        completion = asyncio.run(scenario())
    finally:
        database.dispose()
    assert completion["model"] == "tiny-full"
    assert completion["choices"][0]["message"]["role"] == "assistant"
