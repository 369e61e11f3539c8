"""``LeanTransport``: httpx's API over the lean HTTP/1.1 connections, against loopback
servers that write scripted bytes (framing, keep-alive, the pool, timeouts, fallback)."""

from __future__ import annotations

import asyncio
import gzip
import importlib.util

import httpx
import pytest

from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.client import RolloutClient
from osmosis_ai.rollout.http import aclose_shared_transport, async_client, post_json
from osmosis_ai.rollout.http1 import (
    IDEMPOTENT_EXTENSION,
    LeanTransport,
    RemoteProtocolError,
    split_url,
)
from rawhttp import (
    RawServer,
    answers,
    answers_then_closes,
    first_answer_stalls,
    first_connection_dies_when_idle,
    ok,
    raw_server,
    second_request_kills_the_connection,
    streams_in_two,
)

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None


def base(server: RawServer) -> str:
    return server.url.removesuffix("/v1/chat/completions")


async def test_requests_share_one_kept_alive_connection_and_keep_their_heads():
    replies = [ok(b'{"n":1}', b"x-answer: a\r\nx-answer: b\r\n"), ok(b"second"), ok(b"")]
    async with raw_server(answers(*replies)) as server, async_client() as client:
        first = await client.post(f"{base(server)}/rollout?x=1", json={"q": 1})
        assert (first.status_code, first.json()) == (200, {"n": 1})
        assert first.headers.get_list("x-answer") == ["a", "b"]
        assert first.http_version == "HTTP/1.1" and first.reason_phrase == "OK"
        second = await client.get(f"{base(server)}/result", headers={"X-Mine": "yes"})
        assert second.text == "second"
        third = await client.delete(f"{base(server)}/rollout/r1")
        assert third.content == b""
    assert server.connections == 1
    post_head, post_body = server.requests[0]
    assert post_head.startswith(b"POST /rollout?x=1 HTTP/1.1\r\n")
    assert b"\r\ncontent-length: 7\r\n" in post_head.lower() and post_body == b'{"q":1}'
    get_head, get_body = server.requests[1]
    assert get_head.startswith(b"GET /result HTTP/1.1\r\n") and get_body == b""
    assert b"\r\nx-mine: yes\r\n" in get_head.lower()
    assert b"content-length" not in get_head.lower()
    assert b"\r\nhost: 127.0.0.1:" in get_head.lower()


async def test_a_streamed_body_arrives_as_the_server_sends_it():
    release = asyncio.Event()
    async with (
        raw_server(streams_in_two(release)) as server,
        async_client() as client,
        client.stream("POST", server.url, content=b"{}") as response,
    ):
        chunks = response.aiter_raw()
        assert await anext(chunks) == b"first"  # before the rest was even written
        release.set()
        assert [c async for c in chunks] == [b"second"]


async def test_compressed_bodies_are_decoded_once_by_httpx():
    body = gzip.compress(b'{"ok":true}')
    reply = ok(body, b"content-encoding: gzip\r\n")
    async with raw_server(answers(reply)) as server, async_client() as client:
        response = await client.get(server.url)
        assert response.json() == {"ok": True}


async def test_head_answers_have_no_body_and_the_connection_is_reused():
    head = b"HTTP/1.1 200 OK\r\ncontent-length: 1234\r\n\r\n"
    async with raw_server(answers(head, ok(b"after"))) as server, async_client() as client:
        response = await client.head(server.url)
        assert (response.status_code, response.content) == (200, b"")
        assert response.headers["content-length"] == "1234"
        assert (await client.get(server.url)).text == "after"
    assert server.connections == 1


async def test_an_unread_body_closes_its_connection_instead_of_reusing_it():
    half = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nhalf."
    async with (
        raw_server(first_answer_stalls(half, b"next")) as server,
        async_client() as client,
    ):
        async with client.stream("GET", server.url) as response:
            assert await anext(response.aiter_raw()) == b"half."  # the rest is left unread
        assert (await client.get(server.url)).text == "next"
    assert server.connections == 2


async def test_a_stale_pooled_connection_is_retried_on_a_fresh_one_for_idempotent_requests():
    async with raw_server(first_connection_dies_when_idle) as server, async_client() as client:
        assert (await client.post(server.url, content=b"1")).text == "answer"
        assert (await client.get(server.url)).text == "answer"
    assert server.connections == 2
    assert [head.split(b" ")[0] for head, _ in server.requests] == [b"POST", b"GET", b"GET"]

    # A POST is sent again only when its caller declares it idempotent.
    declared = {IDEMPOTENT_EXTENSION: True}
    async with raw_server(first_connection_dies_when_idle) as server, async_client() as client:
        assert (await client.post(server.url, content=b"1")).text == "answer"
        second = await client.post(server.url, content=b"2", extensions=declared)
        assert second.text == "answer"
    assert [body for _, body in server.requests] == [b"1", b"2", b"2"]


async def test_a_post_is_not_sent_again_when_a_reused_connection_closes_unanswered():
    limits = httpx.Timeout(5).as_dict()
    async with (
        raw_server(second_request_kills_the_connection) as server,
        async_client() as client,
    ):
        assert (await client.post(server.url, content=b"1")).text == "answer"
        with pytest.raises(httpx.RemoteProtocolError, match="not idempotent") as caught:
            await client.post(server.url, content=b"2")
        assert isinstance(caught.value.__cause__, RemoteProtocolError)
        assert "before answering" in str(caught.value)
        transport = client._transport  # pyright: ignore[reportPrivateUsage]
        assert isinstance(transport, LeanTransport)
        quick = await transport.quick("POST", server.url, headers={}, content=b"3", timeouts=limits)
        assert quick.text == "answer"
        with pytest.raises(httpx.RemoteProtocolError, match="not idempotent"):
            await transport.quick("POST", server.url, headers={}, content=b"4", timeouts=limits)
    # each POST reached the server once: the second and fourth died with their connections
    assert [body for _, body in server.requests] == [b"1", b"2", b"3", b"4"]
    assert server.connections == 2


async def test_failures_are_httpx_errors():
    async with raw_server(answers()) as server:
        url = server.url
    async with async_client() as client:
        with pytest.raises(httpx.ConnectError, match=r"127\.0\.0\.1"):
            await client.get(url)

    async def silent(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        await reader.read()

    async with raw_server(silent) as server, async_client(timeout=0.2) as client:
        with pytest.raises(httpx.ReadTimeout):
            await client.get(server.url)

    cut = b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nabc"

    async with raw_server(answers_then_closes(cut)) as server, async_client() as client:
        with pytest.raises(httpx.RemoteProtocolError, match="mid-answer"):
            await client.get(server.url)


async def test_the_pool_caps_connections_per_origin_and_times_out_waiting():
    gate = asyncio.Event()

    async def slow(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while await server.read_request(reader):
            await gate.wait()
            writer.write(ok(b"done"))
            await writer.drain()

    async with raw_server(slow) as server:
        async with async_client(max_connections=1, timeout=5.0) as client:
            calls = [asyncio.ensure_future(client.get(server.url)) for _ in range(3)]
            await asyncio.sleep(0.1)
            assert server.connections == 1 and len(server.requests) == 1
            gate.set()
            assert [r.text for r in await asyncio.gather(*calls)] == ["done"] * 3
        assert server.connections == 1
        gate.clear()
        timeout = httpx.Timeout(5.0, pool=0.1)
        async with async_client(max_connections=1, timeout=timeout) as client:
            held = asyncio.ensure_future(client.get(server.url))
            await asyncio.sleep(0.05)
            with pytest.raises(httpx.PoolTimeout):
                await client.get(server.url)
            gate.set()
            assert (await held).text == "done"


async def test_other_schemes_go_to_the_fallback_transport():
    seen: list[str] = []

    def answer(request: httpx.Request) -> httpx.Response:
        seen.append(str(request.url))
        return httpx.Response(200, text="from the fallback")

    transport = LeanTransport(max_connections=4, fallback=lambda: httpx.MockTransport(answer))
    async with httpx.AsyncClient(transport=transport) as client:
        response = await client.get("https://models.example/v1/models")
    assert response.text == "from the fallback"
    assert seen == ["https://models.example/v1/models"]


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_works_on_uvloop():
    import uvloop

    async def main() -> None:
        async with raw_server(answers(ok(b"1"), ok(b"2"))) as server, async_client() as client:
            assert [(await client.get(server.url)).text for _ in range(2)] == ["1", "2"]
        assert server.connections == 1

    uvloop.run(main())


async def test_quick_exchanges_skip_the_client_layer_and_decode_the_body():
    replies = [ok(gzip.compress(b'{"a":1}'), b"content-encoding: gzip\r\n"), ok(b"plain")]
    async with raw_server(answers(*replies)) as server, async_client() as client:
        transport = client._transport  # pyright: ignore[reportPrivateUsage]
        assert isinstance(transport, LeanTransport)
        limits = httpx.Timeout(5.0).as_dict()
        first = await transport.quick(
            "POST", server.url, headers={"x-k": "v"}, content=b"{}", timeouts=limits
        )
        assert (first.status_code, first.json()) == (200, {"a": 1})
        assert "content-encoding" not in first.headers  # decoded here, not again by httpx
        second = await transport.quick("GET", f"{base(server)}/r?x=2", headers={}, timeouts=limits)
        assert second.text == "plain"
    assert server.connections == 1
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n") and body == b"{}"
    assert b"\r\nx-k: v\r\n" in head and b"\r\naccept-encoding: identity\r\n" in head
    assert server.requests[1][0].startswith(b"GET /r?x=2 HTTP/1.1\r\n")
    assert b"content-length" not in server.requests[1][0]


async def test_post_json_sends_one_json_call_on_shared_connections():
    error = b"HTTP/1.1 429 Too Many Requests\r\ncontent-length: 9\r\n\r\nslow down"
    replies = [ok(b'{"choices":[1]}'), ok(b'{"n":2}'), error, ok(b"not json")]
    async with raw_server(answers(*replies)) as server:
        try:
            first = await post_json(server.url, {"q": "é"}, headers={"authorization": "Bearer k"})
            assert first == {"choices": [1]}
            assert await post_json(server.url, [1, 2]) == {"n": 2}
            with pytest.raises(httpx.HTTPStatusError, match="answered 429: slow down") as failed:
                await post_json(server.url, {})
            assert failed.value.response.status_code == 429
            with pytest.raises(ValueError):
                await post_json(server.url, {})
        finally:
            await aclose_shared_transport()
    assert server.connections == 1  # the running loop's pooled connection, kept alive
    head, body = server.requests[0]
    assert head.startswith(b"POST /v1/chat/completions HTTP/1.1\r\n")
    assert b"\r\ncontent-type: application/json\r\n" in head
    assert b"\r\nauthorization: Bearer k\r\n" in head
    assert body == '{"q":"é"}'.encode()


async def test_post_json_takes_other_urls_through_the_shared_pool(
    monkeypatch: pytest.MonkeyPatch,
):
    # what an https URL gets: the shared transport's pooled fallback, no client per call
    pooled = httpx.AsyncHTTPTransport()
    monkeypatch.setattr("osmosis_ai.rollout.http.shared_transport", lambda: pooled)
    error = b"HTTP/1.1 500 Internal Server Error\r\ncontent-length: 4\r\n\r\noops"
    async with raw_server(answers(ok(b'{"a":1}'), error)) as server:
        try:
            assert await post_json(server.url, {"q": 1}, headers={"x-k": "v"}) == {"a": 1}
            with pytest.raises(httpx.HTTPStatusError, match="answered 500: oops"):
                await post_json(server.url, {})
        finally:
            await pooled.aclose()
    assert server.connections == 1
    head, body = server.requests[0]
    assert b"\r\nx-k: v\r\n" in head.lower() and body == b'{"q":1}'


async def test_cookies_are_still_kept_when_an_answer_sets_them():
    replies = [ok(b"plain"), ok(b"sets", b"set-cookie: session=abc; Path=/\r\n"), ok(b"sent")]
    async with raw_server(answers(*replies)) as server, async_client() as client:
        await client.get(server.url)
        assert not client.cookies
        await client.get(server.url)
        assert client.cookies.get("session") == "abc"
        await client.get(server.url)
    assert b"\r\ncookie: session=abc\r\n" in server.requests[2][0].lower()


async def test_rollout_client_skips_the_client_layer_only_when_it_adds_nothing():
    status = ok(b'{"rollout_id":"r1","status":"running"}')
    seen: list[str] = []

    async def hook(request: httpx.Request) -> None:
        seen.append(request.url.path)

    async with raw_server(answers(status, status)) as server:
        async with async_client() as plain:
            answer = await RolloutClient(base(server), api_key="k", http_client=plain).status("r1")
            assert answer.status.value == "running"
        async with async_client(event_hooks={"request": [hook]}) as hooked:
            await RolloutClient(base(server), http_client=hooked).status("r1")
    assert seen == ["/rollout/r1/status"]  # the hooked client went through httpx
    quick, layered = (head.lower() for head, _ in server.requests)
    assert b"\r\naccept-encoding: identity\r\n" in quick
    assert b"\r\nauthorization: bearer k\r\n" in quick
    assert b"\r\naccept-encoding: identity\r\n" not in layered


@pytest.mark.parametrize(
    ("url", "expected"),
    [
        (
            "http://127.0.0.1:8000/rollout/a%2Fb/result",
            ("127.0.0.1", 8000, "/rollout/a%2Fb/result"),
        ),
        ("http://h", ("h", 80, "/")),
        ("http://h?x=1#top", ("h", 80, "/?x=1")),
        ("http://user:pw@h:81/p#f", ("h", 81, "/p")),
        ("http://[::1]:9/v1", ("::1", 9, "/v1")),
        ("HTTP://H:82/", ("h", 82, "/")),
    ],
)
def test_split_url_parses_the_origin_and_keeps_the_target(
    url: str, expected: tuple[str, int, str]
) -> None:
    host, port, target, authority = split_url(url)
    assert (host, port, target) == expected
    assert "@" not in authority


@pytest.mark.parametrize("url", ["https://h/x", "ftp://h", "http:///x", "h:80/x", "http://h:x/"])
def test_split_url_refuses_anything_but_http_with_a_host(url: str) -> None:
    with pytest.raises(UsageError, match="is not an http:// URL with a host"):
        split_url(url)


@pytest.mark.parametrize(
    "url",
    [
        "http://h/rollout\n",
        "http://h/a b",
        "http://h/\r\nx-injected: 1",
        "http://h/\x00",
        "http://h/é",
        "http://user:s3cret@h/x\n",
    ],
)
def test_split_url_refuses_what_cannot_be_a_request_target(url: str) -> None:
    with pytest.raises(UsageError, match="space, control or non-ASCII") as caught:
        split_url(url)
    assert "s3cret" not in str(caught.value)
