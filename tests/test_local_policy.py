"""The local policy on the tiny model: sampling, token data, weight updates, HTTP, proxy."""

from __future__ import annotations

import concurrent.futures
import json
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

torch = pytest.importorskip("torch", reason="torch not installed (extra train)")
pytest.importorskip("transformers", reason="transformers not installed (extra train)")

from safetensors.torch import save  # noqa: E402

from osmosis_ai.controller import PolicyProxy, UpstreamRequestError  # noqa: E402
from osmosis_ai.controller.policy import (  # noqa: E402
    LocalPolicy,
    LocalPolicyUpstream,
    PolicyRequestError,
    Sample,
    SamplingParams,
    create_policy_app,
)
from osmosis_ai.controller.policy.responses import Renderer  # noqa: E402
from osmosis_ai.errors import ConfigError, UsageError  # noqa: E402
from osmosis_ai.testing.serving import ServerThread, serve_in_task  # noqa: E402
from osmosis_ai.train.tiny_model import build_tiny_model  # noqa: E402

USER = [{"role": "user", "content": "Copy: 7"}]
LAYER = "model.norm.weight"  # zeroed, every logit is 0: greedy picks token 0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("policy") / "tiny")


@pytest.fixture(scope="module")
def policy(model_dir: Path) -> LocalPolicy:
    return LocalPolicy(model_dir, seed=0)


@pytest.fixture
def fresh(model_dir: Path) -> LocalPolicy:
    """A policy of its own, for tests that change weights."""
    return LocalPolicy(model_dir, seed=0)


def chat(policy: LocalPolicy, **body: Any) -> dict[str, Any]:
    return policy.chat({"messages": USER, **body})


def tokens(answer: dict[str, Any]) -> list[list[int]]:
    return [choice["token_ids"] for choice in answer["choices"]]


# -- sampling ------------------------------------------------------------------------------


def test_temperature_zero_is_greedy_and_deterministic(policy: LocalPolicy):
    first = chat(policy, temperature=0, max_tokens=12)
    assert tokens(first) == tokens(chat(policy, temperature=0, max_tokens=12))
    # a nucleus of one token is greedy too
    assert tokens(chat(policy, temperature=1.0, top_p=1e-9, max_tokens=12)) == tokens(first)


def test_seed_reproduces_samples(policy: LocalPolicy):
    a = chat(policy, temperature=1.0, seed=7, n=3, max_tokens=16)
    b = chat(policy, temperature=1.0, seed=7, n=3, max_tokens=16)
    c = chat(policy, temperature=1.0, seed=8, n=3, max_tokens=16)
    assert tokens(a) == tokens(b)
    assert tokens(a) != tokens(c)
    assert len(set(map(tuple, tokens(a)))) == 3  # the n samples differ from each other


def test_max_tokens_ends_with_length_and_never_empty(policy: LocalPolicy):
    answer = chat(policy, max_tokens=5, seed=1)
    choice = answer["choices"][0]
    assert choice["finish_reason"] == "length" and len(choice["token_ids"]) == 5
    one = chat(policy, max_completion_tokens=1, seed=1)["choices"][0]
    assert len(one["token_ids"]) == 1 and one["finish_reason"] == "length"
    assert answer["usage"] == {"prompt_tokens": 15, "completion_tokens": 5, "total_tokens": 20}


def test_stop_string_ends_the_sample_and_is_cut(policy: LocalPolicy):
    full = chat(policy, seed=3, max_tokens=32)["choices"][0]
    text = full["message"]["content"]
    stop = next(ch for ch in text[1:] if ch.isascii() and ch.isprintable())
    cut = chat(policy, seed=3, max_tokens=32, stop=[stop, "never-seen"])["choices"][0]
    assert cut["finish_reason"] == "stop"
    assert cut["message"]["content"] == text[: text.index(stop, 1)]
    assert full["token_ids"][: len(cut["token_ids"])] == cut["token_ids"]
    assert policy.decode(cut["token_ids"]).endswith(stop)


def test_token_ids_match_the_tokenizer(policy: LocalPolicy):
    answer = chat(policy, max_tokens=10, seed=2)
    rendered = policy.tokenizer.apply_chat_template(
        USER, tokenize=False, add_generation_prompt=True
    )
    expected = policy.tokenizer(rendered, add_special_tokens=False).input_ids
    assert answer["prompt_token_ids"] == expected
    choice = answer["choices"][0]
    assert choice["prompt_token_ids"] == expected
    decoded = policy.tokenizer.decode(choice["token_ids"], skip_special_tokens=True)
    assert decoded == choice["message"]["content"]


def test_logprobs_are_those_of_the_sampling_distribution(policy: LocalPolicy):
    answer = chat(policy, temperature=0.7, n=2, max_tokens=8, seed=4, logprobs=True, top_logprobs=3)
    for choice in answer["choices"]:
        ids = choice["token_ids"]
        entries = choice["logprobs"]["content"]
        assert len(entries) == len(ids) >= 1
        assert all(e["logprob"] <= 0 for e in entries)
        assert all(len(e["top_logprobs"]) == 3 for e in entries)
        assert all(
            e["bytes"] == list(policy.token_bytes(t)) for e, t in zip(entries, ids, strict=True)
        )
        # recompute with one forward pass over prompt + completion
        full = torch.tensor([answer["prompt_token_ids"] + ids])
        with torch.no_grad():
            logits = policy.model(full).logits[0, len(answer["prompt_token_ids"]) - 1 : -1]
        expected = torch.log_softmax(logits / 0.7, -1)[torch.arange(len(ids)), torch.tensor(ids)]
        assert [e["logprob"] for e in entries] == pytest.approx(expected.tolist(), abs=1e-4)
        best = entries[0]["top_logprobs"][0]["logprob"]
        assert best == pytest.approx(torch.log_softmax(logits[0] / 0.7, -1).max().item(), abs=1e-4)


def test_concurrent_requests_batch_to_the_same_answers(policy: LocalPolicy):
    prompts = ["a", "a much longer prompt than the first", "mid length", "b"]
    bodies = [
        {"messages": [{"role": "user", "content": p}], "temperature": 0, "max_tokens": 8}
        for p in prompts
    ]
    alone = [tokens(policy.chat(body)) for body in bodies]
    together: list[Any] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def call(i: int) -> None:
        barrier.wait()
        together[i] = tokens(policy.chat(bodies[i]))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(bodies))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert together == alone


def test_expected_callers_wait_for_each_other_and_never_hang(fresh: LocalPolicy):
    body = {"messages": USER, "temperature": 0, "max_tokens": 4}
    alone = tokens(fresh.chat(dict(body)))
    fresh.batch_linger_s = 2.0  # arrivals 50 ms apart still join one batch
    fresh.expect_callers(3)
    before = fresh.batches
    answers: list[Any] = [None] * 3

    def call(i: int) -> None:
        time.sleep(0.05 * i)
        answers[i] = tokens(fresh.chat(dict(body)))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert fresh.batches - before == 1
    assert answers == [alone] * 3
    # A caller that never asks costs the linger, not a hang: the lone request still runs,
    # in a batch of its own, though three callers are still expected.
    fresh.batch_linger_s = 0.05
    before = fresh.batches
    lone = concurrent.futures.ThreadPoolExecutor(1)
    started = time.monotonic()
    answer = lone.submit(lambda: tokens(fresh.chat(dict(body))))
    try:
        concurrent.futures.wait([answer], timeout=60)  # a guard against a hang, not a bound
        assert answer.done(), "a lone caller hung waiting for callers that never came"
        assert answer.result() == alone
    finally:
        fresh.expect_callers(0)  # frees a hung caller, so a failure ends cleanly
        lone.shutdown()
    assert time.monotonic() - started >= fresh.batch_linger_s  # it did wait for the others
    assert fresh.batches - before == 1


def test_a_held_policy_queues_requests_and_serves_them_with_the_weights_of_release(
    fresh: LocalPolicy,
):
    body = {"messages": USER, "temperature": 0, "max_tokens": 4}
    before = fresh.batches
    fresh.hold(True)
    answers: list[Any] = [None] * 2

    def call(i: int) -> None:
        answers[i] = fresh.chat(dict(body))

    threads = [threading.Thread(target=call, args=(i,)) for i in range(2)]
    for thread in threads:
        thread.start()
    time.sleep(0.3)  # far past the batch linger: only the hold keeps them waiting
    assert fresh.batches == before and answers == [None, None]
    with fresh.updating(7):
        pass  # the trainer's update lands while they wait
    assert fresh.batches == before
    fresh.hold(False)
    for thread in threads:
        thread.join(timeout=30)
    assert fresh.batches - before == 1  # released together: one batch
    assert [a["policy_version"] for a in answers] == [7, 7]


def test_submitted_chats_reply_from_the_engine_then_flush_once_per_batch(fresh: LocalPolicy):
    body = {"messages": USER, "temperature": 0, "max_tokens": 3}
    expected = fresh.chat(dict(body))
    replies: list[tuple[Any, BaseException | None]] = []
    flushed: list[int] = []
    done = threading.Event()

    def reply(answer: Any, error: BaseException | None) -> None:
        replies.append((answer, error))

    def flush() -> None:
        flushed.append(len(replies))  # every reply of the batch is in before the flush
        done.set()

    fresh.hold(True)
    fresh.submit_chat(dict(body), reply, flush=flush)
    fresh.submit_chat({**body, "stream": True}, reply, chunks=True, flush=flush)
    assert replies == []  # queued: the caller's thread returned at once
    fresh.hold(False)
    assert done.wait(30)
    assert flushed == [2]  # both in one batch, one flush
    (answer, error), (chunks, chunk_error) = replies
    assert error is None and chunk_error is None
    assert answer["choices"][0]["token_ids"] == expected["choices"][0]["token_ids"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"
    with pytest.raises(PolicyRequestError, match="top_p"):  # refused before it is queued
        fresh.submit_chat({**body, "top_p": 2.0}, reply, flush=flush)


def test_samples_sharing_a_prompt_match_their_separate_decodes(policy: LocalPolicy):
    # Rows with one prompt share its prefill (its cache is copied): the same tokens and
    # logprobs as decoding each prompt on its own.
    prompts = [policy.encode(policy.render([{"role": "user", "content": p}])) for p in "ab"]
    params = SamplingParams(temperature=0, max_tokens=6, n=3, logprobs=True)
    _version, together = policy.generate([prompts[0], prompts[1], prompts[0]], params)
    single = SamplingParams(temperature=0, max_tokens=6, logprobs=True)
    for i, prompt in enumerate([prompts[0], prompts[1], prompts[0]]):
        _version, (alone,) = policy.generate([prompt], single)
        for sample in together[3 * i : 3 * i + 3]:
            assert sample.token_ids == alone.token_ids
            assert sample.logprobs == pytest.approx(alone.logprobs, abs=1e-4)


def test_text_completions_take_text_or_token_ids(policy: LocalPolicy):
    answer = policy.complete({"prompt": ["ab", [97, 98]], "n": 2, "max_tokens": 4, "logprobs": 0})
    assert len(answer["choices"]) == 4
    assert [c["prompt_token_ids"] for c in answer["choices"]] == [[97, 98]] * 4
    for choice in answer["choices"]:
        assert len(choice["token_ids"]) == len(choice["logprobs"]["token_logprobs"]) == 4
        assert choice["text"] == policy.decode(choice["token_ids"])


def test_tool_calls_in_messages_render(policy: LocalPolicy):
    messages = [
        *USER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "7"}]},
    ]
    tools = [{"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}]
    answer = policy.chat({"messages": messages, "tools": tools, "max_tokens": 2})
    prompt = policy.decode(answer["prompt_token_ids"])
    assert '<tool_call>\n{"name": "f", "arguments": {}}\n</tool_call>' in prompt
    assert "tool\n7" in prompt and "<tools>" in prompt


def test_bad_requests_name_the_parameter(policy: LocalPolicy):
    for body, param in [
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"n": 0}, "n"),
        ({"max_tokens": 0}, "max_tokens"),
        ({"stop": [1]}, "stop"),
        ({"messages": []}, "messages"),
    ]:
        with pytest.raises(PolicyRequestError) as caught:
            policy.chat({"messages": USER, **body})
        assert caught.value.param == param
    small = LocalPolicy.from_model(policy.model, policy.tokenizer, max_model_len=10)
    with pytest.raises(PolicyRequestError, match="max_model_len is 10"):
        small.chat({"messages": USER})
    # a budget past the context is cut to what fits
    assert (
        len(
            LocalPolicy.from_model(policy.model, policy.tokenizer, max_model_len=17).chat(
                {"messages": USER, "max_tokens": 50, "temperature": 0}
            )["choices"][0]["token_ids"]
        )
        == 2
    )


def byte_tokens(token_id: int) -> bytes:
    return bytes([token_id]) if token_id < 256 else b"<|im_end|>"


def test_tool_call_completions_become_openai_tool_calls():
    text = 'Sure é.\n<tool_call>\n{"name": "add", "arguments": {"a": 1}}\n</tool_call>'
    ids = [*text.encode(), 259]
    sample = Sample(ids, [-0.5] * len(ids), "stop", text)
    renderer = Renderer(model="m", prompt_ids=[[1, 2]], version=3, token_bytes=byte_tokens)
    choice = renderer.chat([sample], SamplingParams())["choices"][0]
    assert choice["finish_reason"] == "tool_calls" and choice["policy_version"] == 3
    assert choice["message"]["content"] == "Sure é."
    [call] = choice["message"]["tool_calls"]
    assert call["function"] == {"name": "add", "arguments": '{"a": 1}'}
    assert call["type"] == "function" and call["id"].startswith("call_")
    chunks = renderer.chat_chunks([sample], SamplingParams(logprobs=True), include_usage=True)
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    pieces = [d["content"] for d in deltas if d.get("content")]
    assert "".join(pieces) == "Sure é." and "é" in pieces  # never half a character
    assert [d["tool_calls"][0]["function"]["name"] for d in deltas if "tool_calls" in d] == ["add"]
    assert [t for c in chunks if c["choices"] for t in c["choices"][0].get("token_ids", [])] == ids
    assert chunks[-2]["choices"][0]["finish_reason"] == "tool_calls"
    assert chunks[-1]["usage"]["completion_tokens"] == len(ids)
    # a malformed call stays content
    broken = Sample([60], [-1.0], "stop", "<tool_call>{not json}</tool_call>")
    message = renderer.chat([broken], SamplingParams())["choices"][0]
    assert message["message"] == {"role": "assistant", "content": broken.text}
    assert message["finish_reason"] == "stop"


# -- weights -------------------------------------------------------------------------------


def test_weight_update_changes_outputs_and_version(fresh: LocalPolicy):
    before = chat(fresh, temperature=0, max_tokens=8)
    assert before["policy_version"] == 0
    zero = torch.zeros_like(fresh.model.state_dict()[LAYER])
    assert fresh.load_state_dict({LAYER: zero}) == 1
    after = chat(fresh, temperature=0, max_tokens=8)
    assert tokens(after) != tokens(before)
    assert after["policy_version"] == 1 and after["choices"][0]["policy_version"] == 1
    assert fresh.update_weights([(LAYER, zero)], version=41) == 41
    assert fresh.version == 41 and fresh.health()["policy_version"] == 41


def test_weight_update_rejects_unknown_names_and_shapes(fresh: LocalPolicy):
    with pytest.raises(UsageError, match="'nope' is not in the policy model"):
        fresh.load_state_dict({"nope": torch.zeros(1)})
    with pytest.raises(UsageError, match="has shape"):
        fresh.load_state_dict({LAYER: torch.zeros(3)})
    with pytest.raises(UsageError, match="version=-1"):
        fresh.load_state_dict({LAYER: torch.zeros(128)}, version=-1)
    assert fresh.model.state_dict()[LAYER].abs().sum() > 0  # nothing was copied
    assert fresh.version == 0


def test_shared_weights_update_in_place(fresh: LocalPolicy):
    shared = LocalPolicy.from_model(fresh.model, fresh.tokenizer, name="shared")
    before = tokens(shared.chat({"messages": USER, "temperature": 0, "max_tokens": 6}))
    with shared.updating(), torch.no_grad():
        fresh.model.get_parameter(LAYER).mul_(0)
    answer = shared.chat({"messages": USER, "temperature": 0, "max_tokens": 6})
    assert tokens(answer) != before and answer["policy_version"] == 1


# -- HTTP ----------------------------------------------------------------------------------


def test_http_app_serves_chat_stream_completions_and_weights(fresh: LocalPolicy):
    with (
        ServerThread(create_policy_app(fresh)) as server,
        httpx.Client(base_url=server.url) as http,
    ):
        health = http.get("/health").json()
        assert health == {
            "status": "ok",
            "policy_version": 0,
            "model_dir": fresh.name,
            "device": "cpu",
        }
        assert http.get("/v1/models").json()["data"][0]["id"] == fresh.name
        body = {"messages": USER, "temperature": 0, "max_tokens": 6, "logprobs": True}
        answer = http.post("/v1/chat/completions", json=body).json()
        assert len(answer["choices"][0]["logprobs"]["content"]) == 6
        streamed = http.post("/v1/chat/completions", json={**body, "stream": True})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        payloads = [line[6:] for line in streamed.text.split("\n\n") if line.startswith("data: ")]
        assert payloads[-1] == "[DONE]"
        chunks = [json.loads(p) for p in payloads[:-1]]
        content = "".join(c["choices"][0]["delta"].get("content", "") for c in chunks)
        ids = [t for c in chunks for t in c["choices"][0].get("token_ids", [])]
        assert content == answer["choices"][0]["message"]["content"]
        assert ids == answer["choices"][0]["token_ids"]
        assert chunks[0]["prompt_token_ids"] == answer["prompt_token_ids"]
        text = http.post("/v1/completions", json={"prompt": [97], "max_tokens": 3}).json()
        assert len(text["choices"][0]["token_ids"]) == 3
        # weights: raw safetensors body, version bump, then an explicit version
        zero = {LAYER: torch.zeros_like(fresh.model.state_dict()[LAYER])}
        pushed = http.post("/weights", content=save(zero))
        assert pushed.json() == {"policy_version": 1}
        assert http.get("/health").json()["policy_version"] == 1
        changed = http.post("/v1/chat/completions", json=body).json()
        assert changed["policy_version"] == 1 and tokens(changed) != tokens(answer)
        assert http.post("/weights?version=9", content=save(zero)).json()["policy_version"] == 9
        # errors
        assert http.post("/weights", content=b"not safetensors").status_code == 400
        bad = http.post("/v1/chat/completions", json={**body, "temperature": -1})
        assert bad.status_code == 400 and "temperature" in bad.json()["error"]["message"]
        assert http.post("/v1/chat/completions", content=b"{").status_code == 400
        assert http.get("/v1/chat/completions").status_code == 405
        assert http.get("/nope").status_code == 404


async def test_proxy_records_token_ids_and_logprobs(policy: LocalPolicy):
    proxy = PolicyProxy(LocalPolicyUpstream(policy), token="t", request_token_data=True)
    proxy.register("r1")
    headers = {"authorization": "Bearer t"}
    async with serve_in_task(proxy) as base, httpx.AsyncClient(headers=headers) as http:
        url = proxy.chat_base_url("r1", base) + "/chat/completions"
        plain = await http.post(url, json={"messages": USER, "max_tokens": 5, "seed": 1})
        streamed = await http.post(
            url, json={"messages": USER, "max_tokens": 4, "seed": 1, "stream": True}
        )
        bad = await http.post(url, json={"messages": USER, "n": 0})
    assert plain.status_code == 200 and streamed.status_code == 200
    assert bad.status_code == 400 and "n=0" in bad.json()["error"]["message"]
    answer = plain.json()
    assert answer["model"] == f"local:{policy.name}"
    first, second, failed = proxy.calls("r1")
    assert first.prompt_token_ids == answer["prompt_token_ids"]
    assert first.completion_token_ids == answer["choices"][0]["token_ids"]
    assert first.logprobs is not None and len(first.logprobs) == 5
    assert first.finish_reason == "length" and first.usage is not None
    assert second.stream and second.ok
    assert second.prompt_token_ids == first.prompt_token_ids
    assert first.completion_token_ids is not None
    assert second.completion_token_ids == first.completion_token_ids[:4]  # same seed
    assert second.logprobs is not None and len(second.logprobs) == 4
    assert second.usage is not None and second.usage.completion_tokens == 4
    assert not failed.ok and failed.status_code == 400


async def test_messages_count_tokens_uses_the_policys_chat_template(policy: LocalPolicy):
    """Anthropic's token counting through the proxy counts the prompt a call samples from."""
    import anthropic

    proxy = PolicyProxy(LocalPolicyUpstream(policy), token="t", request_token_data=True)
    proxy.register("r1")
    async with serve_in_task(proxy) as base:
        client = anthropic.AsyncAnthropic(
            base_url=proxy.chat_base_url("r1", base), api_key="t", max_retries=0
        )
        asked: list[Any] = [
            {"role": "user", "content": "Copy: 7"},
            {"role": "assistant", "content": "7"},
            {"role": "user", "content": "Again: 3"},
        ]
        counted = await client.messages.count_tokens(model="m", messages=asked)
        await client.messages.create(model="m", max_tokens=2, messages=asked)
    (call,) = proxy.calls("r1")  # the count made no call
    assert call.prompt_token_ids is not None
    assert counted.input_tokens == len(call.prompt_token_ids)
    rendered = policy.encode(policy.render([dict(m) for m in asked]))
    assert counted.input_tokens == len(rendered)


async def test_upstream_maps_bad_requests_and_preflights(policy: LocalPolicy):
    upstream = LocalPolicyUpstream(policy, model="tiny")
    with pytest.raises(UpstreamRequestError) as caught:
        await upstream.complete({"messages": USER, "top_p": 2})
    assert caught.value.status_code == 400 and "top_p" in str(caught.value)
    checked = await upstream.preflight()
    assert checked.model == "tiny" and checked.target == f"local:{policy.name}"


# -- loading errors and imports ------------------------------------------------------------


def test_missing_directory_names_the_path_and_the_fix(tmp_path: Path):
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError) as caught:
        LocalPolicy(missing)
    message = str(caught.value)
    assert str(missing) in message and "python -m osmosis_ai.train.tiny_model" in message
    with pytest.raises(ConfigError, match=r"no config\.json"):
        LocalPolicy(tmp_path)


def test_missing_chat_template_names_the_file(model_dir: Path, tmp_path: Path):
    copy = Path(shutil.copytree(model_dir, tmp_path / "no-template"))
    (copy / "chat_template.jinja").unlink()
    with pytest.raises(ConfigError) as caught:
        LocalPolicy(copy)
    assert str(copy / "chat_template.jinja") in str(caught.value)


def test_controller_import_stays_free_of_torch():
    code = (
        "import sys, osmosis_ai.controller, osmosis_ai.controller.policy;"
        "from osmosis_ai.controller.policy import LocalPolicyUpstream, create_policy_app;"
        "assert 'torch' not in sys.modules and 'transformers' not in sys.modules"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    # without torch, a local model fails once, naming the extra
    code = (
        "import sys; sys.modules['torch'] = None;"
        "from osmosis_ai.controller.policy import open_local_upstream;"
        "open_local_upstream('anywhere')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], check=False, capture_output=True, text=True, timeout=60
    )
    assert "MissingExtraError" in done.stderr and "osmosis-ai[train]" in done.stderr
