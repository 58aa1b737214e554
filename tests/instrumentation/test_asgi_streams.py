"""The ASGI middleware on every transport it watches, through a real server and real clients.

One Starlette app (no LangGraph: its tokens reach the guard through the response body) is served by
uvicorn on 127.0.0.1 in this process, so the tests read what a client really receives and the spans the
harness runtime exported. Transports: SSE (sse-starlette ``EventSourceResponse`` with ``event: done``, a
plain ``StreamingResponse`` with OpenAI-style ``data: [DONE]``), NDJSON, plain text and WebSocket.
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator, Mapping
from typing import Any

import httpx
import pytest
import uvicorn
from opentelemetry import trace
from sse_starlette import EventSourceResponse
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route, WebSocketRoute
from starlette.websockets import WebSocket, WebSocketDisconnect
from websockets.sync.client import connect as ws_connect

from conftest import Harness
from streamjudge import semconv
from streamjudge.instrumentation import FrameHook, StreamJudgeMiddleware, default_frame_hook
from streamjudge.judging.guard import StreamEvent
from streamjudge.runtime import get_runtime

QUESTION = "How tall is the Eiffel Tower?"
CONTEXT = "The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889 for the World's Fair."
GROUNDED = "The Eiffel Tower is 330 metres tall. It was completed in 1889 for the World's Fair."
# one checkpoint (two sentences), closed only at the end of the answer: its verdict is the last one
INVENTED = "The Eiffel Tower is 330 metres tall. It was built by Napoleon Bonaparte in 1750 from Norwegian granite."
LONG = " ".join([GROUNDED] * 12)  # many checkpoints: long enough to leave in the middle


def _tokens(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


async def _answer(request: Request | WebSocket, text: str, delay_s: float) -> AsyncIterator[str]:
    # what a retriever would do: the question and contexts of this trace, for the judge
    trace_id = trace.get_current_span().get_span_context().trace_id
    get_runtime().contexts.register(trace_id, question=QUESTION, contexts=[CONTEXT])
    for tok in _tokens(text):
        await asyncio.sleep(delay_s)
        yield tok


def _params(request: Request) -> tuple[str, float]:
    q = request.query_params
    text = {"grounded": GROUNDED, "invented": INVENTED, "long": LONG,
            "invented_early": f"{INVENTED} {LONG}"}[q.get("answer", "grounded")]
    return text, float(q.get("delay", "0.002"))


async def sse(request: Request) -> EventSourceResponse:
    text, delay = _params(request)

    async def events() -> AsyncIterator[dict[str, str]]:
        yield {"event": "thread", "data": json.dumps({"thread_id": "t1"})}
        async for tok in _answer(request, text, delay):
            yield {"event": "token", "data": json.dumps({"token": tok})}
        yield {"event": "done", "data": json.dumps({"thread_id": "t1"})}

    return EventSourceResponse(events(), ping=600)


async def openai_sse(request: Request) -> StreamingResponse:
    """OpenAI-style chunks; ``shape`` decides how the last token and ``data: [DONE]`` are chunked."""
    text, delay = _params(request)
    shape = request.query_params.get("shape", "frames")

    async def body() -> AsyncIterator[bytes]:
        done = b"data: [DONE]\r\n\r\n"
        last = b""  # the previous token's frame: sent once the next one exists, so the last stays here
        async for tok in _answer(request, text, delay):
            if last:
                yield last
            last = f"data: {json.dumps({'token': tok})}\r\n\r\n".encode()
        if shape == "frames":  # one frame per chunk
            yield last
            yield done
        elif shape == "together":  # the last token and the terminal frame in one chunk
            yield last + done
        else:  # "split": the last token frame and the terminal frame cut across chunks
            cut = len(last) + 4
            tail = last + done
            yield tail[:7]
            yield tail[7:cut]
            yield tail[cut:]

    return StreamingResponse(body(), media_type="text/event-stream")


async def ndjson(request: Request) -> StreamingResponse:
    text, delay = _params(request)

    async def body() -> AsyncIterator[str]:
        async for tok in _answer(request, text, delay):
            yield json.dumps({"type": "token", "token": tok}) + "\n"
        yield json.dumps({"type": "done"}) + "\n"

    return StreamingResponse(body(), media_type="application/x-ndjson")


async def plain(request: Request) -> StreamingResponse:
    text, delay = _params(request)
    return StreamingResponse(_answer(request, text, delay), media_type="text/plain")


async def ws(socket_: WebSocket) -> None:
    await socket_.accept()
    try:
        while True:
            request = await socket_.receive_json()
            text = {"grounded": GROUNDED, "invented": INVENTED, "long": LONG}[request["answer"]]
            async for tok in _answer(socket_, text, float(request.get("delay", 0.002))):
                await socket_.send_json({"type": "token", "token": tok})
            await socket_.send_json({"type": "done"})
    except WebSocketDisconnect:
        return


def text_hook(event: StreamEvent, kind: str) -> bytes | str | Mapping[str, Any] | None:
    """A plain-text app's own format for warnings: a bracketed line."""
    if kind == "text" and event.type == "warning":
        return f"\n[warning: {event.data.get('metric')}]\n"
    return default_frame_hook(event, kind)  # type: ignore[arg-type]


def make_app(frame_hook: FrameHook | None = None) -> Starlette:
    routes = [
        Route("/sse", sse),
        Route("/openai", openai_sse),
        Route("/ndjson", ndjson),
        Route("/text", plain),
        WebSocketRoute("/ws", ws),
    ]
    return Starlette(routes=routes, middleware=[Middleware(StreamJudgeMiddleware, frame_hook=frame_hook)])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Served:
    def __init__(self, app: Starlette) -> None:
        self.port = _free_port()
        config = uvicorn.Config(app, host="127.0.0.1", port=self.port, log_level="warning", lifespan="off",
                                ws="websockets-sansio")
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-test", daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Served:
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started:
            if not self.thread.is_alive() or time.monotonic() > deadline:
                raise AssertionError("uvicorn did not start")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(10)


@pytest.fixture
def served(harness: Harness) -> Iterator[tuple[Served, Harness]]:
    harness.configure(None)  # the local judge: real claim-level grounding, no network
    server = Served(make_app(text_hook)).start()
    try:
        yield server, harness
    finally:
        server.stop()


# --- clients ----------------------------------------------------------------------------------------

def _sse_frames(url: str, **params: object) -> list[tuple[str, str]]:
    """(event, data) of every frame, in arrival order (EventSource rules for the fields we use)."""
    frames: list[tuple[str, str]] = []
    with httpx.stream("GET", url, params=params, timeout=30) as r:  # type: ignore[arg-type]
        assert r.status_code == 200
        event, data = "message", []
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:].strip())
            elif not line and (data or event != "message"):
                frames.append((event, "\n".join(data)))
                event, data = "message", []
    return frames


def _lines(url: str, **params: object) -> list[dict[str, Any]]:
    with httpx.stream("GET", url, params=params, timeout=30) as r:  # type: ignore[arg-type]
        assert r.status_code == 200
        return [json.loads(line) for line in r.iter_lines() if line.strip()]


def _ws_messages(url: str, answer: str) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    with ws_connect(url.replace("http://", "ws://") + "/ws", open_timeout=10) as conn:
        conn.send(json.dumps({"answer": answer}))
        while True:
            msg = json.loads(conn.recv(timeout=30))
            out.append(msg)
            if msg["type"] == "done":
                return out


def _streams(h: Harness, n: int = 1, timeout: float = 10.0) -> list[Any]:
    deadline = time.monotonic() + timeout
    while True:
        spans = [s for s in h.spans() if s.name == semconv.SPAN_STREAM]
        if len(spans) >= n or time.monotonic() > deadline:
            return spans
        time.sleep(0.05)


def _answer_of_sse(frames: list[tuple[str, str]]) -> str:
    return "".join(json.loads(d)["token"] for e, d in frames if e in ("token", "message") and d != "[DONE]")


# --- (1) the guard's last events go out before the app's terminal frame -----------------------------

def test_sse_warning_for_the_last_checkpoint_precedes_event_done(served: tuple[Served, Harness]) -> None:
    server, h = served
    frames = _sse_frames(server.url + "/sse", answer="invented")
    events = [e for e, _ in frames]
    assert events[-1] == "done"  # the app's done frame is still the last one the client sees
    assert "warning" in events, events
    assert events.index("warning") < events.index("done")
    warning = json.loads(next(d for e, d in frames if e == "warning"))
    assert warning["metric"] == semconv.FAITHFULNESS
    assert _answer_of_sse(frames) == INVENTED  # the app's frames pass through unchanged
    (stream,) = _streams(h)
    assert stream.attributes[semconv.STREAM_OUTCOME] == "completed"
    assert stream.attributes[semconv.STREAM_ALERTS] >= 1


@pytest.mark.parametrize("shape", ["frames", "together", "split"])
def test_openai_style_data_done_comes_after_the_warning(served: tuple[Served, Harness], shape: str) -> None:
    server, _ = served
    frames = _sse_frames(server.url + "/openai", answer="invented", shape=shape)
    assert frames[-1] == ("message", "[DONE]")
    # the app's frames are data-only, so the warning is one too: ``data: {"type": "warning", ...}``
    assert all(e == "message" for e, _ in frames)
    kinds = [json.loads(d).get("type", "token") if d.startswith("{") else d for _, d in frames]
    assert "warning" in kinds
    tokens = [(e, d) for (e, d), k in zip(frames, kinds, strict=True) if k == "token"]
    # every token precedes the warning about it; nothing was cut or merged
    assert _answer_of_sse(tokens) == INVENTED
    assert kinds.index("warning") > max(i for i, k in enumerate(kinds) if k == "token")


def test_ndjson_warning_line_precedes_the_done_line(served: tuple[Served, Harness]) -> None:
    server, h = served
    lines = _lines(server.url + "/ndjson", answer="invented")
    types = [x["type"] for x in lines]
    assert types[-1] == "done"
    assert "warning" in types, types
    warning = lines[types.index("warning")]
    assert warning["metric"] == semconv.FAITHFULNESS and warning["text"]
    assert "".join(x["token"] for x in lines if x["type"] == "token") == INVENTED
    assert _streams(h)[0].attributes[semconv.STREAM_VERDICT] == "flagged"


def test_websocket_warning_precedes_the_done_message(served: tuple[Served, Harness]) -> None:
    server, _ = served
    messages = _ws_messages(server.url, "invented")
    types = [m["type"] for m in messages]
    assert types[-1] == "done" and "warning" in types
    assert messages[types.index("warning")]["metric"] == semconv.FAITHFULNESS
    assert "".join(m["token"] for m in messages if m["type"] == "token") == INVENTED


# --- (2) each transport: a warning in its own format for an invented answer, none for a grounded one --

def test_grounded_answers_get_no_warning_on_any_transport(served: tuple[Served, Harness]) -> None:
    server, h = served
    sse_frames = _sse_frames(server.url + "/sse", answer="grounded")
    raw_frames = _sse_frames(server.url + "/openai", answer="grounded", shape="split")
    lines = _lines(server.url + "/ndjson", answer="grounded")
    messages = _ws_messages(server.url, "grounded")
    with httpx.stream("GET", server.url + "/text", params={"answer": "grounded"}, timeout=30) as r:
        text = "".join(r.iter_text())
    assert [e for e, _ in sse_frames if e not in ("token", "thread")] == ["done"]
    assert [d for e, d in raw_frames if e != "message"] == [] and raw_frames[-1][1] == "[DONE]"
    assert [x["type"] for x in lines if x["type"] != "token"] == ["done"]
    assert [m["type"] for m in messages if m["type"] != "token"] == ["done"]
    assert text == GROUNDED
    streams = _streams(h, 5)
    assert len(streams) == 5
    for s in streams:
        assert s.attributes[semconv.STREAM_ALERTS] == 0
        assert s.attributes[semconv.STREAM_OUTCOME] == "completed"
        assert s.attributes[semconv.STREAM_ANSWER] == GROUNDED


def test_plain_text_warning_uses_the_hook_format_and_default_hook_sends_none(harness: Harness) -> None:
    harness.configure(None)
    hooked = Served(make_app(text_hook)).start()
    try:
        with httpx.stream("GET", hooked.url + "/text", params={"answer": "invented"}, timeout=30) as r:
            text = "".join(r.iter_text())
    finally:
        hooked.stop()
    assert text.startswith(INVENTED)
    assert text[len(INVENTED):] == "\n[warning: faithfulness]\n"

    bare = Served(make_app()).start()
    try:
        with httpx.stream("GET", bare.url + "/text", params={"answer": "invented"}, timeout=30) as r:
            text = "".join(r.iter_text())
    finally:
        bare.stop()
    assert text == INVENTED  # a plain body has no room for frames unless the app says how
    streams = _streams(harness, 2)
    assert [s.attributes[semconv.STREAM_VERDICT] for s in streams] == ["flagged", "flagged"]


# --- (2) a client that leaves mid-stream ends the stream span as disconnected ------------------------

def _left_early(h: Harness) -> Any:
    (stream,) = _streams(h)
    assert stream.attributes[semconv.STREAM_OUTCOME] == "disconnected"
    assert stream.status.status_code == trace.StatusCode.ERROR
    assert 0 < stream.attributes[semconv.STREAM_TOKENS] < len(_tokens(LONG))
    return stream


@pytest.mark.parametrize("path", ["/sse", "/openai", "/ndjson", "/text"])
def test_http_client_disconnect_mid_stream(served: tuple[Served, Harness], path: str) -> None:
    server, h = served
    params = {"answer": "long", "delay": "0.02"}
    with httpx.stream("GET", server.url + path, params=params, timeout=30) as r:
        received = 0
        for chunk in r.iter_bytes():
            received += len(chunk)
            if received > 200:
                break  # leave after a few tokens
    _left_early(h)


def test_websocket_client_disconnect_mid_stream(served: tuple[Served, Harness]) -> None:
    server, h = served
    with ws_connect(server.url.replace("http://", "ws://") + "/ws", open_timeout=10) as conn:
        conn.send(json.dumps({"answer": "long", "delay": 0.02}))
        for _ in range(5):
            assert json.loads(conn.recv(timeout=10))["type"] == "token"
    _left_early(h)


def test_terminal_frames_are_configurable(harness: Harness) -> None:
    from starlette.testclient import TestClient

    harness.configure(None)

    def order(terminal_frames: tuple[str, ...]) -> list[str]:
        app = Starlette(routes=[Route("/sse", sse)],
                        middleware=[Middleware(StreamJudgeMiddleware, terminal_frames=terminal_frames,
                                               client_events=True)])
        with TestClient(app) as client:
            body = client.get("/sse", params={"answer": "invented"}).text
        return [line[6:].strip() for line in body.splitlines() if line.startswith("event:")]

    assert order(("event:done",))[-2:] == ["warning", "done"]  # client events on (asked for in code)
    # nothing held back: the warning can only follow the app's done frame (what the option turns off)
    assert order(())[-2:] == ["done", "warning"]
