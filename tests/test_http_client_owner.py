"""The one rule for an object's HTTP client (RolloutClient, Dispatcher, CallbackPoster,
ProtocolController): a client it was given is its caller's and stays open; one it made is
closed when it closes, and is made only when first used."""

from __future__ import annotations

import httpx

from osmosis_ai.controller.dispatch import Dispatcher
from osmosis_ai.controller.proxy import PolicyProxy
from osmosis_ai.controller.service import ControllerService
from osmosis_ai.controller.upstreams import OpenAICompatibleUpstream
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.server.callbacks import CallbackPoster
from osmosis_ai.testing.controller import ProtocolController


async def test_a_given_client_stays_open_and_a_made_one_closes():
    given = httpx.AsyncClient()
    try:
        async with RolloutClient("http://127.0.0.1:9", http_client=given) as client:
            assert client.http_client is given
        async with CallbackPoster(given) as poster:
            assert poster.client is given
        assert not given.is_closed
    finally:
        await given.aclose()
    async with RolloutClient("http://127.0.0.1:9") as client:
        made = client.http_client
    assert made.is_closed
    async with ProtocolController("http://127.0.0.1:9") as controller:
        made = controller.http_client
    assert made.is_closed


async def test_the_dispatcher_shares_its_client_with_its_rollout_client():
    upstream = OpenAICompatibleUpstream("http://127.0.0.1:9/v1", None, "policy-model")
    service = ControllerService(PolicyProxy(upstream))
    async with Dispatcher("http://127.0.0.1:9", service) as dispatcher:
        assert dispatcher.client.http_client is dispatcher.http_client
        made = dispatcher.http_client
    assert made.is_closed


async def test_a_poster_makes_its_client_on_first_use_and_again_after_closing():
    poster = CallbackPoster()
    assert poster._made_http is None  # nothing made before a callback needs it
    first = poster.client
    await poster.aclose()
    assert first.is_closed
    second = poster.client
    assert second is not first and not second.is_closed
    await poster.aclose()
