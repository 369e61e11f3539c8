"""HarborBackend end to end in the bubblewrap sandbox: real Harbor trials, a scripted model on
127.0.0.1, workflows copied in as a code folder or a wheel, the task's verifier or the
grader as verifier, network policies, cancel, missing rewards, symlinks and the API key."""

from __future__ import annotations

import asyncio
import json
import sys
import textwrap
import warnings
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from harbor_support import make_task

from osmosis_ai.rollout.context import RolloutContext
from osmosis_ai.rollout.execution import ExecutionOutcome, ExecutionRequest
from osmosis_ai.rollout.status import RolloutErrorCategory, RolloutStatus
from osmosis_ai.testing import ScriptedModelServer

pytestmark = [pytest.mark.harbor, pytest.mark.usefixtures("sandbox_available")]

SECRET = "sk-osmosis-test-3f9a1c7e5b2d"

WORKFLOW_MODULE = textwrap.dedent(
    '''
    """A workflow that asks the rollout's model once and writes files in its environment."""
    import json
    import os
    import socket
    from pathlib import Path

    import httpx

    from osmosis_ai.rollout import AgentWorkflow, AgentWorkflowOutput, Grader, get_rollout_context


    def probe(host, port):
        try:
            with socket.create_connection((host, port), timeout=2):
                return 1.0
        except OSError:
            return 0.0


    class AskModel(AgentWorkflow):
        async def run(self, ctx):
            rctx = get_rollout_context()
            meta = ctx.metadata or {}
            if meta.get("sleep"):
                import asyncio
                Path("/logs/agent/sleeping").write_text("yes")
                await asyncio.sleep(float(meta["sleep"]))
            async with httpx.AsyncClient(timeout=10) as client:
                answer = await client.post(
                    rctx.chat_completions_url + "/chat/completions",
                    headers={"Authorization": f"Bearer {rctx.api_key}"},
                    json={"model": "scripted", "messages": ctx.prompt},
                )
            answer.raise_for_status()
            text = answer.json()["choices"][0]["message"]["content"]
            if meta.get("write_answer"):
                Path("/app").mkdir(exist_ok=True)
                Path("/app/answer.txt").write_text(text.strip())
            if ctx.artifacts_dir:
                (ctx.artifacts_dir / "note.txt").write_text("from the sandbox")
            metrics = {}
            if "probe_port" in meta:
                metrics["probe"] = probe("127.0.0.1", int(meta["probe_port"]))
            metrics["label_visible"] = float(
                "LABEL-MARK" in Path("/logs/agent/container_input.json").read_text()
            )
            return AgentWorkflowOutput(
                messages=[*ctx.prompt, {"role": "assistant", "content": text}], metrics=metrics
            )


    class ExactGrader(Grader):
        async def grade(self, ctx):
            reply = ctx.sample.messages[-1]["content"].strip()
            ctx.set_reward(1.0 if reply == (ctx.label or "").replace("LABEL-MARK:", "") else 0.0)
    '''
)


@pytest.fixture
def code_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    folder = tmp_path / "code"
    folder.mkdir()
    (folder / "harbor_flow.py").write_text(WORKFLOW_MODULE)
    monkeypatch.syspath_prepend(str(folder))
    sys.modules.pop("harbor_flow", None)
    return folder


def wheel_of(code: Path, dest: Path) -> Path:
    """A minimal pure-Python wheel of ``code``'s modules (zip-importable as is)."""
    wheel = dest / "harbor_flow-0.1-py3-none-any.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.write(code / "harbor_flow.py", "harbor_flow.py")
        archive.writestr("harbor_flow-0.1.dist-info/METADATA", "Name: harbor-flow\nVersion: 0.1\n")
    return wheel


def make_backend(tmp_path: Path, tasks: Path, **kwargs: Any) -> Any:
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return HarborBackend(
            orchestrator=TrialQueue(n_concurrent=4),
            tasks_dir=tasks,
            trials_dir=tmp_path / "trials",
            artifact_root=tmp_path / "artifacts",
            **kwargs,
        )


async def run(
    backend: Any,
    rollout_id: str,
    *,
    chat_url: str = "",
    prompt: list[dict[str, Any]] | None = None,
    label: str | None = None,
    metadata: dict[str, Any] | None = None,
    **extra: Any,
) -> ExecutionOutcome:
    request = ExecutionRequest(
        id=rollout_id,
        prompt=prompt or [{"role": "user", "content": "What is 6 times 7?"}],
        label=label,
        metadata=metadata,
        **extra,
    )
    with RolloutContext(chat_completions_url=chat_url, api_key=SECRET, rollout_id=rollout_id):
        return await backend.execute(request)


def files_containing(root: Path, needle: str) -> list[Path]:
    return [
        p
        for p in root.rglob("*")
        if p.is_file() and not p.is_symlink() and needle.encode() in p.read_bytes()
    ]


@pytest.mark.parametrize("packaging", ["code_dir", "bundle"])
async def test_template_mode_runs_the_workflow_in_the_sandbox_and_grades_it(
    tmp_path: Path, code_dir: Path, packaging: str, task_builder: Callable[..., Path]
):
    task = task_builder("template", test_sh=None, solve_sh=None)
    shipped = (
        {"code_dir": code_dir}
        if packaging == "code_dir"
        else {"bundle": wheel_of(code_dir, tmp_path)}
    )
    backend = make_backend(
        tmp_path,
        task,
        agent="harbor_flow:AskModel",
        grader="harbor_flow:ExactGrader",
        cleanup_successful_trials=False,
        **shipped,
    )
    async with ScriptedModelServer(["42"], api_key=SECRET, record_requests=True) as model:
        outcome = await run(backend, "tpl-1", chat_url=model.base_url, label="LABEL-MARK:42")
    assert outcome.workflow.status == RolloutStatus.SUCCESS, outcome.workflow.err_message
    grader = outcome.grader
    assert grader is not None and grader.status == RolloutStatus.SUCCESS, grader.err_message
    assert grader.sample is not None and grader.sample.reward == 1.0
    assert grader.sample.label == "LABEL-MARK:42"
    assert grader.sample.messages[-1] == {"role": "assistant", "content": "42"}
    assert grader.sample.metrics["label_visible"] == 0.0  # the label never reaches the agent
    # The model saw the request's prompt, with the rollout's key.
    assert model.requests[0].body["messages"] == [{"role": "user", "content": "What is 6 times 7?"}]
    assert model.requests[0].headers["authorization"] == f"Bearer {SECRET}"
    # Template mode wrote the prompt as the instruction; the artifact landed in Harbor's layout.
    kept = tmp_path / "artifacts" / "tpl-1"
    assert (
        kept / "artifacts" / "logs" / "artifacts" / "note.txt"
    ).read_text() == "from the sandbox"
    assert (kept / "harbor" / "verifier" / "reward.json").is_file()
    assert (
        json.loads((kept / "harbor" / "agent" / "container_result.json").read_text())["status"]
        == "success"
    )
    # The key went in (config.json, container_input.json) and was scrubbed from every file.
    assert files_containing(tmp_path / "trials", SECRET) == []
    assert files_containing(kept, SECRET) == []
    assert "<redacted>" in (kept / "harbor" / "agent" / "container_input.json").read_text()
    assert backend.rollout_status("tpl-1") == {
        "status": "success",
        "reward": 1.0,
        "err_message": None,
    }


async def test_dataset_mode_uses_each_tasks_own_instruction_and_verifier(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    task_builder("answer-42", instruction="Answer with 42.\n")
    task_builder("answer-41", instruction="Answer with 41.\n")
    backend = make_backend(
        tmp_path, tmp_path / "tasks", agent="harbor_flow:AskModel", task_mode="dataset"
    )
    async with ScriptedModelServer(["42"], api_key=SECRET, record_requests=True) as model:
        right, wrong = await asyncio.gather(
            run(
                backend,
                "ds-1",
                chat_url=model.base_url,
                metadata={"harbor_task_id": "answer-42", "write_answer": True},
            ),
            run(backend, "ds-2", chat_url=model.base_url, metadata={"harbor_task_id": "answer-41"}),
        )
        asked = sorted(r.body["messages"][0]["content"] for r in model.requests)
    assert right.grader is not None and right.grader.sample is not None
    assert right.grader.sample.reward == 1.0
    # The second workflow wrote no answer: the task's own test.sh gives 0, a valid reward.
    assert wrong.grader is not None and wrong.grader.status == RolloutStatus.SUCCESS
    assert wrong.grader.sample is not None and wrong.grader.sample.reward == 0.0
    assert asked == ["Answer with 41.\n", "Answer with 42.\n"]
    # Successful trials are removed once their outputs are kept.
    assert not any((tmp_path / "trials").glob("ds-*"))


async def test_dataset_mode_with_oracle_runs_the_reference_solutions(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    task_builder("a")
    task_builder("b")
    backend = make_backend(tmp_path, tmp_path / "tasks", agent="oracle", task_mode="dataset")
    outcomes = await asyncio.gather(
        *(run(backend, f"or-{name}", metadata={"harbor_task_id": name}) for name in "ab")
    )
    for outcome in outcomes:
        assert outcome.grader is not None and outcome.grader.sample is not None
        assert outcome.grader.sample.reward == 1.0
        assert outcome.grader.sample.messages == [
            {"role": "user", "content": "Write 42 to /app/answer.txt.\n"}
        ]
    assert backend.health()["backend"] == "harbor" and backend.health()["in_flight"] == 0


@pytest.mark.parametrize("mode", ["no-network", "allowlist"])
async def test_restricted_networks_still_reach_the_model_endpoint(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path], mode: str
):
    hosts = ["example.invalid"] if mode == "allowlist" else None
    task_builder("closed", network_mode=mode, allowed_hosts=hosts)
    backend = make_backend(
        tmp_path, tmp_path / "tasks", agent="harbor_flow:AskModel", task_mode="dataset"
    )
    async with (
        ScriptedModelServer(["42"], api_key=SECRET) as model,
        ScriptedModelServer(["other"]) as other,
    ):
        other_port = int(other.url.rsplit(":", 1)[1])
        outcome = await run(
            backend,
            f"net-{mode}",
            chat_url=model.base_url,
            metadata={"harbor_task_id": "closed", "write_answer": True, "probe_port": other_port},
        )
    assert outcome.workflow.status == RolloutStatus.SUCCESS, outcome.workflow.err_message
    sample = outcome.grader.sample if outcome.grader else None
    assert sample is not None and sample.reward == 1.0  # the model answered through the policy
    assert sample.metrics["probe"] == 0.0  # any other host port stays closed


async def test_an_offline_agent_phase_over_a_public_environment_reaches_only_the_model(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    """The usual shape of a benchmark task in dataset mode: a public environment whose
    ``[agent] network_mode = "no-network"`` takes the network from the agent phase only."""
    task_builder(
        "offline-agent",
        network_mode="public",
        agent_network_mode="no-network",
    )
    backend = make_backend(
        tmp_path, tmp_path / "tasks", agent="harbor_flow:AskModel", task_mode="dataset"
    )
    async with (
        ScriptedModelServer(["42"], api_key=SECRET) as model,
        ScriptedModelServer(["other"]) as other,
    ):
        outcome = await run(
            backend,
            "offline-agent",
            chat_url=model.base_url,
            metadata={
                "harbor_task_id": "offline-agent",
                "write_answer": True,
                "probe_port": int(other.url.rsplit(":", 1)[1]),
            },
        )
    assert outcome.workflow.status == RolloutStatus.SUCCESS, outcome.workflow.err_message
    sample = outcome.grader.sample if outcome.grader else None
    assert sample is not None and sample.reward == 1.0  # the model answered, the task's tests ran
    assert sample.metrics["probe"] == 0.0  # the agent phase had no network of its own


async def test_public_network_reaches_host_ports(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    task_builder("open")
    backend = make_backend(
        tmp_path, tmp_path / "tasks", agent="harbor_flow:AskModel", task_mode="dataset"
    )
    async with ScriptedModelServer(["42"]) as model, ScriptedModelServer(["x"]) as other:
        outcome = await run(
            backend,
            "net-public",
            chat_url=model.base_url,
            metadata={"harbor_task_id": "open", "probe_port": int(other.url.rsplit(":", 1)[1])},
        )
    assert outcome.workflow.sample is not None
    assert outcome.workflow.sample.metrics["probe"] == 1.0  # the probe itself can succeed


async def test_cancel_mid_trial_stops_the_rollout(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    task_builder("slow", agent_timeout_sec=300)
    backend = make_backend(
        tmp_path, tmp_path / "tasks", agent="harbor_flow:AskModel", task_mode="dataset"
    )
    async with ScriptedModelServer(["42"]) as model:
        job = asyncio.create_task(
            run(
                backend,
                "cx-1",
                chat_url=model.base_url,
                metadata={"harbor_task_id": "slow", "sleep": 120},
            )
        )
        for _ in range(600):
            status = backend.rollout_status("cx-1")
            sleeping = any((tmp_path / "trials").glob("cx-1__*/agent/sleeping"))
            if status and status["status"] == "running" and sleeping:
                break
            await asyncio.sleep(0.05)
        else:
            pytest.fail(f"the trial never started its workflow: {backend.rollout_status('cx-1')}")
        assert backend.cancel_rollouts(ids=["cx-1", "nope"]) == {
            "cx-1": "cancelled_running",
            "nope": "not_found",
        }
        with pytest.raises(asyncio.CancelledError):
            await job
    assert backend.rollout_status("cx-1")["status"] == "cancelled"
    assert backend.health()["in_flight"] == 0
    assert model.request_count == 0
    # The cancelled trial keeps its (scrubbed) folder for debugging.
    assert files_containing(tmp_path / "trials", SECRET) == []


async def test_a_verifier_that_writes_no_reward_fails_the_rollout(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    task_builder("silent", test_sh="#!/bin/bash\necho checked\n")
    backend = make_backend(tmp_path, tmp_path / "tasks", agent="oracle", task_mode="dataset")
    outcome = await run(backend, "nr-1", metadata={"harbor_task_id": "silent"})
    assert outcome.workflow.status == RolloutStatus.SUCCESS
    assert outcome.grader is not None and outcome.grader.status == RolloutStatus.FAILURE
    assert outcome.grader.err_category == RolloutErrorCategory.VALIDATION_ERROR
    assert "reward" in (outcome.grader.err_message or "")
    assert backend.rollout_status("nr-1")["reward"] is None
    # A failed trial keeps its folder.
    assert any((tmp_path / "trials").glob("nr-1__*/result.json"))


async def test_a_reward_without_the_reward_key_is_a_validation_error(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    task_builder(
        "named", test_sh="#!/bin/bash\necho '{\"score\": 1}' > /logs/verifier/reward.json\n"
    )
    backend = make_backend(tmp_path, tmp_path / "tasks", agent="oracle", task_mode="dataset")
    outcome = await run(backend, "rk-1", metadata={"harbor_task_id": "named"})
    assert outcome.grader is not None and outcome.grader.status == RolloutStatus.FAILURE
    assert "no 'reward' key" in (outcome.grader.err_message or "")


async def test_tasks_with_symlinks_and_escaping_ids_are_refused(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    linked = task_builder("linked")
    (linked / "environment" / "passwd").symlink_to("/etc/passwd")
    make_task(tmp_path, "outside")
    backend = make_backend(tmp_path, tmp_path / "tasks", agent="oracle", task_mode="dataset")
    cases = {
        "sl-1": ({"harbor_task_id": "linked"}, "symlink"),
        "sl-2": ({"harbor_task_id": "../outside"}, "unknown harbor task id"),
        "sl-3": ({"harbor_task_id": "missing"}, "unknown harbor task id"),
        "sl-4": ({}, "unknown harbor task id"),
    }
    for rollout_id, (metadata, message) in cases.items():
        outcome = await run(backend, rollout_id, metadata=metadata)
        assert outcome.workflow.status == RolloutStatus.FAILURE
        assert message in (outcome.workflow.err_message or ""), outcome.workflow.err_message
        assert outcome.grader is not None and outcome.grader.status == RolloutStatus.FAILURE
    assert not (tmp_path / "trials").exists() or not any((tmp_path / "trials").iterdir())


async def test_no_tests_and_no_grader_is_no_reward_source(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    task_builder("untested", test_sh=None)
    backend = make_backend(tmp_path, tmp_path / "tasks", agent="oracle", task_mode="dataset")
    outcome = await run(backend, "ns-1", metadata={"harbor_task_id": "untested"})
    assert outcome.workflow.status == RolloutStatus.FAILURE
    assert "no reward source" in (outcome.workflow.err_message or "")


async def test_max_queue_depth_bounds_rollouts_in_flight(
    tmp_path: Path, code_dir: Path, task_builder: Callable[..., Path]
):
    task_builder("slow", agent_timeout_sec=300)
    backend = make_backend(
        tmp_path,
        tmp_path / "tasks",
        agent="harbor_flow:AskModel",
        task_mode="dataset",
        max_queue_depth=1,
    )
    assert backend.has_capacity()
    async with ScriptedModelServer(["42"]) as model:
        job = asyncio.create_task(
            run(
                backend,
                "q-1",
                chat_url=model.base_url,
                metadata={"harbor_task_id": "slow", "sleep": 60},
            )
        )
        await asyncio.sleep(0)
        assert not backend.has_capacity()
        assert backend.health()["in_flight"] == 1
        backend.cancel_rollouts(all=True)
        with pytest.raises(asyncio.CancelledError):
            await job
    assert backend.has_capacity()


def test_native_agents_are_wired_to_the_rollout_endpoint(
    tmp_path: Path, task_builder: Callable[..., Path]
):
    task = task_builder("t")
    url = "http://127.0.0.1:9/v1/rollouts/r1"
    request = ExecutionRequest(
        id="r1", prompt=[{"role": "user", "content": "x"}], agent_timeout_sec=30
    )
    terminus = make_backend(
        tmp_path, task, agent="terminus-2", native_agent_kwargs={"max_turns": 5}
    )
    config = terminus._agent_config(request, url, "openai/my-model", SECRET, None)
    assert (config.name, config.model_name, config.override_timeout_sec) == (
        "terminus-2",
        "openai/my-model",
        30,
    )
    assert config.kwargs["api_base"] == url and config.kwargs["llm_kwargs"] == {"api_key": SECRET}
    assert config.kwargs["enable_summarize"] is False and config.kwargs["max_turns"] == 5
    mini = make_backend(tmp_path, task, agent="mini-swe-agent")
    config = mini._agent_config(request, url, "openai/my-model", SECRET, "allowlist")
    assert config.env["OPENAI_API_BASE"] == config.env["OPENAI_BASE_URL"] == url
    assert config.env["OPENAI_API_KEY"] == SECRET
    assert config.env["MSWEA_COST_TRACKING"] == "ignore_errors"
    assert config.extra_allowed_hosts == ["127.0.0.1"]
    from harbor.trial.queue import TrialQueue

    from osmosis_ai.rollout.backend.harbor import HarborBackend

    with pytest.warns(UserWarning, match="not to train"):
        HarborBackend(orchestrator=TrialQueue(n_concurrent=1), tasks_dir=task, agent="oracle")
