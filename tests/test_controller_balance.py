"""The balanced dispatcher over a fleet named by URL: real rollout servers on loopback, the
controller service, a scripted model. Eval's and training's fleet dispatch both go through
``slot_for`` and ``follow``."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncGenerator
from pathlib import Path

import pytest

from osmosis_ai.controller.balance import LEFT_FLEET, BalancedDispatcher, ServerSlot
from osmosis_ai.controller.dispatch import DispatchRequest
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.controller.upstreams import OpenAICompatibleUpstream
from osmosis_ai.rollout import LocalBackend
from osmosis_ai.rollout.server import create_rollout_server
from osmosis_ai.rollout.status import RolloutStatus
from osmosis_ai.testing.model_server import ScriptedModelServer
from osmosis_ai.testing.serving import free_port, serve_in_task
from rollouts import TOOL_SCRIPT, MetadataGrader, ScriptedBehaviour

PROMPT = [{"role": "user", "content": "What is 6 * 7?"}]

pytestmark = pytest.mark.asyncio(loop_scope="module")


@pytest.fixture(autouse=True)
def _artifacts(artifact_root: Path) -> Path:
    return artifact_root


def server(capacity: int):
    backend = LocalBackend(
        workflow=ScriptedBehaviour, grader=MetadataGrader, max_concurrent=capacity
    )
    return create_rollout_server(backend=backend, configure_logging=False)


@contextlib.asynccontextmanager
async def controller() -> AsyncGenerator[ControllerService]:
    async with ScriptedModelServer(TOOL_SCRIPT) as model:
        upstream = OpenAICompatibleUpstream(model.base_url, None, "policy-model")
        try:
            async with ControllerService(PolicyProxy(upstream)) as service:
                yield service
        finally:
            await upstream.aclose()


def request(reward: float) -> DispatchRequest:
    return DispatchRequest(PROMPT, metadata={"reward": reward})


async def test_a_fleet_is_followed_by_url_and_a_server_not_up_yet_joins_later():
    late_port = free_port()
    late = f"http://127.0.0.1:{late_port}"
    dead: list[ServerSlot] = []
    async with (
        controller() as service,
        serve_in_task(server(3)) as first,
        serve_in_task(server(5)) as second,
    ):
        balanced = BalancedDispatcher(service, on_dead=dead.append)
        try:
            slot = await balanced.slot_for(first)
            assert (slot.name, slot.capacity) == (first, 3)  # /health's advertised capacity
            assert await balanced.slot_for(first) is slot  # a URL has one slot
            joined, unreachable = await balanced.follow([first, second, late])
            assert [s.name for s in joined] == [second] and balanced.capacity == 8
            assert [url for url, _ in unreachable] == [late]  # nothing listens there yet
            outcomes = [await balanced.run(request(r / 4)) for r in range(4)]
            assert [o.status for o in outcomes] == [RolloutStatus.SUCCESS] * 4
            assert sum(s.dispatched for s in balanced.slots) == 4

            async with serve_in_task(server(2), port=late_port):
                joined, unreachable = await balanced.follow([second, late])
                assert [s.name for s in joined] == [late] and not unreachable
                # the server no longer listed left: its slot is dead, and stays out
                assert [(s.name, s.death) for s in dead] == [(first, LEFT_FLEET)]
                assert [s.name for s in balanced.live()] == [second, late]
                joined, _ = await balanced.follow([first, second, late])
                assert not joined and balanced.capacity == 7
                outcome = await balanced.run(request(1.0))
                assert outcome.sample is not None and outcome.sample.reward == 1.0
        finally:
            await balanced.aclose()


async def test_the_generation_pinned_reaches_every_server_and_each_that_joins():
    async with (
        controller() as service,
        serve_in_task(server(1)) as first,
        serve_in_task(server(1)) as second,
    ):
        balanced = BalancedDispatcher(service)
        try:
            slot = await balanced.slot_for(first)
            assert slot.dispatcher.generation is None  # "auto": not asked yet
            balanced.pin(await slot.dispatcher.detect_generation())
            assert balanced.generation == "polling"
            balanced.pin("callback")
            (joined,), _ = await balanced.follow([first, second])
            assert [s.dispatcher.generation for s in balanced.slots] == ["callback"] * 2
            outcome = await joined.dispatcher.run(request(0.5))
            assert outcome.generation == "callback" and outcome.status == RolloutStatus.SUCCESS
        finally:
            await balanced.aclose()
