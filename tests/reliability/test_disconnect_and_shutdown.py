"""Streams cut short: clients that go away mid-answer (through uvicorn on loopback) leave nothing behind,
and a runtime shut down while streams are mid-answer breaks none of them."""

from __future__ import annotations

import asyncio
import gc
import socket
import threading
import time

import httpx
import pytest
import uvicorn

import streamjudge
from conftest import Harness
from reliability.conftest import SpanLedger, atokens, wait_unbound
from reliability.test_unsampled_asgi import make_app
from streamjudge import semconv
from streamjudge.instrumentation import uninstrument_app
from streamjudge.judging.guard import GuardSession

CLIENTS = 100


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(120)
def test_clients_that_leave_mid_answer_leave_nothing_behind(harness: Harness) -> None:
    rt = harness.configure(None, end_wait_s=2.0)
    ledger = SpanLedger()
    rt.tracer_provider.add_span_processor(ledger)
    app = streamjudge.instrument_app(make_app())
    port = _free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning",
                                           lifespan="off"))
    thread = threading.Thread(target=server.run, name="uvicorn-reliability", daemon=True)
    thread.start()
    try:
        deadline = time.monotonic() + 10
        while not server.started:
            assert thread.is_alive() and time.monotonic() < deadline, "uvicorn did not start"
            time.sleep(0.01)

        async def clients() -> None:
            limits = httpx.Limits(max_connections=CLIENTS, max_keepalive_connections=0)
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", limits=limits,
                                         timeout=30) as client:
                async def one(i: int) -> None:
                    async with client.stream("GET", "/chat", params={"delay": "0.02"}) as r:
                        async for _ in r.aiter_bytes():
                            break  # the first frame, then away

                await asyncio.gather(*(one(i) for i in range(CLIENTS)))

        asyncio.run(clients())
        assert wait_unbound() == 0  # the server notices each disconnect at its next send
        assert rt.force_flush(20_000)
        assert rt.processor.held == 0 and rt.pool.depth == 0 and rt.pool.tracked_streams == 0
        gc.collect()
        assert not [o for o in gc.get_objects() if isinstance(o, GuardSession)]
        spans = harness.exporter.get_finished_spans()
        ids = [s.context.span_id for s in spans]
        assert len(ids) == len(set(ids)) and set(ids) == set(ledger.ended)
        streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
        # one stream span per request: a token the app sends after the client left opens no second one
        assert len({s.context.trace_id for s in streams}) == len(streams), "a request has two stream spans"
        assert len(streams) == CLIENTS
        assert {s.attributes[semconv.STREAM_OUTCOME] for s in streams} == {"disconnected"}
    finally:
        server.should_exit = True
        thread.join(10)
        uninstrument_app(app)


@pytest.mark.timeout(60)
def test_shutting_the_runtime_down_mid_stream_breaks_no_stream(harness: Harness) -> None:
    rt = harness.configure(None, end_wait_s=0.5)
    text = " ".join(f"The sky is blue {i}. Grass is green {i}." for i in range(20))

    async def one() -> list[str]:
        kinds = []
        async for ev in streamjudge.guard(atokens(text, 0.002), question="sky",
                                          contexts=["The sky is blue. Grass is green."]):
            kinds.append(ev.type)
        return kinds

    async def main() -> list[list[str] | BaseException]:
        tasks = [asyncio.create_task(one()) for _ in range(50)]
        await asyncio.sleep(0.2)
        stopper = threading.Thread(target=rt.shutdown, args=(2_000,))  # e.g. a SIGTERM drain
        stopper.start()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        stopper.join(10)
        assert not stopper.is_alive(), "shutdown did not return"
        return results

    started = time.monotonic()
    results = asyncio.run(main())
    assert time.monotonic() - started < 20
    for r in results:
        assert not isinstance(r, BaseException), repr(r)
        assert r[-1] == "done" and r.count("token") == len(text.split(" "))


@pytest.mark.parametrize("end", ["abort", "finish"])
def test_a_token_after_the_stream_ended_opens_no_second_stream(harness: Harness, end: str) -> None:
    # what the middleware does when the client left (abort) or the app's terminal frame passed (finish)
    # while the app's body still sends a chunk
    from streamjudge.instrumentation._binding import StreamBinding

    rt = harness.configure(None)
    with rt.tracer.start_as_current_span("request") as request:
        binding = StreamBinding(request.get_span_context().trace_id, owner="http")
        binding.feed("The", "body")
        binding.abort("disconnected") if end == "abort" else binding.finish()
        binding.feed(" Eiffel", "body")
        assert binding.session is None
    streams = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1
