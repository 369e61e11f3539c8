"""The policy endpoint's Responses and Messages APIs, over real HTTP on 127.0.0.1: the
real openai and anthropic clients, the real proxy, the scripted model upstream."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import anthropic
import httpx
import openai
import pytest

from osmosis_ai.controller import CallRecord, OpenAICompatibleUpstream, PolicyProxy
from osmosis_ai.controller.dialects import DIALECTS, MessagesDialect
from osmosis_ai.controller.dialects.messages import estimate_tokens
from osmosis_ai.testing.model_server import ScriptedModelServer, ScriptedTurn, ToolCall
from osmosis_ai.testing.scripted_reply import ScriptedReply
from osmosis_ai.testing.serving import serve_in_task

POLICY = "policy-model"
ADD_TOOL_RESPONSES = {
    "type": "function",
    "name": "add",
    "description": "Add two numbers",
    "parameters": {
        "type": "object",
        "properties": {"a": {"type": "number"}, "b": {"type": "number"}},
        "required": ["a", "b"],
    },
}
ADD_TOOL_MESSAGES = {
    "name": "add",
    "description": "Add two numbers",
    "input_schema": ADD_TOOL_RESPONSES["parameters"],
}
ADD_SCRIPT = [
    ScriptedTurn(tool_calls=[ToolCall("add", {"a": 2, "b": 3}, id="call_add")]),
    "The sum is 5.",
]


@dataclass
class Rig:
    model: ScriptedModelServer
    proxy: PolicyProxy
    origin: str

    def base(self, rollout: str = "r1") -> str:
        return self.proxy.chat_base_url(rollout, self.origin)

    def openai(self, rollout: str = "r1", key: str | None = None) -> openai.AsyncOpenAI:
        return openai.AsyncOpenAI(
            base_url=self.base(rollout), api_key=key or self.proxy.token, max_retries=0
        )

    def anthropic(self, rollout: str = "r1", key: str | None = None) -> anthropic.AsyncAnthropic:
        return anthropic.AsyncAnthropic(
            base_url=self.base(rollout), api_key=key or self.proxy.token, max_retries=0
        )

    def upstream_body(self, index: int = -1) -> dict[str, Any]:
        """The chat-completions body the scripted upstream received."""
        return self.model.requests[index].body

    async def calls(self, count: int, rollout: str = "r1") -> list[CallRecord]:
        """The rollout's records once ``count`` are in: a call is recorded just after its
        answer went out, so the client may see the answer first."""
        for _ in range(500):
            if len(records := self.proxy.calls(rollout)) >= count:
                return records
            await asyncio.sleep(0.01)
        raise AssertionError(f"{len(self.proxy.calls(rollout))} calls recorded, not {count}")

    async def call(self, index: int, rollout: str = "r1") -> CallRecord:
        return (await self.calls(index + 1, rollout))[index]


@contextlib.asynccontextmanager
async def rig(model: ScriptedModelServer, *rollouts: str) -> AsyncIterator[Rig]:
    async with contextlib.AsyncExitStack() as stack:
        await stack.enter_async_context(model)
        upstream = OpenAICompatibleUpstream(model.base_url, None, POLICY, timeout=20)
        stack.push_async_callback(upstream.aclose)
        proxy = PolicyProxy(upstream, request_token_data=True)
        for rollout in rollouts or ("r1",):
            proxy.register(rollout)
        origin = await stack.enter_async_context(serve_in_task(proxy, access_log=False))
        yield Rig(model, proxy, origin)


def scripted(*turns: ScriptedTurn | str, **options: Any) -> ScriptedModelServer:
    return ScriptedModelServer(list(turns), record_requests=True, **options)


def assert_tokens(record: CallRecord, text: str) -> None:
    """The record holds the scripted model's fake tokens (one per UTF-8 byte)."""
    assert record.ok, record.error
    assert record.prompt_token_ids and record.completion_token_ids is not None
    assert bytes(record.completion_token_ids).decode().startswith(text)
    assert record.logprobs is not None
    assert len(record.logprobs) == len(record.completion_token_ids)


# -- the Responses API -------------------------------------------------------------------


async def test_responses_text_maps_onto_chat_and_records_the_same_tokens_as_chat():
    async with rig(scripted("Hello there.", on_exhausted="repeat_last"), "r1", "r2") as r:
        answer = await r.openai().responses.create(
            model="any",
            instructions="Be brief.",
            input="Say hello.",
            max_output_tokens=64,
            temperature=0.25,
            top_p=0.5,
        )
        assert answer.output_text == "Hello there."
        assert answer.status == "completed" and answer.object == "response"
        assert answer.output[0].type == "message"
        assert answer.usage is not None and answer.usage.output_tokens == len("Hello there.")
        sent = r.upstream_body()
        assert sent["messages"] == [
            {"role": "system", "content": "Be brief."},
            {"role": "user", "content": "Say hello."},
        ]
        assert (sent["max_tokens"], sent["temperature"], sent["top_p"]) == (64, 0.25, 0.5)
        assert sent["model"] == POLICY and sent["logprobs"] and sent["return_token_ids"]
        # the same conversation through chat completions records the same tokens
        chat = await r.openai("r2").chat.completions.create(
            model="any",
            messages=[
                {"role": "system", "content": "Be brief."},
                {"role": "user", "content": "Say hello."},
            ],
            max_tokens=64,
        )
        assert chat.choices[0].message.content == "Hello there."
        via_responses, via_chat = await r.call(0), await r.call(0, "r2")
        assert_tokens(via_responses, "Hello there.")
        assert via_responses.prompt_token_ids == via_chat.prompt_token_ids
        assert via_responses.completion_token_ids == via_chat.completion_token_ids
        assert via_responses.logprobs == via_chat.logprobs
        report = r.proxy.trajectory_report("r1").samples["r1"].llm_call_metrics
        assert report[0].completion_token_ids == via_responses.completion_token_ids


async def test_responses_tool_call_round_trip_with_function_call_items():
    async with rig(scripted(*ADD_SCRIPT)) as r:
        client = r.openai()
        first = await client.responses.create(
            model="any", input="What is 2 + 3?", tools=[ADD_TOOL_RESPONSES], tool_choice="auto"
        )
        (call,) = first.output
        assert call.type == "function_call"
        assert (call.name, call.call_id) == ("add", "call_add")
        assert json.loads(call.arguments) == {"a": 2, "b": 3}
        sent = r.upstream_body()
        assert sent["tools"] == [
            {
                "type": "function",
                "function": {
                    "name": "add",
                    "parameters": ADD_TOOL_RESPONSES["parameters"],
                    "description": "Add two numbers",
                },
            }
        ]
        assert sent["tool_choice"] == "auto"
        second = await client.responses.create(
            model="any",
            input=[
                {"role": "user", "content": "What is 2 + 3?"},
                {
                    "type": "function_call",
                    "call_id": call.call_id,
                    "name": call.name,
                    "arguments": call.arguments,
                },
                {"type": "function_call_output", "call_id": call.call_id, "output": "5"},
            ],
            tools=[ADD_TOOL_RESPONSES],
        )
        assert second.output_text == "The sum is 5."
        messages = r.upstream_body()["messages"]
        assert messages[1]["role"] == "assistant"
        assert messages[1]["tool_calls"][0]["id"] == "call_add"
        assert messages[2] == {"role": "tool", "tool_call_id": "call_add", "content": "5"}
        assert_tokens(await r.call(0), '{"name": "add"')
        assert_tokens(await r.call(1), "The sum is 5.")


async def test_responses_stream_emits_the_event_sequence_and_records_tokens():
    async with rig(scripted("Streaming works fine.", *ADD_SCRIPT)) as r:
        client = r.openai()
        stream = await client.responses.create(model="any", input="go", stream=True)
        events = [event async for event in stream]
        kinds = [event.type for event in events]
        assert kinds[:4] == [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
        ]
        assert kinds[-4:] == [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
        deltas = [e.delta for e in events if e.type == "response.output_text.delta"]
        assert len(deltas) > 1 and "".join(deltas) == "Streaming works fine."
        assert [e.sequence_number for e in events] == list(range(len(events)))
        done = events[-1].response
        assert done.output_text == "Streaming works fine." and done.usage is not None
        assert_tokens(await r.call(0), "Streaming works fine.")
        assert (await r.call(0)).stream
        # a tool call streams as function_call items; the SDK's own stream helper agrees
        async with client.responses.stream(
            model="any",
            input=[
                {"role": "assistant", "content": "Streaming works fine."},
                {"role": "user", "content": "add"},
            ],
            tools=[ADD_TOOL_RESPONSES],
        ) as helper:
            kinds = [event.type async for event in helper]
            final = await helper.get_final_response()
        assert "response.function_call_arguments.delta" in kinds
        assert "response.function_call_arguments.done" in kinds
        (call,) = final.output
        assert call.type == "function_call" and json.loads(call.arguments) == {"a": 2, "b": 3}
        assert_tokens(await r.call(1), '{"name": "add"')


async def test_responses_errors_come_in_the_openai_shape():
    async with rig(
        scripted(ScriptedTurn(status_code=429, error="slow down"), on_exhausted="repeat_last")
    ) as r:
        with pytest.raises(openai.AuthenticationError):
            await r.openai(key="wrong").responses.create(model="any", input="hi")
        with pytest.raises(openai.BadRequestError, match="previous_response_id"):
            await r.openai().responses.create(model="any", input="hi", previous_response_id="x")
        with pytest.raises(openai.BadRequestError, match="web_search"):
            await r.openai().responses.create(
                model="any", input="hi", tools=[{"type": "web_search"}]
            )
        with pytest.raises(openai.NotFoundError, match="unknown rollout"):
            await r.openai("nope").responses.create(model="any", input="hi")
        with pytest.raises(openai.RateLimitError, match="slow down"):
            await r.openai().responses.create(model="any", input="hi")
        with pytest.raises(openai.RateLimitError, match="slow down"):
            await r.openai().responses.create(model="any", input="hi", stream=True)
        assert [call.status_code for call in await r.calls(2)] == [429, 429]


# -- the Messages API --------------------------------------------------------------------


async def test_messages_tool_use_round_trip_records_tokens():
    async with rig(scripted(*ADD_SCRIPT)) as r:
        client = r.anthropic()
        first = await client.messages.create(
            model="claude-any",
            max_tokens=128,
            system="You add numbers.",
            messages=[{"role": "user", "content": "What is 2 + 3?"}],
            tools=[ADD_TOOL_MESSAGES],
            tool_choice={"type": "any"},
            stop_sequences=["###"],
            extra_body={"temperature": 0.5, "top_p": 0.9},
        )
        assert first.stop_reason == "tool_use" and first.role == "assistant"
        (use,) = first.content
        assert use.type == "tool_use" and use.input == {"a": 2, "b": 3} and use.id == "call_add"
        sent = r.upstream_body()
        assert sent["messages"][0] == {"role": "system", "content": "You add numbers."}
        assert sent["tools"][0]["function"]["parameters"] == ADD_TOOL_MESSAGES["input_schema"]
        assert (sent["tool_choice"], sent["stop"], sent["max_tokens"]) == ("required", ["###"], 128)
        assert (sent["temperature"], sent["top_p"]) == (0.5, 0.9)
        second = await client.messages.create(
            model="claude-any",
            max_tokens=128,
            messages=[
                {"role": "user", "content": "What is 2 + 3?"},
                {"role": "assistant", "content": [use.model_dump(exclude_none=True)]},
                {
                    "role": "user",
                    "content": [
                        {"type": "tool_result", "tool_use_id": use.id, "content": "5"},
                        {"type": "text", "text": "Go on."},
                    ],
                },
            ],
            tools=[ADD_TOOL_MESSAGES],
        )
        assert second.stop_reason == "end_turn"
        assert second.content[0].type == "text" and second.content[0].text == "The sum is 5."
        assert second.usage.output_tokens == len("The sum is 5.")
        messages = r.upstream_body()["messages"]
        assert messages[1]["tool_calls"][0]["function"] == {
            "name": "add",
            "arguments": json.dumps({"a": 2, "b": 3}),
        }
        assert messages[2] == {"role": "tool", "tool_call_id": "call_add", "content": "5"}
        assert messages[3] == {"role": "user", "content": "Go on."}
        assert_tokens(await r.call(0), '{"name": "add"')
        assert_tokens(await r.call(1), "The sum is 5.")


async def test_messages_stream_emits_the_event_sequence_and_records_tokens():
    async with rig(scripted("Streaming works fine.", *ADD_SCRIPT)) as r:
        client = r.anthropic()
        async with client.messages.stream(
            model="claude-any", max_tokens=64, messages=[{"role": "user", "content": "go"}]
        ) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_message()
        raw = [k for k in kinds if k not in ("text",)]
        assert raw[0] == "message_start" and raw[1] == "content_block_start"
        assert raw[-3:] == ["content_block_stop", "message_delta", "message_stop"]
        assert final.content[0].type == "text"
        assert final.content[0].text == "Streaming works fine."
        assert final.stop_reason == "end_turn"
        assert final.usage.output_tokens == len("Streaming works fine.")
        assert_tokens(await r.call(0), "Streaming works fine.")
        async with client.messages.stream(
            model="claude-any",
            max_tokens=64,
            messages=[
                {"role": "user", "content": "go"},
                {"role": "assistant", "content": "Streaming works fine."},
                {"role": "user", "content": "add"},
            ],
            tools=[ADD_TOOL_MESSAGES],
        ) as stream:
            final = await stream.get_final_message()
        assert final.stop_reason == "tool_use"
        (use,) = final.content
        assert use.type == "tool_use" and use.name == "add" and use.input == {"a": 2, "b": 3}
        assert_tokens(await r.call(1), '{"name": "add"')


async def test_messages_auth_by_x_api_key_or_bearer_and_errors_in_the_anthropic_shape():
    async with rig(scripted("ok", on_exhausted="repeat_last")) as r:
        url = r.base() + "/v1/messages"
        body = {"model": "c", "max_tokens": 8, "messages": [{"role": "user", "content": "hi"}]}
        async with httpx.AsyncClient(timeout=20) as http:
            by_key = await http.post(url, json=body, headers={"x-api-key": r.proxy.token})
            bearer = {"authorization": f"Bearer {r.proxy.token}"}
            by_bearer = await http.post(r.base() + "/messages", json=body, headers=bearer)
            wrong = await http.post(url, json=body, headers={"x-api-key": "wrong"})
            no_max = await http.post(url, json={**body, "max_tokens": None}, headers=bearer)
            server_tool = {**body, "tools": [{"type": "web_search_20250305", "name": "web"}]}
            refused = await http.post(url, json=server_tool, headers=bearer)
            not_json = await http.post(url, content=b"{", headers=bearer)
            models = await http.get(r.base() + "/v1/models", headers={"x-api-key": r.proxy.token})
        assert by_key.status_code == by_bearer.status_code == 200
        assert by_key.json()["content"] == [{"type": "text", "text": "ok"}]
        assert wrong.status_code == 401
        assert wrong.json() == {
            "type": "error",
            "error": {"type": "authentication_error", "message": wrong.json()["error"]["message"]},
        }
        for answer, needle in ((no_max, "max_tokens"), (refused, "web_search_20250305")):
            assert answer.status_code == 400
            assert answer.json()["error"]["type"] == "invalid_request_error"
            assert needle in answer.json()["error"]["message"]
        assert not_json.status_code == 400 and not_json.json()["type"] == "error"
        assert models.status_code == 200 and models.json()["data"][0]["id"] == POLICY
        assert len(await r.calls(2)) == 2  # refused requests never reach the sampler
        with pytest.raises(anthropic.AuthenticationError):
            await r.anthropic(key="wrong").messages.create(
                model="c", max_tokens=8, messages=[{"role": "user", "content": "hi"}]
            )


async def test_messages_upstream_errors_are_relayed_in_the_anthropic_shape():
    model = scripted(ScriptedTurn(status_code=429, error="slow down"), on_exhausted="repeat_last")
    async with rig(model) as r:
        for stream in (False, True):
            with pytest.raises(anthropic.RateLimitError, match="slow down"):
                await r.anthropic().messages.create(
                    model="c",
                    max_tokens=8,
                    messages=[{"role": "user", "content": "hi"}],
                    stream=stream,
                )
        assert [call.status_code for call in await r.calls(2)] == [429, 429]


async def test_messages_count_tokens_answers_an_estimate_without_a_model_call():
    """An OpenAI-compatible upstream has no tokenizer here: the proxy estimates, checks the
    rollout's key like any call, and records nothing."""
    async with rig(scripted("ok")) as r:
        messages: list[Any] = [
            {"role": "user", "content": "a" * 40},
            {"role": "assistant", "content": [{"type": "text", "text": "b" * 8}]},
            {"role": "user", "content": "c" * 3},
        ]
        counted = await r.anthropic().messages.count_tokens(
            model="c", system="s" * 12, messages=messages, tools=[ADD_TOOL_MESSAGES]
        )
        chat = MessagesDialect().counting_chat(
            {"system": "s" * 12, "messages": messages, "tools": [ADD_TOOL_MESSAGES]}
        )
        assert counted.input_tokens == estimate_tokens(chat) > 16 + (40 + 8 + 3 + 12) // 4
        plain = await r.anthropic().messages.count_tokens(
            model="c", messages=[{"role": "user", "content": "12345678"}]
        )
        assert plain.input_tokens == 2 + 4
        with pytest.raises(anthropic.AuthenticationError):
            await r.anthropic(key="wrong").messages.count_tokens(model="c", messages=messages)
        with pytest.raises(anthropic.NotFoundError, match="unknown rollout"):
            await r.anthropic(rollout="r9").messages.count_tokens(model="c", messages=messages)
        with pytest.raises(anthropic.BadRequestError, match="web_search"):
            await r.anthropic().messages.count_tokens(
                model="c",
                messages=messages,
                tools=[{"type": "web_search_20250305", "name": "web_search"}],
            )
        async with httpx.AsyncClient(timeout=20) as http:
            url = r.base() + "/messages/count_tokens"  # without /v1, as for /messages
            key = {"x-api-key": r.proxy.token}
            bare = await http.post(url, json={"messages": messages}, headers=key)
            wrong_method = await http.get(url, headers=key)
        # 51 characters (4 a token, rounded up) and 3 messages (4 tokens each)
        assert bare.status_code == 200 and bare.json() == {"input_tokens": 13 + 12}
        assert wrong_method.status_code == 405 and wrong_method.json()["type"] == "error"
        assert r.proxy.calls("r1") == [] and r.model.requests == []


# -- the scripted model speaks both APIs on its own ---------------------------------------


async def test_scripted_model_answers_responses_and_messages_clients_directly():
    model = ScriptedModelServer(
        scripts={"add please": ADD_SCRIPT}, record_requests=True, api_key="sk-test"
    )
    async with model:
        oa = openai.AsyncOpenAI(base_url=model.base_url, api_key="sk-test", max_retries=0)
        first = await oa.responses.create(model="m", input="add please", tools=[ADD_TOOL_RESPONSES])
        assert first.output[0].type == "function_call"
        an = anthropic.AsyncAnthropic(base_url=model.url, api_key="sk-test", max_retries=0)
        async with an.messages.stream(
            model="m",
            max_tokens=64,
            messages=[
                {"role": "user", "content": "add please"},
                {
                    "role": "assistant",
                    "content": [{"type": "tool_use", "id": "t1", "name": "add", "input": {}}],
                },
                {
                    "role": "user",
                    "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "5"}],
                },
            ],
        ) as stream:
            final = await stream.get_final_message()
        assert final.content[0].type == "text" and final.content[0].text == "The sum is 5."
        assert [request.path for request in model.requests] == ["/v1/responses", "/v1/messages"]
        assert model.requests[1].body["max_tokens"] == 64  # recorded as the client sent it
        # token counting: the fake prompt tokens a call with the same messages reports
        asked = [{"role": "user", "content": "add please"}]
        counted = await an.messages.count_tokens(model="m", system="be brief", messages=asked)
        answered = await an.messages.create(
            model="m", max_tokens=8, system="be brief", messages=asked
        )
        assert counted.input_tokens == answered.usage.input_tokens > 0
        assert len(model.requests) == 3  # the count is not a model call
        with pytest.raises(anthropic.AuthenticationError):
            await anthropic.AsyncAnthropic(
                base_url=model.url, api_key="wrong", max_retries=0
            ).messages.count_tokens(model="m", messages=asked)
        with pytest.raises(anthropic.AuthenticationError):
            await anthropic.AsyncAnthropic(
                base_url=model.url, api_key="wrong", max_retries=0
            ).messages.create(model="m", max_tokens=8, messages=[{"role": "user", "content": "x"}])


# -- the mapping in detail ---------------------------------------------------------------


async def test_responses_items_roles_parts_and_formats_map_onto_chat():
    model = scripted(ScriptedTurn(content="cut", finish_reason="length"))
    async with rig(model) as r:
        answer = await r.openai().responses.create(
            model="any",
            input=[
                {"role": "developer", "content": "Answer in JSON."},
                {"type": "reasoning", "id": "rs_1", "summary": []},
                {
                    "type": "message",
                    "role": "user",
                    "content": [
                        {"type": "input_text", "text": "Describe "},
                        {"type": "input_image", "image_url": "data:image/png;base64,AAAA"},
                    ],
                },
            ],
            text={"format": {"type": "json_schema", "name": "out", "schema": {"type": "object"}}},
            tool_choice={"type": "function", "name": "add"},
            tools=[ADD_TOOL_RESPONSES],
            parallel_tool_calls=False,
            max_output_tokens=3,
        )
        assert answer.status == "incomplete"
        assert answer.incomplete_details is not None
        assert answer.incomplete_details.reason == "max_output_tokens"
        sent = r.upstream_body()
        assert sent["messages"] == [
            {"role": "system", "content": "Answer in JSON."},  # developer; reasoning skipped
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Describe "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
        ]
        assert sent["response_format"] == {
            "type": "json_schema",
            "json_schema": {"name": "out", "schema": {"type": "object"}},
        }
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "add"}}
        assert (sent["parallel_tool_calls"], sent["max_tokens"]) == (False, 3)


async def test_messages_blocks_and_choices_map_onto_chat():
    model = scripted(
        ScriptedTurn(content="cut", finish_reason="length"), on_exhausted="repeat_last"
    )
    async with rig(model) as r:
        answer = await r.anthropic().messages.create(
            model="c",
            max_tokens=3,
            system=[{"type": "text", "text": "Be exact."}],
            messages=[
                {
                    "role": "user",
                    "content": [
                        {"type": "text", "text": "Look: "},
                        {
                            "type": "image",
                            "source": {"type": "base64", "media_type": "image/png", "data": "AAAA"},
                        },
                    ],
                },
                {
                    "role": "assistant",
                    "content": [
                        {"type": "thinking", "thinking": "hm", "signature": "s"},
                        {"type": "text", "text": "Adding."},
                        {"type": "tool_use", "id": "t1", "name": "add", "input": {"a": 1}},
                    ],
                },
                {
                    "role": "user",
                    "content": [
                        {
                            "type": "tool_result",
                            "tool_use_id": "t1",
                            "content": [{"type": "text", "text": "1"}],
                            "is_error": False,
                        }
                    ],
                },
            ],
            tools=[ADD_TOOL_MESSAGES],
            tool_choice={"type": "tool", "name": "add", "disable_parallel_tool_use": True},
        )
        assert answer.stop_reason == "max_tokens"
        sent = r.upstream_body()
        assert sent["messages"] == [
            {"role": "system", "content": "Be exact."},
            {
                "role": "user",
                "content": [
                    {"type": "text", "text": "Look: "},
                    {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
                ],
            },
            {
                "role": "assistant",
                "content": "Adding.",  # the thinking block is skipped
                "tool_calls": [
                    {
                        "id": "t1",
                        "type": "function",
                        "function": {"name": "add", "arguments": json.dumps({"a": 1})},
                    }
                ],
            },
            {"role": "tool", "tool_call_id": "t1", "content": "1"},
        ]
        assert sent["tool_choice"] == {"type": "function", "function": {"name": "add"}}
        assert sent["parallel_tool_calls"] is False


async def test_messages_system_messages_inside_the_conversation_map_onto_chat_system():
    # Claude Code sends extra context as a system-role message after the user's first one.
    async with rig(scripted("ok")) as r:
        answer = await r.anthropic().messages.create(
            model="c",
            max_tokens=8,
            messages=[
                {"role": "user", "content": "Hi."},
                {"role": "system", "content": "Agents: none."},  # type: ignore[list-item]
                {"role": "system", "content": [{"type": "text", "text": "Tools: Bash."}]},  # type: ignore[list-item]
            ],
        )
        assert answer.content[0].text == "ok"  # type: ignore[union-attr]
        assert r.upstream_body()["messages"] == [
            {"role": "user", "content": "Hi."},
            {"role": "system", "content": "Agents: none."},
            {"role": "system", "content": "Tools: Bash."},
        ]
        assert_tokens(await r.call(0), "ok")


class CrashingUpstream:
    """A chat upstream whose stream breaks after two chunks."""

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] != "http":
            return
        await receive()
        head = {"id": "c", "object": "chat.completion.chunk", "created": 0, "model": POLICY}
        chunks = [
            {**head, "choices": [{"index": 0, "delta": {"role": "assistant", "content": ""}}]},
            {**head, "choices": [{"index": 0, "delta": {"content": "partial"}}]},
        ]
        await send(
            {
                "type": "http.response.start",
                "status": 200,
                "headers": [(b"content-type", b"text/event-stream")],
            }
        )
        for chunk in chunks:
            event = b"data: " + json.dumps(chunk).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": event, "more_body": True})
        raise RuntimeError("upstream crashed mid-stream")


def named_events(text: str) -> list[tuple[str, dict[str, Any]]]:
    events = []
    for block in text.split("\n\n"):
        lines = block.split("\n")
        if len(lines) == 2 and lines[0].startswith("event: "):
            events.append((lines[0][7:], json.loads(lines[1].removeprefix("data: "))))
    return events


async def test_a_stream_that_breaks_ends_with_the_apis_own_error_event():
    async with contextlib.AsyncExitStack() as stack:
        origin = await stack.enter_async_context(
            serve_in_task(CrashingUpstream(), log_level="critical")
        )
        upstream = OpenAICompatibleUpstream(origin + "/v1", None, POLICY, timeout=20)
        stack.push_async_callback(upstream.aclose)
        proxy = PolicyProxy(upstream)
        proxy.register("r1")
        base = proxy.chat_base_url("r1", await stack.enter_async_context(serve_in_task(proxy)))
        http = await stack.enter_async_context(
            httpx.AsyncClient(headers={"x-api-key": proxy.token}, timeout=20)
        )
        responses = await http.post(
            base + "/responses", json={"model": "m", "input": "hi", "stream": True}
        )
        messages = await http.post(
            base + "/v1/messages",
            json={
                "model": "m",
                "max_tokens": 8,
                "stream": True,
                "messages": [{"role": "user", "content": "hi"}],
            },
        )
    events = named_events(responses.text)
    assert events[0][0] == "response.created"
    assert next(e for e in events if e[0] == "response.output_text.delta")[1]["delta"] == "partial"
    kind, error = events[-1]
    assert kind == "error" and error["type"] == "error" and "mid-stream" in error["message"]
    assert error["sequence_number"] == len(events) - 1
    events = named_events(messages.text)
    assert events[0][0] == "message_start"
    assert events[-1] == ("error", {"type": "error", "error": events[-1][1]["error"]})
    assert events[-1][1]["error"]["type"] == "api_error"
    assert "mid-stream" in events[-1][1]["error"]["message"]
    assert [call.status_code for call in proxy.calls("r1")] == [502, 502]


STREAM_REQUESTS = {
    "responses": {"model": "m", "input": "hi", "tools": [ADD_TOOL_RESPONSES], "stream": True},
    "messages": {
        "model": "m",
        "max_tokens": 64,
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [ADD_TOOL_MESSAGES],
        "stream": True,
    },
}


@pytest.mark.parametrize("name", sorted(STREAM_REQUESTS))
def test_a_batch_of_chunks_is_written_as_its_chunks_one_by_one_would_be(name: str):
    dialect = DIALECTS[name]
    asked = STREAM_REQUESTS[name]
    chat = dialect.to_chat(asked)
    turn = ScriptedTurn(
        content='Adding "é" \U0001f600 and\n', tool_calls=[ToolCall("add", {"a": 2, "b": 3})]
    )
    chunks = ScriptedReply(chat, chat["messages"], turn, 1).chunks()
    assert len(chunks) > 5
    one_by_one = dialect.writer(asked)
    together = dialect.writer(asked)
    single = b"".join(one_by_one.feed(chunk) for chunk in chunks) + one_by_one.end()
    batched = together.feed_all(chunks[:2]) + together.feed_all(chunks[2:]) + together.end()

    def fixed(events: bytes) -> str:  # the random ids and the clock
        text = re.sub(r"\b(resp|msg|fc|call)_[0-9a-f]{24}\b", r"\1_id", events.decode())
        return re.sub(r'"created_at":\d+', '"created_at":0', text)

    assert fixed(batched) == fixed(single)
    events = named_events(single.decode())
    assert len(events) == single.count(b"\n\n") > len(chunks)
    if name == "responses":
        assert [event["sequence_number"] for _, event in events] == list(range(len(events)))
        assert events[-1][0] == "response.completed"
        assert events[-1][1]["response"]["tools"] == [ADD_TOOL_RESPONSES]
    else:
        assert events[-1][0] == "message_stop"
