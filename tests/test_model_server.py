"""The scripted chat-completions server, over real HTTP on 127.0.0.1."""

from __future__ import annotations

import asyncio
import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Any

import httpx
import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.testing.model_server import (
    ChatRequest,
    RecordedRequest,
    ScriptedModelServer,
    ScriptedTurn,
    ToolCall,
)

WEATHER = [
    ScriptedTurn(tool_calls=[ToolCall("get_weather", {"city": "Paris"})]),
    "It is sunny in Paris.",
]


def user(text: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": text}]


def chat_body(messages: list[dict[str, Any]], **extra: Any) -> dict[str, Any]:
    return {"model": "osmosis-rollout", "messages": messages, **extra}


def sse_chunks(text: str) -> list[dict[str, Any]]:
    events = [e for e in text.split("\n\n") if e.strip()]
    assert all(e.startswith("data: ") for e in events)
    assert events[-1] == "data: [DONE]"
    return [json.loads(e[len("data: ") :]) for e in events[:-1]]


def reassemble(chunks: list[dict[str, Any]], index: int = 0) -> dict[str, Any]:
    """Fold stream chunks of one choice back into a message, the way clients do."""
    content = ""
    calls: dict[int, dict[str, Any]] = {}
    finish = None
    for chunk in chunks:
        for choice in chunk["choices"]:
            if choice["index"] != index:
                continue
            delta = choice["delta"]
            content += delta.get("content") or ""
            for call in delta.get("tool_calls", []):
                slot = calls.setdefault(call["index"], {"id": None, "name": "", "arguments": ""})
                slot["id"] = call.get("id") or slot["id"]
                slot["name"] += call["function"].get("name", "")
                slot["arguments"] += call["function"].get("arguments", "")
            finish = choice["finish_reason"] or finish
    return {"content": content, "tool_calls": [calls[i] for i in sorted(calls)], "finish": finish}


# -- scripted turns, non-stream and stream ----------------------------------------------------


def test_multi_turn_tool_call_then_answer_in_a_thread():
    with ScriptedModelServer(WEATHER) as server:
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+", server.url)
        assert server.base_url == server.url + "/v1"
        url = server.base_url + "/chat/completions"
        first = httpx.post(url, json=chat_body(user("weather?"))).json()
        assert first["object"] == "chat.completion"
        assert first["id"].startswith("chatcmpl-")
        assert first["model"] == "osmosis-rollout"
        assert isinstance(first["created"], int)
        (choice,) = first["choices"]
        assert choice["index"] == 0
        assert choice["finish_reason"] == "tool_calls"
        assert choice["message"]["role"] == "assistant"
        assert choice["message"]["content"] is None
        (call,) = choice["message"]["tool_calls"]
        assert re.fullmatch(r"call_[0-9a-f]+", call["id"])
        assert call["type"] == "function"
        assert call["function"]["name"] == "get_weather"
        assert json.loads(call["function"]["arguments"]) == {"city": "Paris"}
        usage = first["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"] > 0

        history = [
            *user("weather?"),
            {"role": "assistant", "content": None, "tool_calls": [call]},
            {"role": "tool", "tool_call_id": call["id"], "content": "sunny"},
        ]
        second = httpx.post(url, json=chat_body(history)).json()
        assert second["choices"][0]["message"] == {
            "role": "assistant",
            "content": "It is sunny in Paris.",
        }
        assert second["choices"][0]["finish_reason"] == "stop"


async def test_multi_turn_streamed_as_a_task():
    async with ScriptedModelServer(WEATHER) as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        response = await client.post(url, json=chat_body(user("weather?"), stream=True))
        assert response.headers["content-type"].startswith("text/event-stream")
        assert response.headers["cache-control"] == "no-cache"
        chunks = sse_chunks(response.text)
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"}
        assert len({c["id"] for c in chunks}) == 1
        assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
        call_deltas = [c for c in chunks if c["choices"][0]["delta"].get("tool_calls")]
        head = call_deltas[0]["choices"][0]["delta"]["tool_calls"][0]
        assert head["function"] == {"name": "get_weather", "arguments": ""}
        assert head["index"] == 0
        assert head["type"] == "function"
        assert len(call_deltas) > 2, "arguments arrive in fragments"
        folded = reassemble(chunks)
        assert folded["finish"] == "tool_calls"
        (call,) = folded["tool_calls"]
        assert call["id"] == head["id"]
        assert json.loads(call["arguments"]) == {"city": "Paris"}

        history = [*user("weather?"), {"role": "assistant", "content": None}]
        response = await client.post(url, json=chat_body(history, stream=True))
        chunks = sse_chunks(response.text)
        content_deltas = [c for c in chunks if c["choices"][0]["delta"].get("content")]
        assert len(content_deltas) > 1, "content arrives in several chunks"
        assert reassemble(chunks) == {
            "content": "It is sunny in Paris.",
            "tool_calls": [],
            "finish": "stop",
        }
        assert "usage" not in chunks[-1]


async def test_include_usage_and_n_choices_when_streaming():
    async with ScriptedModelServer(["two words"]) as server, httpx.AsyncClient() as client:
        body = chat_body(user("hi"), stream=True, n=2, stream_options={"include_usage": True})
        response = await client.post(server.base_url + "/chat/completions", json=body)
        chunks = sse_chunks(response.text)
        assert chunks[-1]["choices"] == []
        usage = chunks[-1]["usage"]
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        for index in (0, 1):
            assert reassemble(chunks, index)["content"] == "two words"


async def test_n_identical_choices():
    async with ScriptedModelServer(["same"]) as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        data = (await client.post(url, json=chat_body(user("hi"), n=3))).json()
        assert [c["index"] for c in data["choices"]] == [0, 1, 2]
        assert {c["message"]["content"] for c in data["choices"]} == {"same"}
        bad = await client.post(url, json=chat_body(user("hi"), n=0))
        assert bad.status_code == 400
        assert "'n'" in bad.json()["error"]["message"]


async def test_echo_when_nothing_is_scripted_over_asgi_transport():
    server = ScriptedModelServer()
    transport = httpx.ASGITransport(app=server.app)
    async with httpx.AsyncClient(transport=transport, base_url="http://test") as client:
        messages = [*user("first"), {"role": "assistant", "content": "x"}, *user("again")]
        data = (await client.post("/v1/chat/completions", json=chat_body(messages))).json()
        assert data["choices"][0]["message"]["content"] == "again"
        parts = [{"role": "user", "content": [{"type": "text", "text": "in parts"}]}]
        data = (await client.post("/v1/chat/completions", json=chat_body(parts))).json()
        assert data["choices"][0]["message"]["content"] == "in parts"
        assert (await client.get("/health")).json() == {"status": "ok"}
        models = (await client.get("/v1/models")).json()
        assert models["object"] == "list"
        assert models["data"][0]["id"] == "scripted"


# -- choosing a reply ---------------------------------------------------------------------------


async def test_scripts_per_conversation_run_concurrently():
    scripts = {
        "r1": ["r1 turn 0", "r1 turn 1"],
        "r2": ["r2 turn 0", "r2 turn 1"],
        "plain question": ["keyed by the first user message"],
    }
    async with ScriptedModelServer(scripts=scripts) as server, httpx.AsyncClient() as client:

        async def ask(path: str, messages: list[dict[str, Any]]) -> str:
            response = await client.post(server.url + path, json=chat_body(messages))
            return response.json()["choices"][0]["message"]["content"]

        later = [*user("x"), {"role": "assistant", "content": "y"}, *user("z")]
        replies = await asyncio.gather(
            ask("/v1/rollouts/r1/chat/completions", user("x")),
            ask("/v1/rollouts/r2/chat/completions", later),
            ask("/v1/rollouts/r1/chat/completions", later),
            ask("/v1/chat/completions", user("plain question")),
        )
        assert replies == ["r1 turn 0", "r2 turn 1", "r1 turn 1", "keyed by the first user message"]
        unknown = await client.post(
            server.url + "/v1/rollouts/r9/chat/completions", json=chat_body(user("x"))
        )
        assert unknown.status_code == 400
        assert "'r9'" in unknown.json()["error"]["message"]


async def test_custom_key_callable():
    server = ScriptedModelServer(
        scripts={"alice": ["hi alice"], "bob": ["hi bob"]},
        key=lambda request: request.headers.get("x-user", ""),
    )
    async with server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        for name in ("bob", "alice"):
            response = await client.post(url, json=chat_body(user("?")), headers={"x-user": name})
            assert response.json()["choices"][0]["message"]["content"] == f"hi {name}"


async def test_responder_sees_the_request_sync_and_async():
    seen: list[ChatRequest] = []

    def sync_responder(request: ChatRequest) -> str:
        seen.append(request)
        return f"turn {request.turn} via {request.path_prefix}"

    async def async_responder(request: ChatRequest) -> ScriptedTurn:
        await asyncio.sleep(0)
        return ScriptedTurn(content="async", finish_reason="length")

    async with httpx.AsyncClient() as client:
        async with ScriptedModelServer(responder=sync_responder) as server:
            messages = [*user("a"), {"role": "assistant", "content": "b"}, *user("c")]
            response = await client.post(
                server.url + "/v1/rollouts/abc/chat/completions",
                json=chat_body(messages, temperature=0.5),
                headers={"x-trace": "t1"},
            )
            content = response.json()["choices"][0]["message"]["content"]
            assert content == "turn 1 via /v1/rollouts/abc"
            (request,) = seen
            assert request.body["temperature"] == 0.5
            assert request.messages == messages
            assert request.headers["x-trace"] == "t1"
        async with ScriptedModelServer(responder=async_responder) as server:
            url = server.base_url + "/chat/completions"
            choice = (await client.post(url, json=chat_body(user("a")))).json()["choices"][0]
            assert choice["message"]["content"] == "async"
            assert choice["finish_reason"] == "length"


async def test_a_failing_responder_answers_500():
    def broken(request: ChatRequest) -> str:
        raise ValueError("no reply for you")

    async with ScriptedModelServer(responder=broken) as server, httpx.AsyncClient() as client:
        response = await client.post(server.base_url + "/chat/completions", json=chat_body([]))
        assert response.status_code == 500
        assert "ValueError: no reply for you" in response.json()["error"]["message"]


async def test_exhausted_script_errors_or_repeats():
    long_history = [*user("q"), {"role": "assistant", "content": "a"}, *user("q2")]
    async with httpx.AsyncClient() as client:
        async with ScriptedModelServer(["only"]) as server:
            url = server.base_url + "/chat/completions"
            response = await client.post(url, json=chat_body(long_history))
            assert response.status_code == 400
            error = response.json()["error"]
            assert error["code"] == "script_exhausted"
            assert "'q'" in error["message"]
            assert "turn 1" in error["message"]
        async with ScriptedModelServer(["first", "last"], on_exhausted="repeat_last") as server:
            url = server.base_url + "/chat/completions"
            history = [*long_history, {"role": "assistant", "content": "b"}, *user("q3")]
            data = (await client.post(url, json=chat_body(history))).json()
            assert data["choices"][0]["message"]["content"] == "last"


# -- latency, errors, auth, bad requests ---------------------------------------------------------


async def test_latency_global_and_per_turn():
    script = ["slow by default", ScriptedTurn(content="slower", latency_ms=120)]
    async with (
        ScriptedModelServer(script, latency_ms=60) as server,
        httpx.AsyncClient() as client,
    ):
        url = server.base_url + "/chat/completions"
        started = time.monotonic()
        await client.post(url, json=chat_body(user("q"), stream=True))
        assert time.monotonic() - started >= 0.05
        history = [*user("q"), {"role": "assistant", "content": "a"}]
        started = time.monotonic()
        await client.post(url, json=chat_body(history))
        assert time.monotonic() - started >= 0.11


async def test_error_turn_returns_openai_error_body():
    script = [
        ScriptedTurn(status_code=429, error="slow down"),
        ScriptedTurn(status_code=503),
    ]
    async with ScriptedModelServer(script) as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        response = await client.post(url, json=chat_body(user("q"), stream=True))
        assert response.status_code == 429
        error = response.json()["error"]
        assert error["message"] == "slow down"
        assert error["type"] == "rate_limit_error"
        assert set(error) == {"message", "type", "code"}
        history = [*user("q"), {"role": "assistant", "content": "a"}]
        response = await client.post(url, json=chat_body(history))
        assert response.status_code == 503
        assert response.json()["error"]["type"] == "server_error"


async def test_api_key_is_required_when_set():
    async with ScriptedModelServer(api_key="sk-test") as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        missing = await client.post(url, json=chat_body(user("q")))
        assert missing.status_code == 401
        assert missing.json()["error"]["code"] == "invalid_api_key"
        wrong = await client.post(
            url, json=chat_body(user("q")), headers={"Authorization": "Bearer nope"}
        )
        assert wrong.status_code == 401
        assert (await client.get(server.base_url + "/models")).status_code == 401
        assert (await client.get(server.url + "/health")).status_code == 200
        good = await client.post(
            url, json=chat_body(user("q")), headers={"Authorization": "Bearer sk-test"}
        )
        assert good.status_code == 200


async def test_malformed_requests_name_the_problem():
    async with ScriptedModelServer() as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        cases = {
            b"{not json": "not valid JSON",
            b"[1, 2]": "must be a JSON object",
            b'{"model": "m"}': "'messages'",
            b'{"messages": "hi"}': "'messages'",
        }
        for raw, expected in cases.items():
            response = await client.post(url, content=raw)
            assert response.status_code == 400, raw
            assert expected in response.json()["error"]["message"], raw
        assert (await client.get(url)).status_code == 405
        assert (await client.get(server.url + "/elsewhere")).status_code == 404


# -- token data, recording ------------------------------------------------------------------------


async def test_logprobs_and_token_ids_agree_with_usage_and_with_the_stream():
    turn = ScriptedTurn(content="héllo wörld", tool_calls=[ToolCall("f", '{"x": 1}', id="call_1")])
    async with ScriptedModelServer([turn]) as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        body = chat_body(user("prompt ✓"), logprobs=True, return_token_ids=True)
        data = (await client.post(url, json=body)).json()
        again = (await client.post(url, json=body)).json()
        choice = data["choices"][0]
        usage = data["usage"]
        assert len(choice["prompt_token_ids"]) == usage["prompt_tokens"]
        assert data["prompt_token_ids"] == choice["prompt_token_ids"]
        assert len(choice["token_ids"]) == usage["completion_tokens"]
        assert all(isinstance(t, int) for t in choice["token_ids"] + choice["prompt_token_ids"])
        entries = choice["logprobs"]["content"]
        assert len(entries) == len(choice["token_ids"])
        assert all(e["logprob"] < 0 and e["top_logprobs"] == [] for e in entries)
        assert [e["bytes"][0] for e in entries] == choice["token_ids"]
        assert again["choices"][0]["logprobs"] == choice["logprobs"], "deterministic"
        assert choice["message"]["tool_calls"][0]["id"] == "call_1"

        chunks = sse_chunks((await client.post(url, json={**body, "stream": True})).text)
        streamed_ids: list[int] = []
        streamed_logprobs: list[dict[str, Any]] = []
        for chunk in chunks:
            (streamed,) = chunk["choices"]
            streamed_ids += streamed.get("token_ids", [])
            streamed_logprobs += (streamed["logprobs"] or {}).get("content", [])
        assert chunks[0]["choices"][0]["prompt_token_ids"] == choice["prompt_token_ids"]
        assert chunks[0]["prompt_token_ids"] == choice["prompt_token_ids"]
        assert streamed_ids == choice["token_ids"]
        assert streamed_logprobs == entries


async def test_usage_is_approximate_without_token_ids_and_can_be_scripted():
    script = ["x", ScriptedTurn(content="y", usage={"prompt_tokens": 1, "completion_tokens": 2})]
    async with ScriptedModelServer(script) as server, httpx.AsyncClient() as client:
        url = server.base_url + "/chat/completions"
        first = (await client.post(url, json=chat_body(user("q")))).json()
        assert "token_ids" not in first["choices"][0]
        assert first["choices"][0]["logprobs"] is None
        history = [*user("q"), {"role": "assistant", "content": "x"}]
        second = (await client.post(url, json=chat_body(history))).json()
        assert second["usage"] == {"prompt_tokens": 1, "completion_tokens": 2}


async def test_recording_and_counting():
    server = ScriptedModelServer(record_requests=True)
    async with server, httpx.AsyncClient() as client:
        await client.post(
            server.url + "/v1/rollouts/r1/chat/completions",
            json=chat_body(user("q")),
            headers={"x-k": "v"},
        )
        await client.post(server.base_url + "/chat/completions", content=b"bad")
        assert server.request_count == 2
        (recorded,) = server.requests
        assert isinstance(recorded, RecordedRequest)
        assert recorded.path == "/v1/rollouts/r1/chat/completions"
        assert recorded.headers["x-k"] == "v"
        assert recorded.body["messages"] == user("q")
        server.clear()
        assert server.requests == []
        assert server.request_count == 0
    assert ScriptedModelServer().requests == []


# -- construction and lifecycle -------------------------------------------------------------------


def test_usage_errors():
    with pytest.raises(UsageError, match="at most one"):
        ScriptedModelServer(["a"], responder=lambda request: "b")
    with pytest.raises(UsageError, match="key="):
        ScriptedModelServer(["a"], key=lambda request: "k")
    with pytest.raises(UsageError, match="empty"):
        ScriptedModelServer([])
    with pytest.raises(UsageError, match="not a string"):
        ScriptedModelServer("abc")
    with pytest.raises(UsageError, match="on_exhausted"):
        ScriptedModelServer(["a"], on_exhausted="loop")  # type: ignore[arg-type]
    with pytest.raises(UsageError, match="status_code"):
        ScriptedTurn(error="boom")
    with pytest.raises(UsageError, match="not running"):
        _ = ScriptedModelServer().url


def test_cli_serves_until_sigterm():
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(
        [sys.executable, "-m", "osmosis_ai.testing.model_server", "--port", "0", "--reply", "pong"],
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    try:
        assert process.stdout is not None
        base_url = process.stdout.readline().strip()
        assert re.fullmatch(r"http://127\.0\.0\.1:\d+/v1", base_url)
        for _ in range(2):
            data = httpx.post(base_url + "/chat/completions", json=chat_body(user("ping"))).json()
            assert data["choices"][0]["message"]["content"] == "pong"
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


# -- the official client --------------------------------------------------------------------------


def test_openai_client_stream_and_not():
    openai = pytest.importorskip("openai", reason="the 'openai' package is not installed")
    with ScriptedModelServer(WEATHER, api_key="sk-test") as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="sk-test", max_retries=0)
        first = client.chat.completions.create(model="osmosis-rollout", messages=user("weather?"))
        call = first.choices[0].message.tool_calls[0]
        assert call.function.name == "get_weather"
        assert first.choices[0].finish_reason == "tool_calls"
        history = [
            *user("weather?"),
            {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
            {"role": "tool", "tool_call_id": call.id, "content": "sunny"},
        ]
        stream = client.chat.completions.create(
            model="osmosis-rollout",
            messages=history,
            stream=True,
            stream_options={"include_usage": True},
        )
        chunks = list(stream)
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "It is sunny in Paris."
        assert chunks[-1].usage is not None
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="wrong", max_retries=0).models.list()


async def test_openai_async_client_streams_a_tool_call():
    openai = pytest.importorskip("openai", reason="the 'openai' package is not installed")
    async with ScriptedModelServer(WEATHER) as server:
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        stream = await client.chat.completions.create(
            model="m", messages=user("weather?"), stream=True
        )
        arguments = ""
        async for chunk in stream:
            for call in chunk.choices[0].delta.tool_calls or []:
                arguments += call.function.arguments or ""
        assert json.loads(arguments) == {"city": "Paris"}
        await client.close()


# -- the multiply solver ------------------------------------------------------------------------

MULTIPLY_TOOL = {
    "type": "function",
    "function": {
        "name": "multiply",
        "parameters": {"type": "object", "properties": {"a": {}, "b": {}}},
    },
}


def test_multiply_responder_calls_the_tool_then_answers_its_result():
    from osmosis_ai.testing.model_server import multiply_responder

    with ScriptedModelServer(responder=multiply_responder) as server:
        prompt = user("val1 = 192.524\nval2 = -798.0")
        with httpx.Client(base_url=server.base_url, timeout=10) as client:
            first = client.post(
                "/chat/completions", json=chat_body(prompt, tools=[MULTIPLY_TOOL])
            ).json()["choices"][0]["message"]
            [call] = first["tool_calls"]
            assert call["function"]["name"] == "multiply"
            assert json.loads(call["function"]["arguments"]) == {"a": 192.524, "b": -798.0}
            tool = {"role": "tool", "tool_call_id": call["id"], "content": "-153634.152"}
            second = client.post(
                "/chat/completions",
                json=chat_body([*prompt, first, tool], tools=[MULTIPLY_TOOL]),
            ).json()["choices"][0]["message"]
            assert second["content"].splitlines()[-1] == "#### -153634.1520"
            plain = client.post("/chat/completions", json=chat_body(user("hello"))).json()
            assert plain["choices"][0]["message"]["content"] == "ok"


def test_the_cli_refuses_reply_and_solve_together():
    done = subprocess.run(
        [sys.executable, "-m", "osmosis_ai.testing.model_server", "--reply", "x", "--solve",
         "multiply"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode == 2 and "not allowed with argument" in done.stderr
