"""The SSE frame parser and token extraction, as a body wrapper sees arbitrary chunking."""

from __future__ import annotations

import itertools

import pytest
from hypothesis import given
from hypothesis import strategies as st

from streamjudge.config import ConfigError, load_settings
from streamjudge.instrumentation._sse import (
    SSEFrame,
    SSEParser,
    TerminalFrames,
    make_token_extractor,
    render_sse,
)

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


TERMINAL = TerminalFrames()
DONE_AT = STREAM.index(b"event: done")


@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_forwarded_bytes_are_whole_frames_and_the_terminal_frame_is_found(cuts: list[int]) -> None:
    parser = SSEParser(TERMINAL.sse)
    sent = b""
    terminal_at: list[int] = []
    bounds = [0, *sorted(cuts), len(STREAM)]
    for a, b in itertools.pairwise(bounds):
        complete, _, at = parser.feed_split(STREAM[a:b])
        if at >= 0:
            terminal_at.append(len(sent) + at)
        sent += complete
        # whatever went out ends at a frame boundary: a frame injected now cannot corrupt the app's
        assert SSEParser().feed(sent + b"event: x\ndata: 1\n\n")[-1] == SSEFrame("x", "1")
    assert sent + parser.flush() == STREAM  # nothing lost, nothing changed
    assert terminal_at == [DONE_AT]


def test_a_character_split_across_chunks_is_decoded_whole() -> None:
    frame = 'data: {"token": "Zürich – 東京"}\n\n'.encode()
    parser = SSEParser()
    out = [f for i in range(len(frame)) for f in parser.feed(frame[i:i + 1])]
    assert out == [SSEFrame(None, '{"token": "Zürich – 東京"}')]


def test_terminal_frames_by_event_data_and_json_type() -> None:
    t = TerminalFrames(["event:finished", "data:[END]", "type:complete"])
    assert t.sse(SSEFrame("finished", "{}")) and t.sse(SSEFrame(None, "[END]"))
    assert not t.sse(SSEFrame("done", "{}")) and not t.sse(SSEFrame(None, "[DONE]"))
    assert t.json({"type": "complete"}) and not t.json({"type": "done"}) and not t.json({"type": ["x"]})
    assert t.may_be_json(b'{"type": "complete"}') and not t.may_be_json(b'{"type": "token"}')
    assert not TerminalFrames([])
    with pytest.raises(ValueError, match="event:VALUE"):
        TerminalFrames(["done"])


def test_terminal_frames_setting() -> None:
    assert load_settings({}).terminal_frames == ("event:done", "event:end", "data:[DONE]", "type:done")
    env = {"STREAMJUDGE_TERMINAL_FRAMES": "event:finished, data:[END]"}
    assert load_settings(env).terminal_frames == ("event:finished", "data:[END]")
    assert load_settings({"STREAMJUDGE_TERMINAL_FRAMES": "none"}).terminal_frames == ()
    with pytest.raises(ConfigError, match="STREAMJUDGE_TERMINAL_FRAMES=none"):
        load_settings({"STREAMJUDGE_TERMINAL_FRAMES": "finished"})


# --- cost: linear in the bytes fed, however they are chunked (counted, not timed) --------------------------
def _scanned(body: bytes, chunks: list[bytes], **kwargs: int) -> int:
    parser = SSEParser(**kwargs)
    sent = b"".join(parser.feed_split(c)[0] for c in chunks) + parser.flush()
    assert sent == body
    return parser.scanned


@pytest.mark.parametrize("line_end", ["\n", "\r\n", "\r"])
def test_a_large_frame_in_small_chunks_is_scanned_once(line_end: str) -> None:
    # a parser that re-searches its buffer per chunk scans ~n^2/2 KB bytes here (2 GB for 1 KB chunks)
    body = ('event: token\ndata: {"token": "' + "x" * 900_000 + '"}\n\n').replace("\n", line_end).encode()
    chunks = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    whole = _scanned(body, [body])
    chunked = _scanned(body, chunks)
    assert whole <= 2 * len(body)
    # each byte is searched once (+3 per chunk), appended to the buffer and copied out with its frame
    assert chunked <= 4 * len(body)


def test_many_lines_without_a_blank_line_are_scanned_once() -> None:
    lines = [b"data: line %d\n" % i for i in range(20_000)]
    body = b"".join(lines) + b"\n"
    assert _scanned(body, [*lines, b"\n"]) <= 4 * len(body)


def test_a_frame_over_the_cap_is_not_buffered() -> None:
    body = b"data: " + b"x" * 5_000_000 + b"\n\ndata: ok\n\n"
    chunks = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    parser = SSEParser(max_frame_bytes=100_000)
    fed = sent = held = 0
    frames = []
    for chunk in chunks:
        complete, got, _ = parser.feed_split(chunk)
        frames += got
        fed += len(chunk)
        sent += len(complete)
        held = max(held, fed - sent)
    assert held <= 100_000 + 1024  # the client's bytes wait for the cap at most
    assert [f.data for f in frames] == ["ok"]
    assert parser.skipped == {"frame_too_large": 1}
    assert parser.scanned <= 3 * len(body)


_LINES = st.sampled_from([
    "event: token", "data: {\"token\": \" done\"}", "data: x" + "y" * 30, "data:x", ": ping", "", "id: 7",
])


@given(st.lists(st.tuples(_LINES, st.sampled_from(["\n", "\r\n", "\r"])), max_size=30),
       st.lists(st.integers(min_value=0, max_value=2000), max_size=10), st.integers(min_value=1, max_value=40))
def test_frames_over_the_cap_are_skipped_alike_however_the_stream_is_chunked(
    lines: list[tuple[str, str]], cuts: list[int], cap: int
) -> None:
    raw = "".join(text + end for text, end in lines).encode()
    whole = SSEParser(max_frame_bytes=cap)
    expected = whole.feed(raw)
    parser = SSEParser(max_frame_bytes=cap)
    sent = b""
    frames: list[SSEFrame] = []
    for a, b in itertools.pairwise([0, *sorted(c for c in cuts if c < len(raw)), len(raw)]):
        complete, got, _ = parser.feed_split(raw[a:b])
        sent += complete
        frames += got
    assert sent + parser.flush() == raw  # nothing lost, nothing changed
    assert frames == expected
    assert parser.skipped == whole.skipped


@pytest.mark.parametrize("end", [b"\n\n", b"\r\n\r\n", b"\r\r"])
def test_a_frame_at_the_cap_is_parsed_when_its_end_is_split(end: bytes) -> None:
    frame = b"data: " + b"x" * 94  # 100 bytes: at the cap, not over it
    for cut in range(1, len(end)):
        parser = SSEParser(max_frame_bytes=100)
        # ("\r\n\r" already ends a frame: a lone "\r" at the end of the buffer counts as a line end)
        first, second = parser.feed_split(frame + end[:cut]), parser.feed_split(end[cut:])
        assert first[0] + second[0] + parser.flush() == frame + end
        assert first[1] + second[1] == [SSEFrame(None, "x" * 94)]
        assert parser.skipped == {}


def test_the_terminal_frame_after_an_oversized_one_is_found() -> None:
    parser = SSEParser(TERMINAL.sse, max_frame_bytes=50)
    first, _, at = parser.feed_split(b"data: " + b"x" * 100)
    assert first == b"data: " + b"x" * 100 and at == -1 and parser.pending  # over the cap: passed through
    chunk = b"x\n\nevent: token\ndata: a\n\nevent: done\ndata: {}\n\n"
    complete, frames, at = parser.feed_split(chunk)
    assert complete == chunk and not parser.pending
    assert [f.event for f in frames] == ["token", "done"]
    assert complete[at:].startswith(b"event: done")
