"""The rollout server, callback generation (0.3.0), driven over real HTTP."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server.execution import RolloutRunner
from osmosis_ai.rollout.server.registry import Registry
from osmosis_ai.testing import CallbackReceiver
from osmosis_ai.testing.model_server import ScriptedModelServer
from osmosis_ai.testing.serving import serve_in_task
from rollouts import (
    TOOL_SCRIPT,
    AnswerGrader,
    MetadataGrader,
    ScriptedBehaviour,
    ToolWorkflow,
    init_body,
    rollout_server,
)

KEY = "controller-key"


class Flaky:
    """An ASGI layer that answers the first ``failures`` callbacks with 503."""

    def __init__(self, app: Any, failures: int) -> None:
        self.app = app
        self.failures = failures
        self.refused = 0

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http" and self.refused < self.failures:
            self.refused += 1
            await send({"type": "http.response.start", "status": 503, "headers": []})
            await send({"type": "http.response.body", "body": b""})
            return
        await self.app(scope, receive, send)


async def run_callback_rollout(
    server_url: str,
    receiver_url: str,
    receiver: CallbackReceiver,
    rollout_id: str | None,
    chat_url: str,
    *,
    grade: bool = True,
    **fields: Any,
) -> httpx.Response:
    path_id = rollout_id or "minted"
    receiver.expect(path_id)
    body = init_body(
        rollout_id,
        chat_url,
        completion_callback_url=f"{receiver_url}/v1/rollouts/{path_id}/completion",
        controller_api_key=KEY,
        **fields,
    )
    if grade:
        body["grader_callback_url"] = f"{receiver_url}/v1/rollouts/{path_id}/grader"
    async with httpx.AsyncClient() as client:
        return await client.post(f"{server_url}/rollout", json=body)


async def test_tool_rollout_with_callbacks_and_report(artifact_root):
    receiver = CallbackReceiver(KEY)
    calls = [
        {
            "prompt_tokens": 10,
            "completion_tokens": 3,
            "prompt_token_ids": [1, 2],
            "completion_token_ids": [3],
            "logprobs": [-0.5],
        },
        {"prompt_tokens": 20, "completion_tokens": 4},
    ]
    report = {"model_name": "policy-7", "samples": {"0": {"llm_call_metrics": calls}}}
    backend = LocalBackend(workflow=ToolWorkflow, grader=AnswerGrader)
    async with (
        ScriptedModelServer(TOOL_SCRIPT, record_requests=True) as model,
        serve_in_task(receiver.app) as receiver_url,
        rollout_server(backend) as url,
    ):
        receiver.expect("t1", ack_trajectory=report)
        body = init_body(
            "t1",
            f"{model.base_url}/rollouts/t1",
            llm_api_key=None,
            completion_callback_url=f"{receiver_url}/v1/rollouts/t1/completion",
            grader_callback_url=f"{receiver_url}/v1/rollouts/t1/grader",
            controller_api_key=KEY,
        )
        async with httpx.AsyncClient() as client:
            response = await client.post(f"{url}/rollout", json=body)
            assert (response.status_code, response.json()) == (202, {})
            grader = await asyncio.wait_for(receiver.wait_for("t1", "grader"), 30)
            completion = receiver.body("t1", "completion")
            status = (await client.get(f"{url}/rollout/t1/status")).json()
            # the trajectory (with the acks' report) is saved after the callbacks, before the
            # rollout's task ends
            await RolloutClient(url, http_client=client).wait_idle(poll_interval_sec=0.02)
        path = artifact_root / "t1" / "trajectory.json"
    assert completion == {
        "status": "success",
        "rollout_id": "t1",
        "extra_fields": None,
        "err_message": None,
        "err_category": None,
    }
    assert grader["status"] == "success" and grader["sample"]["reward"] == 1.0
    assert "trajectory_messages" not in grader["sample"]
    assert status["status"] == "success" and status["reward"] == 1.0
    # Without llm_api_key the agent's bearer falls back to controller_api_key.
    assert {r.headers["authorization"] for r in model.requests} == {f"Bearer {KEY}"}
    trajectory = json.loads(path.read_text())
    agent_steps = [s for s in trajectory["steps"] if s["source"] == "agent"]
    assert agent_steps[0]["metrics"]["completion_token_ids"] == [3]
    assert trajectory["agent"]["model_name"] == "policy-7"
    assert [c.kind for c in receiver.calls] == ["completion", "grader"]


async def test_minted_id_duplicates_and_no_grader_url(artifact_root):
    receiver = CallbackReceiver(KEY)
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with serve_in_task(receiver.app) as receiver_url, rollout_server(backend) as url:
        minted = await run_callback_rollout(
            url, receiver_url, receiver, None, "http://127.0.0.1:9/v1"
        )
        assert minted.status_code == 202
        grader = await asyncio.wait_for(receiver.wait_for("minted", "grader"), 30)
        assert grader["rollout_id"] is None  # the server's own id is not echoed back
        for _ in range(2):  # the callback generation never de-duplicated ids
            receiver.forget("dup")
            again = await run_callback_rollout(
                url, receiver_url, receiver, "dup", "http://127.0.0.1:9/v1", grade=False
            )
            assert again.status_code == 202
            done = await asyncio.wait_for(receiver.wait_for("dup", "completion"), 30)
            assert done["status"] == "success"
        assert [c.kind for c in receiver.calls if c.rollout_id == "dup"] == [
            "completion",
            "completion",
        ]


async def test_failed_workflow_still_gets_a_grader_callback(artifact_root):
    receiver = CallbackReceiver(KEY)
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with serve_in_task(receiver.app) as receiver_url, rollout_server(backend) as url:
        await run_callback_rollout(
            url, receiver_url, receiver, "f", "http://127.0.0.1:9/v1", metadata={"raise": "nope"}
        )
        grader = await asyncio.wait_for(receiver.wait_for("f", "grader"), 30)
        completion = receiver.body("f", "completion")
    assert completion["status"] == "failure" and completion["err_message"] == "nope"
    assert grader == {
        "status": "failure",
        "rollout_id": "f",
        "sample": None,
        "err_message": "nope",
        "err_category": "validation_error",
    }


async def test_callbacks_are_retried_on_503(artifact_root):
    receiver = CallbackReceiver(KEY)
    flaky = Flaky(receiver.app, failures=2)
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with serve_in_task(flaky) as receiver_url, rollout_server(backend) as url:
        await run_callback_rollout(url, receiver_url, receiver, "retry", "http://127.0.0.1:9/v1")
        grader = await asyncio.wait_for(receiver.wait_for("retry", "grader"), 30)
    assert flaky.refused == 2
    assert grader["status"] == "success"


async def test_removed_sample_reward_is_nulled_on_the_wire(artifact_root):
    receiver = CallbackReceiver(KEY)
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with serve_in_task(receiver.app) as receiver_url, rollout_server(backend) as url:
        await run_callback_rollout(
            url, receiver_url, receiver, "rm", "http://127.0.0.1:9/v1", metadata={"remove": True}
        )
        grader = await asyncio.wait_for(receiver.wait_for("rm", "grader"), 30)
    assert grader["status"] == "success"
    assert grader["sample"]["remove_sample"] is True and grader["sample"]["reward"] is None


async def test_cancel_after_execution_ended_does_not_strand_the_result():
    """A cancel that lands while the result is being saved must not cancel publication."""
    backend = LocalBackend(workflow=ScriptedBehaviour)
    registry = Registry(
        polling_lease_timeout_sec=60, result_retention_sec=60, on_lease_expired=lambda e: None
    )
    async with httpx.AsyncClient() as client:
        runner = RolloutRunner(backend, registry, client, save_trajectories=False)
        entry, _lease = registry.admit("late", "polling")
        task = asyncio.create_task(asyncio.sleep(10))
        registry.attach(entry, task)
        entry.concluding = True
        assert runner.cancel(["late"], None, False) == {"late": "not_found"}
        assert not task.cancelled()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
