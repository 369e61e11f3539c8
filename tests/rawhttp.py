"""Loopback HTTP servers that write scripted bytes, for the lean HTTP/1.1 clients' tests."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncGenerator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Literal

import httpx

Handler = Callable[[asyncio.StreamReader, asyncio.StreamWriter, "RawServer"], Awaitable[None]]


@dataclass
class RawServer:
    """A loopback TCP server; each connection runs ``handler`` (which may answer many
    requests). ``requests`` holds each request's head and body, ``connections`` counts."""

    handler: Handler
    url: str = ""
    connections: int = 0
    requests: list[tuple[bytes, bytes]] = field(default_factory=list)

    @property
    def origin(self) -> str:
        return self.url.removesuffix("/v1/chat/completions")

    async def read_request(self, reader: asyncio.StreamReader) -> bool:
        try:
            head = await reader.readuntil(b"\r\n\r\n")
        except (asyncio.IncompleteReadError, ConnectionError):
            return False
        length = 0
        for line in head.split(b"\r\n"):
            if line.lower().startswith(b"content-length:"):
                length = int(line.split(b":", 1)[1])
        self.requests.append((head, await reader.readexactly(length)))
        return True


@contextlib.asynccontextmanager
async def raw_server(handler: Handler) -> AsyncGenerator[RawServer]:
    server = RawServer(handler)

    async def on_connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        server.connections += 1
        try:
            await handler(reader, writer, server)
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()

    listener = await asyncio.start_server(on_connection, "127.0.0.1", 0)
    port = listener.sockets[0].getsockname()[1]
    server.url = f"http://127.0.0.1:{port}/v1/chat/completions"
    try:
        yield server
    finally:
        listener.close()


def answers(*replies: bytes) -> Handler:
    """A keep-alive handler: the i-th request on a connection gets ``replies[i]``."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        for reply in replies:
            if not await server.read_request(reader):
                return
            writer.write(reply)
            await writer.drain()
        await reader.read()  # hold the connection open until the client closes it

    return handler


def ok(body: bytes, *extra: bytes) -> bytes:
    head = b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\n" + b"".join(extra)
    return head + b"content-length: %d\r\n\r\n%b" % (len(body), body)


def chunked(*pieces: bytes, trailer: bytes = b"") -> bytes:
    body = b"".join(b"%x\r\n%b\r\n" % (len(p), p) for p in pieces)
    head = b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\ntransfer-encoding: chunked"
    return head + b"\r\n\r\n" + body + b"0\r\n" + trailer + b"\r\n"


def streams_in_two(release: asyncio.Event) -> Handler:
    """A chunked answer: ``first`` at once, ``second`` (and the end) once ``release`` is set."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        writer.write(chunked(b"first")[: -len(b"0\r\n\r\n")])
        await writer.drain()
        await release.wait()
        writer.write(b"6\r\nsecond\r\n0\r\n\r\n")
        await writer.drain()
        await reader.read()

    return handler


async def first_connection_dies_when_idle(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
) -> None:
    """Answers ``answer``; the first connection is then closed, unannounced, once idle."""
    await server.read_request(reader)
    writer.write(ok(b"answer"))
    await writer.drain()
    if server.connections == 1:
        await server.read_request(reader)
        return
    await reader.read()


async def second_request_kills_the_connection(
    reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
) -> None:
    """Every connection answers ``answer`` once; its next request is read, then the
    connection is closed unanswered (as a server dying, or timing out an idle connection
    just as a request arrives)."""
    await server.read_request(reader)
    writer.write(ok(b"answer"))
    await writer.drain()
    await server.read_request(reader)


def first_answer_stalls(start: bytes, then: bytes) -> Handler:
    """The first connection gets ``start`` (a head and part of its body) and nothing more;
    later connections get ``ok(then)``."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        writer.write(start if server.connections == 1 else ok(then))
        await writer.drain()
        await reader.read()

    return handler


def answers_then_closes(reply: bytes) -> Handler:
    """Writes ``reply`` to the first request, then closes the connection."""

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        await server.read_request(reader)
        writer.write(reply)
        await writer.drain()

    return handler


Lost = Literal["before", "after"]


_ALREADY_REGISTERED = b'{"detail":"rollout_id is already registered"}'


def forwards_to(
    upstream: str, lose: Callable[[bytes], Lost | None], *, replays: bool = True
) -> Handler:
    """A keep-alive front for the real server at ``upstream``: each request is forwarded
    and its answer relayed, except where ``lose(request head)`` says to close the client's
    connection unanswered, ``"before"`` forwarding it (the server never saw it) or
    ``"after"`` (the server acted on it; its answer is thrown away).

    ``replays=False`` makes the front a server that does not answer a resent submit with
    its lease, as 0.3.8's: a ``POST /rollout`` whose body the server admitted before gets
    ``409`` for its rollout id, from the front itself."""
    submitted: set[bytes] = set()

    async def handler(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, server: RawServer
    ) -> None:
        async with httpx.AsyncClient(base_url=upstream) as client:
            while await server.read_request(reader):
                head, body = server.requests[-1]
                lines = head.decode("latin-1").split("\r\n")
                method, target, _ = lines[0].split(" ")
                submit = (method, target) == ("POST", "/rollout") and not replays
                if submit and body in submitted:
                    writer.write(
                        b"HTTP/1.1 409 X\r\ncontent-type: application/json\r\n"
                        b"content-length: %d\r\n\r\n%s"
                        % (len(_ALREADY_REGISTERED), _ALREADY_REGISTERED)
                    )
                    await writer.drain()
                    continue
                skip = ("host", "content-length", "connection", "accept-encoding")
                headers = [
                    (name.strip(), value.strip())
                    for name, _, value in (line.partition(":") for line in lines[1:] if line)
                    if name.strip().lower() not in skip
                ]
                lost = lose(head)
                if lost == "before":
                    return
                answer = await client.request(method, target, headers=headers, content=body)
                if submit and answer.status_code == 202:  # admitted: the id is held
                    submitted.add(body)
                if lost == "after":
                    return
                relayed = b"".join(
                    b"%s: %s\r\n" % (name.encode("latin-1"), value.encode("latin-1"))
                    for name, value in answer.headers.items()
                    if name.lower() in ("content-type", "retry-after")
                )
                writer.write(
                    b"HTTP/1.1 %d X\r\n%scontent-length: %d\r\n\r\n%s"
                    % (answer.status_code, relayed, len(answer.content), answer.content)
                )
                await writer.drain()

    return handler


def first_submit(when: Lost) -> Callable[[bytes], Lost | None]:
    """For :func:`forwards_to`: lose the first ``POST /rollout``, ``when`` forwarding it."""
    lost: list[bytes] = []

    def lose(head: bytes) -> Lost | None:
        if head.startswith(b"POST /rollout ") and not lost:
            lost.append(head)
            return when
        return None

    return lose


def submits_lost(when: Lost, count: int | None = None) -> Callable[[bytes], Lost | None]:
    """For :func:`forwards_to`: lose the first ``count`` ``POST /rollout`` forwarded (every
    one when ``None``), ``when`` forwarding them. A resend that the front answers ``409``
    itself is not forwarded, so it is not counted."""
    lost: list[bytes] = []

    def lose(head: bytes) -> Lost | None:
        if head.startswith(b"POST /rollout ") and (count is None or len(lost) < count):
            lost.append(head)
            return when
        return None

    return lose


def submitted_ids(server: RawServer) -> list[str]:
    """The ``rollout_id`` of each ``POST /rollout`` that reached ``server``, resends included,
    in the order they arrived."""
    return [
        json.loads(body)["rollout_id"]
        for head, body in server.requests
        if head.startswith(b"POST /rollout ")
    ]


def cancelled_ids(server: RawServer) -> list[str]:
    """The ids named by each ``POST /rollout/cancel`` that reached ``server``."""
    return [
        rollout_id
        for head, body in server.requests
        if head.startswith(b"POST /rollout/cancel ")
        for rollout_id in json.loads(body).get("ids") or []
    ]
