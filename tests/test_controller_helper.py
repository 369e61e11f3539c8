"""ProtocolController against a real rollout server, both generations, and CallbackReceiver rules."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

import osmosis_ai.testing as testing
from osmosis_ai.errors import RolloutProtocolError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    Grader,
    LocalBackend,
    RolloutErrorCategory,
    RolloutStatus,
)
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import CallbackReceiver, ControllerOutcome, ProtocolController
from osmosis_ai.testing.serving import serve_in_task

CHAT_URL = "http://127.0.0.1:9/v1"  # never dialled: the workflow below does not call a model
PROMPT = [{"role": "user", "content": "hello"}]
KEY = "controller-key"


class EchoWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """Echoes the last prompt message; ``metadata`` may ask it to sleep or fail."""

    async def run(self, ctx):
        meta = ctx.metadata or {}
        await asyncio.sleep(meta.get("sleep", 0))
        if "fail" in meta:
            raise ValueError(meta["fail"])
        return [*ctx.prompt, {"role": "assistant", "content": ctx.prompt[-1]["content"]}]


class ExactGrader(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


@pytest.fixture(autouse=True)
def _artifacts(artifact_root):
    return artifact_root


@contextlib.asynccontextmanager
async def rollout_server(**options: Any) -> AsyncIterator[str]:
    backend = LocalBackend(workflow=EchoWorkflow, grader=ExactGrader)
    app = create_rollout_server(backend=backend, configure_logging=False, **options)
    async with serve_in_task(app) as url:
        yield url


def test_exports_are_lazy_and_complete():
    assert testing.__all__ == sorted(testing._EXPORTS)
    assert testing.ProtocolController is ProtocolController
    with pytest.raises(AttributeError):
        _ = testing.NoSuchHelper


# -- ProtocolController ----------------------------------------------------------------------


async def test_auto_detects_polling_and_runs_a_graded_rollout():
    async with rollout_server() as url, ProtocolController(url) as controller:
        assert await controller.resolve_generation() == "polling"
        outcome = await controller.run(PROMPT, CHAT_URL, label="hello", rollout_id="p1")
        assert isinstance(outcome, ControllerOutcome)
        assert outcome.generation == "polling" and outcome.rollout_id == "p1"
        assert outcome.status == RolloutStatus.SUCCESS and outcome.reward == 1.0
        assert outcome.result is not None and outcome.completion is None


async def test_polling_failure_and_ungraded_runs():
    async with rollout_server() as url, ProtocolController(url, generation="polling") as controller:
        failed = await controller.run(PROMPT, CHAT_URL, metadata={"fail": "boom"})
        assert failed.status == RolloutStatus.FAILURE and failed.sample is None
        assert failed.err_message == "boom"
        assert failed.err_category == RolloutErrorCategory.VALIDATION_ERROR
        ungraded = await controller.run(PROMPT, CHAT_URL, label="hello", grade=False)
        assert ungraded.status == RolloutStatus.SUCCESS and ungraded.reward is None


async def test_callback_generation_graded(artifact_root):
    report = {"model_name": "policy-v7", "samples": {}}
    async with (
        rollout_server() as url,
        ProtocolController(url, generation="callback", controller_api_key=KEY) as controller,
    ):
        outcome = await controller.run(
            PROMPT, CHAT_URL, label="hello", rollout_id="c1", ack_trajectory=report
        )
        assert outcome.generation == "callback" and outcome.rollout_id == "c1"
        assert outcome.status == RolloutStatus.SUCCESS and outcome.reward == 1.0
        assert outcome.sample is not None and outcome.sample.messages[-1]["content"] == "hello"
        assert outcome.completion is not None and outcome.completion["status"] == "success"
        assert outcome.grader is not None and outcome.grader["status"] == "success"
        assert outcome.result is None
        calls = controller.receiver.calls
        assert [(c.kind, c.status_code) for c in calls] == [("completion", 200), ("grader", 200)]
        # Callback generation saves the trajectory after the grader callback (reference §2.3).
        path = artifact_root / "c1" / "trajectory.json"
        for _ in range(200):
            if path.exists():
                break
            await asyncio.sleep(0.025)
        assert "policy-v7" in path.read_text()  # the completion ack's report was used


async def test_callback_generation_without_grading():
    async with (
        rollout_server() as url,
        ProtocolController(url, generation="callback") as controller,
    ):
        outcome = await controller.run(PROMPT, CHAT_URL, label="hello", grade=False)
        assert outcome.status == RolloutStatus.SUCCESS
        assert outcome.grader is None and outcome.sample is None and outcome.reward is None
        assert outcome.completion is not None
        assert [c.kind for c in controller.receiver.calls] == ["completion"]


async def test_callback_generation_failure():
    async with (
        rollout_server() as url,
        ProtocolController(url, generation="callback") as controller,
    ):
        outcome = await controller.run(PROMPT, CHAT_URL, label="hello", metadata={"fail": "boom"})
        assert outcome.status == RolloutStatus.FAILURE
        assert outcome.err_message == "boom"
        assert outcome.err_category == RolloutErrorCategory.VALIDATION_ERROR
        assert outcome.reward is None
        assert outcome.grader is not None and outcome.grader["status"] == "failure"


async def test_callback_timeout_cancels_the_rollout():
    async with (
        rollout_server() as url,
        ProtocolController(url, generation="callback") as controller,
    ):
        with pytest.raises(TimeoutError, match=r"did not finish within 0\.5s"):
            await controller.run(
                PROMPT, CHAT_URL, rollout_id="slow", metadata={"sleep": 30}, timeout=0.5
            )
        completion = await asyncio.wait_for(controller.receiver.wait_for("slow", "completion"), 10)
        assert completion["status"] == "cancelled"


async def test_polling_timeout_cancels_the_rollout():
    async with rollout_server() as url, ProtocolController(url) as controller:
        with pytest.raises(TimeoutError, match="polling generation"):
            await controller.run(
                PROMPT, CHAT_URL, rollout_id="slow", metadata={"sleep": 30}, timeout=0.5
            )
        status = await controller.client.status("slow")
        assert status.status == RolloutStatus.CANCELLED


async def test_server_api_key_for_both_generations():
    async with rollout_server(api_key="s3cret") as url:
        for generation in ("auto", "callback"):
            async with ProtocolController(
                url, generation=generation, api_key="s3cret"
            ) as controller:
                outcome = await controller.run(PROMPT, CHAT_URL, label="hello")
                assert outcome.status == RolloutStatus.SUCCESS and outcome.reward == 1.0
        async with ProtocolController(url, generation="callback") as anonymous:
            with pytest.raises(RolloutProtocolError) as caught:
                await anonymous.run(PROMPT, CHAT_URL, label="hello")
            assert caught.value.status_code == 401


async def test_auto_falls_back_to_callback_without_lifecycle():
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    async def health(request):
        return JSONResponse({"status": "ok", "instance_id": "x"})

    app = Starlette(routes=[Route("/health", health)])
    async with serve_in_task(app) as url, ProtocolController(url) as controller:
        assert await controller.resolve_generation() == "callback"


# -- CallbackReceiver rules (reference §2.5) ---------------------------------------------------


@pytest.fixture
async def receiver():
    rec = CallbackReceiver(KEY)
    transport = httpx.ASGITransport(app=rec.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://receiver") as http:
        rec.http = http
        yield rec


async def post(rec, rollout_id, kind, body, key=KEY, raw=None):
    headers = {} if key is None else {"Authorization": f"Bearer {key}"}
    content = raw if raw is not None else json.dumps(body).encode()
    return await rec.http.post(
        f"/v1/rollouts/{rollout_id}/{kind}", content=content, headers=headers
    )


DONE = {"status": "success", "rollout_id": "r1", "err_message": None, "err_category": None}
GRADED = {
    "status": "success",
    "rollout_id": "r1",
    "sample": {"messages": [], "label": "x", "reward": 0.5, "remove_sample": False},
}


async def test_receiver_rejects_bad_bearer(receiver):
    receiver.expect("r1")
    for key in (None, "wrong", ""):
        response = await post(receiver, "r1", "completion", DONE, key=key)
        assert response.status_code == 401
    response = await receiver.http.post(
        "/v1/rollouts/r1/completion", json=DONE, headers={"Authorization": f"Basic {KEY}"}
    )
    assert response.status_code == 401
    assert receiver.body("r1", "completion") is None


async def test_receiver_404_for_unknown_and_forgotten_ids(receiver):
    assert (await post(receiver, "nobody", "completion", DONE)).status_code == 404
    receiver.expect("r1")
    receiver.forget("r1")
    assert (await post(receiver, "r1", "grader", GRADED)).status_code == 404


@pytest.mark.parametrize(
    ("kind", "body", "raw"),
    [
        ("completion", {**DONE, "rollout_id": "other"}, None),
        ("grader", {**GRADED, "rollout_id": "other"}, None),
        ("completion", {**DONE, "status": "running"}, None),
        ("completion", {**DONE, "status": "queued"}, None),
        ("grader", {**GRADED, "status": "pending"}, None),
        ("completion", {"rollout_id": "r1"}, None),
        ("grader", {**GRADED, "sample": {"reward": "lots"}}, None),
        ("completion", None, b"{not json"),
        ("completion", None, b"[1, 2]"),
        ("completion", None, b""),
    ],
)
async def test_receiver_422_cases(receiver, kind, body, raw):
    receiver.expect("r1")
    response = await post(receiver, "r1", kind, body, raw=raw)
    assert response.status_code == 422, response.text
    assert "detail" in response.json()
    assert receiver.body("r1", kind) is None
    assert receiver.calls[-1].status_code == 422


async def test_receiver_422_for_a_path_id_that_is_not_one_segment():
    rec = CallbackReceiver(KEY)
    rec.expect("..")
    code, answer = await rec.receive("completion", "..", f"Bearer {KEY}", json.dumps(DONE).encode())
    assert code == 422 and "relative path" in answer["detail"]


async def test_receiver_acks_and_answers_duplicates_with_the_stored_ack(receiver):
    trajectory = {"model_name": "m", "samples": {}}
    receiver.expect("r1", ack_trajectory=trajectory)
    first = await post(receiver, "r1", "completion", DONE)
    assert first.status_code == 200 and first.json() == {"ok": True, "trajectory": trajectory}
    conflicting = {**DONE, "status": "failure", "err_message": "late"}
    again = await post(receiver, "r1", "completion", conflicting)
    assert again.status_code == 200 and again.json() == first.json()
    assert receiver.body("r1", "completion") == DONE  # the first body wins

    no_id = {k: v for k, v in GRADED.items() if k != "rollout_id"}  # rollout_id is optional
    graded = await post(receiver, "r1", "grader", no_id)
    assert graded.status_code == 200 and graded.json() == {"ok": True}
    assert (await post(receiver, "r1", "grader", no_id)).json() == {"ok": True}
    assert await receiver.wait_for("r1", "grader") == no_id
    assert [(c.kind, c.status_code) for c in receiver.calls] == [
        ("completion", 200),
        ("completion", 200),
        ("grader", 200),
        ("grader", 200),
    ]


async def test_receiver_accepts_every_terminal_status(receiver):
    for index, status in enumerate(("success", "failure", "cancelled")):
        receiver.expect(f"r{index}")
        body = {**DONE, "rollout_id": f"r{index}", "status": status}
        assert (await post(receiver, f"r{index}", "completion", body)).status_code == 200
    receiver.expect("g")
    failed = {"status": "failure", "sample": None, "err_message": "no reward"}
    assert (await post(receiver, "g", "grader", failed)).status_code == 200
