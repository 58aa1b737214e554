"""The SSE frame parser and token extraction, as a body wrapper sees arbitrary chunking."""

from __future__ import annotations

import itertools

from hypothesis import given
from hypothesis import strategies as st

from streamjudge.instrumentation._sse import SSEFrame, SSEParser, make_token_extractor, render_sse

STREAM = (
    b"event: thread\r\ndata: {\"thread_id\": \"t1\"}\r\n\r\n"
    b": keep-alive\r\n\r\n"
    b"event: token\r\ndata: {\"token\": \"The\"}\r\n\r\n"
    b"event: token\ndata: {\"token\": \" tower\"}\n\n"
    b"data:  plain\rdata: two\r\r"
    b"event: done\r\ndata: {}\r\n\r\n"
)
EXPECTED = [
    SSEFrame("thread", '{"thread_id": "t1"}'),
    SSEFrame("token", '{"token": "The"}'),
    SSEFrame("token", '{"token": " tower"}'),
    SSEFrame(None, " plain\ntwo"),
    SSEFrame("done", "{}"),
]


def test_frames_in_one_chunk() -> None:
    assert SSEParser().feed(STREAM) == EXPECTED


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_frames_survive_any_chunking(cuts: list[int]) -> None:
    parser = SSEParser()
    frames: list[SSEFrame] = []
    bounds = [0, *sorted(cuts), len(STREAM)]
    for a, b in itertools.pairwise(bounds):
        frames += parser.feed(STREAM[a:b])
    assert frames == EXPECTED
    assert not parser.pending


def test_pending_while_a_frame_is_open() -> None:
    parser = SSEParser()
    assert parser.feed(b"event: token\ndata: {\"tok") == []
    assert parser.pending
    assert parser.feed(b"en\": \"x\"}\n\n") == [SSEFrame("token", '{"token": "x"}')]
    assert not parser.pending


def test_default_extractor_reads_token_events_only() -> None:
    extract = make_token_extractor()
    assert [extract(f) for f in EXPECTED] == [None, "The", " tower", " plain\ntwo", None]
    assert extract(SSEFrame(None, "[DONE]")) is None
    assert extract(SSEFrame("status", '{"token": "no"}')) is None


def test_configured_json_path() -> None:
    extract = make_token_extractor("choices.0.delta.content", token_events=None)
    frame = SSEFrame(None, '{"choices": [{"delta": {"content": "Hi"}}]}')
    assert extract(frame) == "Hi"
    assert extract(SSEFrame("x", '{"choices": []}')) is None


def test_rendered_frame_parses_back() -> None:
    frame = render_sse("warning", {"metric": "faithfulness", "char_end": 12})
    assert SSEParser().feed(frame) == [SSEFrame("warning", '{"metric":"faithfulness","char_end":12}')]
