"""The SSE parser's fast paths (CRLF-only buffers, terminal-only parsing) agree with its general path."""

from __future__ import annotations

from itertools import pairwise

from hypothesis import given
from hypothesis import strategies as st

from streamjudge.instrumentation._sse import SSEFrame, SSEParser, TerminalFrames

_LINES = st.sampled_from([
    "event: token", "event: done", "event:end", "event: status", "data: [DONE]", "data: {\"token\": \" done\"}",
    "data: {\"token\": \"é\"}", "data:x", "id: 7", ": keep-alive", "data: [DONE] ", "", "event: donee",
])
_ENDS = st.sampled_from(["\n", "\r\n", "\r"])


@st.composite
def _streams(draw: st.DrawFn) -> tuple[bytes, list[int]]:
    """A byte stream of SSE lines with any mix of line ends, and where to cut it into chunks."""
    lines = draw(st.lists(st.tuples(_LINES, _ENDS), max_size=30))
    crlf_only = draw(st.booleans())  # the sse-starlette case: every line ends in \r\n
    raw = "".join(text + ("\r\n" if crlf_only else end) for text, end in lines).encode()
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=len(raw)), max_size=8)))
    return raw, cuts


def _chunks(raw: bytes, cuts: list[int]) -> list[bytes]:
    bounds = [0, *cuts, len(raw)]
    return [raw[a:b] for a, b in pairwise(bounds)]


def _reference(raw: bytes) -> list[SSEFrame]:
    # the general (regex) path on the whole stream, forced by a lone "\r" that only ends the last line
    return SSEParser().feed(raw + b"\r" if raw.endswith((b"\n", b"\r")) else raw)


@given(_streams())
def test_chunked_parse_matches_the_general_path(stream: tuple[bytes, list[int]]) -> None:
    raw, cuts = stream
    parser = SSEParser()
    frames: list[SSEFrame] = []
    for chunk in _chunks(raw, cuts):
        frames += parser.feed(chunk)
    # a frame still open at the end is completed by the blank line the reference adds
    frames += parser.feed(b"\n\n")
    assert frames == SSEParser().feed(raw + b"\n\n") == _reference(raw + b"\n\n")


def test_crlf_frames_parse_like_lf_frames() -> None:
    lf = b'event: token\ndata: {"token": "The"}\n\n: ping\n\nevent: done\ndata: {}\n\n'
    assert SSEParser().feed(lf.replace(b"\n", b"\r\n")) == SSEParser().feed(lf)


@given(_streams(), st.sampled_from([(), ("event:done",), ("event:done", "event:end", "data:[DONE]"),
                                    ("data:a\nb",)]))
def test_terminal_only_parsing_finds_the_same_terminal_frame(
    stream: tuple[bytes, list[int]], specs: tuple[str, ...]
) -> None:
    raw, cuts = stream
    terminal = TerminalFrames(specs)
    full = SSEParser(terminal.sse if terminal else None)
    lean = SSEParser(terminal.sse if terminal else None, terminal.may_be_sse if terminal else None)
    for chunk in _chunks(raw, cuts):
        complete, frames, at = full.feed_split(chunk)
        lean_complete, lean_frames, lean_at = lean.feed_split(chunk, False)
        assert (lean_complete, lean_at) == (complete, at)
        assert all(f in frames for f in lean_frames)
    assert lean.flush() == full.flush()


def test_terminal_only_parsing_skips_frames_that_cannot_be_terminal() -> None:
    terminal = TerminalFrames()
    parser = SSEParser(terminal.sse, terminal.may_be_sse)
    chunk = b'event: token\r\ndata: {"token": "x"}\r\n\r\nevent: done\r\ndata: {}\r\n\r\n'
    complete, frames, at = parser.feed_split(chunk, False)
    assert complete == chunk
    assert frames == [SSEFrame("done", "{}")]
    assert at == chunk.index(b"event: done")
    assert SSEParser(None).feed_split(chunk, False)[1:] == ([], -1)
