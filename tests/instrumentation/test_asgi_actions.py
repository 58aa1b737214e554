"""Actions on a body-fed stream, and the stream span inside its request's span, through a real server."""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
from opentelemetry import trace as otel_trace
from opentelemetry.instrumentation.asgi import OpenTelemetryMiddleware
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import Route

from conftest import Harness
from instrumentation.test_asgi_streams import (
    CONTEXT,
    INVENTED,
    QUESTION,
    Served,
    _sse_frames,
    _streams,
    ndjson,
    sse,
)
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeMiddleware


def _app(**options: Any) -> Starlette:
    return Starlette(routes=[Route("/sse", sse), Route("/ndjson", ndjson)],
                     middleware=[Middleware(StreamJudgeMiddleware, **options)])


def test_a_stop_of_a_body_fed_stream_drops_the_rest_of_the_answer_but_not_the_terminal_frame(
    harness: Harness,
) -> None:
    harness.configure(None, action="stop", window_sentences=1, preflight=False)
    server = Served(_app()).start()  # client events off: nothing is injected
    try:
        frames = _sse_frames(server.url + "/sse", answer="invented_early", delay="0.02")
    finally:
        server.stop()
    events = [e for e, _ in frames]
    assert events[-1] == "done" and events.count("done") == 1  # the app's terminal frame, last
    assert "warning" not in events and "stop" not in events
    shown = "".join(json.loads(d)["token"] for e, d in frames if e == "token")
    assert shown.startswith(INVENTED)  # stream-first: shown before its verdict came
    assert len(events) < 40, "the answer after the stop was sent"
    (stream,) = _streams(harness)
    assert stream.attributes[semconv.STREAM_OUTCOME] == "stopped"
    assert stream.attributes[semconv.STREAM_ANSWER] == shown  # what the client received


def test_the_stream_span_ends_inside_its_request_span(harness: Harness) -> None:
    rt = harness.configure(None, window_sentences=1, preflight=False)
    app = OpenTelemetryMiddleware(_app(), tracer_provider=rt.tracer_provider)
    server = Served(app).start()  # type: ignore[arg-type]
    try:
        frames = _sse_frames(server.url + "/sse", answer="invented")
        with httpx.stream("GET", server.url + "/ndjson", params={"answer": "invented"}, timeout=30) as r:
            r.read()
    finally:
        server.stop()
    assert frames[-1][0] == "done"
    deadline = time.monotonic() + 10
    while True:
        spans = harness.spans()
        streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
        requests = {s.context.span_id: s for s in spans if s.kind.name == "SERVER"}
        if (len(streams) == 2 and len(requests) == 2) or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert len(streams) == 2
    for stream in streams:
        request = requests[stream.parent.span_id]
        assert stream.end_time <= request.end_time
        checkpoints = [s for s in spans if s.name == semconv.SPAN_CHECKPOINT
                       and s.parent.span_id == stream.context.span_id]
        assert checkpoints and all(c.end_time <= stream.end_time for c in checkpoints)


def test_a_body_fed_stream_cannot_hold_back_and_its_span_says_so(harness: Harness) -> None:
    harness.configure(None, mode="hold_back", window_sentences=1, preflight=False)
    server = Served(_app()).start()
    try:
        frames = _sse_frames(server.url + "/sse", answer="invented")
    finally:
        server.stop()
    shown = "".join(json.loads(d)["token"] for e, d in frames if e == "token")
    assert shown == INVENTED  # the app's frames went out as they came
    (stream,) = _streams(harness)
    assert stream.attributes[semconv.ACTION_ENFORCED] is False
    assert "hold_back" in stream.attributes[semconv.ACTION_ENFORCED_REASON]
    assert stream.attributes[semconv.STREAM_MODE] == "stream_first"  # what it did
    assert stream.attributes[semconv.STREAM_ANSWER] == shown


async def _json_answer(request: Any) -> Any:
    # what an instrumented graph does for a JSON endpoint: its answer's tokens feed the request's stream
    from starlette.responses import JSONResponse

    from streamjudge.instrumentation import _binding
    from streamjudge.runtime import get_runtime

    trace_id = otel_trace.get_current_span().get_span_context().trace_id
    get_runtime().contexts.register(trace_id, question=QUESTION, contexts=[CONTEXT])
    binding = _binding.lookup(trace_id)
    assert binding is not None
    for tok in INVENTED.split(" "):
        binding.feed(tok + " ", "graph")
    return JSONResponse({"answer": INVENTED})


def test_a_json_answers_stream_span_ends_inside_its_request_span(harness: Harness) -> None:
    rt = harness.configure(None, window_sentences=1, preflight=False)
    app = Starlette(routes=[Route("/ask", _json_answer)], middleware=[Middleware(StreamJudgeMiddleware)])
    server = Served(OpenTelemetryMiddleware(app, tracer_provider=rt.tracer_provider)).start()  # type: ignore[arg-type]
    try:
        assert httpx.get(server.url + "/ask", timeout=30).json() == {"answer": INVENTED}
    finally:
        server.stop()
    (stream,) = _streams(harness)
    spans = harness.spans()
    request = next(s for s in spans if s.context.span_id == stream.parent.span_id)
    assert stream.end_time <= request.end_time
    assert stream.attributes[semconv.STREAM_ALERTS] == 1  # its last verdict still landed on it
