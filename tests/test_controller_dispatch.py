"""The dispatcher end to end: a real rollout server, the controller service, a scripted model."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from subprocess import PIPE, STDOUT
from typing import Any

import httpx
import pytest
import pytest_asyncio

from osmosis_ai.controller.dispatch import Dispatcher, DispatchOutcome, DispatchRequest
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.controller.upstreams import OpenAICompatibleUpstream
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.testing.model_server import ScriptedModelServer
from osmosis_ai.testing.serving import free_port, serve_in_task
from rawhttp import first_submit, forwards_to, raw_server
from rollouts import TOOL_SCRIPT, AnswerGrader, MetadataGrader, ScriptedBehaviour, ToolWorkflow

PROMPT = [{"role": "user", "content": "What is 6 * 7?"}]


pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(autouse=True)
def _artifacts(artifact_root):
    return artifact_root


class BusyBackend(LocalBackend):
    """Says it has no capacity for the first ``busy_for`` admissions (the server answers 429)."""

    def __init__(self, busy_for: int, **options: Any) -> None:
        super().__init__(**options)
        self.busy_for = busy_for
        self.refused = 0

    def has_capacity(self) -> bool:
        if self.busy_for < 0 or self.refused < self.busy_for:
            self.refused += 1
            return False
        return super().has_capacity()


class Rewrite:
    """ASGI layer over the real server: shortens ``Retry-After`` (tests must not wait 5 s);
    with ``old_health`` hides ``process_id``/``lifecycle`` like a 0.3.0 server; with
    ``drop_callbacks`` ignores callback fields like a 0.3.8 server."""

    def __init__(self, app: Any, *, old_health: bool = False, drop_callbacks: bool = False):
        self.app = app
        self.old_health = old_health
        self.drop_callbacks = drop_callbacks

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        if self.drop_callbacks and scope["path"] == "/rollout":
            receive = await self._without_callbacks(receive)
        held: dict[str, Any] = {}

        async def rewrite(message):
            if message["type"] == "http.response.start":
                headers = [
                    (k, b"0.05" if k.lower() == b"retry-after" else v)
                    for k, v in message["headers"]
                ]
                message = {**message, "headers": headers}
                if self.old_health and scope["path"] == "/health":
                    held["start"] = message
                    return None
            elif "start" in held:
                body = json.loads(message["body"])
                body.pop("process_id")
                body.pop("lifecycle")
                raw = json.dumps(body).encode()
                start = held.pop("start")
                headers = [(k, v) for k, v in start["headers"] if k.lower() != b"content-length"]
                headers.append((b"content-length", str(len(raw)).encode()))
                await send({**start, "headers": headers})
                message = {**message, "body": raw}
            return await send(message)

        return await self.app(scope, receive, rewrite)

    @staticmethod
    async def _without_callbacks(receive):
        chunks = []
        while True:
            message = await receive()
            chunks.append(message.get("body", b""))
            if not message.get("more_body"):
                break
        body = json.loads(b"".join(chunks))
        for key in ("completion_callback_url", "grader_callback_url", "controller_api_key"):
            body.pop(key, None)
        sent = False

        async def replay():
            nonlocal sent
            if sent:
                return {"type": "http.disconnect"}
            sent = True
            return {"type": "http.request", "body": json.dumps(body).encode()}

        return replay


@dataclass
class Stack:
    model: ScriptedModelServer
    service: ControllerService
    url: str
    rewrite: Rewrite


@contextlib.asynccontextmanager
async def stack(backend: Any, *, old_health: bool = False, **server: Any) -> AsyncIterator[Stack]:
    app = create_rollout_server(backend=backend, configure_logging=False, **server)
    app = Rewrite(app, old_health=old_health)
    async with ScriptedModelServer(TOOL_SCRIPT) as model:
        upstream = OpenAICompatibleUpstream(model.base_url, None, "policy-model")
        proxy = PolicyProxy(upstream, request_token_data=True)
        try:
            async with (
                ControllerService(proxy) as service,
                serve_in_task(app) as url,
            ):
                yield Stack(model, service, url, app)
        finally:
            await upstream.aclose()


def tool_backend() -> LocalBackend:
    return LocalBackend(workflow=ToolWorkflow, grader=AnswerGrader)


def sleepy_backend(**options: Any) -> LocalBackend:
    return LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader, **options)


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def sleepy(tmp_path_factory) -> AsyncIterator[Stack]:
    """One server for the cancellation tests: their rollouts have distinct ids."""
    backend = sleepy_backend(artifact_root=tmp_path_factory.mktemp("artifacts"))
    async with stack(backend) as s:
        yield s


async def server_status(url: str, rollout_id: str, wanted: str, limit: float = 5.0) -> str:
    async with httpx.AsyncClient() as client, asyncio.timeout(limit):
        while True:
            body = (await client.get(f"{url}/rollout/{rollout_id}/status")).json()
            if body["status"] == wanted:
                return wanted
            await asyncio.sleep(0.02)


async def saved_file(path: Path, limit: float = 5.0) -> Path:
    async with asyncio.timeout(limit):
        while True:
            if await asyncio.to_thread(path.exists):
                return path
            await asyncio.sleep(0.02)


class Journal:
    def __init__(self) -> None:
        self.records: list[DispatchOutcome] = []

    async def __call__(self, outcome: DispatchOutcome) -> None:
        self.records.append(outcome)


# -- both generations end to end ---------------------------------------------------------------


async def test_both_generations_end_to_end(artifact_root):
    journal = Journal()
    async with (
        stack(tool_backend()) as s,
        Dispatcher(s.url, s.service) as auto,
        Dispatcher(s.url, s.service, generation="callback") as callback,
    ):
        request = DispatchRequest(PROMPT, label="42", extra_fields={"row_index": 3})
        polled = await auto.run(request, commit=journal)
        assert (await auto.health())["process_id"]
        with pytest.raises(UsageError):  # the attempt is closed on the proxy
            s.service.proxy.calls(polled.rollout_id)
        called = await callback.run(request, commit=journal)
        ungraded = await callback.run(DispatchRequest(PROMPT, grade=False), commit=journal)
        # Saved after the grader callback was acknowledged.
        path = await saved_file(artifact_root / called.rollout_id / "trajectory.json")
    assert journal.records == [polled, called, ungraded]
    assert s.model.request_count == 6
    for outcome in (polled, called):
        assert outcome.kind == "result" and outcome.admitted
        assert outcome.status == RolloutStatus.SUCCESS
        assert outcome.sample is not None and outcome.sample.reward == 1.0
        assert len(outcome.rollout_id) == 32 and len(outcome.calls) == 2
        assert all(call.ok and call.completion_token_ids for call in outcome.calls)
        assert outcome.total_tokens == sum(call.usage.total for call in outcome.calls)
        assert outcome.duration_ms > 0
    assert polled.generation == "polling" and polled.result is not None
    saved = json.loads((artifact_root / polled.rollout_id / "trajectory.json").read_text())
    assert saved["extra"]["osmosis"]["request_extra_fields"] == {"row_index": 3}

    assert called.generation == "callback" and called.result is None
    assert called.completion is not None and called.completion.status == "success"
    assert called.grader is not None and called.grader.status == "success"
    saved = json.loads(path.read_text())
    assert saved["agent"]["model_name"] == "policy-model"  # from the completion ack's report
    steps = [step for step in saved["steps"] if step["source"] == "agent"]
    recorded = [call.completion_token_ids for call in called.calls]
    assert [step["metrics"]["completion_token_ids"] for step in steps] == recorded

    assert ungraded.kind == "result" and ungraded.grader is None  # committed on the completion
    assert ungraded.status == RolloutStatus.SUCCESS and ungraded.sample is None


# -- admission ------------------------------------------------------------------------------


async def test_429_is_retried_after_retry_after_within_the_budget():
    backend = BusyBackend(3, workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with stack(backend) as s:
        for generation in ("polling", "callback"):
            backend.busy_for, backend.refused = 3, 0
            async with Dispatcher(s.url, s.service, generation=generation) as dispatcher:
                outcome = await dispatcher.run(DispatchRequest(PROMPT, label="42"))
                assert outcome.kind == "result" and outcome.status == RolloutStatus.SUCCESS
                assert backend.refused == 3
                backend.busy_for = -1  # always busy: the admission budget runs out
                dispatcher.max_admission_wait_sec = 0.2
                starved = await dispatcher.run(DispatchRequest(PROMPT, label="42"))
                assert (starved.kind, starved.admitted) == ("timeout", False)
                assert "not admitted within 0.2s" in (starved.detail or "")


async def test_4xx_admissions_are_rejected():
    async with (
        stack(sleepy_backend(), api_key="server-key") as s,
        Dispatcher(s.url, s.service, api_key="server-key") as keyed,
        Dispatcher(s.url, s.service) as keyless,
    ):
        for generation in ("polling", "callback"):
            keyless.generation = generation
            outcome = await keyless.run(DispatchRequest(PROMPT))
            assert (outcome.kind, outcome.status_code) == ("admission_rejected", 401)
            assert not outcome.admitted and "unauthorized" in (outcome.detail or "")
        first = await keyed.run(DispatchRequest(PROMPT, rollout_id="dup"))
        # the same request under the same id, while the server holds its result: answered
        # as a replay of the first submit, with the first's lease and so its result
        replayed = await keyed.run(DispatchRequest(PROMPT, rollout_id="dup"))
        again = await keyed.run(DispatchRequest(PROMPT, label="other", rollout_id="dup"))
        keyless.generation = None  # auto: /health itself answers 401
        unknown = await keyless.run(DispatchRequest(PROMPT))
    assert first.kind == "result"
    assert (replayed.kind, replayed.result) == ("result", first.result)
    assert (again.kind, again.status_code) == ("admission_rejected", 409)
    assert (unknown.kind, unknown.generation) == ("transport_error", None)


async def test_a_lost_submit_answer_is_recovered_from_the_resend(sleepy):
    journal, s = Journal(), sleepy
    async with (
        raw_server(forwards_to(s.url, first_submit("after"))) as front,
        Dispatcher(front.origin, s.service, generation="polling") as dispatcher,
    ):
        await dispatcher.health()  # a kept-alive connection, which the submit reuses
        request = DispatchRequest(PROMPT, label="42", metadata={"sleep": 0.2})
        outcome = await dispatcher.run(request, commit=journal)
    # the server admitted the first POST and answered the resend, the same bytes, with the
    # same lease: the attempt is polled to its result, as if nothing was lost
    submits = [body for head, body in front.requests if head.startswith(b"POST /rollout ")]
    assert len(submits) == 2 and submits[0] == submits[1]
    assert (outcome.kind, outcome.admitted, outcome.status) == (
        "result",
        True,
        RolloutStatus.SUCCESS,
    )
    assert outcome.sample is not None and outcome.sample.reward == 1.0
    assert outcome.cancel_disposition is None
    assert journal.records == [outcome]


async def lease_lost(server_url: str, service: ControllerService, *, replays: bool) -> None:
    """A submit whose answer is lost, against a server at ``server_url`` that does not
    replay (or behind a front that makes it so: ``replays=False``): admitted, its lease
    lost, the orphan cancelled, nothing journaled; the item's next attempt, under a fresh
    id, runs."""
    journal = Journal()
    lose = first_submit("after")
    async with (
        raw_server(forwards_to(server_url, lose, replays=replays)) as front,
        Dispatcher(front.origin, service, generation="polling") as dispatcher,
    ):
        await dispatcher.health()  # a kept-alive connection, which the submit reuses
        request = DispatchRequest(PROMPT, label="42", metadata={"sleep": 30})
        outcome = await dispatcher.run(request, commit=journal)
        if not replays:  # this package's server: its status endpoint shows the cancel
            assert await server_status(server_url, outcome.rollout_id, "cancelled") == "cancelled"
        retried = await dispatcher.run(DispatchRequest(PROMPT, label="42"), commit=journal)
    # the server admitted the first POST; its resend got 409 for the same id
    submits = [head for head, _ in front.requests if head.startswith(b"POST /rollout ")]
    assert len(submits) == 3  # the lost one, its resend, and the next attempt's
    assert (outcome.kind, outcome.admitted) == ("transport_error", True)
    assert outcome.cancel_disposition in ("cancelled_queued", "cancelled_running")
    assert "was admitted, but its answer was lost" in (outcome.detail or "")
    assert retried.rollout_id != outcome.rollout_id
    assert (retried.kind, retried.status) == ("result", RolloutStatus.SUCCESS)
    assert journal.records == [retried]  # the lost attempt is never journaled as failed


async def test_a_lost_submit_answer_from_a_server_without_replay_is_an_admitted_attempt(sleepy):
    await lease_lost(sleepy.url, sleepy.service, replays=False)


COMPAT_PYTHON = os.environ.get("OSMOSIS_COMPAT_PYTHON", "")
ORIGINAL_SERVER = """
import asyncio
import os

import uvicorn

from osmosis_ai.rollout import AgentWorkflow, Grader, LocalBackend
from osmosis_ai.rollout.server import create_rollout_server


class Sleepy(AgentWorkflow):
    async def run(self, ctx):
        await asyncio.sleep((ctx.metadata or {}).get("sleep", 0))
        return [*ctx.prompt, {"role": "assistant", "content": "#### 42"}]


class Full(Grader):
    async def grade(self, ctx):
        ctx.set_reward(1.0)


app = create_rollout_server(backend=LocalBackend(workflow=Sleepy, grader=Full))
uvicorn.run(app, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
"""


@pytest.mark.compat
@pytest.mark.skipif(
    not COMPAT_PYTHON,
    reason="compat tier: set OSMOSIS_COMPAT_PYTHON to an interpreter with the original "
    "osmosis-ai 0.3.8 (extra server) installed",
)
async def test_a_lost_submit_answer_from_the_original_server_is_an_admitted_attempt(
    sleepy, tmp_path
):
    script = tmp_path / "original_server.py"
    script.write_text(ORIGINAL_SERVER)
    port = free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OSMOSIS_", "_OSMOSIS_"))}
    env |= {"PORT": str(port), "_OSMOSIS_ROLLOUT_ARTIFACT_ROOT": str(tmp_path / "artifacts")}
    proc = await asyncio.create_subprocess_exec(
        COMPAT_PYTHON, str(script), env=env, stdout=PIPE, stderr=STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    try:
        async with httpx.AsyncClient() as client, asyncio.timeout(60):
            while True:
                if proc.returncode is not None:
                    output = (await proc.communicate())[0].decode(errors="replace")
                    raise AssertionError(f"the original server exited: {output}")
                with contextlib.suppress(httpx.TransportError):
                    if (await client.get(f"{url}/health")).status_code == 200:
                        break
                await asyncio.sleep(0.1)
        # 0.3.8 answers the resend 409 itself: the front passes it on as it is
        await lease_lost(url, sleepy.service, replays=True)
    finally:
        if proc.returncode is None:
            proc.terminate()
        await asyncio.wait_for(proc.communicate(), 30)


async def test_a_submit_lost_before_reaching_the_server_is_sent_again(sleepy):
    journal, s = Journal(), sleepy
    async with (
        raw_server(forwards_to(s.url, first_submit("before"))) as front,
        Dispatcher(front.origin, s.service, generation="polling") as dispatcher,
    ):
        await dispatcher.health()
        resent = await dispatcher.run(DispatchRequest(PROMPT, label="42"), commit=journal)
    assert (resent.kind, resent.status) == ("result", RolloutStatus.SUCCESS)


# -- deadline and cancellation ------------------------------------------------------------------


async def test_the_deadline_cancels_the_remote_rollout(sleepy):
    journal, s = Journal(), sleepy
    async with (
        Dispatcher(s.url, s.service, generation="polling") as polling,
        Dispatcher(s.url, s.service, generation="callback") as callback,
    ):
        request = DispatchRequest(PROMPT, metadata={"sleep": 30}, deadline_sec=0.3)
        outcomes = await asyncio.gather(
            polling.run(request, commit=journal), callback.run(request, commit=journal)
        )
        for outcome in outcomes:
            assert await server_status(s.url, outcome.rollout_id, "cancelled") == "cancelled"
    assert [o.generation for o in outcomes] == ["polling", "callback"]
    for outcome in outcomes:
        assert (outcome.kind, outcome.cancel_disposition) == ("timeout", "cancelled_running")
        assert "0.3s deadline" in (outcome.detail or "")
    assert journal.records == []


async def test_cancel_all_ends_the_attempts_as_cancelled(sleepy):
    journal, s = Journal(), sleepy
    async with (
        Dispatcher(s.url, s.service, generation="polling") as polling,
        Dispatcher(s.url, s.service, generation="callback") as callback,
    ):
        tasks = [
            asyncio.create_task(
                dispatcher.run(
                    DispatchRequest(PROMPT, metadata={"sleep": 30}, rollout_id=rollout_id),
                    commit=journal,
                )
            )
            for dispatcher, rollout_id in ((polling, "p1"), (callback, "c1"))
        ]
        for rollout_id in ("p1", "c1"):
            await server_status(s.url, rollout_id, "running")
        assert await polling.cancel_all(["p1", "c1", "ghost"]) == {
            "p1": "cancelled_running",
            "c1": "cancelled_running",
            "ghost": "not_found",
        }
        assert await polling.cancel_all([]) == {}
        outcomes = await asyncio.wait_for(asyncio.gather(*tasks), 5)
    for outcome in outcomes:
        assert outcome.kind == "cancelled" and outcome.status == RolloutStatus.CANCELLED
    assert sorted(journal.records, key=lambda o: o.rollout_id) == [outcomes[1], outcomes[0]]


async def test_a_cancelled_task_cancels_the_remote_rollout(sleepy):
    s = sleepy
    async with Dispatcher(s.url, s.service) as dispatcher:
        request = DispatchRequest(PROMPT, metadata={"sleep": 30}, rollout_id="t1")
        task = asyncio.create_task(dispatcher.run(request))
        await server_status(s.url, "t1", "running")
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert await server_status(s.url, "t1", "cancelled") == "cancelled"
        assert "t1" not in s.service.listener


# -- generation detection -------------------------------------------------------------------------


async def test_generation_detection():
    async with stack(tool_backend(), old_health=True) as s:
        async with Dispatcher(s.url, s.service) as dispatcher:
            assert await dispatcher.detect_generation() == "callback"  # a 0.3.0-style /health
            outcome = await dispatcher.run(DispatchRequest(PROMPT, label="42"))
            assert (outcome.kind, outcome.generation) == ("result", "callback")
            assert outcome.sample is not None and outcome.sample.reward == 1.0
        s.rewrite.drop_callbacks = True  # now a 0.3.8 server: callback fields are ignored
        async with Dispatcher(s.url, s.service) as dispatcher:
            assert await dispatcher.detect_generation() == "callback"
            outcome = await dispatcher.run(DispatchRequest(PROMPT, label="42"))
            assert dispatcher.generation == "polling"  # the 202 carried a polling lease
            assert (outcome.kind, outcome.generation) == ("result", "polling")
            assert outcome.result is not None and outcome.sample.reward == 1.0
            assert len(outcome.calls) == 2
