"""The rollout server away from the root of its host: served under a ``root_path`` and
mounted inside another FastAPI or Starlette app. There the raw fast path steps aside and
FastAPI's copies of the hot routes answer; both protocol generations run through them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest

from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.testing import ProtocolController
from osmosis_ai.testing.serving import serve_in_task
from rollouts import MetadataGrader, ScriptedBehaviour, init_body

pytest.importorskip("uvicorn", reason="serving needs the server extra (uvicorn)")

LEASE = "X-Osmosis-Rollout-Lease"
PROMPT = [{"role": "user", "content": "What is 6 * 7?"}]
NO_MODEL = "http://127.0.0.1:9/v1"  # the scripted workflow never calls it


def rollout_app(**options: Any) -> Any:
    backend = LocalBackend(workflow=ScriptedBehaviour, grader=MetadataGrader)
    return create_rollout_server(backend=backend, configure_logging=False, **options)


def fastapi_host(inner: Any, prefix: str) -> Any:
    from fastapi import FastAPI

    # A mounted app's lifespan is not run by Starlette: the host enters it.
    host = FastAPI(lifespan=lambda _app: inner.router.lifespan_context(inner))

    @host.get("/own")
    async def own() -> dict[str, str]:
        return {"host": "fastapi"}

    host.mount(prefix, inner)
    return host


def starlette_host(inner: Any, prefix: str) -> Any:
    from starlette.applications import Starlette
    from starlette.routing import Mount

    @contextlib.asynccontextmanager
    async def lifespan(_app: Any) -> AsyncIterator[None]:
        async with inner.router.lifespan_context(inner):
            yield

    return Starlette(routes=[Mount(prefix, app=inner)], lifespan=lifespan)


async def run_both_generations(base_url: str, **headers: str) -> None:
    """Rollouts of each generation through ``base_url``: graded, failed, and cancelled."""
    for generation in ("polling", "callback"):
        async with ProtocolController(base_url, generation=generation, **headers) as controller:
            graded, failed = await asyncio.gather(
                controller.run(
                    PROMPT,
                    NO_MODEL,
                    label="42",
                    metadata={"reward": 0.75},
                    rollout_id=f"{generation}-graded",
                ),
                controller.run(
                    PROMPT, NO_MODEL, metadata={"raise": "bad row"}, rollout_id=f"{generation}-f"
                ),
            )
            status = await controller.client.status(f"{generation}-graded")
        assert (graded.generation, graded.status.value, graded.reward) == (
            generation,
            "success",
            0.75,
        )
        assert (failed.status.value, failed.err_message) == ("failure", "bad row")
        assert (status.status.value, status.reward) == ("success", 0.75)


async def check_routes(client: httpx.AsyncClient) -> None:
    """The hot routes' answers through FastAPI's copies match the protocol's wording."""
    missing = await client.get("/rollout/nobody/result")
    assert missing.status_code == 422 and LEASE in missing.text
    unknown = await client.get("/rollout/nobody/result", headers={LEASE: "x"})
    assert (unknown.status_code, unknown.json()) == (404, {"detail": "unknown rollout_id"})
    bad = await client.post("/rollout", json={"initial_messages": []})
    assert bad.status_code == 422 and "chat_completions_url" in bad.text
    slow = await client.post("/rollout", json=init_body("slow", NO_MODEL, metadata={"sleep": 60}))
    assert slow.status_code == 202
    lease = slow.json()["polling_lease_token"]
    again = await client.post("/rollout", json=init_body("slow", NO_MODEL))
    assert (again.status_code, again.json()) == (
        409,
        {"detail": "rollout_id is already registered"},
    )
    cancel = await client.post("/rollout/cancel", json={"prefix": "slow"})
    assert cancel.json()["dispositions"]["slow"] in ("cancelled_queued", "cancelled_running")
    async with asyncio.timeout(30):  # a guard against a hang: each poll returns at a change
        while True:
            result = (await client.get("/rollout/slow/result", headers={LEASE: lease})).json()
            if result["status"] == "cancelled":
                break
    health = (await client.get("/health")).json()
    assert health["lifecycle"]["accepting_rollouts"] is True


async def test_served_under_a_root_path(artifact_root):
    async with serve_in_task(rollout_app(), root_path="/api") as url:
        await run_both_generations(url)
        async with httpx.AsyncClient(base_url=url, timeout=30) as client:
            await check_routes(client)
            schema = (await client.get("/openapi.json")).json()
    assert schema["servers"] == [{"url": "/api"}]


@pytest.mark.parametrize("host", [fastapi_host, starlette_host])
async def test_mounted_inside_another_app(artifact_root, host):
    app = host(rollout_app(), "/rollouts/math")
    async with serve_in_task(app) as url:
        await run_both_generations(f"{url}/rollouts/math")
        async with httpx.AsyncClient(base_url=f"{url}/rollouts/math", timeout=30) as client:
            await check_routes(client)
        async with httpx.AsyncClient(base_url=url) as client:
            if host is fastapi_host:
                assert (await client.get("/own")).json() == {"host": "fastapi"}
            assert (await client.get("/rollout/x/status")).status_code == 404  # not the host's


async def test_mounted_with_auth_under_a_root_path(artifact_root):
    app = fastapi_host(rollout_app(api_key="server-secret"), "/rollouts/math")
    async with serve_in_task(app, root_path="/proxy") as url:
        base = f"{url}/rollouts/math"
        async with httpx.AsyncClient(base_url=base) as anonymous:
            refused = await anonymous.post("/rollout", json=init_body("a", NO_MODEL))
            assert (refused.status_code, refused.json()) == (401, {"detail": "unauthorized"})
        await run_both_generations(base, api_key="server-secret")


async def test_mounted_without_its_lifespan_says_how_to_enter_it(artifact_root):
    from starlette.applications import Starlette
    from starlette.routing import Mount

    app = Starlette(routes=[Mount("/r", app=rollout_app())])  # the lifespan never runs
    async with serve_in_task(app) as url, httpx.AsyncClient(base_url=f"{url}/r") as client:
        submitted = await client.post("/rollout", json=init_body("a", NO_MODEL))
        polled = await client.get("/rollout/a/result", headers={LEASE: "x"})
        status = await client.get("/rollout/a/status")
        cancelled = await client.post("/rollout/cancel", json={"all": True})
        health = await client.get("/health")
    for answer in (submitted, polled, status, cancelled):
        assert answer.status_code == 503
        assert "has not started: its lifespan has not run" in answer.json()["detail"]
        assert "router.lifespan_context" in answer.json()["detail"]
    assert health.status_code == 200
    assert health.json()["lifecycle"] == {"accepting_rollouts": False, "active_rollouts": 0}
