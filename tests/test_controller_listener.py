"""The callback listener's rules and the combined controller service, over real HTTP."""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from osmosis_ai.controller.errors import ControllerError
from osmosis_ai.controller.listener import CallbackListener, CallbackResult
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.service import ControllerService, ControllerServiceError
from osmosis_ai.controller.upstreams import OpenAICompatibleUpstream
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.status import GraderStatus, RolloutStatus

COMPLETION = {"status": "success", "rollout_id": "r1", "extra_fields": None}
GRADER = {
    "status": "success",
    "rollout_id": "r1",
    "sample": {"messages": [{"role": "assistant", "content": "#### 42"}], "reward": 1.0},
}


def proxy() -> PolicyProxy:
    # Never dialled: these tests exercise the callback side only.
    return PolicyProxy(OpenAICompatibleUpstream("http://127.0.0.1:9/v1", None, "m"))


@contextlib.asynccontextmanager
async def service(**options: Any) -> AsyncIterator[tuple[ControllerService, httpx.AsyncClient]]:
    async with ControllerService(proxy(), **options) as running, httpx.AsyncClient() as client:
        yield running, client


async def post(
    client: httpx.AsyncClient,
    url: str,
    body: object,
    token: str | None,
) -> httpx.Response:
    headers = {"Authorization": f"Bearer {token}"} if token is not None else {}
    if isinstance(body, bytes):
        return await client.post(url, content=body, headers=headers)
    return await client.post(url, json=body, headers=headers)


class Hooks:
    """A terminal hook that records its calls; it can be slow or fail the first N times."""

    def __init__(self, *, delay: float = 0.0, failures: int = 0, ack: dict | None = None):
        self.delay = delay
        self.failures = failures
        self.ack = ack
        self.calls: list[CallbackResult] = []
        self.committed: list[CallbackResult] = []

    async def __call__(self, result: CallbackResult) -> dict | None:
        self.calls.append(result)
        await asyncio.sleep(self.delay)
        if self.failures:
            self.failures -= 1
            raise OSError("journal disk is full")
        self.committed.append(result)
        return self.ack


# -- the service ------------------------------------------------------------------------------


async def test_urls_tokens_and_lifecycle():
    ctl = ControllerService(proxy())
    with pytest.raises(UsageError, match="not running"):
        _ = ctl.base_url
    async with ctl:
        base = ctl.base_url
        assert base.startswith("http://127.0.0.1:")
        assert ctl.chat_completions_url("a b") == f"{base}/v1/rollouts/a%20b"
        assert ctl.completion_url("r1") == f"{base}/v1/rollouts/r1/completion"
        assert ctl.grader_url("r1") == f"{base}/v1/rollouts/r1/grader"
        assert ctl.proxy_token and ctl.controller_token
        assert ctl.proxy_token != ctl.controller_token
        with pytest.raises(UsageError, match="already running"):
            await ctl.start()
    await ctl.stop()  # idempotent
    shared = proxy()
    with pytest.raises(UsageError, match="must differ"):
        ControllerService(shared, controller_token=shared.token)


async def test_a_taken_port_is_a_clear_error():
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        with pytest.raises(ControllerServiceError, match=rf"127\.0\.0\.1:{port}.*already in use"):
            await ControllerService(proxy(), port=port).start()


async def test_a_given_port_is_used():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    async with service(port=port) as (ctl, client):
        assert ctl.port == port
        response = await client.get(f"{ctl.base_url}/v1/rollouts/x/models")
        assert response.status_code == 401  # the proxy answers on the same port


async def test_the_model_bearer_cannot_deliver_results():
    async with service() as (ctl, client):
        ctl.proxy.register("r1")
        ctl.listener.register("r1", on_terminal=Hooks())
        models = f"{ctl.chat_completions_url('r1')}/models"
        wrong = {"Authorization": f"Bearer {ctl.proxy_token}x"}
        assert (await client.get(models, headers=wrong)).status_code == 401
        right = {"Authorization": f"Bearer {ctl.proxy_token}"}
        assert (await client.get(models, headers=right)).status_code == 200
        # servers of the first 0.3.0 releases call the model with the callback bearer
        theirs = {"Authorization": f"Bearer {ctl.controller_token}"}
        assert (await client.get(models, headers=theirs)).status_code == 200
        completion = ctl.completion_url("r1")
        assert (await post(client, completion, COMPLETION, ctl.proxy_token)).status_code == 401
        assert (await post(client, completion, COMPLETION, None)).status_code == 401
        assert (await post(client, completion, COMPLETION, ctl.controller_token)).status_code == 200


# -- receiver rules ----------------------------------------------------------------------------


RULES = [
    ("nobody", "completion", COMPLETION, 404, "unknown rollout_id"),
    ("a%2Fb", "completion", COMPLETION, 422, "single path segment"),
    ("r1", "completion", {**COMPLETION, "rollout_id": "r2"}, 422, "differs from the URL"),
    ("r1", "completion", {**COMPLETION, "status": "running"}, 422, "not terminal"),
    ("r1", "grader", {**GRADER, "status": "pending"}, 422, "not terminal"),
    ("r1", "completion", b"{not json", 422, "not valid JSON"),
    ("r1", "completion", [1, 2], 422, "must be a JSON object"),
    ("r1", "grader", {"rollout_id": "r1"}, 422, "malformed grader callback"),
    ("r1", "completion", {"status": "exploded"}, 422, "malformed completion callback"),
    ("u", "grader", GRADER | {"rollout_id": None}, 404, "expects no grader callback"),
]


async def test_receiver_rules():
    async with service() as (ctl, client):
        hooks = Hooks()
        ctl.listener.register("r1", on_terminal=hooks)
        ctl.listener.register("u", on_terminal=hooks, expect_grader=False)
        for path_id, kind, body, status, detail in RULES:
            url = f"{ctl.base_url}/v1/rollouts/{path_id}/{kind}"
            response = await post(client, url, body, ctl.controller_token)
            assert response.status_code == status, (path_id, kind, response.text)
            assert detail in response.json()["detail"]
        assert hooks.calls == []


async def test_method_and_route_errors():
    async with service() as (ctl, client):
        ctl.listener.register("r1", on_terminal=Hooks())
        auth = {"Authorization": f"Bearer {ctl.controller_token}"}
        got = await client.get(ctl.completion_url("r1"), headers=auth)
        assert got.status_code == 405
        nested = f"{ctl.base_url}/v1/rollouts/a/b/grader"
        assert (await client.post(nested, json=GRADER, headers=auth)).status_code == 422


async def test_completion_ack_carries_the_report_and_the_grader_commits():
    report = {"model_name": "policy", "samples": {"r1": {"llm_call_metrics": []}}}
    seen: list[Any] = []

    def on_completion(completion):
        seen.append(completion)
        return report

    hooks = Hooks(ack={"ok": True, "journaled": 1})
    async with service() as (ctl, client):
        ctl.listener.register("r1", on_terminal=hooks, on_completion=on_completion)
        waiter = asyncio.create_task(ctl.listener.wait_terminal("r1"))
        first = await post(client, ctl.completion_url("r1"), COMPLETION, ctl.controller_token)
        assert first.json() == {"ok": True, "trajectory": report}
        again = await post(client, ctl.completion_url("r1"), COMPLETION, ctl.controller_token)
        assert again.json() == first.json() and len(seen) == 1  # a duplicate: the stored ack
        await asyncio.sleep(0.05)
        assert not waiter.done()  # a completion is not terminal while a grader is expected
        graded = await post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token)
        assert graded.json() == {"ok": True, "journaled": 1}
        result = await asyncio.wait_for(waiter, 5)
    assert result.completion is not None and result.completion.status == RolloutStatus.SUCCESS
    assert result.grader is not None and result.grader.status == GraderStatus.SUCCESS
    assert result.grader.sample is not None and result.grader.sample.reward == 1.0
    assert hooks.committed == [result]


async def test_completion_is_terminal_without_a_grader():
    hooks = Hooks()
    async with service() as (ctl, client):
        ctl.listener.register(
            "r1", on_terminal=hooks, on_completion=lambda _c: {"samples": {}}, expect_grader=False
        )
        response = await post(client, ctl.completion_url("r1"), COMPLETION, ctl.controller_token)
        assert response.json() == {"ok": True, "trajectory": {"samples": {}}}
        result = await ctl.listener.wait_terminal("r1")
    assert result.grader is None and result.completion is not None
    assert len(hooks.committed) == 1


async def test_the_ack_waits_for_a_slow_commit_and_the_commit_is_single_flight():
    hooks = Hooks(delay=0.3, ack={"ok": True, "seq": 7})
    async with service() as (ctl, client):
        ctl.listener.register("r1", on_terminal=hooks)
        started = time.monotonic()
        first, second = await asyncio.gather(
            post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token),
            post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token),
        )
        elapsed = time.monotonic() - started
    assert elapsed >= 0.3
    assert first.status_code == second.status_code == 200
    assert first.json() == second.json() == {"ok": True, "seq": 7}
    assert len(hooks.calls) == 1 and len(hooks.committed) == 1


async def test_a_failing_commit_answers_500_and_the_retry_commits():
    hooks = Hooks(failures=1)
    async with service() as (ctl, client):
        ctl.listener.register("r1", on_terminal=hooks)
        failed = await post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token)
        assert failed.status_code == 500
        assert "journal disk is full" in failed.json()["detail"]
        retried = await post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token)
        assert (retried.status_code, retried.json()) == (200, {"ok": True})
        duplicate = await post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token)
        assert (duplicate.status_code, duplicate.json()) == (200, {"ok": True})
        result = await ctl.listener.wait_terminal("r1")
    assert len(hooks.calls) == 2 and hooks.committed == [result]


async def test_a_conflicting_duplicate_gets_the_stored_ack(caplog):
    async with service() as (ctl, client):
        ctl.listener.register("r1", on_terminal=Hooks())
        await post(client, ctl.grader_url("r1"), GRADER, ctl.controller_token)
        other = {**GRADER, "status": "failure", "sample": None}
        response = await post(client, ctl.grader_url("r1"), other, ctl.controller_token)
    assert (response.status_code, response.json()) == (200, {"ok": True})
    assert "conflicting duplicate grader callback" in caplog.text


async def test_register_discard_and_waiters():
    listener = CallbackListener(token="t")
    with pytest.raises(UsageError):
        CallbackListener(token="")
    listener.register("r1", on_terminal=Hooks())
    assert "r1" in listener
    with pytest.raises(UsageError, match="already registered"):
        listener.register("r1", on_terminal=Hooks())
    with pytest.raises(UsageError, match="single path segment"):
        listener.register("a/b", on_terminal=Hooks())
    waiter = asyncio.create_task(listener.wait_terminal("r1"))
    await asyncio.sleep(0)
    listener.discard("r1")
    listener.discard("r1")
    with pytest.raises(ControllerError, match="discarded"):
        await waiter
    with pytest.raises(UsageError, match="not registered"):
        await listener.wait_terminal("r1")
