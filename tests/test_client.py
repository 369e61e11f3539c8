"""RolloutClient against a real rollout server (LocalBackend) on 127.0.0.1."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout import (
    AgentWorkflow,
    AgentWorkflowConfig,
    Grader,
    LocalBackend,
    RolloutErrorCategory,
    RolloutStatus,
)
from osmosis_ai.rollout.client import (
    RolloutAdmissionTimeoutError,
    RolloutClient,
    RolloutHandle,
    RolloutLeaseLostError,
    RolloutProtocolError,
    retry_after_sec,
)
from osmosis_ai.rollout.http import async_client
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing.serving import serve_in_task
from rawhttp import first_submit, forwards_to, raw_server

CHAT_URL = "http://127.0.0.1:9/v1"  # never dialled: the workflows below do not call a model
PROMPT = [{"role": "user", "content": "hello"}]


started_tags: list[str] = []


class EchoWorkflow(AgentWorkflow[AgentWorkflowConfig]):
    """Echoes the last prompt message; ``metadata`` may ask it to sleep or fail, and its
    ``tag`` is noted in :data:`started_tags` as it starts."""

    async def run(self, ctx):
        meta = ctx.metadata or {}
        if "tag" in meta:
            started_tags.append(meta["tag"])
        await asyncio.sleep(meta.get("sleep", 0))
        if "fail" in meta:
            raise ValueError(meta["fail"])
        return [*ctx.prompt, {"role": "assistant", "content": ctx.prompt[-1]["content"]}]


class ExactGrader(Grader):
    """Reward 1.0 when the answer equals the label; ``metadata.grade_sleep`` slows it."""

    async def grade(self, ctx):
        await asyncio.sleep((ctx.metadata or {}).get("grade_sleep", 0))
        ctx.set_reward(1.0 if ctx.sample.messages[-1]["content"] == ctx.label else 0.0)


class FullBackend(LocalBackend):
    """A LocalBackend that never has capacity: the server answers 429."""

    def has_capacity(self) -> bool:
        return False


class Faults:
    """ASGI app fronting the real server: the first matching requests get scripted answers.

    A script entry is ``(status, headers)`` or ``"drop"`` (start a response, then break the
    connection mid-body, which the client sees as ``httpx.RemoteProtocolError``).
    """

    def __init__(self, app: Any, method: str, suffix: str, script: list[Any]) -> None:
        self.app, self.method, self.suffix, self.script = app, method, suffix, list(script)
        self.hits = 0

    async def __call__(self, scope, receive, send):
        matches = (
            scope["type"] == "http"
            and scope["method"] == self.method
            and scope["path"].endswith(self.suffix)
        )
        if not (matches and self.script):
            await self.app(scope, receive, send)
            return
        action = self.script.pop(0)
        self.hits += 1
        if action == "drop":
            headers = [(b"content-type", b"application/json"), (b"content-length", b"100")]
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b"{", "more_body": True})
            raise RuntimeError("scripted connection drop")
        status, extra = action
        body = json.dumps({"detail": f"scripted {status}"}).encode()
        headers = [(b"content-type", b"application/json")]
        headers += [(k.lower().encode(), v.encode()) for k, v in extra.items()]
        await send({"type": "http.response.start", "status": status, "headers": headers})
        await send({"type": "http.response.body", "body": body})


@pytest.fixture(autouse=True)
def _artifacts(artifact_root):
    return artifact_root


@contextlib.asynccontextmanager
async def rollout_server(
    backend_cls: type[LocalBackend] = LocalBackend, wrap: Any = None, **options: Any
) -> AsyncIterator[str]:
    backend = backend_cls(workflow=EchoWorkflow, grader=ExactGrader)
    app = create_rollout_server(backend=backend, configure_logging=False, **options)
    async with serve_in_task(app if wrap is None else wrap(app)) as url:
        yield url


async def test_graded_rollout_succeeds_with_reward():
    async with rollout_server() as url, RolloutClient(url) as client:
        result = await client.run_rollout_async(
            PROMPT,
            CHAT_URL,
            rollout_id="r1",
            label="hello",
            llm_api_key="k",
            extra_fields={"row": 1},
        )
        assert result.rollout_id == "r1"
        assert result.status == RolloutStatus.SUCCESS
        assert result.sample is not None and result.sample.reward == 1.0
        assert result.sample.messages[-1] == {"role": "assistant", "content": "hello"}
        assert result.err_message is None and result.err_category is None
        idle = await client.wait_idle(timeout_sec=5, poll_interval_sec=0.05)
        assert idle["lifecycle"]["active_rollouts"] == 0


async def test_generated_rollout_id_is_uuid_hex():
    async with rollout_server() as url, RolloutClient(url) as client:
        handle = await client.submit(PROMPT, CHAT_URL, label="hello")
        assert len(handle.rollout_id) == 32 and int(handle.rollout_id, 16) >= 0
        assert (await handle).rollout_id == handle.rollout_id


async def test_ungraded_rollout_has_no_reward():
    async with rollout_server() as url, RolloutClient(url) as client:
        result = await client.run_rollout_async(PROMPT, CHAT_URL, label="hello", grade=False)
        assert result.status == RolloutStatus.SUCCESS
        assert result.sample is not None and result.sample.reward is None


async def test_workflow_failure_is_a_terminal_result():
    async with rollout_server() as url, RolloutClient(url) as client:
        result = await client.run_rollout_async(PROMPT, CHAT_URL, metadata={"fail": "boom"})
        assert result.status == RolloutStatus.FAILURE
        assert result.sample is None
        assert result.err_message == "boom"
        assert result.err_category == RolloutErrorCategory.VALIDATION_ERROR


async def test_handle_reports_progress_then_completion():
    async with (
        rollout_server(result_wait_timeout_sec=0.5, polling_lease_timeout_sec=5) as url,
        RolloutClient(url) as client,
    ):
        handle = await client.submit(
            PROMPT, CHAT_URL, label="hello", metadata={"sleep": 0.3, "grade_sleep": 1.0}
        )
        assert isinstance(handle, RolloutHandle)
        assert handle.status == RolloutStatus.QUEUED and handle.latest_result is None
        assert not handle.done()
        running = await handle.wait_for_running()
        assert running is not None and handle.status != RolloutStatus.QUEUED
        grading = await handle.wait_for_grading()
        assert grading is not None and grading.status == RolloutStatus.GRADING
        assert grading.sample is None and grading.err_message is None
        assert not handle.done()
        result = await handle
        assert handle.done() and handle.latest_result is result
        assert result.sample is not None and result.sample.reward == 1.0
        assert await handle.wait_for_completion() is result  # no further poll


async def test_concurrent_waiters_share_the_result():
    async with (
        rollout_server(result_wait_timeout_sec=0.3, polling_lease_timeout_sec=5) as url,
        RolloutClient(url) as client,
    ):
        handle = await client.submit(PROMPT, CHAT_URL, label="hello", metadata={"sleep": 0.5})
        results = await asyncio.gather(
            handle.wait_for_completion(), handle, handle.wait_for_running()
        )
        assert results[0] is results[1]
        assert results[0].status == RolloutStatus.SUCCESS


async def test_cancel_running_rollout():
    async with (
        rollout_server(result_wait_timeout_sec=0.3, polling_lease_timeout_sec=5) as url,
        RolloutClient(url) as client,
    ):
        handle = await client.submit(PROMPT, CHAT_URL, metadata={"sleep": 30})
        await handle.wait_for_running()
        assert await handle.cancel() == "cancelled_running"
        result = await handle
        assert result.status == RolloutStatus.CANCELLED
        assert result.sample is None and result.err_message == "cancelled"
        assert (await client.cancel(ids=[handle.rollout_id])).dispositions == {
            handle.rollout_id: "not_found"
        }
        assert await client.cancel_rollout("never-seen") == "not_found"
        assert (await client.cancel(prefix="zzz")).dispositions == {}
        assert (await client.cancel(all=True)).dispositions == {}


async def test_cancel_needs_exactly_one_selector():
    async with RolloutClient("http://127.0.0.1:9") as client:
        with pytest.raises(UsageError, match="exactly one selector"):
            await client.cancel()
        with pytest.raises(UsageError, match="exactly one selector"):
            await client.cancel(ids=["a"], all=True)


async def test_duplicate_rollout_id_is_409():
    async with rollout_server() as url, RolloutClient(url) as client:
        handle = await client.submit(PROMPT, CHAT_URL, rollout_id="dup", metadata={"sleep": 0.2})
        with pytest.raises(RolloutProtocolError, match="already registered") as caught:
            await client.submit(PROMPT, CHAT_URL, rollout_id="dup")
        assert caught.value.status_code == 409
        assert not isinstance(caught.value, RolloutLeaseLostError)  # nothing was resent
        await handle


async def test_invalid_request_is_422_with_detail():
    async with rollout_server() as url, RolloutClient(url) as client:
        with pytest.raises(RolloutProtocolError, match="llm_api_key") as caught:
            await client.submit(PROMPT, CHAT_URL, llm_api_key="")
        assert caught.value.status_code == 422


async def test_api_key_is_sent_on_every_call():
    async with rollout_server(api_key="s3cret") as url:
        async with RolloutClient(url) as anonymous:
            with pytest.raises(RolloutProtocolError) as caught:
                await anonymous.health()
            assert caught.value.status_code == 401
        async with RolloutClient(url, api_key="s3cret") as client:
            result = await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")
            assert result.status == RolloutStatus.SUCCESS
            assert (await client.status(result.rollout_id)).rollout_id == result.rollout_id
            assert await client.cancel_rollout(result.rollout_id) == "not_found"
            await client.wait_idle(timeout_sec=5, poll_interval_sec=0.05)


def test_an_api_key_with_a_trailing_newline_is_refused_naming_the_header():
    with pytest.raises(UsageError, match=r"'Authorization'.*ends with a line feed") as caught:
        RolloutClient("http://127.0.0.1:9", api_key="sk-from-a-file\n")
    assert "sk-from-a-file" not in str(caught.value)
    assert "strip" in str(caught.value)


async def test_admission_retries_429_honouring_retry_after():
    faults: list[Faults] = []

    def wrap(app):
        faults.append(Faults(app, "POST", "/rollout", [(429, {"Retry-After": "0"}), (429, {})]))
        return faults[0]

    async with rollout_server(wrap=wrap) as url, RolloutClient(url) as client:
        started = time.monotonic()
        result = await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")
        elapsed = time.monotonic() - started
        assert result.status == RolloutStatus.SUCCESS
        assert faults[0].hits == 2
        assert 1.0 <= elapsed < 5  # 0.05 s (clamped "0") + 1 s (no header)


NOW = 1_700_000_000.0  # 2023-11-14 22:13:20 UTC


@pytest.mark.parametrize(
    ("value", "seconds"),
    [
        (None, 1.0),
        ("3", 3.0),
        (" 2.5 ", 2.5),
        ("0", 0.05),
        ("-4", 0.05),
        ("3600", 60.0),
        ("nan", 1.0),
        ("inf", 1.0),
        ("soon", 1.0),
        ("", 1.0),
        ("Tue, 14 Nov 2023 22:13:27 GMT", 7.0),
        ("Tuesday, 14-Nov-23 22:13:30 GMT", 10.0),  # the obsolete RFC 850 form
        ("Tue Nov 14 22:13:25 2023", 5.0),  # asctime, read as UTC
        ("Tue, 14 Nov 2023 22:13:00 GMT", 0.05),  # already past
        ("Wed, 15 Nov 2023 22:13:20 GMT", 60.0),
        ("Tue, 99 Nov 2023 22:13:27 GMT", 1.0),
    ],
)
def test_retry_after_reads_seconds_and_http_dates(value: str | None, seconds: float):
    assert retry_after_sec(value, now=NOW) == pytest.approx(seconds)


async def test_admission_timeout_when_server_stays_full():
    async with rollout_server(backend_cls=FullBackend) as url, RolloutClient(url) as client:
        started = time.monotonic()
        with pytest.raises(RolloutAdmissionTimeoutError, match="429") as caught:
            await client.submit(PROMPT, CHAT_URL, admission_timeout_sec=0.3)
        assert isinstance(caught.value, TimeoutError)
        assert time.monotonic() - started < 2  # the server's Retry-After: 5 is cut short


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "httpx"])
async def test_a_submit_answered_into_a_closed_connection_gets_its_lease_from_the_resend(
    lean: bool,
):
    started_tags.clear()
    async with (
        rollout_server() as url,
        raw_server(forwards_to(url, first_submit("after"))) as front,
        async_client() if lean else httpx.AsyncClient() as http,
        RolloutClient(front.origin, http_client=http) as client,
    ):
        await client.health()  # a kept-alive connection, which the submit then reuses
        handle = await client.submit(
            PROMPT,
            CHAT_URL,
            rollout_id="resent",
            label="hello",
            llm_api_key="k",
            metadata={"tag": "resent"},
        )
        result = await handle
    assert (result.status, result.sample and result.sample.reward) == (RolloutStatus.SUCCESS, 1.0)
    submits = [body for head, body in front.requests if head.startswith(b"POST /rollout ")]
    # the first, which the server admitted, and the resend, the same bytes, which the
    # server answered as a replay of the first: one run, polled under the lease it gave
    assert len(submits) == 2 and submits[0] == submits[1]
    assert front.connections == 2
    assert started_tags == ["resent"]


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "httpx"])
@pytest.mark.parametrize(
    ("replays", "llm_api_key"),
    [(False, "k"), (True, None)],
    ids=["server-without-replay", "body-without-llm-api-key"],
)
async def test_a_submit_answered_into_a_closed_connection_is_admitted_and_its_lease_lost(
    lean: bool, replays: bool, llm_api_key: str | None
):
    async with (
        rollout_server() as url,
        raw_server(forwards_to(url, first_submit("after"), replays=replays)) as front,
        async_client() if lean else httpx.AsyncClient() as http,
        RolloutClient(front.origin, http_client=http) as client,
    ):
        await client.health()  # a kept-alive connection, which the submit then reuses
        with pytest.raises(RolloutLeaseLostError, match="409 for this rollout id") as caught:
            await client.submit(
                PROMPT,
                CHAT_URL,
                rollout_id="lost",
                llm_api_key=llm_api_key,
                metadata={"sleep": 30},
            )
        lost = caught.value
        assert (lost.rollout_id, lost.status_code) == ("lost", 409)
        assert lost.rollout_status in (RolloutStatus.QUEUED, RolloutStatus.RUNNING)
        assert "reports it" in str(lost)
        assert await client.cancel_rollout("lost") in ("cancelled_queued", "cancelled_running")
    submits = [head for head, _ in front.requests if head.startswith(b"POST /rollout ")]
    assert len(submits) == 2  # the first, which the server admitted, and the one resend
    assert front.connections == 2


@pytest.mark.parametrize("lean", [True, False], ids=["lean", "httpx"])
async def test_a_submit_lost_before_reaching_the_server_is_sent_again_and_runs(lean: bool):
    async with (
        rollout_server() as url,
        raw_server(forwards_to(url, first_submit("before"))) as front,
        async_client() if lean else httpx.AsyncClient() as http,
        RolloutClient(front.origin, http_client=http) as client,
    ):
        await client.health()
        result = await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")
        assert (result.status, result.sample and result.sample.reward) == (
            RolloutStatus.SUCCESS,
            1.0,
        )
    submits = [head for head, _ in front.requests if head.startswith(b"POST /rollout ")]
    assert len(submits) == 2


async def test_poll_retries_gateway_errors_and_dropped_connections():
    faults: list[Faults] = []

    def wrap(app):
        script = [(503, {}), "drop", (502, {}), "drop", (504, {})]
        faults.append(Faults(app, "GET", "/result", script))
        return faults[0]

    async with rollout_server(wrap=wrap) as url, RolloutClient(url) as client:
        result = await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")
        assert result.status == RolloutStatus.SUCCESS
        assert faults[0].hits == 5


async def test_poll_gives_up_after_two_transport_retries():
    def wrap(app):
        return Faults(app, "GET", "/result", ["drop"] * 3)

    async with rollout_server(wrap=wrap) as url, RolloutClient(url) as client:
        with pytest.raises(httpx.RemoteProtocolError):
            await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")


async def test_gateway_retries_stop_before_the_lease_lapses():
    def wrap(app):
        return Faults(app, "GET", "/result", [(503, {})] * 20)

    options = {"result_wait_timeout_sec": 0.5, "polling_lease_timeout_sec": 1.5}
    async with rollout_server(wrap=wrap, **options) as url, RolloutClient(url) as client:
        started = time.monotonic()
        with pytest.raises(RolloutProtocolError, match="lease") as caught:
            await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")
        assert caught.value.status_code == 503
        assert time.monotonic() - started < 1.5  # 0.25 + 0.5, then 1 s would pass the lease


async def test_other_poll_statuses_are_fatal():
    def wrap(app):
        return Faults(app, "GET", "/result", [(404, {})])

    async with rollout_server(wrap=wrap) as url, RolloutClient(url) as client:
        with pytest.raises(RolloutProtocolError, match="scripted 404") as caught:
            await client.run_rollout_async(PROMPT, CHAT_URL, label="hello")
        assert caught.value.status_code == 404


async def test_lease_expires_when_nobody_polls():
    options = {"result_wait_timeout_sec": 0.2, "polling_lease_timeout_sec": 0.5}
    async with rollout_server(**options) as url, RolloutClient(url) as client:
        handle = await client.submit(PROMPT, CHAT_URL, metadata={"sleep": 10})
        await asyncio.sleep(1.0)
        result = await handle
        assert result.status == RolloutStatus.FAILURE
        assert result.err_category == RolloutErrorCategory.LEASE_EXPIRED
        assert result.err_message == "polling lease expired"


async def test_rollout_id_is_quoted_in_paths():
    async with rollout_server() as url, RolloutClient(url) as client:
        rollout_id = "a b:c?%2F#x"
        result = await client.run_rollout_async(
            PROMPT, CHAT_URL, rollout_id=rollout_id, label="hello"
        )
        assert result.rollout_id == rollout_id and result.status == RolloutStatus.SUCCESS
        status = await client.status(rollout_id)
        assert status.rollout_id == rollout_id
        assert status.status == RolloutStatus.SUCCESS and status.reward == 1.0


async def test_wait_idle_waits_for_active_rollouts_and_checks_process_id():
    async with rollout_server() as url, RolloutClient(url) as client:
        process_id = (await client.health())["process_id"]
        handle = await client.submit(PROMPT, CHAT_URL, metadata={"sleep": 0.5})
        with pytest.raises(TimeoutError, match="1 active"):
            await client.wait_idle(timeout_sec=0.1, poll_interval_sec=0.05)
        with pytest.raises(RolloutProtocolError, match="process_id changed"):
            await client.wait_idle(timeout_sec=5, process_id="not-this-server")
        waiter = asyncio.create_task(client.wait_idle(5, 0.05, process_id=process_id))
        await handle
        assert (await waiter)["lifecycle"]["active_rollouts"] == 0


async def test_caller_http_client_is_left_open():
    async with rollout_server() as url, httpx.AsyncClient() as http:
        async with RolloutClient(url, http_client=http) as client:
            assert (await client.health())["status"] == "ok"
        assert not http.is_closed
        assert (await http.get(f"{url}/health")).status_code == 200


def _fake_server():
    """A server that breaks the polling protocol in the ways the client must notice."""
    from starlette.applications import Starlette
    from starlette.requests import Request
    from starlette.responses import JSONResponse
    from starlette.routing import Route

    def lease(rollout_id: str) -> dict[str, Any]:
        return {
            "rollout_id": rollout_id,
            "status": "queued",
            "polling_lease_token": "t",
            "result_wait_timeout_sec": 1.0,
            "polling_lease_timeout_sec": 2.0,
        }

    async def submit(request: Request) -> JSONResponse:
        rollout_id = (await request.json())["rollout_id"]
        if rollout_id == "empty":
            return JSONResponse({}, status_code=202)  # a callback-generation server
        if rollout_id == "mismatch":
            return JSONResponse(lease("someone-else"), status_code=202)
        return JSONResponse(lease(rollout_id), status_code=202)

    async def result(request: Request) -> JSONResponse:
        return JSONResponse({"rollout_id": "someone-else", "status": "success"})

    async def health(request: Request) -> JSONResponse:
        return JSONResponse({"status": "ok"})

    return Starlette(
        routes=[
            Route("/rollout", submit, methods=["POST"]),
            Route("/rollout/{rollout_id}/result", result),
            Route("/health", health),
        ]
    )


async def test_protocol_violations_are_reported():
    async with serve_in_task(_fake_server()) as url, RolloutClient(url) as client:
        with pytest.raises(RolloutProtocolError, match="without a polling lease") as caught:
            await client.submit(PROMPT, CHAT_URL, rollout_id="empty")
        assert caught.value.status_code == 202
        with pytest.raises(RolloutProtocolError, match="'someone-else'"):
            await client.submit(PROMPT, CHAT_URL, rollout_id="mismatch")
        handle = await client.submit(PROMPT, CHAT_URL, rollout_id="echo")
        with pytest.raises(RolloutProtocolError, match="result of rollout 'someone-else'"):
            await handle
        with pytest.raises(RolloutProtocolError, match="lacks process_id"):
            await client.wait_idle(timeout_sec=1)
