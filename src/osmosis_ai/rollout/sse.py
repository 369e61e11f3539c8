"""Server-sent events: the one parser of ``text/event-stream`` bodies in the package.

:class:`SSEDecoder` is fed the body as it arrives and hands back each complete event as an
``(event type, data)`` pair of bytes: the policy proxy reads an upstream's stream with it,
and the rollout's OpenAI client reads a recorded reply with :func:`sse_events`. It sits on
the proxy's streaming path, so it works on bytes and keeps the common case (one ``data:``
line per event, ``\\n`` line ends) cheap.

Per the SSE format: lines end in ``\\n`` or ``\\r\\n`` (a lone ``\\r`` is not a line end
here: no OpenAI-compatible server sends one); a blank line ends an event; ``data:`` lines
of one event are joined with ``\\n``; one space after the colon is dropped; ``event:`` names
the event (``b""`` when absent); comments (``:``), ``id:``, ``retry:`` and unknown fields are
ignored; an event without data is not dispatched.
"""

from __future__ import annotations

from collections.abc import Sequence

__all__ = ["SSEDecoder", "SSEEvent", "sse_events"]

SSEEvent = tuple[bytes, bytes]
"""``(event type, data)``; the type is ``b""`` for a plain ``data:`` event."""

_NONE: tuple[SSEEvent, ...] = ()  # what feed() answers for a chunk that ends no line


class SSEDecoder:
    """An incremental SSE parser: :meth:`feed` each chunk of the body in order, then
    :meth:`flush` once at its end for an event the server did not close with a blank line."""

    __slots__ = ("_buffer", "_data", "_event")

    def __init__(self) -> None:
        self._buffer = b""
        self._data: list[bytes] = []
        self._event = b""

    def feed(self, chunk: bytes) -> Sequence[SSEEvent]:
        """The events that ``chunk`` completes, in order (often none)."""
        end = chunk.find(b"\n")
        if end < 0:
            self._buffer += chunk
            return _NONE
        if self._buffer:  # the buffer never holds a line end
            end += len(self._buffer)
            text = self._buffer + chunk
        else:
            text = chunk
        if (  # one whole data line and its blank line: the usual read of a streamed completion
            end == len(text) - 2
            and text[-1] == 10
            and text[end - 1] != 13
            and text.startswith(b"data: ")
            and not self._data
        ):
            event, self._event, self._buffer = self._event, b"", b""
            return [(event, text[6:end])]
        *lines, self._buffer = text.split(b"\n")
        events: list[SSEEvent] = []
        data = self._data
        event = self._event
        for line in lines:
            if line.endswith(b"\r"):
                line = line[:-1]  # noqa: PLW2901
            if line:
                if line.startswith(b"data:"):
                    data.append(line[6:] if line.startswith(b"data: ") else line[5:])
                elif line.startswith(b"event:"):
                    event = line[7:] if line.startswith(b"event: ") else line[6:]
                continue
            if data:
                events.append((event, b"\n".join(data)))
                data = []
            event = b""
        self._data = data
        self._event = event
        return events

    def flush(self) -> Sequence[SSEEvent]:
        """The event left open when the body ended without its blank line, if any."""
        rest, self._buffer = self._buffer, b""
        if not (rest or self._data):
            return _NONE
        events = self.feed(rest + b"\n\n")
        self._data = []
        self._event = b""
        return events


def sse_events(body: bytes) -> list[SSEEvent]:
    """Every event of a whole ``text/event-stream`` body, the last one closed or not."""
    decoder = SSEDecoder()
    return [*decoder.feed(body), *decoder.flush()]
