"""The wire between the trainer and its rollout I/O process: pickled tuples over one end of
a Unix socket pair, each ``(kind, *fields)``.

Both processes are ours and started together, so pickle is safe here and cheaper than any
text encoding. Each message is framed by its length; sends are whole messages under a lock
(several threads send); one thread per process receives. A closed peer reads as
:class:`EOFError`. Messages that arise together travel as one ``("many", [...])`` burst.

Why not ``multiprocessing.connection``: the I/O process reads on its event loop, and uvloop
makes the socket it watches non-blocking, where a ``Connection`` fails on a message that has
only partly arrived; this framing keeps partial reads in its buffer. ``bench/channel.py``, on
the messages of a real training run: same speed (ours / ``Connection`` 0.91-1.05, about
60 us a rollout), and with the I/O end non-blocking ``Connection`` failed 30 of 36 replays,
ours none.

Messages, trainer to I/O process:
    ``("start", StartSpec)``, ``("serve", ServeSpec)``, ``("launch", batch, requests)``,
    ``("abandon", batch)``, ``("answer", call, answer, error)``, ``("servers", urls)``,
    ``("close",)``
I/O process to trainer:
    ``("spawned", pid, port, instance_id)``, ``("started", generation, port)``,
    ``("chat", call, body, chunks)``, ``("count", call, body, False)``, ``("callers", count)``,
    ``("outcome", batch, index, outcome)``, ``("done", batch)``,
    ``("failed", batch, message)``, ``("abandoned", batch)``, ``("fatal", message, error or None)``,
    ``("fleet", event, name, detail)`` (a fleet server ``joined``, ``left`` or ``died``)
"""

from __future__ import annotations

import contextlib
import pickle
import select
import socket
import struct
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

FD_ENV = "_OSMOSIS_TRAIN_IO_FD"
_HEADER = struct.Struct("<I")  # each message: its pickle's length, then the pickle
_READ_BYTES = 1 << 18


@dataclass(frozen=True)
class StartSpec:
    """What the I/O process starts: the rollout server and the controller service.

    ``servers``: rollout servers already running elsewhere (a fleet on a cluster) to balance
    over instead of starting one; ``host``: the address the controller service binds and
    hands to them (an address they can reach)."""

    rollout_dir: Path
    entrypoint: Path
    artifact_root: Path
    env: dict[str, str]
    port: int | None
    proxy_token: str
    controller_token: str
    temperature: float
    top_p: float
    max_tokens: int
    servers: tuple[str, ...] = ()
    host: str = "127.0.0.1"


@dataclass(frozen=True)
class ServeSpec:
    """The policy the proxy serves: the trainer's local policy (``base_url`` ``None``: its
    calls come back over the channel), or an OpenAI-compatible server such as vLLM."""

    model: str
    base_url: str | None = None
    api_key: str | None = field(default=None, repr=False)


@dataclass(frozen=True)
class CallError:
    """Why the trainer's policy did not answer a call: an HTTP status and message."""

    status: int
    message: str
    kind: str  # the OpenAI error type: invalid_request_error, server_error


class Channel:
    """One end of the socket pair. :meth:`send` from any thread; read with :meth:`recv`
    (blocking) or :meth:`drain` (what has arrived, for an event loop's reader callback),
    from one thread. A message sent as ``("many", [message, ...])`` is a burst of several:
    :func:`unpack` yields them in order."""

    def __init__(self, sock: socket.socket) -> None:
        self._sock = sock
        self._lock = threading.Lock()
        self._buffer = bytearray()

    @classmethod
    def pair(cls) -> tuple[Channel, socket.socket]:
        """Our end, and the other end's socket to hand to the child (``pass_fds``)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        return cls(ours), theirs

    @classmethod
    def from_fd(cls, fd: int) -> Channel:
        return cls(socket.socket(fileno=fd))

    def send(self, *message: Any) -> None:
        """Send ``message`` whole, waiting for room in the socket; raises :class:`OSError`
        once the peer is gone."""
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        frame = memoryview(_HEADER.pack(len(data)) + data)
        with self._lock:
            sent = 0
            while sent < len(frame):
                try:
                    sent += self._sock.send(frame[sent:])
                except BlockingIOError:  # a full socket that a loop made non-blocking
                    self._wait(select.POLLOUT)

    def recv(self) -> tuple[Any, ...]:
        """The next message (blocking); :class:`EOFError` once the peer closed its end."""
        while True:
            message = self._frame()
            if message is not None:
                return message
            try:
                chunk = self._sock.recv(_READ_BYTES)
            except BlockingIOError:
                self._wait(select.POLLIN)
                continue
            if not chunk:
                raise EOFError("the other end of the channel closed")
            self._buffer += chunk

    def _wait(self, event: int) -> None:
        """Block until the socket is ready for ``event``. An event loop watching the socket
        makes it non-blocking (uvloop does, in the I/O process), yet a send or a
        :meth:`recv` must still wait, not fail halfway through a message."""
        poller = select.poll()
        poller.register(self._sock, event)
        poller.poll()

    def drain(self) -> list[tuple[Any, ...]]:
        """Every message that has arrived, without blocking; :class:`EOFError` once the peer
        closed its end and nothing is left."""
        while True:
            try:
                chunk = self._sock.recv(_READ_BYTES, socket.MSG_DONTWAIT)
            except BlockingIOError:
                break
            if not chunk:
                if not self._buffer:
                    raise EOFError("the other end of the channel closed")
                break
            self._buffer += chunk
            if len(chunk) < _READ_BYTES:
                break
        messages: list[tuple[Any, ...]] = []
        while (message := self._frame()) is not None:
            messages.append(message)
        return messages

    def _frame(self) -> tuple[Any, ...] | None:
        buffer = self._buffer
        if len(buffer) < _HEADER.size:
            return None
        (size,) = _HEADER.unpack_from(buffer)
        end = _HEADER.size + size
        if len(buffer) < end:
            return None
        view = memoryview(buffer)
        try:
            part = view[_HEADER.size : end]
            try:
                message: tuple[Any, ...] = pickle.loads(part)
            finally:
                part.release()
        finally:
            view.release()  # (the buffer cannot shrink while a view of it exists)
        del buffer[:end]
        return message

    def fileno(self) -> int:
        return self._sock.fileno()

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()


def unpack(message: tuple[Any, ...]) -> list[tuple[Any, ...]]:
    """The messages a received one stands for (a ``many`` burst, or itself)."""
    return list(message[1]) if message[0] == "many" else [message]
