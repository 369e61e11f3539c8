"""The rollout server, polling generation, driven over real HTTP."""

from __future__ import annotations

import asyncio
import base64
import json
import time
from collections.abc import Callable
from typing import Any

import httpx
import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout import (
    AgentWorkflow,
    ExecutionBackend,
    ExecutionResult,
    Grader,
    LocalBackend,
    RolloutStatus,
)
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.server import registry as registry_module
from osmosis_ai.rollout.server.app import ServerOptionError
from osmosis_ai.testing.model_server import ScriptedModelServer
from rollouts import (
    TOOL_SCRIPT,
    AnswerGrader,
    MetadataGrader,
    ScriptedBehaviour,
    ToolWorkflow,
    init_body,
    poll_until_done,
    rollout_server,
)

LEASE = "X-Osmosis-Rollout-Lease"


@pytest.fixture
async def model():
    async with ScriptedModelServer(TOOL_SCRIPT, record_requests=True) as server:
        yield server


async def submit(client: httpx.AsyncClient, body: dict) -> str:
    response = await client.post("/rollout", json=body)
    assert response.status_code == 202, response.text
    return response.json()["polling_lease_token"]


# Gates the test opens to move a rollout on, instead of sleeps it hopes are long enough.
# The server runs on the test's event loop, so its workflows share them.
GATES: dict[str, asyncio.Event] = {}


def gate(name: str) -> asyncio.Event:
    return GATES.setdefault(name, asyncio.Event())


@pytest.fixture(autouse=True)
def _fresh_gates():
    GATES.clear()
    yield
    for event in GATES.values():
        event.set()  # nothing is left waiting for a test that has ended


class Gated(AgentWorkflow):
    """Answers once the gate named by ``metadata["gate"]`` (if any) opens."""

    async def run(self, ctx):
        meta = ctx.metadata or {}
        if "gate" in meta:
            await gate(meta["gate"]).wait()
        return [*ctx.prompt, {"role": "assistant", "content": "#### 42"}]


class GatedGrader(Grader):
    """Rewards 1.0 once the gate named by ``metadata["grade_gate"]`` (if any) opens."""

    async def grade(self, ctx):
        meta = ctx.metadata or {}
        if "grade_gate" in meta:
            await gate(meta["grade_gate"]).wait()
        ctx.set_reward(1.0)


async def until(probe: Callable[[], Any], ready: Callable[[Any], bool]) -> Any:
    """Ask ``probe`` until its answer is ``ready``; returns that answer."""
    async with asyncio.timeout(30):  # a guard against a hang, not a speed requirement
        while True:
            answer = await probe()
            if ready(answer):
                return answer
            await asyncio.sleep(0.01)


async def status_of(client: httpx.AsyncClient, rollout_id: str) -> str:
    return (await client.get(f"/rollout/{rollout_id}/status")).json()["status"]


async def health(client: httpx.AsyncClient) -> dict[str, Any]:
    return (await client.get("/health")).json()


async def test_tool_calling_rollout_end_to_end(model, artifact_root):
    backend = LocalBackend(workflow=ToolWorkflow, grader=AnswerGrader)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        response = await client.post(
            "/rollout",
            json=init_body("r1", f"{model.base_url}/rollouts/r1", extra_fields={"row": 3}),
        )
        assert response.status_code == 202
        admitted = response.json()
        assert set(admitted) == {
            "rollout_id",
            "status",
            "polling_lease_token",
            "result_wait_timeout_sec",
            "polling_lease_timeout_sec",
        }
        assert admitted["rollout_id"] == "r1" and admitted["status"] == "queued"
        assert len(admitted["polling_lease_token"]) == 43
        assert admitted["polling_lease_timeout_sec"] > admitted["result_wait_timeout_sec"]

        result = await poll_until_done(client, "r1", admitted["polling_lease_token"])
        # Trajectory is on disk before the terminal result is visible.
        trajectory = json.loads((artifact_root / "r1" / "trajectory.json").read_text())

    assert set(result) - {"_seen"} == {
        "rollout_id",
        "status",
        "sample",
        "err_message",
        "err_category",
    }
    assert result["status"] == "success"
    sample = result["sample"]
    assert sample["reward"] == 1.0
    assert "trajectory_messages" not in sample
    assert [m["role"] for m in sample["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert sample["messages"][2]["content"] == "42"
    assert sample["metrics"] == {"turns": 4.0}
    assert [r.path for r in model.requests] == ["/v1/rollouts/r1/chat/completions"] * 2
    assert all(r.headers["authorization"] == "Bearer llm-key" for r in model.requests)
    assert trajectory["session_id"] == "r1"
    assert trajectory["extra"]["osmosis"]["reward"] == 1.0
    assert trajectory["extra"]["osmosis"]["request_extra_fields"] == {"row": 3}
    assert (artifact_root / "r1" / "artifacts" / "notes.txt").read_text() == "multiplied"


async def test_progress_statuses_are_reported(artifact_root):
    backend = LocalBackend(workflow=Gated, grader=GatedGrader)
    async with (
        rollout_server(backend, result_wait_timeout_sec=5) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        gates = {"gate": "p-agent", "grade_gate": "p-grade"}
        lease = await submit(client, init_body("p", "http://127.0.0.1:9/v1", metadata=gates))
        await until(lambda: status_of(client, "p"), lambda status: status == "running")
        polling = asyncio.create_task(client.get("/rollout/p/result", headers={LEASE: lease}))
        await asyncio.sleep(0.1)  # the poll reaches the server while the rollout runs
        gate("p-agent").set()
        # that poll returns at grading; had it come later, it would return grading at its
        # wait timeout: grading either way, as the grader is held
        waiting = (await polling).json()
        gate("p-grade").set()
        result = await poll_until_done(client, "p", lease)
    assert waiting["status"] == "grading" and waiting["sample"] is None
    assert result["_seen"] == ["success"]  # each poll returns at a status change


async def test_a_quick_grade_answers_the_waiting_poll_with_the_result(artifact_root, monkeypatch):
    # A wide coalescing window, so that a grade of no work is quick on a loaded machine too.
    monkeypatch.setattr(registry_module, "PROGRESS_COALESCE_SEC", 1.0)
    backend = LocalBackend(workflow=Gated, grader=GatedGrader)
    async with (
        rollout_server(backend, result_wait_timeout_sec=5) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        lease = await submit(
            client, init_body("q", "http://127.0.0.1:9/v1", metadata={"gate": "q"})
        )
        await until(lambda: status_of(client, "q"), lambda status: status == "running")
        polling = asyncio.create_task(poll_until_done(client, "q", lease))
        await asyncio.sleep(0.1)  # the poll reaches the server (a later one proves less)
        gate("q").set()
        # grading then success within the coalescing window: the poll gets the result,
        # never a grading answer that would cost a second poll
        result = await polling
        assert "grading" not in result["_seen"] and result["_seen"][-1] == "success"

        # a poll that begins after a change, within its coalescing window, is not woken
        # when the window ends
        lease = await submit(
            client, init_body("w", "http://127.0.0.1:9/v1", metadata={"gate": "w"})
        )
        await until(lambda: status_of(client, "w"), lambda status: status == "running")
        polling = asyncio.create_task(poll_until_done(client, "w", lease))
        await asyncio.sleep(1.2)  # past the window, whose wake the poll must sleep through
        gate("w").set()
        result = await polling
        assert result["_seen"] == ["success"]


@pytest.mark.parametrize(
    ("fields", "status", "reward", "has_sample"),
    [
        ({"metadata": {"reward": 0.0}}, "success", 0.0, True),
        ({"metadata": {"remove": True}}, "success", None, True),
        ({"grade": False}, "success", None, True),
        ({"metadata": {"raise": "boom"}}, "failure", None, False),
        ({"label": None, "metadata": None}, "failure", None, False),
    ],
)
async def test_reward_nulling_rules(artifact_root, fields, status, reward, has_sample):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        lease = await submit(client, init_body("n", "http://127.0.0.1:9/v1", **fields))
        result = await poll_until_done(client, "n", lease)
    assert result["status"] == status
    assert (result["sample"] is not None) == has_sample
    if has_sample:
        assert result["sample"]["reward"] == reward
    if fields.get("metadata", {}) and "raise" in fields["metadata"]:
        assert (result["err_message"], result["err_category"]) == ("boom", "validation_error")


async def test_removed_sample_archives_real_reward(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        lease = await submit(
            client, init_body("rm", "http://127.0.0.1:9/v1", metadata={"remove": True})
        )
        await poll_until_done(client, "rm", lease)
    archived = json.loads((artifact_root / "rm" / "trajectory.json").read_text())
    assert archived["extra"]["osmosis"]["reward"] == 1.0


async def test_timeouts_become_failures(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        lease = await submit(
            client,
            init_body("t", "http://127.0.0.1:9/v1", metadata={"sleep": 5}, agent_timeout_sec=0.2),
        )
        result = await poll_until_done(client, "t", lease)
        assert result["err_category"] == "timeout"
        # the queue wait is named too when there was one (a loaded machine)
        assert result["err_message"].startswith("workflow exceeded its 0.2s deadline")
        lease = await submit(
            client,
            init_body(
                "g", "http://127.0.0.1:9/v1", metadata={"grader_sleep": 5}, grader_timeout_sec=0.2
            ),
        )
        result = await poll_until_done(client, "g", lease)
        assert (result["status"], result["err_category"]) == ("failure", "timeout")


async def test_result_auth_order_and_idempotent_terminal_body(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        lease = await submit(client, init_body("a", "http://127.0.0.1:9/v1"))
        missing = await client.get("/rollout/a/result")
        assert missing.status_code == 422
        assert LEASE in missing.text
        assert (await client.get("/rollout/zz/result", headers={LEASE: lease})).status_code == 404
        wrong = await client.get("/rollout/a/result", headers={LEASE: "x" * 43})
        assert (wrong.status_code, wrong.json()) == (403, {"detail": "invalid polling lease"})
        first = await poll_until_done(client, "a", lease)
        again = await client.get("/rollout/a/result", headers={LEASE: lease})
        assert again.json() == {k: v for k, v in first.items() if k != "_seen"}
        assert (await client.get("/rollout/a/result", headers={LEASE: "nope"})).status_code == 403
        dup = await client.post("/rollout", json=init_body("a", "http://127.0.0.1:9/v2"))
        assert (dup.status_code, dup.json()) == (
            409,
            {"detail": "rollout_id is already registered"},
        )


async def test_retention_then_id_is_free_again(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with (
        rollout_server(backend, result_retention_sec=0.2) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        admitted = time.monotonic()  # (before the server admits it, and so before it ends)
        lease = await submit(client, init_body("ret", "http://127.0.0.1:9/v1"))
        await poll_until_done(client, "ret", lease)
        await until(
            lambda: client.get("/rollout/ret/result", headers={LEASE: lease}),
            lambda answer: answer.status_code == 404,
        )
        assert time.monotonic() - admitted >= 0.2  # not before the retention ran out
        # the same body once more: the first admission is forgotten, so a new one, new lease
        again = await submit(client, init_body("ret", "http://127.0.0.1:9/v1"))
        assert again != lease
        assert (await poll_until_done(client, "ret", again))["status"] == "success"


RUNS: list[str] = []


class CountedGated(Gated):
    """:class:`Gated`, noting each run's rollout id in :data:`RUNS`."""

    async def run(self, ctx):
        RUNS.append((ctx.metadata or {}).get("gate", "?"))
        return await super().run(ctx)


class ToggledCapacity(LocalBackend):
    """Refuses new rollouts (429) while ``full`` is set."""

    full = False

    def has_capacity(self) -> bool:
        return not self.full and super().has_capacity()


async def test_a_resent_identical_body_gets_the_same_lease_and_runs_once(artifact_root):
    RUNS.clear()
    backend = ToggledCapacity(workflow=CountedGated, grader=GatedGrader)
    async with (
        rollout_server(backend, result_retention_sec=60) as url,
        httpx.AsyncClient(base_url=url, timeout=30) as client,
    ):
        body = json.dumps(init_body("rp", "http://127.0.0.1:9/v1", metadata={"gate": "rp"}))
        first = await client.post("/rollout", content=body)
        assert first.status_code == 202
        # the same bytes again: the same answer, lease included, and no second run
        again = await client.post("/rollout", content=body)
        assert (again.status_code, again.json()) == (202, first.json())
        lease = first.json()["polling_lease_token"]
        # another body for the held id is refused as the protocol says, even one byte off
        other = body.replace('"42"', '"43"')
        assert other != body
        refused = await client.post("/rollout", content=other)
        assert (refused.status_code, refused.json()) == (
            409,
            {"detail": "rollout_id is already registered"},
        )
        # a replay is no new admission: a full server still answers it
        backend.full = True
        assert (await client.post("/rollout", content=body)).json() == first.json()
        full = await client.post("/rollout", json=init_body("new", "http://127.0.0.1:9/v1"))
        assert full.status_code == 429
        backend.full = False
        gate("rp").set()
        result = await poll_until_done(client, "rp", lease)
        assert result["status"] == "success", result
        assert result["sample"]["reward"] == 1.0
        # finished, within retention: the replay still recovers the lease, and with it the
        # result
        late = await client.post("/rollout", content=body)
        assert (late.status_code, late.json()) == (202, first.json())
        polled = await client.get("/rollout/rp/result", headers={LEASE: lease})
        assert polled.json() == {k: v for k, v in result.items() if k != "_seen"}
    assert RUNS == ["rp"]


async def test_a_body_without_an_llm_api_key_cannot_recover_its_lease(artifact_root):
    backend = LocalBackend(workflow=Gated)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        body = init_body("bare", "http://127.0.0.1:9/v1", metadata={"gate": "bare"})
        del body["llm_api_key"]  # nothing secret in it: knowing it proves nothing
        raw = json.dumps(body)
        assert (await client.post("/rollout", content=raw)).status_code == 202
        again = await client.post("/rollout", content=raw)
        assert (again.status_code, again.json()) == (
            409,
            {"detail": "rollout_id is already registered"},
        )
        gate("bare").set()


async def test_the_lease_is_kept_sealed_and_a_replay_renews_it():
    registry = registry_module.Registry(
        polling_lease_timeout_sec=60, result_retention_sec=60, on_lease_expired=lambda e: None
    )
    body = b'{"rollout_id":"s","llm_api_key":"k"}'
    entry, token = registry.admit("s", "polling", body=body)
    assert token is not None and len(token) == 43
    # neither the token nor its bytes are held: only a digest, and a sealed copy
    raw = base64.urlsafe_b64decode(token + "=")
    held = [v for v in vars(entry).values() if isinstance(v, bytes | str)]
    assert held and not any(token in str(v) or raw in v for v in held if isinstance(v, bytes))
    assert not any(token in v for v in held if isinstance(v, str))
    assert registry.replay("s", body + b" ") is None
    assert registry.replay("t", body) is None
    deadline = entry.lease_deadline
    await asyncio.sleep(0.01)
    assert registry.replay("s", body) == token
    assert entry.lease_deadline > deadline
    # another registry (another server, or a restart) cannot open it, even with the body
    other = registry_module.Registry(
        polling_lease_timeout_sec=60, result_retention_sec=60, on_lease_expired=lambda e: None
    )
    other.entries["s"] = entry
    assert other.replay("s", body) is None
    unsealed, bare = registry.admit("u", "polling")
    assert unsealed.replay_digest is None and bare is not None
    assert registry.replay("u", b"") is None
    for held_entry in (entry, unsealed):
        assert held_entry.lease_timer is not None
        held_entry.lease_timer.cancel()


async def test_lease_expiry_cancels_the_rollout(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    options = {"result_wait_timeout_sec": 0.1, "polling_lease_timeout_sec": 0.3}
    async with rollout_server(backend, **options) as url, httpx.AsyncClient(base_url=url) as client:
        admitted = time.monotonic()  # (before the server admits it)
        lease = await submit(
            client, init_body("le", "http://127.0.0.1:9/v1", metadata={"sleep": 30})
        )
        status = await until(
            lambda: client.get("/rollout/le/status"),
            lambda answer: answer.json()["status"] not in ("queued", "running"),
        )
        assert time.monotonic() - admitted >= 0.3  # not before the lease ran out
        status = status.json()
        assert status["status"] == "failure" and status["err_message"] == "polling lease expired"
        result = (await client.get("/rollout/le/result", headers={LEASE: lease})).json()
        assert result == {
            "rollout_id": "le",
            "status": "failure",
            "sample": None,
            "err_message": "polling lease expired",
            "err_category": "lease_expired",
        }
        # execution was cancelled
        await until(lambda: health(client), lambda body: body["lifecycle"]["active_rollouts"] == 0)
        assert backend.rollout_status("le")["status"] == "cancelled"  # type: ignore[index]


async def test_polling_keeps_the_lease_alive(artifact_root):
    backend = LocalBackend(workflow=Gated, grader=GatedGrader)
    # a poll returns within 0.2 s; the next may come up to 0.8 s after it, on a slow machine
    options = {"result_wait_timeout_sec": 0.2, "polling_lease_timeout_sec": 1.0}
    async with rollout_server(backend, **options) as url, httpx.AsyncClient(base_url=url) as client:
        body = init_body("alive", "http://127.0.0.1:9/v1", metadata={"gate": "alive"})
        lease = await submit(client, body)
        admitted = time.monotonic()
        polls = 0
        while time.monotonic() - admitted < 2.5:  # outlive the lease more than twice over
            answer = await client.get("/rollout/alive/result", headers={LEASE: lease})
            assert answer.json()["status"] in ("queued", "running"), answer.text
            polls += 1
        gate("alive").set()
        result = await poll_until_done(client, "alive", lease)
    assert polls >= 3
    assert result["status"] == "success"


async def test_cancel_selectors_and_dispositions(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader, max_concurrent=1)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        leases = {}
        for rid in ("job-a", "job-b", "other"):
            leases[rid] = await submit(
                client, init_body(rid, "http://127.0.0.1:9/v1", metadata={"sleep": 30})
            )
        # one runs, two wait for it (max_concurrent=1)
        await until(lambda: health(client), lambda body: body["concurrency"]["queued"] == 2)
        assert await status_of(client, "job-a") == "running"
        for bad in ({}, {"ids": ["a"], "all": True}):
            response = await client.post("/rollout/cancel", json=bad)
            assert response.status_code == 422
            assert "exactly one selector" in response.text
        cancel = await client.post("/rollout/cancel", json={"ids": ["job-a", "job-b", "ghost"]})
        assert cancel.json() == {
            "dispositions": {
                "job-a": "cancelled_running",
                "job-b": "cancelled_queued",
                "ghost": "not_found",
            }
        }
        repeat = await client.post("/rollout/cancel", json={"ids": ["job-a"]})
        assert repeat.json()["dispositions"]["job-a"] in ("cancelled_running", "not_found")
        result = await poll_until_done(client, "job-a", leases["job-a"])
        assert result == {
            "rollout_id": "job-a",
            "status": "cancelled",
            "sample": None,
            "err_message": "cancelled",
            "err_category": None,
            "_seen": result["_seen"],
        }
        assert (await client.post("/rollout/cancel", json={"ids": ["job-a"]})).json() == {
            "dispositions": {"job-a": "not_found"}
        }
        by_prefix = await client.post("/rollout/cancel", json={"prefix": "oth"})
        assert by_prefix.json() == {"dispositions": {"other": "cancelled_running"}}
        assert (await poll_until_done(client, "other", leases["other"]))["status"] == "cancelled"
        assert (await client.post("/rollout/cancel", json={"all": True})).json() == {
            "dispositions": {}
        }


async def test_status_endpoint(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/rollout/never/status")).json() == {
            "rollout_id": "never",
            "status": "unknown",
            "reward": None,
            "err_message": None,
        }
        lease = await submit(
            client, init_body("s", "http://127.0.0.1:9/v1", metadata={"reward": 0.5})
        )
        await poll_until_done(client, "s", lease)
        assert (await client.get("/rollout/s/status")).json()["reward"] == 0.5


async def test_queue_full_answers_429(artifact_root):
    backend = LocalBackend(
        workflow=ScriptedBehaviour, grader=MetadataGrader, max_concurrent=1, max_queue_depth=1
    )
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        await submit(client, init_body("q1", "http://127.0.0.1:9/v1", metadata={"sleep": 30}))
        await submit(client, init_body("q2", "http://127.0.0.1:9/v1", metadata={"sleep": 30}))
        await until(  # one runs and one waits: the queue of one is full
            lambda: health(client),
            lambda body: body["concurrency"] == {"max_concurrent": 1, "queued": 1, "running": 1},
        )
        full = await client.post("/rollout", json=init_body("q3", "http://127.0.0.1:9/v1"))
        assert full.status_code == 429
        assert full.headers["retry-after"] == "5"
        assert full.json() == {"detail": "rollout queue is full; retry later"}
        await client.post("/rollout/cancel", json={"all": True})


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"initial_messages": []}, "chat_completions_url"),
        ({"rollout_id": "x", "chat_completions_url": "http://a/v1"}, "initial_messages"),
        ({"rollout_id": "x", "chat_completions_url": "http://a", "initial_messages": "hi"}, "initial_messages"),
        ({"rollout_id": "../x", "chat_completions_url": "http://a", "initial_messages": []}, "rollout_id"),
        ({"rollout_id": "x", "chat_completions_url": "http://a", "initial_messages": [], "llm_api_key": ""}, "llm_api_key"),
        ({"rollout_id": "x", "chat_completions_url": "http://a", "initial_messages": [], "agent_timeout_sec": "inf"}, "agent_timeout_sec"),
        ({"chat_completions_url": "http://a", "initial_messages": []}, "rollout_id"),
    ],
)  # fmt: skip
async def test_malformed_requests_get_named_422s(artifact_root, body, field):
    backend = LocalBackend(workflow=ScriptedBehaviour)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        response = await client.post("/rollout", json=body)
        assert response.status_code == 422
        assert field in response.text
        assert "secret" not in response.text
        assert (await client.get("/health")).status_code == 200


async def test_bad_json_and_oversized_bodies(artifact_root):
    backend = LocalBackend(workflow=ScriptedBehaviour)
    async with (
        rollout_server(backend, max_body_bytes=2000) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        broken = await client.post(
            "/rollout", content=b"{not json", headers={"content-type": "application/json"}
        )
        assert broken.status_code == 422
        assert "json" in broken.text.lower()
        big = init_body("big", "http://127.0.0.1:9/v1", label="x" * 5000)
        too_large = await client.post("/rollout", json=big)
        assert too_large.status_code == 413
        assert "2000-byte limit" in too_large.json()["detail"]

        async def chunks():
            for _ in range(10):
                yield b" " * 500

        streamed = await client.post("/rollout", content=chunks())
        assert streamed.status_code == 413
        assert (await client.get("/health")).status_code == 200


async def test_bearer_auth_on_every_path(artifact_root, monkeypatch):
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    async with rollout_server(backend, api_key="server-secret") as url:
        async with httpx.AsyncClient(base_url=url) as anonymous:
            for method, path in [
                ("GET", "/health"),
                ("GET", "/docs"),
                ("GET", "/openapi.json"),
                ("POST", "/rollout"),
                ("POST", "/rollout/cancel"),
                ("GET", "/rollout/x/status"),
                ("GET", "/rollout/x/result"),
            ]:
                response = await anonymous.request(method, path)
                assert (response.status_code, response.json()) == (401, {"detail": "unauthorized"})
            wrong = await anonymous.get(
                "/health", headers={"Authorization": "Bearer server-secreT"}
            )
            assert wrong.status_code == 401
        headers = {"Authorization": "Bearer server-secret"}
        async with httpx.AsyncClient(base_url=url, headers=headers) as client:
            assert (await client.get("/health")).status_code == 200
            lease = await submit(client, init_body("auth", "http://127.0.0.1:9/v1"))
            assert (await poll_until_done(client, "auth", lease))["status"] == "success"
    monkeypatch.setenv("OSMOSIS_ROLLOUT_SERVER_API_KEY", "from-env")
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        assert (await client.get("/health")).status_code == 401
        ok = await client.get("/health", headers={"Authorization": "Bearer from-env"})
        assert ok.status_code == 200


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (
            {"result_wait_timeout_sec": 30, "polling_lease_timeout_sec": 30},
            "polling_lease_timeout_sec must be finite and greater than result_wait_timeout_sec "
            "(30), got 30",
        ),
        ({"result_wait_timeout_sec": float("nan")}, "result_wait_timeout_sec must be a finite"),
        ({"result_wait_timeout_sec": "30"}, "number > 0, got str '30'"),
        ({"result_retention_sec": -1}, "result_retention_sec must be a finite number >= 0, got -1"),
        ({"drain_timeout_sec": float("inf")}, "drain_timeout_sec must be a finite number >= 0"),
        ({"max_body_bytes": 0}, "max_body_bytes must be a whole number of bytes >= 1, got 0"),
        ({"max_body_bytes": 1.5}, "got 1.5"),
        ({"backend": LocalBackend}, "backend must be an ExecutionBackend instance, got the class"),
        ({"backend": None}, "backend must be an ExecutionBackend instance, got None"),
        ({"lifespan": "mine"}, "lifespan must be a callable"),
        ({"api_key": "  "}, "api_key must be a non-blank string, or None to disable auth; got a"),
        ({"api_key": b"secret-bytes"}, "got bytes"),
    ],
)
def test_server_option_validation(options, message):
    options.setdefault("backend", LocalBackend(workflow=ScriptedBehaviour))
    with pytest.raises(ServerOptionError) as raised:
        create_rollout_server(configure_logging=False, **options)
    assert message in str(raised.value)
    assert isinstance(raised.value, ValueError)  # what these raised before they had a name
    assert "secret-bytes" not in str(raised.value)


def test_the_server_package_exports_its_option_error():
    import osmosis_ai.rollout.server as server

    assert server.__all__ == ["ServerOptionError", "create_rollout_server", "run_rollout_server"]
    assert server.ServerOptionError is ServerOptionError
    assert issubclass(server.ServerOptionError, UsageError)


async def test_health_body_and_headers(artifact_root, monkeypatch):
    monkeypatch.setenv("_OSMOSIS_ROLLOUT_INSTANCE_ID", "instance-7")
    backend = LocalBackend(workflow=ScriptedBehaviour, max_concurrent=8)
    async with rollout_server(backend) as url, httpx.AsyncClient(base_url=url) as client:
        response = await client.get("/health")
    body = response.json()
    assert body["status"] == "ok"
    assert body["concurrency"] == {"max_concurrent": 8, "queued": 0, "running": 0}
    assert body["instance_id"] == "instance-7"
    assert len(body["process_id"]) == 32
    assert body["lifecycle"] == {"accepting_rollouts": True, "active_rollouts": 0}
    assert response.headers["x-osmosis-rollout-instance-id"] == "instance-7"
    assert response.headers["x-osmosis-rollout-sdk-version"]


class CrashingBackend(ExecutionBackend):
    async def execute(self, request, on_workflow_complete=None, on_grader_complete=None):
        raise RuntimeError("disk on fire")


class CallbackOnlyBackend(ExecutionBackend):
    """Written for the callback-only interface: reports through callbacks, returns None."""

    async def execute(self, request, on_workflow_complete=None, on_grader_complete=None):
        from osmosis_ai.rollout import RolloutSample

        sample = RolloutSample(messages=[{"role": "assistant", "content": "x"}], reward=0.25)
        if on_workflow_complete:
            await on_workflow_complete(ExecutionResult(RolloutStatus.SUCCESS, sample))
        if on_grader_complete:
            await on_grader_complete(ExecutionResult(RolloutStatus.SUCCESS, sample))


async def test_backend_crash_and_callback_only_backends(artifact_root):
    async with rollout_server(CrashingBackend()) as url, httpx.AsyncClient(base_url=url) as client:
        lease = await submit(client, init_body("c", "http://127.0.0.1:9/v1"))
        result = await poll_until_done(client, "c", lease)
        assert (result["status"], result["err_message"], result["err_category"]) == (
            "failure",
            "disk on fire",
            "agent_error",
        )
    async with (
        rollout_server(CallbackOnlyBackend()) as url,
        httpx.AsyncClient(base_url=url) as client,
    ):
        lease = await submit(client, init_body("cb", "http://127.0.0.1:9/v1"))
        result = await poll_until_done(client, "cb", lease)
        assert (result["status"], result["sample"]["reward"]) == ("success", 0.25)


async def test_graceful_shutdown_drains_then_cancels(artifact_root):
    backend = LocalBackend(workflow=Gated, grader=GatedGrader)
    # the drain lets "quick" finish once its gate opens, and waits that long for "slow"
    app = create_rollout_server(backend=backend, configure_logging=False, drain_timeout_sec=1.5)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://rollout") as client:
        lifespan = app.router.lifespan_context(app)
        await lifespan.__aenter__()
        await submit(client, init_body("quick", "http://127.0.0.1:9/v1", metadata={"gate": "q"}))
        await submit(client, init_body("slow", "http://127.0.0.1:9/v1", metadata={"gate": "s"}))
        stopping = asyncio.create_task(lifespan.__aexit__(None, None, None))
        await until(
            lambda: health(client), lambda body: not body["lifecycle"]["accepting_rollouts"]
        )
        gate("q").set()  # it finishes during the drain
        refused = await client.post("/rollout", json=init_body("late", "http://127.0.0.1:9/v1"))
        assert (refused.status_code, refused.json()) == (
            503,
            {"detail": "rollout server is shutting down"},
        )
        await stopping
    assert backend.rollout_status("quick")["status"] == "success"  # type: ignore[index]
    assert backend.rollout_status("slow")["status"] == "cancelled"  # type: ignore[index]
