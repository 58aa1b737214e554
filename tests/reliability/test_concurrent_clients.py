"""200 concurrent SSE clients against an instrumented FastAPI app served by uvicorn on 127.0.0.1: every
answer arrives whole, every invented one is warned about live, every span is exported exactly once, and
nothing is left bound or held afterwards."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn

import streamjudge
from conftest import Harness
from reliability.conftest import SpanLedger, wait_unbound, warned
from reliability.test_unsampled_asgi import make_app
from streamjudge import semconv
from streamjudge.instrumentation import uninstrument_app

CLIENTS = 200


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(180)
def test_two_hundred_concurrent_sse_clients(harness: Harness) -> None:
    rt = harness.configure(None, end_wait_s=2.0, client_events=True)  # the local judge
    ledger = SpanLedger()
    rt.tracer_provider.add_span_processor(ledger)
    app = streamjudge.instrument_app(make_app())
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off", backlog=CLIENTS * 2))
    thread = threading.Thread(target=server.run, name="uvicorn-reliability", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

        async def clients() -> list[tuple[bool, str]]:
            limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                         timeout=60) as client:
                async def one(i: int) -> tuple[bool, str]:
                    bad = i % 5 == 0
                    r = await client.get("/chat", params={"answer": "invented" if bad else "grounded",
                                                          "delay": "0.005"})
                    assert r.status_code == 200
                    return bad, r.text

                return list(await asyncio.gather(*(one(i) for i in range(CLIENTS))))

        started = time.monotonic()
        results = asyncio.run(clients())
        took = time.monotonic() - started
        for _bad, text in results:
            assert text.rstrip().endswith("data: [DONE]")
        assert wait_unbound() == 0
        assert rt.force_flush(30_000)
        spans = harness.exporter.get_finished_spans()
        wrong = [text for bad, text in results if warned(text) != bad]
        # why a stream went unwarned is on its span (a skipped checkpoint says its reason)
        skips = sorted({str(e.attributes.get(semconv.SKIP_REASON)) for s in spans for e in s.events
                        if e.name == semconv.EVENT_SKIP and e.attributes})
        assert not wrong, f"{len(wrong)} of {CLIENTS} answers warned wrongly; skips: {skips}; first: {wrong[0]}"
        exported = [s.context.span_id for s in spans]
        assert len(exported) == len(set(exported)) and set(exported) == set(ledger.ended)
        streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
        assert len(streams) == CLIENTS
        assert {s.attributes[semconv.EVAL_STATUS] for s in streams} == {"judged"}
        assert rt.processor.held == 0
        print(f"\n{CLIENTS} concurrent SSE clients: {took:.2f} s, {len(spans)} spans exported once")
    finally:
        server.should_exit = True
        thread.join(10)
        uninstrument_app(app)
