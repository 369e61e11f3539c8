"""Upstream models: the OpenAI-compatible client, preflight errors, SSE parsing, model paths."""

from __future__ import annotations

import asyncio
import importlib.util
import json
import subprocess
import sys
import tomllib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest

from osmosis_ai.controller import (
    ControllerError,
    LiteLLMUpstream,
    OpenAICompatibleUpstream,
    Preflight,
    UpstreamAuthError,
    UpstreamConnectionError,
    UpstreamError,
    UpstreamNotFoundError,
    UpstreamRequestError,
    upstream_from_model_path,
)
from osmosis_ai.controller.upstreams import OPENAI_DEFAULT_BASE_URL, sse_payloads
from osmosis_ai.errors import ConfigError, MissingExtraError, OsmosisError
from osmosis_ai.testing.model_server import ChatRequest, ScriptedModelServer, ScriptedTurn
from osmosis_ai.testing.serving import free_port, serve_in_task

HAS_LITELLM = importlib.util.find_spec("litellm") is not None


def user(text: str) -> dict[str, Any]:
    return {"messages": [{"role": "user", "content": text}]}


# -- complete / stream against the scripted server -------------------------------------------


async def test_complete_sends_the_whole_body_with_model_and_extra_body_set():
    async with ScriptedModelServer(["hello"], record_requests=True, api_key="k1") as server:
        upstream = OpenAICompatibleUpstream(
            server.base_url + "/",
            "k1",
            "policy",
            extra_body={"chat_template_kwargs": {"enable_thinking": False}, "top_k": 5},
        )
        try:
            body = {**user("hi"), "model": "osmosis-rollout", "top_k": 1, "seed": 7}
            raw = await upstream.complete(body)
        finally:
            await upstream.aclose()
    reply = json.loads(raw)
    assert reply["choices"][0]["message"]["content"] == "hello"
    assert reply["model"] == "policy"
    sent = server.requests[0]
    assert sent.path == "/v1/chat/completions"
    assert sent.headers["authorization"] == "Bearer k1"
    assert sent.body == {
        **user("hi"),
        "model": "policy",
        "seed": 7,
        "top_k": 5,  # extra_body wins over the caller
        "chat_template_kwargs": {"enable_thinking": False},
    }
    assert upstream.target.endswith("/v1/chat/completions")
    assert upstream.model == "policy"


async def test_stream_yields_each_data_payload_and_reuses_the_connection():
    async with ScriptedModelServer(["one two three"], on_exhausted="repeat_last") as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "policy")
        try:
            for _ in range(3):
                payloads = [p async for p in upstream.stream({**user("x"), "stream": True})]
                assert payloads[0] == b""  # accepted, before any data
                assert payloads[-1] == b"[DONE]"
                chunks = [json.loads(p) for p in payloads[1:-1]]
                text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks)
                assert text == "one two three"
        finally:
            await upstream.aclose()


async def test_stream_raises_the_error_status_before_any_payload():
    turn = ScriptedTurn(status_code=400, error="maximum context length is 8192 tokens")
    async with ScriptedModelServer([turn]) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "policy")
        try:
            with pytest.raises(UpstreamRequestError) as caught:
                async for _ in upstream.stream({**user("x"), "stream": True}):
                    pass
        finally:
            await upstream.aclose()
    assert caught.value.status_code == 400
    assert caught.value.provider_message == "maximum context length is 8192 tokens"
    assert json.loads(caught.value.body)["error"]["message"] == caught.value.provider_message


async def test_stream_rejects_a_json_answer():
    async def json_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"application/json")],
            }
        )
        await send({"type": "http.response.body", "body": b'{"choices": []}'})

    async with serve_in_task(json_app, lifespan="off") as origin:
        upstream = OpenAICompatibleUpstream(origin + "/v1", None, "policy")
        try:
            with pytest.raises(UpstreamRequestError, match="not server-sent events"):
                async for _ in upstream.stream({**user("x"), "stream": True}):
                    pass
        finally:
            await upstream.aclose()


# -- preflight -------------------------------------------------------------------------------


async def test_preflight_passes_and_sends_a_tiny_request():
    async with ScriptedModelServer(["hey"], record_requests=True) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "policy")
        try:
            result = await upstream.preflight()
        finally:
            await upstream.aclose()
    assert isinstance(result, Preflight)
    assert (result.model, result.rate_limited, result.warning) == ("policy", False, None)
    assert result.target == upstream.target
    assert result.latency_ms >= 0
    body = server.requests[0].body
    assert body["messages"] == [{"role": "user", "content": "hi"}]
    assert 0 < body["max_tokens"] <= 256
    assert not body.get("stream")


async def test_preflight_auth_error_carries_the_provider_message_and_status():
    async with ScriptedModelServer(["hey"], api_key="right") as server:
        upstream = OpenAICompatibleUpstream(server.base_url, "wrong", "policy")
        try:
            with pytest.raises(UpstreamAuthError) as caught:
                await upstream.preflight()
        finally:
            await upstream.aclose()
    error = caught.value
    assert isinstance(error, UpstreamError)
    assert isinstance(error, ControllerError)
    assert isinstance(error, OsmosisError)
    assert error.status_code == 401
    assert "missing or wrong API key" in str(error)
    assert error.provider_message is not None
    assert "missing or wrong API key" in error.provider_message
    assert upstream.target in str(error)


async def test_preflight_forbidden_is_an_auth_error():
    async with ScriptedModelServer(
        [ScriptedTurn(status_code=403, error="project has no access")]
    ) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, "k", "policy")
        try:
            with pytest.raises(UpstreamAuthError, match="project has no access"):
                await upstream.preflight()
        finally:
            await upstream.aclose()


async def test_preflight_unknown_model_is_not_found():
    turn = ScriptedTurn(status_code=404, error="The model `gpt-9` does not exist")
    async with ScriptedModelServer([turn]) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, "k", "gpt-9")
        try:
            with pytest.raises(UpstreamNotFoundError) as caught:
                await upstream.preflight()
        finally:
            await upstream.aclose()
    assert caught.value.status_code == 404
    assert "The model `gpt-9` does not exist" in str(caught.value)
    assert "'gpt-9'" in str(caught.value)


async def test_preflight_wrong_base_path_is_not_found():
    async def not_found_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        headers = [(b"content-type", b"application/json")]
        await send({"type": "http.response.start", "status": 404, "headers": headers})
        await send({"type": "http.response.body", "body": b'{"detail":"Not Found"}'})

    async with serve_in_task(not_found_app, lifespan="off") as origin:
        upstream = OpenAICompatibleUpstream(origin + "/api", None, "policy")
        try:
            with pytest.raises(UpstreamNotFoundError) as caught:
                await upstream.preflight()
        finally:
            await upstream.aclose()
    assert caught.value.provider_message == "Not Found"
    assert origin + "/api/chat/completions" in str(caught.value)


async def test_preflight_connection_refused_names_the_url():
    url = f"http://127.0.0.1:{free_port()}/v1"
    upstream = OpenAICompatibleUpstream(url, None, "policy", connect_timeout=2)
    try:
        with pytest.raises(UpstreamConnectionError) as caught:
            await upstream.preflight()
    finally:
        await upstream.aclose()
    assert url + "/chat/completions" in str(caught.value)
    assert caught.value.status_code is None
    assert caught.value.url == url + "/chat/completions"


async def test_preflight_dns_failure_is_a_connection_error():
    upstream = OpenAICompatibleUpstream(
        "http://no-such-host.invalid/v1", None, "p", connect_timeout=5
    )
    try:
        with pytest.raises(UpstreamConnectionError, match=r"no-such-host\.invalid"):
            await upstream.preflight()
    finally:
        await upstream.aclose()


async def test_preflight_timeout_is_a_connection_error():
    async with ScriptedModelServer(["slow"], latency_ms=800) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "policy", timeout=0.1)
        try:
            with pytest.raises(UpstreamConnectionError, match="timed out"):
                await upstream.preflight()
        finally:
            await upstream.aclose()


@pytest.mark.parametrize("status", [400, 422, 500, 503])
async def test_preflight_other_statuses_are_request_errors(status: int):
    turn = ScriptedTurn(status_code=status, error=f"scripted failure {status}")
    async with ScriptedModelServer([turn]) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "policy")
        try:
            with pytest.raises(UpstreamRequestError) as caught:
                await upstream.preflight()
        finally:
            await upstream.aclose()
    assert caught.value.status_code == status
    assert f"scripted failure {status}" in str(caught.value)


async def test_preflight_passes_a_rate_limit_with_a_warning():
    turn = ScriptedTurn(status_code=429, error="Rate limit reached for requests")
    async with ScriptedModelServer([turn]) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "policy")
        try:
            result = await upstream.preflight()
        finally:
            await upstream.aclose()
    assert result.rate_limited is True
    assert result.warning is not None
    assert "Rate limit reached for requests" in result.warning


async def test_preflight_retries_with_max_completion_tokens_for_reasoning_models():
    def responder(request: ChatRequest) -> ScriptedTurn:
        if "max_tokens" in request.body:
            return ScriptedTurn(
                status_code=400,
                error="Unsupported parameter: 'max_tokens' is not supported with this model. "
                "Use 'max_completion_tokens' instead.",
            )
        return ScriptedTurn(content="ok")

    async with ScriptedModelServer(responder=responder, record_requests=True) as server:
        upstream = OpenAICompatibleUpstream(server.base_url, None, "o-model")
        try:
            result = await upstream.preflight()
        finally:
            await upstream.aclose()
    assert not result.rate_limited
    assert [
        ("max_tokens" in r.body, "max_completion_tokens" in r.body) for r in server.requests
    ] == [
        (True, False),
        (False, True),
    ]


async def test_preflight_rejects_a_200_that_is_not_a_chat_completion():
    async def html_app(scope: dict[str, Any], receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/html")],
            }
        )
        await send({"type": "http.response.body", "body": b"<html>welcome</html>"})

    async with serve_in_task(html_app, lifespan="off") as origin:
        upstream = OpenAICompatibleUpstream(origin, None, "policy")
        try:
            with pytest.raises(UpstreamRequestError, match="not a chat completion"):
                await upstream.preflight()
        finally:
            await upstream.aclose()


# -- SSE parsing -----------------------------------------------------------------------------


async def chunks_of(*parts: bytes) -> AsyncIterator[bytes]:
    for part in parts:
        await asyncio.sleep(0)
        yield part


async def collect(*parts: bytes) -> list[bytes]:
    return [p async for p in sse_payloads(chunks_of(*parts), "http://up")]


async def test_sse_payloads_split_across_reads_crlf_comments_and_multiline():
    stream = (
        b": ping\r\n\r\n"
        b'data: {"a":\r\n'
        b"data: 1}\r\n\r\n"
        b"id: 7\nretry: 10\n"
        b'data:{"b":2}\n\n'
        b"data: [DONE]\n\n"
        b"data: after-done\n\n"
    )
    for size in (1, 3, 7, len(stream)):
        parts = [stream[i : i + size] for i in range(0, len(stream), size)]
        assert await collect(*parts) == [b'{"a":\n1}', b'{"b":2}', b"[DONE]"]


async def test_sse_payloads_flush_a_last_event_without_blank_line():
    assert await collect(b'data: {"x":1}\n\n', b'data: {"y":2}') == [b'{"x":1}', b'{"y":2}']


async def test_sse_error_event_raises_with_the_provider_message():
    with pytest.raises(UpstreamRequestError, match="overloaded") as caught:
        await collect(
            b'data: {"x":1}\n\n', b'event: error\ndata: {"error": {"message": "overloaded"}}\n\n'
        )
    assert caught.value.provider_message == "overloaded"


# -- upstream_from_model_path ----------------------------------------------------------------


async def test_openai_model_path_uses_base_url_and_key_from_env():
    async with ScriptedModelServer(["hi"], api_key="sk-test", record_requests=True) as server:
        env = {"OPENAI_BASE_URL": server.base_url, "OPENAI_API_KEY": "sk-test"}
        upstream = upstream_from_model_path("openai/qwen-7b", env)
        assert isinstance(upstream, OpenAICompatibleUpstream)
        try:
            await upstream.preflight()
        finally:
            await upstream.aclose()
    assert upstream.model == "qwen-7b"
    assert server.requests[0].body["model"] == "qwen-7b"


def test_openai_model_path_falls_back_to_openai_api_base_then_the_default():
    legacy = upstream_from_model_path("openai/m", {"OPENAI_API_BASE": "http://h:1/v1"})
    assert isinstance(legacy, OpenAICompatibleUpstream)
    assert legacy.base_url == "http://h:1/v1"
    both = upstream_from_model_path(
        "openai/m", {"OPENAI_BASE_URL": "http://a/v1", "OPENAI_API_BASE": "http://b/v1"}
    )
    assert isinstance(both, OpenAICompatibleUpstream)
    assert both.base_url == "http://a/v1"
    default = upstream_from_model_path("openai/gpt-4o-mini", {"OPENAI_API_KEY": "sk"})
    assert isinstance(default, OpenAICompatibleUpstream)
    assert default.base_url == OPENAI_DEFAULT_BASE_URL
    assert default.target == "https://api.openai.com/v1/chat/completions"
    assert default.model == "gpt-4o-mini"


def test_openai_model_path_keeps_slashes_in_the_model_name():
    upstream = upstream_from_model_path(
        "openai/Qwen/Qwen2.5-0.5B", {"OPENAI_BASE_URL": "http://h/v1"}
    )
    assert upstream.model == "Qwen/Qwen2.5-0.5B"


def test_openai_api_without_a_key_is_a_config_error():
    with pytest.raises(ConfigError, match="OPENAI_API_KEY"):
        upstream_from_model_path("openai/gpt-4o", {})


@pytest.mark.parametrize("path", ["gpt-4o", "/gpt-4o", "openai/", ""])
def test_model_path_without_provider_is_a_config_error(path: str):
    with pytest.raises(ConfigError, match="provider/model"):
        upstream_from_model_path(path, {"OPENAI_API_KEY": "sk"})


def test_local_model_path_names_the_missing_checkpoint(tmp_path):
    pytest.importorskip("torch", reason="torch not installed (extra train)")
    missing = tmp_path / "checkpoints" / "step-10"
    with pytest.raises(ConfigError, match="step-10"):
        upstream_from_model_path(f"local:{missing}", {})


def test_other_providers_without_litellm_name_the_extra_and_the_openai_route(monkeypatch):
    monkeypatch.setitem(sys.modules, "litellm", None)  # as if the extra were not installed
    with pytest.raises(MissingExtraError) as caught:
        upstream_from_model_path("anthropic/claude-sonnet-4", {})
    message = str(caught.value)
    assert caught.value.extra == "litellm"
    assert 'pip install "osmosis-ai[litellm]"' in message
    assert "openai/<model>" in message
    assert "OPENAI_BASE_URL" in message
    assert "anthropic/claude-sonnet-4" in message
    with pytest.raises(MissingExtraError):
        LiteLLMUpstream("anthropic/claude-sonnet-4")


def test_the_litellm_extra_in_messages_is_the_one_pyproject_declares():
    project = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())
    extras = project["project"]["optional-dependencies"]
    assert any(req.startswith("litellm") for req in extras["litellm"])
    assert any("litellm" in req for req in extras["dev"])  # so CI runs the LiteLLM tests below


def test_choosing_an_upstream_does_not_import_litellm():
    code = (
        "import sys\n"
        "from osmosis_ai.controller import upstream_from_model_path\n"
        "upstream_from_model_path('openai/m', {'OPENAI_BASE_URL': 'http://127.0.0.1:9/v1'})\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'litellm'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


needs_litellm = pytest.mark.skipif(
    not HAS_LITELLM, reason="needs the 'litellm' package (extra 'litellm')"
)


@pytest.fixture
def offline_litellm(monkeypatch):
    # LiteLLM fetches its model price list from the network when first imported unless told
    # to use the copy it ships; these tests need no network.
    monkeypatch.setenv("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")


def litellm_upstream(base_url: str) -> LiteLLMUpstream:
    # hosted_vllm/ is LiteLLM's route to an OpenAI-compatible server at api_base.
    upstream = upstream_from_model_path(
        "hosted_vllm/policy", {}, extra_body={"api_base": base_url}, timeout=30.0
    )
    assert isinstance(upstream, LiteLLMUpstream)
    return upstream


@needs_litellm
async def test_litellm_upstream_completes_and_streams_through_an_openai_compatible_server(
    offline_litellm,
):
    turns = [ScriptedTurn(content="via litellm"), ScriptedTurn(content="streamed reply")]
    async with ScriptedModelServer(turns, record_requests=True) as server:
        upstream = litellm_upstream(server.base_url)
        assert upstream.target == "litellm:hosted_vllm/policy"
        raw = await upstream.complete({**user("hi"), "temperature": 0.5})
        reply = json.loads(raw)
        assert reply["choices"][0]["message"] == {
            **reply["choices"][0]["message"],
            "role": "assistant",
            "content": "via litellm",
        }
        assert reply["choices"][0]["finish_reason"] == "stop"
        history = [*user("hi")["messages"], {"role": "assistant", "content": "via litellm"}]
        body = {"messages": [*history, {"role": "user", "content": "again"}]}
        payloads = [p async for p in upstream.stream(body)]
        await upstream.aclose()
    chunks = [json.loads(p) for p in payloads if p]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    assert text == "streamed reply"
    assert [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1] == "stop"
    first, second = server.requests
    assert first.path == second.path == "/v1/chat/completions"
    assert first.body["model"] == "policy" and first.body["temperature"] == 0.5
    assert first.body["messages"] == user("hi")["messages"]
    assert second.body["stream"] is True
    assert second.body["messages"][-1] == {"role": "user", "content": "again"}


@needs_litellm
async def test_litellm_upstream_preflight_passes(offline_litellm):
    async with ScriptedModelServer(["ok"], on_exhausted="repeat_last") as server:
        preflight = await litellm_upstream(server.base_url).preflight()
    assert preflight.model == "hosted_vllm/policy"
    assert preflight.target == "litellm:hosted_vllm/policy"
    assert not preflight.rate_limited


@needs_litellm
@pytest.mark.parametrize(
    ("status", "kind"),
    [(401, UpstreamAuthError), (404, UpstreamNotFoundError), (400, UpstreamRequestError)],
)
async def test_litellm_upstream_errors_keep_the_provider_status_and_message(
    offline_litellm, status: int, kind: type[UpstreamError]
):
    turn = ScriptedTurn(status_code=status, error=f"scripted refusal {status}")
    async with ScriptedModelServer([turn], on_exhausted="repeat_last") as server:
        upstream = litellm_upstream(server.base_url)
        with pytest.raises(kind) as caught:
            await upstream.complete(user("hi"))
        with pytest.raises(kind):
            async for _ in upstream.stream(user("hi")):
                pass
    assert caught.value.status_code == status
    assert f"scripted refusal {status}" in (caught.value.provider_message or "")


@needs_litellm
async def test_litellm_upstream_that_reaches_nobody_is_a_connection_error(offline_litellm):
    upstream = litellm_upstream(f"http://127.0.0.1:{free_port()}/v1")
    with pytest.raises(UpstreamConnectionError, match="could not reach hosted_vllm/policy"):
        await upstream.complete(user("hi"))
