"""The wire rules of the lean HTTP/1.1 client (``rollout/http1.py``), against raw-socket
servers on 127.0.0.1 that send the bytes in each table row: how answers are framed and
when a connection is reused, which answers are refused (always as the module's
``RemoteProtocolError``, naming the bytes at fault), which outgoing headers are refused
before a byte is sent, and the write timeout."""

from __future__ import annotations

import asyncio

import httpx
import pytest

from osmosis_ai.controller import UpstreamConnectionError
from osmosis_ai.controller.http1 import Http1Transport
from osmosis_ai.controller.transport import HttpxTransport
from osmosis_ai.errors import UsageError
from osmosis_ai.rollout.http import async_client
from osmosis_ai.rollout.http1 import LeanTransport, RemoteProtocolError
from rawhttp import (
    Handler,
    RawServer,
    answers_then_closes,
    chunked,
    ok,
    raw_server,
    second_request_kills_the_connection,
)

HEAD_200 = b"HTTP/1.1 200 OK\r\n"
TWO_CHUNKS = b"2\r\nab\r\n1\r\nc\r\n0\r\n\r\n"


def every_request_gets(reply: bytes) -> Handler:
    """Each request on each connection gets ``reply``, until the client hangs up."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        while await server.read_request(reader):
            writer.write(reply)
            await writer.drain()

    return handler


# -- answers that are read: the body, and whether the connection is kept ----------------------

FRAMED = [
    pytest.param(ok(b"abc"), b"abc", True, id="content-length"),
    pytest.param(chunked(b"ab", b"c"), b"abc", True, id="chunked"),
    pytest.param(
        HEAD_200 + b"content-length: 3\r\ntransfer-encoding: chunked\r\n\r\n" + TWO_CHUNKS,
        b"abc",
        False,
        id="content-length-and-chunked-read-as-chunked-then-closed",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: chunked\r\ncontent-length: 99\r\n\r\n" + TWO_CHUNKS,
        b"abc",
        False,
        id="chunked-and-content-length-read-as-chunked-then-closed",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: Chunked\r\n\r\n" + TWO_CHUNKS,
        b"abc",
        True,
        id="chunked-in-any-case",
    ),
    pytest.param(ok(b"ab") + b"surplus", b"ab", False, id="bytes-after-the-answer"),
    pytest.param(ok(b"ab") + ok(b"cd"), b"ab", False, id="a-second-answer-unasked"),
    pytest.param(ok(b"ab", b"connection: close\r\n"), b"ab", False, id="connection-close"),
    pytest.param(b"HTTP/1.0 200 OK\r\ncontent-length: 2\r\n\r\nab", b"ab", False, id="http-1.0"),
    pytest.param(
        b"HTTP/1.1 100 Continue\r\n\r\nHTTP/1.1 103 Early Hints\r\nlink: </a>\r\n\r\n" + ok(b"ab"),
        b"ab",
        True,
        id="interim-answers-skipped",
    ),
    pytest.param(
        b"HTTP/1.1 204 No Content\r\ncontent-length: 5\r\n\r\n", b"", True, id="204-has-no-body"
    ),
]


@pytest.mark.parametrize(("reply", "body", "kept"), FRAMED)
async def test_answers_are_framed_and_connections_kept_only_when_safe(
    reply: bytes, body: bytes, kept: bool
):
    async with raw_server(every_request_gets(reply)) as server, async_client() as client:
        for _ in range(2):
            response = await client.get(server.url)
            assert response.content == body
    assert server.connections == (1 if kept else 2)


# -- answers that are refused ----------------------------------------------------------------

MALFORMED = [
    pytest.param(
        HEAD_200 + b"transfer-encoding: gzip, chunked\r\n\r\n" + TWO_CHUNKS,
        r"unsupported transfer-encoding 'gzip, chunked'",
        id="gzip-then-chunked",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: gzip\r\ntransfer-encoding: chunked\r\n\r\n" + TWO_CHUNKS,
        r"unsupported transfer-encoding 'gzip,chunked'",
        id="codings-on-two-lines",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: notchunked\r\n\r\n" + TWO_CHUNKS,
        r"unsupported transfer-encoding 'notchunked'",
        id="notchunked-is-not-chunked",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: chunked, gzip\r\n\r\n" + TWO_CHUNKS,
        r"unsupported transfer-encoding 'chunked, gzip'",
        id="chunked-not-last",
    ),
    pytest.param(
        HEAD_200 + "content-length: ١٢\r\n\r\nab".encode(),
        r"Content-Length \(at b'content-length: \\xd9\\xa1\\xd9\\xa2'\)",
        id="non-ascii-content-length",
    ),
    pytest.param(
        HEAD_200 + b"content-length: ten\r\n\r\nab",
        r"Content-Length \(at b'content-length: ten'\)",
        id="word-content-length",
    ),
    pytest.param(
        HEAD_200 + b"content-length: +2\r\n\r\nab",
        r"at b'content-length: \+2'",
        id="signed-content-length",
    ),
    pytest.param(
        HEAD_200 + b"content-length: 2, 2\r\n\r\nab",
        r"at b'content-length: 2, 2'",
        id="listed-content-length",
    ),
    pytest.param(
        HEAD_200 + b"content-length: 2\r\ncontent-length: 3\r\n\r\nab",
        r"Duplicate Content-Length \(at b'content-length: 3'\)",
        id="two-content-lengths",
    ),
    pytest.param(
        HEAD_200 + b"content-length: 99999999999999999999999\r\n\r\n",
        r"overflow \(at b'content-length: 9+'\)",
        id="content-length-overflow",
    ),
    pytest.param(
        b"HTTP/1.1 000 Zero\r\ncontent-length: 0\r\n\r\n", r"status 0 is outside", id="status-0"
    ),
    pytest.param(
        b"HTTP/1.1 600 Six\r\ncontent-length: 0\r\n\r\n", r"status 600 is outside", id="600"
    ),
    pytest.param(
        b"HTTP/1.1 999 Nine\r\ncontent-length: 0\r\n\r\n", r"status 999 is outside", id="999"
    ),
    pytest.param(
        b"HTTP/1.1 99 Two digits\r\n\r\n", r"status code \(at b'HTTP/1.1 99", id="status-99"
    ),
    pytest.param(b"HTTP/1.1 1000 Four digits\r\n\r\n", r"at b'HTTP/1.1 1000", id="status-1000"),
    pytest.param(
        b"HTTP/1.1 101 Switching Protocols\r\nupgrade: websocket\r\nconnection: upgrade\r\n\r\n",
        r"101 Switching Protocols, but no upgrade was asked for",
        id="unexpected-101",
    ),
    pytest.param(
        b"HTTP/1.1 101 Switching Protocols\r\n\r\n",
        r"101 Switching Protocols",
        id="bare-101",
    ),
    pytest.param(b"SPDY/3 200 OK\r\n\r\n", r"at b'SPDY/3 200 OK'", id="not-http"),
    pytest.param(
        HEAD_200 + b"x-a : 1\r\ncontent-length: 0\r\n\r\n",
        r"header token \(at b'x-a : 1'\)",
        id="space-before-colon",
    ),
    pytest.param(
        HEAD_200 + b"x-a: 1\r\n folded\r\ncontent-length: 0\r\n\r\n",
        r"whitespace after header value \(at b' folded'\)",
        id="obsolete-line-folding",
    ),
    pytest.param(
        HEAD_200 + b"x-a: 1\x002\r\ncontent-length: 0\r\n\r\n",
        r"header value char \(at b'x-a: 1\\x002'\)",
        id="nul-in-a-header",
    ),
    pytest.param(
        HEAD_200 + b"x-a: 1\ncontent-length: 0\r\n\r\n",
        r"Missing expected CR .*\(at b'x-a: 1\\ncontent-length: 0'\)",
        id="bare-lf",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: chunked\r\n\r\nzz\r\n",
        r"chunk size \(at b'zz\\r\\n'\)",
        id="bad-chunk-size",
    ),
    pytest.param(
        HEAD_200 + b"transfer-encoding: chunked\r\n\r\n2\r\nabX\r\n",
        r"after chunk data \(at b'2\\r\\nabX",
        id="chunk-without-crlf",
    ),
    pytest.param(
        HEAD_200 + b"x-big: " + b"a" * 70_000 + b"\r\n\r\n",
        r"answer head is over 65536 bytes",
        id="head-too-large",
    ),
    pytest.param(
        HEAD_200 + b"content-length: 10\r\n\r\nshort", r"closed the connection mid-answer", id="cut"
    ),
    pytest.param(b"", r"closed the connection before answering", id="no-answer"),
]


# Content-coding is decoded by the connection only for the callers that ask it to (the quick
# exchanges and the proxy's hop); httpx decodes for itself on its own path.
BAD_CODING = [
    pytest.param(
        HEAD_200 + b"content-encoding: br\r\ncontent-length: 0\r\n\r\n",
        r"unsupported content-encoding 'br'",
        id="unknown-content-encoding",
    ),
    pytest.param(
        HEAD_200 + b"content-encoding: gzip\r\ncontent-length: 4\r\n\r\nnope",
        r"does not decompress",
        id="corrupt-gzip",
    ),
]


@pytest.mark.parametrize(
    ("reply", "message", "decoded_only"),
    [pytest.param(*row.values, False, id=row.id) for row in MALFORMED]
    + [pytest.param(*row.values, True, id=row.id) for row in BAD_CODING],
)
async def test_malformed_answers_are_remote_protocol_errors_naming_the_bytes(
    reply: bytes, message: str, decoded_only: bool
):
    async with raw_server(answers_then_closes(reply)) as server:
        async with async_client() as client:
            if not decoded_only:
                with pytest.raises(httpx.RemoteProtocolError, match=message) as caught:
                    await client.get(server.url)
                # the module's named error underneath, never a stray ValueError
                assert isinstance(caught.value.__cause__, RemoteProtocolError)
            transport = client._transport  # pyright: ignore[reportPrivateUsage]
            assert isinstance(transport, LeanTransport)
            with pytest.raises(httpx.RemoteProtocolError, match=message):
                await transport.quick(
                    "GET", server.url, headers={}, timeouts=httpx.Timeout(5).as_dict()
                )
        transport = Http1Transport(
            server.url, {}, timeout=5.0, connect_timeout=2.0, max_connections=1
        )
        try:
            with pytest.raises(UpstreamConnectionError, match=message) as upstream:
                await (await transport.post(b"{}")).read()
        finally:
            await transport.aclose()
    assert server.url in str(upstream.value)


# -- headers that are refused before sending ----------------------------------------------------

BAD_HEADERS = [
    pytest.param("authorization", "Bearer sk-s3cret\n", "ends with a line feed", id="trailing-lf"),
    pytest.param(
        "authorization", "Bearer sk-s3cret\r\n", "ends with a carriage return", id="trailing-crlf"
    ),
    pytest.param(
        "x-key", "sk-s3cret\r\nx-injected: 1", "contains a carriage return", id="injection"
    ),
    pytest.param("x-key", "sk-\x00s3cret", "contains a NUL byte", id="nul"),
    pytest.param("x-key", "sk-\x1bs3cret", "control character", id="escape"),
    pytest.param("x-key", "sk-s3cret-☃", "outside Latin-1", id="not-latin-1"),
    pytest.param("x key", "sk-s3cret", "not an HTTP token", id="space-in-name"),
    pytest.param("x-key:", "sk-s3cret", "not an HTTP token", id="colon-in-name"),
    pytest.param("x-key\n", "sk-s3cret", "not an HTTP token", id="lf-in-name"),
]


@pytest.mark.parametrize(("name", "value", "problem"), BAD_HEADERS)
async def test_headers_that_cannot_go_on_the_wire_are_refused_before_sending(
    name: str, value: str, problem: str
):
    def check(caught: pytest.ExceptionInfo[UsageError]) -> None:
        assert problem in str(caught.value)
        assert "s3cret" not in str(caught.value)  # the value is redacted
        if "name" not in problem and "token" not in problem:
            assert repr(name) in str(caught.value)

    headers = {name: value}
    async with raw_server(every_request_gets(ok(b"{}"))) as server:
        async with async_client() as client:
            if value.isascii():  # httpx itself refuses to encode the others
                with pytest.raises(UsageError) as caught:
                    await client.get(server.url, headers=headers)
                check(caught)
            transport = client._transport  # pyright: ignore[reportPrivateUsage]
            assert isinstance(transport, LeanTransport)
            with pytest.raises(UsageError) as caught:
                await transport.quick(
                    "POST", server.url, headers=headers, timeouts=httpx.Timeout(5).as_dict()
                )
            check(caught)
        for kind in (Http1Transport, HttpxTransport):
            with pytest.raises(UsageError) as caught:
                kind(server.url, headers, timeout=5.0, connect_timeout=2.0, max_connections=1)
            check(caught)
    assert server.requests == []  # nothing reached the server


# -- the write timeout -------------------------------------------------------------------------


async def test_the_write_timeout_bounds_a_server_that_takes_nothing_in():
    stop = asyncio.Event()

    async def never_reads(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await stop.wait()

    body = b"x" * (32 * 1024 * 1024)  # more than the socket buffers on both sides take in
    timeout = httpx.Timeout(30.0, write=0.2)
    async with raw_server(never_reads) as server:
        try:
            async with async_client(timeout=timeout) as client:
                with pytest.raises(httpx.WriteTimeout):
                    await client.post(server.url, content=body)
            transport = Http1Transport(
                server.url, {}, timeout=0.2, connect_timeout=2.0, max_connections=1
            )
            try:
                with pytest.raises(UpstreamConnectionError, match="WriteTimeout"):
                    await transport.post(body)
            finally:
                await transport.aclose()
        finally:
            stop.set()


async def test_the_quick_path_sends_a_post_declared_idempotent_again_on_a_fresh_connection():
    """As the worker router forwards a polling ``POST /rollout``, which its owner answers
    again as a replay."""
    limits = httpx.Timeout(5).as_dict()
    transport = LeanTransport(max_connections=4)
    async with raw_server(second_request_kills_the_connection) as server:
        try:
            first = await transport.quick(
                "POST", server.url, headers={}, content=b"1", timeouts=limits
            )
            again = await transport.quick(
                "POST", server.url, headers={}, content=b"2", timeouts=limits, idempotent=True
            )
        finally:
            await transport.aclose()
    assert (first.text, again.text) == ("answer", "answer")
    # the second went out twice: on the reused connection, which closed unanswered, then
    # on a fresh one
    assert [body for _, body in server.requests] == [b"1", b"2", b"2"]
    assert server.connections == 2
