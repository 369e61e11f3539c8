"""The policy proxy over real HTTP on 127.0.0.1, with the scripted model server upstream."""

from __future__ import annotations

import asyncio
import contextlib
import importlib.util
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import httpx
import pytest

import osmosis_ai.controller as controller
from osmosis_ai.controller import (
    CallRecord,
    OpenAICompatibleUpstream,
    PolicyProxy,
    Usage,
)
from osmosis_ai.controller.calls import CallRecorder
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.asgi import Receive, Scope, Send, read_body
from osmosis_ai.rollout.trajectory.report import TrajectoryReport, report_from_response
from osmosis_ai.testing.model_server import ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.serving import free_port, serve_in_task

HAS_OPENAI = importlib.util.find_spec("openai") is not None
POLICY = "policy-model"
ROLLOUT = "r1"


@dataclass
class Rig:
    model: Any
    proxy: PolicyProxy
    origin: str
    client: httpx.AsyncClient

    def url(self, rollout: str = ROLLOUT) -> str:
        return self.proxy.chat_base_url(rollout, self.origin) + "/chat/completions"

    async def post(self, body: Any, rollout: str = ROLLOUT) -> httpx.Response:
        return await self.client.post(self.url(rollout), json=body)


@contextlib.asynccontextmanager
async def rig(
    model: Any = None, *, upstream_url: str | None = None, **options: Any
) -> AsyncIterator[Rig]:
    """The proxy in front of ``model`` (a ScriptedModelServer or any ASGI app), served on
    the test's event loop, with rollout ``r1`` registered and an authorised client."""
    async with contextlib.AsyncExitStack() as stack:
        if upstream_url is None:
            if model is None:
                model = ScriptedModelServer(record_requests=True)
            if isinstance(model, ScriptedModelServer):
                await stack.enter_async_context(model)
                upstream_url = model.base_url
            else:
                origin = await stack.enter_async_context(serve_in_task(model, log_level="critical"))
                upstream_url = origin + "/v1"
        upstream = OpenAICompatibleUpstream(upstream_url, None, POLICY, timeout=20)
        stack.push_async_callback(upstream.aclose)
        proxy = PolicyProxy(upstream, **options)
        proxy.register(ROLLOUT)
        origin = await stack.enter_async_context(serve_in_task(proxy, access_log=False))
        client = await stack.enter_async_context(
            httpx.AsyncClient(headers={"authorization": f"Bearer {proxy.token}"}, timeout=30)
        )
        yield Rig(model, proxy, origin, client)


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def sse_events(text: str) -> list[tuple[str, str]]:
    """(kind, value) per event: ("comment", text), ("data", payload), ("error", payload)."""
    events: list[tuple[str, str]] = []
    for block in text.split("\n\n"):
        if not block.strip():
            continue
        lines = block.split("\n")
        if lines[0].startswith(":"):
            events.append(("comment", lines[0][1:].strip()))
        elif lines[0] == "event: error":
            events.append(("error", lines[1].removeprefix("data: ")))
        else:
            assert lines[0].startswith("data: "), block
            events.append(("data", lines[0].removeprefix("data: ")))
    return events


def data_chunks(text: str) -> list[dict[str, Any]]:
    events = [value for kind, value in sse_events(text) if kind == "data"]
    assert events[-1] == "[DONE]"
    return [json.loads(value) for value in events[:-1]]


def content_of(chunks: list[dict[str, Any]]) -> str:
    return "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


class DripUpstream:
    """A raw ASGI upstream that streams the given SSE events with pauses between them, and
    can crash after a number of them. ``gates[n]``, when given, must be set before event
    ``n`` goes out: a test opens it once it has seen what should have arrived by then."""

    def __init__(
        self,
        events: list[bytes],
        *,
        pause: float = 0.0,
        crash_after: int | None = None,
        gates: dict[int, asyncio.Event] | None = None,
    ):
        self.events = events
        self.pause = pause
        self.crash_after = crash_after
        self.gates = gates or {}
        self.sent: list[int] = []
        self.bodies: list[dict[str, Any]] = []
        self.finished = asyncio.Event()
        self.disconnected = False
        self.hung_up = asyncio.Event()  # set with ``disconnected``, to gate an event on it

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        self.bodies.append(json.loads(await read_body(receive) or b""))

        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            self.disconnected = True
            self.hung_up.set()

        watcher = asyncio.create_task(watch())
        headers = [(b"content-type", b"text/event-stream")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        try:
            for number, event in enumerate(self.events):
                if number and self.pause:
                    await asyncio.sleep(self.pause)
                gate = self.gates.get(number)
                if gate is not None:
                    await gate.wait()
                if self.disconnected:
                    return
                if self.crash_after is not None and number == self.crash_after:
                    raise RuntimeError("upstream crashed mid-stream")
                await send({"type": "http.response.body", "body": event, "more_body": True})
                self.sent.append(number)
            await send({"type": "http.response.body", "body": b"data: [DONE]\n\n"})
        finally:
            watcher.cancel()
            self.finished.set()


def chunk_event(text: str, finish: str | None = None) -> bytes:
    chunk = {
        "id": "chatcmpl-drip",
        "object": "chat.completion.chunk",
        "created": 0,
        "model": POLICY,
        "choices": [{"index": 0, "delta": {"content": text}, "finish_reason": finish}],
    }
    return b"data: " + json.dumps(chunk).encode() + b"\n\n"


# -- public surface --------------------------------------------------------------------------


def test_all_matches_the_public_surface():
    assert controller.__all__ == sorted(controller.__all__)
    public = {
        name
        for name, value in vars(controller).items()
        if not name.startswith("_")
        and not isinstance(value, type(controller))
        and name not in {"annotations"}
    }
    assert set(controller.__all__) == public
    for name in controller.__all__:
        assert getattr(controller, name) is not None


def test_register_discard_and_chat_base_url():
    proxy = PolicyProxy(OpenAICompatibleUpstream("http://127.0.0.1:9/v1", None, POLICY))
    assert len(proxy.token) >= 32
    assert PolicyProxy(proxy.upstream).token != proxy.token
    proxy.register("a b")
    with pytest.raises(UsageError, match="already registered"):
        proxy.register("a b")
    for bad in ("", "a/b"):
        with pytest.raises(UsageError, match="one non-empty path segment"):
            proxy.register(bad)
    assert (
        proxy.chat_base_url("a b", "http://127.0.0.1:5/") == "http://127.0.0.1:5/v1/rollouts/a%20b"
    )
    assert proxy.calls("a b") == []
    assert proxy.total_tokens("a b") == 0
    assert proxy.discard("a b") == []
    assert proxy.discard("a b") == []  # idempotent
    with pytest.raises(UsageError, match="not registered"):
        proxy.calls("a b")
    with pytest.raises(UsageError):
        PolicyProxy(proxy.upstream, keepalive_interval=0)
    with pytest.raises(UsageError):
        PolicyProxy(proxy.upstream, token="")


# -- forwarding ------------------------------------------------------------------------------


FULL_REQUEST: dict[str, Any] = {
    "model": "osmosis-rollout",
    "messages": [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "What is 6*7?"}]},
    ],
    "tools": [
        {
            "type": "function",
            "function": {
                "name": "multiply",
                "description": "Multiply two integers.",
                "parameters": {
                    "type": "object",
                    "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}},
                    "required": ["a", "b"],
                },
            },
        }
    ],
    "tool_choice": {"type": "function", "function": {"name": "multiply"}},
    "parallel_tool_calls": False,
    "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}},
    "temperature": 0.3,
    "top_p": 0.9,
    "max_completion_tokens": 64,
    "max_tokens": 64,
    "stop": ["\n\n", "END"],
    "seed": 1234,
    "presence_penalty": 0.1,
    "logit_bias": {"50256": -100},
    "user": "rollout-user",
    "metadata": {"row": 3},
    "chat_template_kwargs": {"enable_thinking": False},
    "reasoning_effort": "low",
    "x_vendor_extension": {"nested": [1, 2, {"k": None}]},
}


async def test_non_stream_forwards_the_whole_body_with_only_model_replaced():
    script = [ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})])]
    async with rig(ScriptedModelServer(script, record_requests=True)) as r:
        response = await r.post(FULL_REQUEST)
        assert response.status_code == 200
        assert response.headers["content-type"] == "application/json"
        reply = response.json()
        sent = r.model.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.body == {**FULL_REQUEST, "model": POLICY}
    assert "authorization" not in sent.headers  # the agent's bearer never leaves the proxy
    assert reply["object"] == "chat.completion"
    assert reply["model"] == POLICY
    call = reply["choices"][0]["message"]["tool_calls"][0]
    assert call["function"] == {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}
    assert reply["choices"][0]["finish_reason"] == "tool_calls"


async def test_a_rollouts_upstream_fields_reach_the_upstream_not_other_rollouts():
    async with rig(ScriptedModelServer(record_requests=True)) as r:
        r.proxy.register("pinned", upstream_fields={"route_to": 3, "temperature": 0.5})
        pinned = await r.post({"messages": user("hi"), "temperature": 1.0}, rollout="pinned")
        plain = await r.post({"messages": user("hi"), "temperature": 1.0})
        sent = [request.body for request in r.model.requests]
    assert pinned.status_code == plain.status_code == 200
    assert "route_to" not in pinned.json()  # the agent gets the upstream's answer only
    assert sent[0] == {"messages": user("hi"), "temperature": 0.5, "route_to": 3, "model": POLICY}
    assert sent[1] == {"messages": user("hi"), "temperature": 1.0, "model": POLICY}


async def test_stream_forwards_the_body_and_relays_the_chunks():
    async with rig(ScriptedModelServer(["It is forty two."], record_requests=True)) as r:
        response = await r.post({**FULL_REQUEST, "stream": True})
        sent = r.model.requests[0].body
        record = r.proxy.calls(ROLLOUT)[0]
    assert response.status_code == 200
    assert response.headers["content-type"].startswith("text/event-stream")
    assert response.headers["cache-control"] == "no-cache"
    assert response.headers["x-accel-buffering"] == "no"
    # usage is asked for so it can be recorded; the caller did not ask, so it is not relayed
    assert sent == {
        **FULL_REQUEST,
        "model": POLICY,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    chunks = data_chunks(response.text)
    assert all(chunk["choices"] for chunk in chunks)
    assert content_of(chunks) == "It is forty two."
    assert chunks[-1]["choices"][0]["finish_reason"] == "stop"
    assert record.stream is True
    assert record.usage is not None
    assert record.usage.completion_tokens == len("It is forty two.")
    assert record.finish_reason == "stop"


async def test_stream_relays_the_usage_chunk_when_the_caller_asked():
    async with rig(ScriptedModelServer(["hi there"], record_requests=True)) as r:
        options = {"include_usage": True, "continuous_usage_stats": False}
        response = await r.post({"messages": user("x"), "stream": True, "stream_options": options})
        sent = r.model.requests[0].body
    assert sent["stream_options"] == options
    chunks = data_chunks(response.text)
    assert chunks[-1]["choices"] == []
    assert chunks[-1]["usage"]["completion_tokens"] == len("hi there")


async def test_stream_usage_can_be_left_alone():
    async with rig(ScriptedModelServer(["hi"], record_requests=True), stream_usage=False) as r:
        await r.post({"messages": user("x"), "stream": True})
        assert "stream_options" not in r.model.requests[0].body
        assert r.proxy.calls(ROLLOUT)[0].usage is None


async def test_models_route_lists_the_policy():
    async with rig() as r:
        base = r.proxy.chat_base_url(ROLLOUT, r.origin)
        listed = (await r.client.get(base + "/models")).json()
        wrong_method = await r.client.post(base + "/models", json={})
        wrong_chat_method = await r.client.get(r.url())
    assert [m["id"] for m in listed["data"]] == [POLICY, "osmosis-rollout"]
    assert wrong_method.status_code == 405
    assert wrong_chat_method.status_code == 405


# -- streaming behaviour ---------------------------------------------------------------------


STALL_GUARD_SEC = 10.0
"""How long a gated exchange may stand still before a test calls it stalled (it takes ms)."""


@contextlib.asynccontextmanager
async def no_stall(gates: list[asyncio.Event], what: str) -> AsyncIterator[None]:
    """Fail with ``what`` if the body stalls; open every gate on the way out, so a stalled
    upstream can finish and the rig can close."""
    try:
        async with asyncio.timeout(STALL_GUARD_SEC):
            yield
    except TimeoutError:
        pytest.fail(f"stalled: {what}")
    finally:
        for gate in gates:
            gate.set()


async def test_stream_chunks_arrive_as_the_upstream_sends_them():
    # Each chunk leaves the upstream only once the agent holds the one before: a proxy that
    # held chunks back would stall the exchange instead.
    seen = [asyncio.Event(), asyncio.Event()]
    drip = DripUpstream(
        [chunk_event("one "), chunk_event("two "), chunk_event("three", "stop")],
        gates={1: seen[0], 2: seen[1]},
    )
    async with rig(drip) as r:
        lines: list[str] = []
        sent_by_then: list[int] = []  # how many chunks the upstream had sent at each arrival
        body = {"messages": user("count"), "stream": True}
        stalled = "a chunk was held back until the upstream sent the next"
        async with (
            no_stall(seen, stalled),
            r.client.stream("POST", r.url(), json=body) as response,
        ):
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    sent_by_then.append(len(drip.sent))
                    if len(lines) < len(seen):
                        seen[len(lines)].set()
                    lines.append(line)
        await asyncio.wait_for(drip.finished.wait(), 5)
    assert lines[-1] == "data: [DONE]"
    assert len(lines) == 4
    assert sent_by_then == [1, 2, 3, 3]  # chunk k reached the agent before chunk k+1 left


async def test_stream_headers_go_out_once_the_upstream_accepts_before_its_first_token():
    # The upstream answers 200 at once, then a comment, then waits for the agent to have the
    # headers before it sends its first token.
    headers_seen = asyncio.Event()
    drip = DripUpstream([b": thinking\n\n", chunk_event("late", "stop")], gates={1: headers_seen})
    async with rig(drip) as r:
        body = {"messages": user("x"), "stream": True}
        async with (
            no_stall([headers_seen], "the headers waited for the first token"),
            r.client.stream("POST", r.url(), json=body) as response,
        ):
            sent_by_then = list(drip.sent)
            headers_seen.set()
            assert response.headers["content-type"].startswith("text/event-stream")
            text = (await response.aread()).decode()
    assert 1 not in sent_by_then  # the headers came before the upstream sent any data
    assert [kind for kind, _ in sse_events(text)] == ["data", "data"]  # the comment is not data
    assert content_of(data_chunks(text)) == "late"


async def test_keepalive_comments_while_the_upstream_is_slow():
    # The upstream answers only once the agent has had three keep-alive comments.
    kept_alive = asyncio.Event()

    async def slow(request: Any) -> str:
        await kept_alive.wait()
        return "finally"

    async with rig(ScriptedModelServer(responder=slow), keepalive_interval=0.05) as r:
        text = ""
        body = {"messages": user("x"), "stream": True}
        async with (
            no_stall([kept_alive], "no keep-alive comments while the upstream thought"),
            r.client.stream("POST", r.url(), json=body) as response,
        ):
            assert response.status_code == 200
            async for piece in response.aiter_text():
                text += piece
                if text.count(": keep-alive") >= 3:
                    kept_alive.set()
    events = sse_events(text)
    comments = [e for e in events if e[0] == "comment"]
    assert len(comments) >= 3
    assert all(value == "keep-alive" for _, value in comments)
    assert events.index(comments[0]) < events.index(next(e for e in events if e[0] == "data"))
    assert content_of(data_chunks(text)) == "finally"


async def test_upstream_crash_mid_stream_ends_with_an_error_event_then_done():
    drip = DripUpstream([chunk_event("partial "), chunk_event("never")], pause=0.05, crash_after=1)
    async with rig(drip) as r:
        response = await r.post({"messages": user("x"), "stream": True})
        record = r.proxy.calls(ROLLOUT)[0]
    assert response.status_code == 200
    events = sse_events(response.text)
    assert events[0][0] == "data"
    assert json.loads(events[0][1])["choices"][0]["delta"]["content"] == "partial "
    kind, payload = events[-2]
    assert kind == "error"
    error = json.loads(payload)["error"]
    assert error["code"] == "upstream_unreachable"
    assert "mid-stream" in error["message"]
    assert events[-1] == ("data", "[DONE]")
    assert record.ok is False
    assert record.status_code == 502
    assert record.error is not None


async def test_client_disconnect_cancels_the_upstream_call():
    # After its first chunk the upstream waits until the proxy hangs up on it.
    events = [chunk_event(f"w{i} ") for i in range(3)]
    drip = DripUpstream(events)
    drip.gates[1] = drip.hung_up
    async with rig(drip) as r:
        body = {"messages": user("x"), "stream": True}
        async with r.client.stream("POST", r.url(), json=body) as response:
            async for line in response.aiter_lines():
                if line.startswith("data: "):
                    break
        await asyncio.wait_for(drip.finished.wait(), 5)
        for _ in range(100):
            if r.proxy.calls(ROLLOUT):
                break
            await asyncio.sleep(0.02)
        record = r.proxy.calls(ROLLOUT)[0]
    assert drip.disconnected  # the proxy hung up on the upstream
    assert drip.sent == [0]  # nothing went out after the hang-up
    assert record.status_code == 499
    assert record.error is not None
    assert "disconnected" in record.error


# -- errors ----------------------------------------------------------------------------------


async def test_bad_or_missing_bearer_is_401():
    async with rig() as r:
        body = {"messages": user("x")}
        async with httpx.AsyncClient() as anonymous:
            missing = await anonymous.post(r.url(), json=body)
        wrong = await r.client.post(r.url(), json=body, headers={"authorization": "Bearer nope"})
        unknown_rollout = await r.client.post(
            r.url("ghost"), json=body, headers={"authorization": "Bearer nope"}
        )
        assert r.model.request_count == 0
    for response in (missing, wrong, unknown_rollout):
        assert response.status_code == 401
        assert response.json()["error"]["type"] == "authentication_error"


async def test_unknown_or_discarded_rollout_is_404():
    async with rig() as r:
        unknown = await r.post({"messages": user("x")}, rollout="ghost")
        r.proxy.discard(ROLLOUT)
        discarded = await r.post({"messages": user("x")})
        other_path = await r.client.get(r.origin + "/v1/chat/completions")
        under_prefix = await r.client.get(r.origin + "/v1/rollouts/r1/other")
    assert unknown.status_code == 404
    assert unknown.json()["error"]["code"] == "unknown_rollout"
    assert "ghost" in unknown.json()["error"]["message"]
    assert discarded.status_code == 404
    assert other_path.status_code == 404
    assert under_prefix.status_code == 404


@pytest.mark.parametrize(
    "path",
    [
        "/v1/rollouts/a/b/chat/completions",
        "/v1/rollouts//chat/completions",
        "/v1/rollouts/a/b/models",
    ],
)
async def test_rollout_id_must_be_one_segment(path: str):
    async with rig() as r:
        response = await r.client.post(r.origin + path, json={"messages": user("x")})
    assert response.status_code == 422
    assert "one path segment" in response.json()["error"]["message"]


async def test_percent_encoded_rollout_ids_are_decoded():
    async with rig() as r:
        r.proxy.register("row 7:run 0")
        assert "row%207%3Arun%200" in r.url("row 7:run 0")
        response = await r.post({"messages": user("x")}, rollout="row 7:run 0")
        recorded = r.proxy.calls("row 7:run 0")
        encoded_slash = await r.client.post(
            r.origin + "/v1/rollouts/a%2Fb/chat/completions", json={"messages": user("x")}
        )
    assert response.status_code == 200
    assert len(recorded) == 1
    assert encoded_slash.status_code == 404  # one segment, but no such rollout


@pytest.mark.parametrize("raw", [b"[1, 2]", b'"text"', b"null", b"{not json", b""])
async def test_non_object_or_invalid_json_is_400(raw: bytes):
    async with rig() as r:
        response = await r.client.post(
            r.url(), content=raw, headers={"content-type": "application/json"}
        )
        assert r.model.request_count == 0
    assert response.status_code == 400
    assert response.json()["error"]["type"] == "invalid_request_error"


async def test_oversized_body_is_413():
    async with rig(max_body_bytes=1000) as r:
        response = await r.post({"messages": user("x" * 2000)})
    assert response.status_code == 413


@pytest.mark.parametrize("status", [400, 401, 404, 429, 500, 503])
async def test_upstream_error_statuses_pass_through(status: int):
    turn = ScriptedTurn(status_code=status, error=f"upstream says no ({status})")
    async with rig(ScriptedModelServer([turn, turn], on_exhausted="repeat_last")) as r:
        plain = await r.post({"messages": user("x")})
        streamed = await r.post({"messages": user("x"), "stream": True})
        records = r.proxy.calls(ROLLOUT)
    for response in (plain, streamed):
        assert response.status_code == status
        assert response.headers["content-type"] == "application/json"
        assert response.json()["error"]["message"] == f"upstream says no ({status})"
    assert [(c.status_code, c.ok, c.stream) for c in records] == [
        (status, False, False),
        (status, False, True),
    ]
    assert all(f"upstream says no ({status})" in (c.error or "") for c in records)


async def test_upstream_down_is_502_naming_the_upstream():
    down = f"http://127.0.0.1:{free_port()}/v1"
    async with rig(upstream_url=down) as r:
        plain = await r.post({"messages": user("x")})
        streamed = await r.post({"messages": user("x"), "stream": True})
        records = r.proxy.calls(ROLLOUT)
    for response in (plain, streamed):
        assert response.status_code == 502
        error = response.json()["error"]
        assert error["code"] == "upstream_unreachable"
        assert down + "/chat/completions" in error["message"]
    assert [c.status_code for c in records] == [502, 502]


async def test_malformed_upstream_json_is_passed_through_and_noted():
    async def broken(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        while (await receive()).get("more_body"):
            pass
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"choices": [ truncated'})

    async with rig(broken) as r:
        response = await r.post({"messages": user("x")})
        record = r.proxy.calls(ROLLOUT)[0]
    assert response.status_code == 200
    assert response.content == b'{"choices": [ truncated'
    assert record.status_code == 200
    assert record.error is not None
    assert "not JSON" in record.error
    assert record.ok is False


class BrokenUpstream:
    """An Upstream whose code fails with a plain exception, as a buggy one might."""

    model = "broken"
    target = "broken://upstream"

    async def complete(self, body: dict[str, Any]) -> bytes:
        raise RuntimeError("bug in complete")

    async def stream(self, body: dict[str, Any]) -> AsyncIterator[bytes]:
        yield b'{"choices": [{"index": 0, "delta": {"content": "a"}}]}'
        raise RuntimeError("bug in stream")

    async def preflight(self) -> Any:
        raise NotImplementedError

    async def aclose(self) -> None:
        return None


async def test_a_broken_upstream_still_answers_the_agent():
    proxy = PolicyProxy(BrokenUpstream())
    proxy.register(ROLLOUT)
    async with (
        serve_in_task(proxy, access_log=False) as origin,
        httpx.AsyncClient(headers={"authorization": f"Bearer {proxy.token}"}) as client,
    ):
        url = proxy.chat_base_url(ROLLOUT, origin) + "/chat/completions"
        plain = await client.post(url, json={"messages": user("x")})
        streamed = await client.post(url, json={"messages": user("x"), "stream": True})
    assert plain.status_code == 502
    assert "RuntimeError: bug in complete" in plain.json()["error"]["message"]
    assert "broken://upstream" in plain.json()["error"]["message"]
    events = sse_events(streamed.text)
    assert events[0][0] == "data"
    assert events[-2][0] == "error"
    assert "RuntimeError: bug in stream" in events[-2][1]
    assert events[-1] == ("data", "[DONE]")
    assert [(c.status_code, c.ok) for c in proxy.calls(ROLLOUT)] == [(502, False), (502, False)]


# -- recording -------------------------------------------------------------------------------


async def test_token_ids_and_logprobs_are_requested_and_recorded():
    script = [
        "Hello there",
        ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})]),
        "42",
    ]
    model = ScriptedModelServer(script, record_requests=True)
    async with rig(model, request_token_data=True) as r:
        first = (await r.post({"messages": user("hi")})).json()
        messages = [*user("hi"), {"role": "assistant", "content": "Hello there"}, *user("multiply")]
        streamed = await r.post({"messages": messages, "stream": True})
        third = await r.post(
            {"messages": [*messages, {"role": "assistant", "content": "x"}], "logprobs": False}
        )
        sent = [request.body for request in model.requests]
        calls = r.proxy.calls(ROLLOUT)
    assert [(b.get("logprobs"), b.get("return_token_ids")) for b in sent] == [
        (True, True),
        (True, True),
        (False, True),  # the caller's own choice wins
    ]
    assert third.status_code == 200
    assert [c.index for c in calls] == [0, 1, 2]
    one, two, three = calls
    choice = first["choices"][0]
    assert one.prompt_token_ids == first["prompt_token_ids"]
    assert one.completion_token_ids == choice["token_ids"] == list(b"Hello there")
    assert one.logprobs == [entry["logprob"] for entry in choice["logprobs"]["content"]]
    assert len(one.logprobs) == len(one.completion_token_ids)
    assert (one.finish_reason, one.model, one.stream, one.status_code) == (
        "stop",
        POLICY,
        False,
        200,
    )
    assert one.usage == Usage(
        prompt_tokens=len(one.prompt_token_ids),
        completion_tokens=11,
        total_tokens=len(one.prompt_token_ids) + 11,
    )
    # the stream: ids and logprobs assembled from the chunks, in order
    chunks = data_chunks(streamed.text)
    streamed_ids = [
        i for c in chunks if c["choices"] for i in c["choices"][0].get("token_ids") or []
    ]
    assert two.completion_token_ids == streamed_ids
    assert two.prompt_token_ids == chunks[0]["prompt_token_ids"]
    assert two.logprobs is not None
    assert len(two.logprobs) == len(two.completion_token_ids)
    assert two.finish_reason == "tool_calls"
    assert two.first_chunk_ms is not None
    assert two.first_chunk_ms <= two.latency_ms
    assert three.logprobs is None
    assert three.completion_token_ids == list(b"42")


async def test_trajectory_report_and_totals():
    script = ["alpha", ScriptedTurn(status_code=500, error="boom"), "beta"]
    async with rig(ScriptedModelServer(script), request_token_data=True) as r:
        await r.post({"messages": user("a")})
        history = [*user("a"), {"role": "assistant", "content": "alpha"}, *user("b")]
        failed = await r.post({"messages": history})
        retry = [*history, {"role": "assistant", "content": "(failed)"}, *user("b again")]
        await r.post({"messages": retry, "stream": True, "stream_options": {"include_usage": True}})
        report = r.proxy.trajectory_report(ROLLOUT)
        calls = r.proxy.calls(ROLLOUT)
        total = r.proxy.total_tokens(ROLLOUT)
        popped = r.proxy.pop_calls(ROLLOUT)
        after_pop = (r.proxy.calls(ROLLOUT), r.proxy.total_tokens(ROLLOUT))
    assert failed.status_code == 500
    assert isinstance(report, TrajectoryReport)
    assert report.model_name == POLICY
    assert list(report.samples) == [ROLLOUT]
    sample = report.samples[ROLLOUT]
    assert sample.model_name == POLICY
    ok_calls = [c for c in calls if c.ok]
    assert len(sample.llm_call_metrics) == len(ok_calls) == 2  # the failed call made no step
    for metrics, call in zip(sample.llm_call_metrics, ok_calls, strict=True):
        assert call.usage is not None
        assert metrics.prompt_tokens == call.usage.prompt_tokens
        assert metrics.completion_tokens == call.usage.completion_tokens
        assert metrics.prompt_token_ids == call.prompt_token_ids
        assert metrics.completion_token_ids == call.completion_token_ids
        assert metrics.logprobs == call.logprobs
        assert metrics.model_name == POLICY
        assert metrics.extra is not None
        assert metrics.extra["finish_reason"] == "stop"
    assert sample.llm_call_metrics[1].completion_token_ids == list(b"beta")
    usages = [c.usage for c in calls if c.usage is not None]
    assert total == sum(u.total for u in usages) > 0
    assert sample.final_metrics == {
        "llm_calls": 3,
        "failed_llm_calls": 1,
        "total_prompt_tokens": sum(u.prompt_tokens or 0 for u in usages),
        "total_completion_tokens": sum(u.completion_tokens or 0 for u in usages),
        "token_segments": 1,  # the retry's prompt extends the first call's tokens
        "chain_breaks": 0,
    }
    assert [m.extra["token_segment"] for m in sample.llm_call_metrics if m.extra] == [0, 0]
    # what a controller puts in the completion-callback ack round-trips through the SDK reader
    ack = {"ok": True, "trajectory": report.model_dump(mode="json")}
    assert report_from_response(json.dumps(ack)) == report
    assert popped == calls
    assert after_pop == ([], total)


async def test_concurrent_calls_of_one_rollout_are_all_recorded_in_order():
    async with rig(ScriptedModelServer(["ok"], on_exhausted="repeat_last")) as r:
        responses = await asyncio.gather(
            *(r.post({"messages": user(str(i)), "stream": i % 2 == 0}) for i in range(16))
        )
        calls = r.proxy.calls(ROLLOUT)
    assert all(response.status_code == 200 for response in responses)
    assert [c.index for c in calls] == list(range(16))
    assert all(isinstance(c, CallRecord) and c.rollout_id == ROLLOUT for c in calls)


def test_recorder_reads_vllm_token_id_names_and_cached_tokens():
    recorder = CallRecorder("r", 0, stream=False)
    body = {
        "model": "m",
        "prompt_token_ids": [1, 2, 3],
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": "ab"},
                "finish_reason": "length",
                "logprobs": {
                    "content": [
                        {"token": "token_id:17", "logprob": -0.5},
                        {"token": "token_id:18", "logprob": -1.25},
                    ]
                },
            }
        ],
        "usage": {
            "prompt_tokens": 3,
            "completion_tokens": 2,
            "total_tokens": 5,
            "prompt_tokens_details": {"cached_tokens": 2},
        },
    }
    recorder.body(json.dumps(body).encode())
    record = recorder.finish()
    assert record.prompt_token_ids == [1, 2, 3]
    assert record.completion_token_ids == [17, 18]
    assert record.logprobs == [-0.5, -1.25]
    assert record.usage == Usage(3, 2, 5, 2)
    assert record.finish_reason == "length"
    assert record.ok
    metrics = record.to_metrics()
    assert metrics.cached_tokens == 2


def test_recorder_notes_odd_shapes_without_raising():
    recorder = CallRecorder("r", 0, stream=True)
    recorder.chunk(b"not json")
    recorder.chunk(b"[1]")
    recorder.chunk(
        b'{"choices": [{"index": 0, "delta": {}, "token_ids": ["x"], "logprobs": {"content": [{"no": 1}]}}]}'
    )
    recorder.chunk(b'{"error": {"message": "overloaded"}}')
    record = recorder.finish()
    assert record.error is not None
    for fragment in ("not JSON", "not an object", "token_ids", "logprobs", "error chunk"):
        assert fragment in record.error
    assert record.completion_token_ids is None
    assert record.logprobs is None


# -- the openai client -----------------------------------------------------------------------


@pytest.mark.skipif(not HAS_OPENAI, reason="needs the 'openai' package (pip install openai)")
async def test_openai_client_through_the_proxy_stream_and_not():
    import openai

    script = [ScriptedTurn(tool_calls=[ToolCall("multiply", {"a": 6, "b": 7})]), "It is 42."]
    async with rig(ScriptedModelServer(script, on_exhausted="repeat_last")) as r:
        client = openai.AsyncOpenAI(
            base_url=r.proxy.chat_base_url(ROLLOUT, r.origin), api_key=r.proxy.token
        )
        try:
            first = await client.chat.completions.create(
                model="osmosis-rollout", messages=user("6*7?")
            )
            calls = first.choices[0].message.tool_calls or []
            assert calls[0].function.name == "multiply"
            history: list[Any] = [
                *user("6*7?"),
                first.choices[0].message.model_dump(exclude_none=True),
                {"role": "tool", "tool_call_id": calls[0].id, "content": "42"},
            ]
            stream = await client.chat.completions.create(
                model="osmosis-rollout", messages=history, stream=True
            )
            text = ""
            async for chunk in stream:
                if chunk.choices:
                    text += chunk.choices[0].delta.content or ""
            assert text == "It is 42."
            with pytest.raises(openai.AuthenticationError):
                await openai.AsyncOpenAI(
                    base_url=r.proxy.chat_base_url(ROLLOUT, r.origin), api_key="wrong"
                ).chat.completions.create(model="x", messages=user("x"))
        finally:
            await client.close()
        assert [c.stream for c in r.proxy.calls(ROLLOUT)] == [False, True]
