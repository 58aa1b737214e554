"""Bad input in the bodies and messages the instrumentation reads: it never changes or breaks them.

For every case the bytes a client receives are the app's bytes, unchanged, however they were chunked,
and the extraction yields the right tokens or counts a skip; the middleware never raises on them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import pytest

from conftest import Harness
from streamjudge.instrumentation import StreamJudgeMiddleware
from streamjudge.instrumentation._sse import (
    MAX_FRAME_BYTES,
    JSONLinesParser,
    SSEParser,
    TerminalFrames,
    make_token_extractor,
)

DEEP = 100_000  # json.loads raises RecursionError from a depth of about 1000
NESTED = "[" * DEEP + "]" * DEEP
TEN_MB = "x" * (10 << 20)


@dataclass(frozen=True)
class Case:
    name: str
    body: bytes
    tokens: list[str]  # what the extraction yields
    skipped: dict[str, int]  # what it counts instead
    chunk_sizes: tuple[int, ...] = (1, 7, 1024)  # besides the whole body in one chunk


def _sse(*frames: str) -> bytes:
    return "".join(frames).encode()


SSE_CASES = [
    Case("utf-8 split across chunks", _sse('data: {"token": "Zürich – 東京 🎉"}\n\n'), ["Zürich – 東京 🎉"], {}),
    Case("invalid utf-8", b"data: \xff\xfe ok\n\n" + b'data: {"token": "caf\xc3"}\n\n',
         ["\ufffd\ufffd ok", "caf\ufffd"], {}),
    Case("NUL bytes", b'data: a\x00b\n\ndata: {"token": "c\\u0000d"}\n\n', ["a\x00b", "c\x00d"], {}),
    Case("10 MB token", _sse('data: {"token": "', TEN_MB, '"}\n\n', 'data: {"token": "after"}\n\n'),
         ["after"], {"frame_too_large": 1}, (1024, 65536)),
    Case("frame over the cap, many lines", _sse("data: line\n" * 200_000, "\n", "data: after\n\n"),
         ["after"], {"frame_too_large": 1}, (1024,)),
    Case("deeply nested JSON", _sse("data: ", NESTED, "\n\n", 'data: {"token": "after"}\n\n'),
         ["after"], {"json_too_deep": 1}, (1024,)),
    Case("nested at depth 1000", _sse("data: ", "[" * 1000, "]" * 1000, "\n\n"), [], {"json_too_deep": 1}),
    Case("CRLF-only framing", _sse('event: token\r\ndata: {"token": "a"}\r\n\r\n: ping\r\n\r\n'
                                   'data: {"token": "b"}\r\n\r\n'), ["a", "b"], {}),
    Case("CR-only framing", _sse('data: {"token": "a"}\r\rdata: b\r\r'), ["a", "b"], {}),
    Case("mixed line ends", _sse('data: a\r\n\ndata: b\n\r\ndata: c\r\r\n'), ["a", "b", "c"], {}),
    Case("data: without a space", _sse('data:{"token":"a"}\n\ndata:b\n\ndata:  c\n\n'), ["a", "b", " c"], {}),
    Case("comments", _sse(": hello\n\n:\n\nevent: token\n: inside\ndata: a\n\n"), ["a"], {}),
    Case("multi-line data", _sse("data: a\ndata: b\ndata:\ndata: c\n\n"), ["a\nb\n\nc"], {}),
    Case("20k data lines, one frame", _sse(*(f"data: {i}\n" for i in range(20_000)), "\n"),
         ["\n".join(str(i) for i in range(20_000))], {}, (1024,)),
    Case("unterminated last frame", _sse('data: {"token": "a"}\n\ndata: {"token": "b"}'), ["a"], {}),
]


def _chunkings(case: Case) -> Iterable[tuple[str, list[bytes]]]:
    yield "whole", [case.body]
    for size in case.chunk_sizes:
        if size > 1 or len(case.body) < 100_000:
            yield f"{size}-byte chunks", [case.body[i : i + size] for i in range(0, len(case.body), size)]


@pytest.mark.parametrize("case", SSE_CASES, ids=lambda c: c.name)
def test_sse_bytes_pass_unchanged_and_tokens_are_extracted_or_skipped(case: Case) -> None:
    for how, chunks in _chunkings(case):
        parser = SSEParser(TerminalFrames().sse)
        extract = make_token_extractor()
        sent = b""
        tokens: list[str] = []
        for chunk in chunks:
            complete, frames, _ = parser.feed_split(chunk)
            sent += complete
            tokens += [t for t in map(extract, frames) if t]
        assert sent + parser.flush() == case.body, how
        assert tokens == case.tokens, how
        assert {**parser.skipped, **extract.skipped} == case.skipped, how


def test_an_oversized_frame_is_not_held() -> None:
    parser = SSEParser()
    head = b"data: " + b"x" * MAX_FRAME_BYTES
    complete, frames, _ = parser.feed_split(head)
    assert complete == head and frames == []  # past the cap the bytes go out at once
    assert parser.pending  # inside a frame: nothing may be injected now
    complete, frames, _ = parser.feed_split(b"x\n")
    assert complete == b"x\n" and parser.pending
    complete, frames, _ = parser.feed_split(b"\ndata: ok\n\n")
    assert complete == b"\ndata: ok\n\n" and not parser.pending
    assert [f.data for f in frames] == ["ok"]
    assert parser.skipped == {"frame_too_large": 1}


# --- JSON lines ------------------------------------------------------------------------------------------
def _lines(*lines: str) -> bytes:
    return "".join(lines).encode()


NDJSON_CASES = [
    Case("utf-8 split across chunks", _lines('{"token": "Zürich – 東京 🎉"}\n'), ["Zürich – 東京 🎉"], {}),
    Case("NUL bytes", _lines('{"token": "a\\u0000b"}\n'), ["a\x00b"], {}),
    Case("10 MB token", _lines('{"token": "', TEN_MB, '"}\n{"token": "after"}\n'), ["after"],
         {"line_too_large": 1}, (1024, 65536)),
    Case("deeply nested JSON", _lines(NESTED, '\n{"token": "after"}\n'), ["after"], {"json_too_deep": 1},
         (1024,)),
    Case("CRLF line ends", _lines('{"token": "a"}\r\n\r\n{"token": "b"}\r\n'), ["a", "b"], {}),
    Case("not JSON", _lines('hello\n{"token": \n{"token": "a"}\n[1, 2]\n'), ["a"], {}),
    Case("unterminated last line", _lines('{"token": "a"}\n{"token": "b"}'), ["a"], {}),
]


@pytest.mark.parametrize("case", NDJSON_CASES, ids=lambda c: c.name)
def test_json_lines_pass_unchanged_and_tokens_are_extracted_or_skipped(case: Case) -> None:
    for how, chunks in _chunkings(case):
        parser = JSONLinesParser(TerminalFrames())
        sent = b""
        tokens: list[str] = []
        for chunk in chunks:
            complete, toks, _ = parser.feed_split(chunk)
            assert complete.endswith(b"\n") or not complete or parser.pending, how  # whole lines only
            sent += complete
            tokens += toks
        assert sent + parser.flush() == case.body, how
        assert tokens == case.tokens, how
        assert parser.skipped == case.skipped, how


def test_json_lines_find_the_terminal_line() -> None:
    parser = JSONLinesParser(TerminalFrames())
    body = b'{"token": "a"}\n{"type": "done"}\n{"token": "late"}\n'
    complete, tokens, at = parser.feed_split(body)
    assert (complete, tokens, at) == (body, ["a"], body.index(b'{"type"'))


# --- through the middleware ------------------------------------------------------------------------------
def _serve(app: Any, scope: dict[str, Any], incoming: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Run the middleware around ``app`` for one connection; the messages it sent."""
    sent: list[dict[str, Any]] = []

    async def receive() -> dict[str, Any]:
        if incoming:
            return incoming.pop(0)
        await asyncio.Event().wait()  # the client stays connected
        raise AssertionError("unreachable")

    async def send(message: dict[str, Any]) -> None:
        sent.append(message)

    asyncio.run(StreamJudgeMiddleware(app)(scope, receive, send))
    return sent


def _http_app(content_type: bytes, chunks: list[bytes]) -> Any:
    async def app(scope: Any, receive: Any, send: Any) -> None:
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", content_type)]})
        for chunk in chunks:
            await send({"type": "http.response.body", "body": chunk, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})

    return app


HTTP = {"type": "http", "method": "GET", "path": "/", "headers": []}


@pytest.mark.parametrize(("content_type", "body"), [
    (b"text/event-stream", _sse("data: ", NESTED, "\n\n", 'data: {"token": "after"}\n\n')),
    (b"text/event-stream", _sse("data: ", "[" * 1000, "]" * 1000, "\n\n", "data: after\n\n")),
    (b"application/x-ndjson", _lines(NESTED, '\n{"token": "after"}\n')),
    (b"application/x-ndjson", _lines("[" * 1000, "]" * 1000, '\n{"token": "after"}\n')),
], ids=["sse", "sse-depth-1000", "ndjson", "ndjson-depth-1000"])
def test_a_deeply_nested_frame_passes_through_the_middleware(
    harness: Harness, content_type: bytes, body: bytes
) -> None:
    harness.configure(None)
    chunks = [body[i : i + 1024] for i in range(0, len(body), 1024)]
    sent = _serve(_http_app(content_type, chunks), dict(HTTP), [{"type": "http.request", "body": b""}])
    assert b"".join(m.get("body", b"") for m in sent if m["type"] == "http.response.body") == body
    assert sent[-1] == {"type": "http.response.body", "body": b"", "more_body": False}
    assert _stream_answers(harness) == [("after", 5)]  # the nested frame carries no token


def test_a_deeply_nested_websocket_message_passes_through(harness: Harness) -> None:
    harness.configure(None)
    messages = ['{"a": ' + NESTED + "}", '{"a": ' + "[" * 1000 + "]" * 1000 + "}", '{"token": "after"}',
                '{"type": "done"}']

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        for text in messages:
            await send({"type": "websocket.send", "text": text})
        await send({"type": "websocket.send", "bytes": messages[0].encode()})
        await send({"type": "websocket.close", "code": 1000})

    scope = {"type": "websocket", "path": "/ws", "headers": []}
    sent = _serve(app, scope, [{"type": "websocket.connect"}])
    texts = [m["text"] for m in sent if m["type"] == "websocket.send" and "text" in m]
    assert [t for t in texts if t in messages] == messages  # the guard may add its own messages
    assert [m["bytes"] for m in sent if "bytes" in m] == [messages[0].encode()]
    assert sent[-1]["type"] == "websocket.close"


def _stream_answers(h: Harness) -> list[tuple[str, int]]:
    """(answer, its length) of each stream span (the answer attribute is capped, its length is not)."""
    from streamjudge import semconv

    out = []
    for s in h.spans():
        if s.name == semconv.SPAN_STREAM:
            answer = s.attributes.get(semconv.STREAM_ANSWER, "")
            out.append((answer, s.attributes.get(semconv.STREAM_ANSWER_LENGTH, len(answer))))
    return out


# (messages the app sends, the answer the guard sees); every case ends with the app's done message
WS_CASES = {
    "NUL bytes": (['{"token": "a\\u0000b"}', "plain\x00text"], "a\x00bplain\x00text"),
    # binary messages pass through unjudged, whatever their bytes: only text messages are answer text
    "invalid utf-8 bytes": ([b'{"token": "caf\xc3"}', b"\xff\xfe ok", '{"token": "ok"}'], "ok"),
    "deeply nested JSON": (['{"a": ' + NESTED + "}", '{"token": "after"}'], "after"),
    "not JSON": (['{"token": ', '{"token": "a"}'], '{"token": a'),
    "large token": (['{"token": "' + "x" * (2 << 20) + '"}'], "x" * (2 << 20)),
}


@pytest.mark.parametrize("case", list(WS_CASES), ids=list(WS_CASES))
def test_websocket_messages_pass_unchanged_and_tokens_are_extracted(harness: Harness, case: str) -> None:
    harness.configure(None)
    messages, answer = WS_CASES[case]
    outgoing = [*messages, '{"type": "done"}']

    async def app(scope: Any, receive: Any, send: Any) -> None:
        await receive()
        await send({"type": "websocket.accept"})
        for m in outgoing:
            await send({"type": "websocket.send", **({"bytes": m} if isinstance(m, bytes) else {"text": m})})
        await send({"type": "websocket.close", "code": 1000})

    sent = _serve(app, {"type": "websocket", "path": "/ws", "headers": []}, [{"type": "websocket.connect"}])
    got = [m.get("text", m.get("bytes")) for m in sent if m["type"] == "websocket.send"]
    assert [m for m in got if m in outgoing] == outgoing  # the app's messages, unchanged and in order
    assert sent[-1]["type"] == "websocket.close"
    ((seen, length),) = _stream_answers(harness)
    head, _, tail = seen.partition(" … ")  # a long answer's attribute keeps its head and tail
    assert length == len(answer) and answer.startswith(head) and answer.endswith(tail)
