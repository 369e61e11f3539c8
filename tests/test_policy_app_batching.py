"""The local policy app batches concurrent chat requests: each waits on the event loop (no
thread per request), so as many as come together can join one generation batch."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx
import pytest

pytest.importorskip("torch", reason="torch not installed (extra train)")
pytest.importorskip("transformers", reason="transformers not installed (extra train)")

from osmosis_ai.controller.policy import LocalPolicy, create_policy_app
from osmosis_ai.testing.serving import ServerThread
from osmosis_ai.train.tiny_model import build_tiny_model

USER = [{"role": "user", "content": "Copy: 7"}]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_model(tmp_path_factory.mktemp("app") / "tiny")


def chat(**extra: Any) -> dict[str, Any]:
    return {"model": "m", "messages": USER, "max_tokens": 3, "temperature": 0.0, **extra}


def test_concurrent_requests_the_policy_expects_run_as_one_generation_batch(model_dir: Path):
    policy = LocalPolicy(model_dir, seed=0)
    policy.batch_linger_s = 0.5  # (a loaded machine's gaps between arrivals split no batch)
    count = 24  # (four times the threads a thread per request would have had at once)

    async def ask_all(url: str) -> list[dict[str, Any]]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=chat()) for _ in range(count))
            )
        assert [a.status_code for a in answers] == [200] * count, answers[0].text
        return [a.json() for a in answers]

    policy.expect_callers(count)  # (the batching hint a run's trainer gives its policy)
    with ServerThread(create_policy_app(policy)) as server:
        before = policy.batches
        answers = asyncio.run(ask_all(server.url))
    # every request waited for the others: none held a thread of its own
    assert policy.batches - before <= 2
    assert {a["policy_version"] for a in answers} == {0}


def test_without_a_hint_every_concurrent_request_is_answered(model_dir: Path):
    policy = LocalPolicy(model_dir, seed=0)
    count = 12

    async def ask_all(url: str) -> list[int]:
        async with httpx.AsyncClient(base_url=url, timeout=60) as client:
            answers = await asyncio.gather(
                *(client.post("/v1/chat/completions", json=chat()) for _ in range(count))
            )
        return [a.status_code for a in answers]

    with ServerThread(create_policy_app(policy)) as server:
        before = policy.batches
        assert asyncio.run(ask_all(server.url)) == [200] * count
    # no hint: a batch starts as soon as one request waits, the others join later batches
    assert 1 <= policy.batches - before < count


def test_a_bad_chat_request_still_names_its_field(model_dir: Path):
    policy = LocalPolicy(model_dir, seed=0)
    with ServerThread(create_policy_app(policy)) as server:
        bad = httpx.post(f"{server.url}/v1/chat/completions", json=chat(temperature=-1), timeout=60)
    assert bad.status_code == 400 and "temperature" in bad.text
