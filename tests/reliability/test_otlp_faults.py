"""The OTLP endpoint down, refusing (503), rejecting the credentials (401) or never answering, with
streamjudge in the export path the SDK built (as under ``opentelemetry-instrument``): streams are not
slowed, shutdown stays within its deadline, the losses are counted, and a backend that recovers from 503
gets every span exactly once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import streamjudge
from _fakes import SyncKeywordJudge
from exporters._http import Reply, always, otlp_spans, sequence, serve
from reliability.conftest import SpanLedger, atokens
from streamjudge import _sdk
from streamjudge.config import Settings
from streamjudge.exporters._counting import CountingSpanExporter
from streamjudge.runtime import Runtime

CONTEXTS = ["The sky is blue. Grass is green."]
END_WAIT_S = 0.3
STREAMS = 20


def _answer(i: int) -> str:
    return f"The sky is blue {i}. Grass is green. The sky is blue. Grass is green {i}."


@contextmanager
def _app(endpoint: str, timeout_s: float = 2.0,
         queue: int = 2048) -> Iterator[tuple[Runtime, BatchSpanProcessor, SpanLedger]]:
    """What the distro builds from OTEL_*: a provider exporting over OTLP/HTTP, streamjudge in front."""
    provider = TracerProvider()
    bsp = BatchSpanProcessor(OTLPSpanExporter(endpoint=endpoint, timeout=timeout_s), schedule_delay_millis=50,
                             max_queue_size=queue, max_export_batch_size=min(queue, 512))
    provider.add_span_processor(bsp)
    rt = streamjudge.configure(Settings(preflight=False, end_wait_s=END_WAIT_S), tracer_provider=provider,
                               judge=SyncKeywordJudge(), set_global=False, backends_from_env=False, sinks=())
    rt.take_over_export(provider)
    ledger = SpanLedger()
    provider.add_span_processor(ledger)
    try:
        yield rt, bsp, ledger
    finally:
        rt.shutdown(3_000)


def _streams() -> list[float]:
    async def one(i: int) -> float:
        started = time.monotonic()
        async for _ in streamjudge.guard(atokens(_answer(i), 0.002), question="sky", contexts=CONTEXTS):
            pass
        return time.monotonic() - started

    async def main() -> list[float]:
        return list(await asyncio.gather(*(one(i) for i in range(STREAMS))))

    return asyncio.run(main())


def _failed(bsp: BatchSpanProcessor) -> int:
    exporter = _sdk.processor_exporter(bsp)
    assert isinstance(exporter, CountingSpanExporter), "the SDK's exporter is counted"
    return sum(exporter.failed.values())


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["down", "503", "401", "hang"])
def test_a_failing_otlp_endpoint_never_slows_streams_and_its_losses_are_counted(fault: str) -> None:
    never = threading.Event()
    replies = {"503": Reply(503, b"unavailable"), "401": Reply(401, b"bad credentials"),
               "hang": Reply(200, hang=never)}

    @contextmanager
    def endpoint() -> Iterator[str]:
        if fault == "down":
            yield f"http://127.0.0.1:{_closed_port()}/v1/traces"
            return
        with serve(always(replies[fault])) as srv:
            yield srv.url + "/v1/traces"

    try:
        with endpoint() as url:
            t0 = time.monotonic()
            with _app(url) as (rt, bsp, ledger):
                durations = _streams()
                assert max(durations) < END_WAIT_S + 1.5, durations
                assert rt.pool.force_flush(10_000)  # the final passes: judged whatever the backend does
                assert rt.processor.held == 0
                t_shutdown = time.monotonic()
            shutdown_s = time.monotonic() - t_shutdown
            assert shutdown_s < 6.0, shutdown_s  # 3 s asked; the exporter's own timeout never adds up
            assert _failed(bsp) == len(ledger.ended), "every lost span is counted"
            assert time.monotonic() - t0 < 30
    finally:
        never.set()


@pytest.mark.timeout(60)
def test_a_backend_recovering_from_503_gets_every_span_exactly_once() -> None:
    # restarting: the first export is refused, the exporter retries within its own timeout
    with serve(sequence(Reply(503, b"restarting"), Reply(200))) as srv:
        with _app(srv.url + "/v1/traces", timeout_s=10.0) as (rt, bsp, ledger):
            _streams()
            assert rt.force_flush(20_000)
            deadline = time.monotonic() + 20
            while time.monotonic() < deadline:
                got = otlp_spans(srv.seen[1:], "/v1/traces")
                if len(got) >= len(ledger.ended):
                    break
                time.sleep(0.1)
        # the first request was refused (and retried): the spans the backend accepted are the rest
        got = Counter(int.from_bytes(s.span_id, "big") for s in otlp_spans(srv.seen[1:], "/v1/traces"))
        assert set(got) == set(ledger.ended), "a span was lost"
        assert max(got.values()) == 1, "a span was exported twice"
        assert _failed(bsp) == 0


@pytest.mark.skipif(not _sdk.BATCH_TAKES_METER_PROVIDER,
                    reason="SDK < 1.41: its batch processor reports no drops (docs/compatibility.md)")
@pytest.mark.timeout(60)
@pytest.mark.parametrize("fault", ["down", "hang"])
def test_an_outage_longer_than_the_batch_queue_counts_every_span_it_drops(fault: str) -> None:
    """The SDK's batch processor drops spans silently once its queue is full (the exporter busy retrying a
    backend that is down): those never reach an exporter, and are counted all the same."""
    never = threading.Event()

    @contextmanager
    def endpoint() -> Iterator[str]:
        if fault == "down":
            yield f"http://127.0.0.1:{_closed_port()}/v1/traces"
            return
        with serve(always(Reply(200, hang=never))) as srv:
            yield srv.url + "/v1/traces"

    try:
        with endpoint() as url:
            with _app(url, queue=8) as (rt, bsp, ledger):
                _streams()
                assert rt.pool.force_flush(10_000)
            ended = len(ledger.ended)
            assert ended > 8 * 4, "more spans than the queue holds"
            exporter = _sdk.processor_exporter(bsp)
            assert isinstance(exporter, CountingSpanExporter)
            assert exporter.failed.get("queue_full", 0) > 0, exporter.failed
            assert _failed(bsp) == ended, exporter.failed  # nothing arrived: every span is a counted loss
    finally:
        never.set()
