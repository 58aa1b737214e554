"""Hostile answer bodies end to end through the middleware of an instrumented FastAPI app: NUL characters,
broken UTF-8 and a 10 MB token reach the client byte for byte, the response is never cut, the spans go
out with capped texts, and an answer too large to judge is a recorded skip (the parser's own cases are in
tests/test_hostile_input.py, token decoding in tests/test_guard.py)."""

from __future__ import annotations

import asyncio
import time
import tracemalloc
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from opentelemetry import trace

import streamjudge
from conftest import Harness
from streamjudge import semconv
from streamjudge.instrumentation import uninstrument_app
from streamjudge.runtime import get_runtime

CONTEXT = "The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889."
TEN_MB = 10 << 20

BODIES: dict[str, tuple[str, list[bytes]]] = {
    "sse-nul": ("text/event-stream", [b'data: {"token": "The tower\\u0000 is"}\n\n', b"data: 330\x00 metres.\n\n",
                                      b"data: [DONE]\n\n"]),
    "sse-broken-utf8": ("text/event-stream", [b'data: {"token": "caf\xc3 is"}\n\n', b"data: \xff\xfe tall.\n\n",
                                              b"data: [DONE]\n\n"]),
    "sse-10mb-frame": ("text/event-stream", [b'data: {"token": "' + b"x" * TEN_MB + b'"}\n\n',
                                             b'data: {"token": "The tower is 330 metres tall."}\n\n',
                                             b"data: [DONE]\n\n"]),
    "text-10mb-token": ("text/plain", [b"The tower is 330 metres tall. ", b"y" * TEN_MB, b" The end."]),
    "ndjson-nul-broken": ("application/x-ndjson", [b'{"token": "a\\u0000b"}\n', b'{"token": "\xc3("}\n',
                                                   b'{"type": "done"}\n']),
}


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/body/{name}")
    async def body(name: str) -> StreamingResponse:
        trace_id = trace.get_current_span().get_span_context().trace_id
        get_runtime().contexts.register(trace_id, question="How tall?", contexts=[CONTEXT])
        media, chunks = BODIES[name]

        async def gen() -> AsyncIterator[bytes]:
            for c in chunks:
                await asyncio.sleep(0)
                yield c

        return StreamingResponse(gen(), media_type=media)

    return app


async def _get(app: FastAPI, name: str) -> bytes:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app",
                                 timeout=60) as client:
        r = await client.get(f"/body/{name}")
        assert r.status_code == 200
        return r.content


@pytest.mark.timeout(120)
@pytest.mark.parametrize("name", list(BODIES))
def test_hostile_bodies_pass_unchanged_and_the_spans_go_out_capped(harness: Harness, name: str) -> None:
    rt = harness.configure(None, end_wait_s=0.5)
    app = streamjudge.instrument_app(make_app(), frame_hook=lambda _e, _k: None)  # compare bytes exactly
    try:
        tracemalloc.start()
        try:
            started = time.monotonic()
            got = asyncio.run(_get(app, name))
            took = time.monotonic() - started
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        print(f"\n{name}: {took:.2f} s, peak {peak / 1e6:.1f} MB")
        assert got == b"".join(BODIES[name][1]), "the client's bytes are untouched"
        assert took < 30, took
        big = name.endswith(("10mb-frame", "10mb-token"))
        # the body is 10 MB (client + server side copies): instrumentation adds a bounded share on top
        assert peak < (12 * TEN_MB if big else 20_000_000), peak
        spans = harness.spans()
        assert rt.processor.held == 0
        streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
        assert len(streams) == 1, [s.name for s in spans]
        stream = streams[0]
        limit = rt.settings.max_text_attribute_chars
        for key, value in stream.attributes.items():
            if isinstance(value, str):
                assert len(value) <= limit + 64, (key, len(value))
        assert stream.attributes[semconv.EVAL_STATUS] == "judged", dict(stream.attributes)
        if name == "text-10mb-token":
            # one token is judged up to a cap; the rest of it reached the client and is counted as unjudged
            assert 0 < stream.attributes[semconv.STREAM_UNJUDGED_CHARS] <= TEN_MB
    finally:
        uninstrument_app(app)
