"""The package's one server-sent-events parser: fed whole, in pieces, or byte by byte."""

from __future__ import annotations

import random

import pytest

from osmosis_ai.rollout.sse import SSEDecoder, sse_events

STREAM = (
    b": keep-alive\r\n\r\n"
    b'data: {"a":\r\n'
    b"data: 1}\r\n\r\n"
    b"id: 7\nretry: 10\n"
    b'data:{"b":2}\n\n'
    b"event: error\n"
    b'data: {"error": {"message": "overloaded"}}\n\n'
    b"event:ping\n\n"
    b"data: [DONE]\n\n"
)
EVENTS = [
    (b"", b'{"a":\n1}'),
    (b"", b'{"b":2}'),
    (b"error", b'{"error": {"message": "overloaded"}}'),
    (b"", b"[DONE]"),
]


def fed(parts: list[bytes]) -> list[tuple[bytes, bytes]]:
    decoder = SSEDecoder()
    events = [event for part in parts for event in decoder.feed(part)]
    return [*events, *decoder.flush()]


def test_a_whole_body_gives_every_event_in_order():
    assert sse_events(STREAM) == EVENTS


@pytest.mark.parametrize("size", [1, 2, 3, 5, 8, 13, 64])
def test_any_split_of_the_body_gives_the_same_events(size: int):
    parts = [STREAM[i : i + size] for i in range(0, len(STREAM), size)]
    assert fed(parts) == EVENTS


def test_random_splits_agree_with_the_whole_body():
    chunk = b'data: {"choices":[{"delta":{"content":"tok"}}]}\n\n'
    body = b"".join([chunk, b"event: error\n", chunk, b"data: a\r\ndata: b\r\n\r\n"] * 20)
    whole = sse_events(body)
    assert len(whole) == 60
    rng = random.Random(7)
    for _ in range(200):
        cuts = sorted(rng.sample(range(1, len(body)), rng.randint(1, 40)))
        parts = [body[a:b] for a, b in zip([0, *cuts], [*cuts, len(body)], strict=True)]
        assert fed(parts) == whole


def test_an_event_name_read_earlier_applies_to_a_whole_data_read():
    decoder = SSEDecoder()
    assert not decoder.feed(b"event: error\n")
    assert decoder.feed(b'data: {"x":1}\n\n') == [(b"error", b'{"x":1}')]
    assert decoder.feed(b"data: next\n\n") == [(b"", b"next")]


def test_a_whole_data_read_after_a_pending_line_joins_it():
    decoder = SSEDecoder()
    assert not decoder.feed(b"data: first\n")
    assert decoder.feed(b"data: second\n\n") == [(b"", b"first\nsecond")]


def test_crlf_line_ends_are_not_part_of_the_data():
    assert sse_events(b"data: x\r\n\r\n") == [(b"", b"x")]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: y\r\n\n") == [(b"", b"y")]


def test_only_one_space_after_the_colon_is_dropped():
    assert sse_events(b"data:  two\n\ndata:none\n\nevent:  e\ndata: z\n\n") == [
        (b"", b" two"),
        (b"", b"none"),
        (b" e", b"z"),
    ]


def test_an_event_without_data_is_not_dispatched_and_resets_the_name():
    assert sse_events(b"event: error\n\ndata: ok\n\n") == [(b"", b"ok")]
    assert sse_events(b": comment only\n\n\n\n") == []


def test_flush_closes_an_event_the_server_left_open():
    assert sse_events(b'data: {"x":1}\n\ndata: {"y":2}') == [(b"", b'{"x":1}'), (b"", b'{"y":2}')]
    assert sse_events(b"data: a\ndata: b\n") == [(b"", b"a\nb")]
    assert sse_events(b"data: a\n\n: trailing comment") == [(b"", b"a")]
    decoder = SSEDecoder()
    assert decoder.feed(b"data: a\n\n") == [(b"", b"a")]
    assert not decoder.flush()
    assert not decoder.flush()


def test_a_line_cut_inside_its_line_end_still_ends_there():
    assert fed([b"data: a\r", b"\n\r", b"\n"]) == [(b"", b"a")]
    assert fed([b"data: a", b"\n", b"\n"]) == [(b"", b"a")]
