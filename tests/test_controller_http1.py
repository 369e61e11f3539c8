"""The upstream transports against real loopback servers that write scripted bytes.

``Http1Transport`` (plain http) is checked on framing, keep-alive, the pool and failures;
behaviour both transports share runs against ``HttpxTransport`` too.
"""

from __future__ import annotations

import asyncio
import gzip
import importlib.util
import zlib

import pytest

from osmosis_ai.controller import UpstreamConnectionError
from osmosis_ai.controller.http1 import Http1Transport
from osmosis_ai.controller.transport import HttpxTransport, Transport, open_transport
from osmosis_ai.errors import UsageError
from rawhttp import (
    RawServer,
    answers,
    answers_then_closes,
    chunked,
    first_answer_stalls,
    first_connection_dies_when_idle,
    ok,
    raw_server,
    streams_in_two,
)

HAS_UVLOOP = importlib.util.find_spec("uvloop") is not None
HEADERS = {"content-type": "application/json", "authorization": "Bearer k"}


def http1(url: str, *, timeout: float = 5.0, max_connections: int = 8) -> Http1Transport:
    return Http1Transport(
        url, HEADERS, timeout=timeout, connect_timeout=2.0, max_connections=max_connections
    )


def transports(url: str) -> list[Transport]:
    options = {"timeout": 5.0, "connect_timeout": 2.0, "max_connections": 8}
    return [Http1Transport(url, HEADERS, **options), HttpxTransport(url, HEADERS, **options)]


async def read_once(transport: Transport) -> bytes:
    return await (await transport.post(b"{}")).read()


# -- what both transports share --------------------------------------------------------------


@pytest.mark.parametrize("kind", ["http1", "httpx"])
async def test_posts_the_body_and_reads_the_answer_on_one_kept_alive_connection(kind: str):
    replies = [ok(b'{"n":%d}' % i) for i in range(3)]
    async with raw_server(answers(*replies)) as server:
        transport = transports(server.url)[kind == "httpx"]
        try:
            for i in range(3):
                answer = await transport.post(b'{"q":%d}' % i)
                assert (answer.status, answer.content_type) == (200, "application/json")
                assert await answer.read() == b'{"n":%d}' % i
        finally:
            await transport.aclose()
    assert server.connections == 1
    assert [body for _, body in server.requests] == [b'{"q":0}', b'{"q":1}', b'{"q":2}']
    head = server.requests[0][0].lower()
    assert head.startswith(b"post /v1/chat/completions http/1.1\r\n")
    assert b"\r\nauthorization: bearer k\r\n" in head
    assert b"\r\ncontent-length: 7\r\n" in head


@pytest.mark.parametrize("kind", ["http1", "httpx"])
async def test_chunks_arrive_as_the_server_sends_them(kind: str):
    release = asyncio.Event()
    async with raw_server(streams_in_two(release)) as server:
        transport = transports(server.url)[kind == "httpx"]
        try:
            answer = await transport.post(b"{}")
            assert answer.content_type == "text/event-stream"
            chunks = answer.chunks()
            assert await anext(chunks) == b"first"  # before the rest was even written
            release.set()
            assert [c async for c in chunks] == [b"second"]
            await answer.aclose()
        finally:
            await transport.aclose()


async def test_a_stale_pooled_connection_is_retried_on_a_fresh_one():
    async with raw_server(first_connection_dies_when_idle) as server:
        transport = http1(server.url)
        try:
            assert await (await transport.post(b"1")).read() == b"answer"
            assert await (await transport.post(b"2")).read() == b"answer"
        finally:
            await transport.aclose()
    assert server.connections == 2


@pytest.mark.parametrize("kind", ["http1", "httpx"])
async def test_a_refused_connection_names_the_url(kind: str):
    async with raw_server(answers()) as server:
        url = server.url
    transport = transports(url)[kind == "httpx"]
    try:
        with pytest.raises(UpstreamConnectionError) as caught:
            await transport.post(b"{}")
    finally:
        await transport.aclose()
    assert url in str(caught.value)
    assert caught.value.url == url


def test_open_transport_picks_the_lean_client_for_plain_http_only():
    options = {"timeout": 1.0, "connect_timeout": 1.0, "max_connections": 1}
    assert isinstance(open_transport("http://h:1/v1", HEADERS, **options), Http1Transport)
    assert isinstance(open_transport("HTTP://h/v1", HEADERS, **options), Http1Transport)
    assert isinstance(open_transport("https://h/v1", HEADERS, **options), HttpxTransport)
    with pytest.raises(UsageError, match="http:// URL with a host"):
        Http1Transport("http:///v1", HEADERS, **options)


# -- Http1Transport: framing -----------------------------------------------------------------


async def test_chunked_framing_survives_every_split():
    reply = chunked(b"data: a\n\n", b"!", b"data: [DONE]\n\n", trailer=b"x-trailer: 1\r\n")
    reply = reply.replace(b"1\r\n!", b"1;ext=1\r\n!", 1)  # a chunk extension

    for size in (1, 2, 3, 5, 8, 13, len(reply)):

        async def handler(
            reader: asyncio.StreamReader,
            writer: asyncio.StreamWriter,
            server: RawServer,
            size: int = size,
        ) -> None:
            while await server.read_request(reader):
                for start in range(0, len(reply), size):
                    writer.write(reply[start : start + size])
                    await writer.drain()
                    await asyncio.sleep(0)

        async with raw_server(handler) as server:
            transport = http1(server.url)
            try:
                for _ in range(2):  # the connection is reusable after each answer
                    answer = await transport.post(b"{}")
                    body = b"".join([c async for c in answer.chunks()])
                    assert body == b"data: a\n\n!data: [DONE]\n\n", size
            finally:
                await transport.aclose()
        assert server.connections == 1


async def test_interim_answers_are_skipped_and_bodies_decoded():
    squeezed = gzip.compress(b'{"zipped":true}')
    deflated = zlib.compress(b'{"deflated":true}')
    replies = (
        b"HTTP/1.1 100 Continue\r\n\r\n" + ok(b"{}"),
        ok(squeezed, b"content-encoding: gzip\r\n"),
        ok(deflated, b"content-encoding: deflate\r\n"),
        b"HTTP/1.1 204 No Content\r\n\r\n",
    )
    async with raw_server(answers(*replies)) as server:
        transport = http1(server.url)
        try:
            bodies = [await (await transport.post(b"{}")).read() for _ in replies]
        finally:
            await transport.aclose()
    assert bodies == [b"{}", b'{"zipped":true}', b'{"deflated":true}', b""]
    assert server.connections == 1
    assert b"\r\naccept-encoding: identity\r\n" in server.requests[0][0]


async def test_a_body_read_to_close_and_connection_close_are_not_reused():
    replies = (
        b'HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n\r\n{"until":"close"}',
        ok(b"{}", b"connection: close\r\n"),
        ok(b"third"),
    )

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        writer.write(replies[server.connections - 1])
        await writer.drain()

    async with raw_server(handler) as server:
        transport = http1(server.url)
        try:
            assert await (await transport.post(b"{}")).read() == b'{"until":"close"}'
            assert await (await transport.post(b"{}")).read() == b"{}"
            assert await (await transport.post(b"{}")).read() == b"third"
        finally:
            await transport.aclose()
    assert server.connections == 3


@pytest.mark.parametrize(
    ("reply", "message"),
    [
        (b"SPDY/3 200 OK\r\n\r\n", "malformed answer: .*at b'SPDY/3 200 OK'"),
        (b"HTTP/1.1 200 OK\r\nbroken header\r\n\r\n", "at b'broken header'"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: ten\r\n\r\n", "at b'content-length: ten'"),
        (b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\nzz\r\n", "chunk size"),
        (b"HTTP/1.1 200 OK\r\ncontent-encoding: br\r\ncontent-length: 0\r\n\r\n", "br"),
        (b"HTTP/1.1 200 OK\r\ncontent-length: 10\r\n\r\nshort", "closed the connection"),
        (b"", "closed the connection before answering"),
    ],
)
async def test_malformed_or_cut_answers_are_connection_errors(reply: bytes, message: str):
    async with raw_server(answers_then_closes(reply)) as server:
        transport = http1(server.url)
        try:
            with pytest.raises(UpstreamConnectionError, match=message) as caught:
                await read_once(transport)
        finally:
            await transport.aclose()
    assert server.url in str(caught.value)


async def test_a_silent_server_times_out():
    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        writer.write(b"HTTP/1.1 200 OK\r\ncontent-length: 5\r\n\r\nab")
        await writer.drain()
        await reader.read()

    async with raw_server(handler) as server:
        transport = http1(server.url, timeout=0.2)
        try:
            answer = await transport.post(b"{}")
            with pytest.raises(UpstreamConnectionError, match="timed out"):
                await answer.read()
        finally:
            await transport.aclose()


# -- Http1Transport: the pool ----------------------------------------------------------------


async def test_the_pool_caps_connections_and_hands_them_over():
    async with raw_server(answers(*[ok(b"%d" % i) for i in range(6)])) as server:
        transport = http1(server.url, max_connections=1)
        try:

            async def call() -> bytes:
                return await (await transport.post(b"{}")).read()

            bodies = await asyncio.gather(*(call() for _ in range(6)))
        finally:
            await transport.aclose()
    assert sorted(bodies) == [b"%d" % i for i in range(6)]
    assert server.connections == 1


async def test_a_cancelled_call_frees_its_connection():
    never_ends = b"HTTP/1.1 200 OK\r\ncontent-length: 100\r\n\r\nstart"
    async with raw_server(first_answer_stalls(never_ends, b"second")) as server:
        transport = http1(server.url, max_connections=1)
        try:
            answer = await transport.post(b"{}")
            reading = asyncio.create_task(answer.read())
            await asyncio.sleep(0.05)
            reading.cancel()
            with pytest.raises(asyncio.CancelledError):
                await reading
            assert await (await transport.post(b"{}")).read() == b"second"
        finally:
            await transport.aclose()
    assert server.connections == 2


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is not installed")
def test_works_on_uvloop():
    import uvloop

    async def main() -> list[bytes]:
        async with raw_server(answers(ok(b"one"), chunked(b"two"))) as server:
            transport = http1(server.url)
            try:
                first = await (await transport.post(b"{}")).read()
                second = b"".join([c async for c in (await transport.post(b"{}")).chunks()])
            finally:
                await transport.aclose()
        return [first, second]

    assert uvloop.run(main()) == [b"one", b"two"]
