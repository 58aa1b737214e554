"""A client that sends ``traceparent: 00-<trace>-<span>-00`` (not sampled) to a FastAPI SSE app.

With a parent-based sampler no processor ever sees such a request's spans. The answer must still be judged
live (the reader is protected whatever the tracing sample), end as soon as its verdicts are in (never wait
``end_wait_s`` for results that cannot be exported), and leave nothing behind: no held span, no stream
binding, no guard session, no per-stream pool state, and memory that does not grow with the requests.
"""

from __future__ import annotations

import asyncio
import gc
import json
import random
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
from reliability.conftest import tokens
from reliability.conftest import warned as warned_in
from streamjudge import semconv
from streamjudge.instrumentation import _binding, uninstrument_app
from streamjudge.judging.guard import GuardSession
from streamjudge.runtime import get_runtime

QUESTION = "How tall is the Eiffel Tower?"
CONTEXT = "The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889 for the World's Fair."
GROUNDED = "The Eiffel Tower is 330 metres tall. It was completed in 1889 for the World's Fair."
INVENTED = "The Eiffel Tower is 330 metres tall. It was built by Napoleon Bonaparte in 1750 from Norwegian granite."
END_WAIT_S = 3.0
WARMUP, MEASURED, CONCURRENT = 200, 1_000, 16


def make_app() -> FastAPI:
    app = FastAPI()

    @app.get("/chat")
    async def chat(answer: str = "grounded", delay: float = 0.0) -> StreamingResponse:
        trace_id = trace.get_current_span().get_span_context().trace_id
        get_runtime().contexts.register(trace_id, question=QUESTION, contexts=[CONTEXT])
        text = INVENTED if answer == "invented" else GROUNDED

        async def body() -> AsyncIterator[bytes]:
            for tok in tokens(text):
                await asyncio.sleep(delay)
                yield f"data: {json.dumps({'token': tok})}\n\n".encode()
            yield b"data: [DONE]\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def _traceparent(rng: random.Random) -> tuple[int, str]:
    trace_id = rng.getrandbits(128) | 1
    return trace_id, f"00-{trace_id:032x}-{rng.getrandbits(64) | 1:016x}-00"


async def _requests(app: FastAPI, n: int, rng: random.Random) -> tuple[list[float], int, int, set[int]]:
    """``n`` unsampled requests, ``CONCURRENT`` at a time: durations, warned / invented counts, trace ids."""
    durations: list[float] = []
    warned = invented = 0
    traces: set[int] = set()
    sem = asyncio.Semaphore(CONCURRENT)
    transport = httpx.ASGITransport(app=app)
    async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
        async def one(i: int) -> None:
            nonlocal warned, invented
            bad = i % 10 == 0
            trace_id, header = _traceparent(rng)
            traces.add(trace_id)
            async with sem:
                started = time.monotonic()
                r = await client.get("/chat", params={"answer": "invented" if bad else "grounded"},
                                     headers={"traceparent": header})
                durations.append(time.monotonic() - started)
            assert r.status_code == 200
            assert r.text.rstrip().endswith("data: [DONE]")
            invented += bad
            warned += warned_in(r.text)
            assert bad or not warned_in(r.text), r.text

        await asyncio.gather(*(one(i) for i in range(n)))
    return durations, warned, invented, traces


async def _sampled_request(app: FastAPI) -> None:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app") as client:
        r = await client.get("/chat")
        assert r.status_code == 200


def _live_sessions() -> int:
    gc.collect()
    return sum(1 for o in gc.get_objects() if isinstance(o, GuardSession))


@pytest.mark.timeout(240)
def test_unsampled_requests_are_not_judged_end_without_waiting_and_leave_nothing(harness: Harness) -> None:
    rt = harness.configure(None, end_wait_s=END_WAIT_S, client_events=True)  # the local judge
    app = streamjudge.instrument_app(make_app())
    rng = random.Random(10)
    try:
        durations, warned, invented, traces = asyncio.run(_requests(app, WARMUP, rng))
        # sampling is decided once at stream start: a trace the client sampled out is not judged
        assert invented > 0 and warned == 0, "unsampled answers are not judged"
        base_sessions = _live_sessions()
        tracemalloc.start()
        try:
            gc.collect()
            before = tracemalloc.get_traced_memory()[0]
            contexts_before = len(rt.contexts)
            durations, warned, invented, more = asyncio.run(_requests(app, MEASURED, rng))
            gc.collect()
            grown = tracemalloc.get_traced_memory()[0] - before
        finally:
            tracemalloc.stop()
        traces |= more
        assert warned == 0 and invented == MEASURED // 10
        # each answer ended at once, never after waiting end_wait_s for verdicts
        assert max(durations) < END_WAIT_S - 0.5, sorted(durations)[-5:]
        # nothing of the requests is left: no held span, binding, session or per-stream pool state
        assert rt.processor.held == 0
        assert _binding.active_count() == 0
        assert _live_sessions() <= base_sessions
        assert rt.pool.depth == 0 and rt.pool.tracked_streams == 0
        # the trace was not sampled: nothing of it is exported
        assert not {s.context.trace_id for s in harness.spans()} & traces
        # memory: the contexts each request registered stay in the bounded store (10,000 traces, 15 min);
        # everything else is released. Before the fix: +19 MB per 1,000 such requests.
        stored = len(rt.contexts) - contexts_before
        print(f"\nunsampled: {MEASURED} requests, tracemalloc +{grown / 1e6:.2f} MB "
              f"({grown / MEASURED:.0f} B/request, {stored} context entries kept), "
              f"p50 {sorted(durations)[len(durations) // 2] * 1000:.1f} ms, max {max(durations) * 1000:.1f} ms")
        assert grown < 2_000_000, f"{grown} bytes kept after {MEASURED} unsampled requests"
        # control: the same request without the client's sampling decision is traced and judged
        asyncio.run(_sampled_request(app))
        streams = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
        assert len(streams) == 1 and streams[0].attributes[semconv.EVAL_STATUS] == "judged"
    finally:
        uninstrument_app(app)
