"""Span exports that fail are counted in ``streamjudge.export.failures`` (issue 10 #18): a backend that is
down, refusing, or restarting was visible only in the SDK's log lines."""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Sequence
from importlib.metadata import version

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import (
    BatchSpanProcessor,
    SimpleSpanProcessor,
    SpanExporter,
    SpanExportResult,
)

from exporters._http import Reply, always, serve
from streamjudge import _sdk, semconv
from streamjudge._deadline import shutdown_deadline
from streamjudge.exporters._counting import CountingSpanExporter, count_export_failures
from streamjudge.exporters.langfuse import langfuse_exporter_from_env
from streamjudge.exporters.phoenix import phoenix_exporter_from_env


def spans(n: int = 3) -> list[ReadableSpan]:
    provider = TracerProvider()
    tracer = provider.get_tracer("test")
    out = []
    for i in range(n):
        span = tracer.start_span(f"s{i}")
        span.end()
        out.append(span)
    return out  # type: ignore[return-value]


def refused_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def failures(reader: InMemoryMetricReader) -> dict[tuple[str, str], int]:
    out: dict[tuple[str, str], int] = {}
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name != semconv.METRIC_EXPORT_FAILURES:
                    continue
                for p in m.data.data_points:
                    a = p.attributes or {}
                    key = (str(a[semconv.METRIC_ATTR_EXPORTER]), str(a[semconv.METRIC_ATTR_REASON]))
                    out[key] = int(p.value)  # type: ignore[union-attr]
    return out


def test_a_backend_answering_503_is_counted_by_exporter_and_spans() -> None:
    reader = InMemoryMetricReader()
    with serve(always(Reply(503, b"down"))) as srv:
        exporter = CountingSpanExporter(
            OTLPSpanExporter(endpoint=srv.url + "/v1/traces", timeout=1),
            meter_provider=MeterProvider(metric_readers=[reader]),
        )
        assert exporter.export(spans(3)) == SpanExportResult.FAILURE
        assert exporter.export(spans(2)) == SpanExportResult.FAILURE
        exporter.shutdown()
    assert failures(reader) == {("otlp_http", "failure"): 5}
    assert exporter.failed == {"failure": 5}


def test_a_successful_export_counts_nothing() -> None:
    reader = InMemoryMetricReader()
    with serve(always(Reply(200, b""))) as srv:
        exporter = CountingSpanExporter(
            OTLPSpanExporter(endpoint=srv.url + "/v1/traces", timeout=1),
            meter_provider=MeterProvider(metric_readers=[reader]),
        )
        assert exporter.export(spans(3)) == SpanExportResult.SUCCESS
        exporter.shutdown()
    assert failures(reader) == {} and exporter.failed == {}


#: how the OTLP/HTTP exporter loses spans sent to a refused port: it returns a failure, or (before 1.40)
#: raises the refused connection's error after its one retry
REFUSED = ("failure" if int(version("opentelemetry-exporter-otlp-proto-http").split(".")[1]) >= 40
           else "exception")


#: the batch processor reports what it drops through a metrics object from SDK 1.41 (streamjudge counts
#: those drops there); before, nothing of it is reachable and its drops go uncounted
BATCH_METRICS = int(version("opentelemetry-sdk").split(".")[1]) >= 41
_NEEDS_BATCH_METRICS = pytest.mark.skipif(not BATCH_METRICS, reason="SDK < 1.41: no batch processor metrics")

#: spans ended after their batch processor's shutdown that the SDK reports (1.42+; before, it only logs them)
AFTER_SHUTDOWN = 1 if int(version("opentelemetry-sdk").split(".")[1]) >= 42 else 0


def _lost(exporter: SpanExporter, n: int) -> None:
    if REFUSED == "failure":
        assert exporter.export(spans(n)) == SpanExportResult.FAILURE
    else:
        with pytest.raises(OSError):  # requests' ConnectionError
            exporter.export(spans(n))


def test_the_langfuse_and_phoenix_exporters_from_env_count_under_their_names() -> None:
    port = refused_port()
    langfuse = langfuse_exporter_from_env(
        {"LANGFUSE_PUBLIC_KEY": "pk", "LANGFUSE_SECRET_KEY": "sk", "LANGFUSE_HOST": f"http://127.0.0.1:{port}"},
        timeout_s=1,
    )
    phoenix = phoenix_exporter_from_env({"PHOENIX_COLLECTOR_ENDPOINT": f"http://127.0.0.1:{port}"}, timeout_s=1)
    assert langfuse is not None and phoenix is not None
    _lost(langfuse, 2)
    _lost(phoenix, 4)
    inner = langfuse._exporter  # type: ignore[attr-defined]
    assert isinstance(inner, CountingSpanExporter) and isinstance(phoenix, CountingSpanExporter)
    assert (inner.name, inner.failed) == ("langfuse", {REFUSED: 2})
    assert (phoenix.name, phoenix.failed) == ("phoenix", {REFUSED: 4})
    langfuse.shutdown()
    phoenix.shutdown()


def test_the_exporters_of_a_provider_are_wrapped_once() -> None:
    port = refused_port()
    provider = TracerProvider()
    otlp = OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces", timeout=1)
    bsp = BatchSpanProcessor(otlp, schedule_delay_millis=50)
    provider.add_span_processor(bsp)
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"http://127.0.0.1:{port}/x", timeout=1))
    )
    assert count_export_failures(provider) == 2
    assert count_export_failures(provider) == 0
    wrapped = bsp._batch_processor._exporter
    assert isinstance(wrapped, CountingSpanExporter) and wrapped.exporter is otlp
    tracer = provider.get_tracer("test")
    tracer.start_span("lost").end()
    provider.force_flush(5_000)
    provider.shutdown()
    assert wrapped.failed == {REFUSED: 1}


def test_an_export_to_a_backend_that_never_answers_gives_up_at_the_shutdown_deadline() -> None:
    never = threading.Event()
    with serve(always(Reply(200, hang=never))) as srv:
        exporter = CountingSpanExporter(OTLPSpanExporter(endpoint=srv.url + "/v1/traces", timeout=30))
        t0 = time.monotonic()
        with shutdown_deadline(0.5):
            result = exporter.export(spans(3))
        took = time.monotonic() - t0
        never.set()
        exporter.shutdown()
    assert result == SpanExportResult.FAILURE
    assert exporter.failed == {"deadline": 3}
    assert took < 2.0, took  # the exporter's own timeout is 30 s


class _Gate(SpanExporter):
    """An exporter whose backend does not answer until ``open`` is set; then it accepts or refuses."""

    def __init__(self, accept: bool) -> None:
        self.open = threading.Event()
        self.accept = accept
        self.delivered = 0
        self.received = 0
        self.calls = 0

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        self.calls += 1
        self.received += len(spans)
        self.open.wait(30)
        if not self.accept:
            return SpanExportResult.FAILURE
        self.delivered += len(spans)
        return SpanExportResult.SUCCESS


def _end_spans(provider: TracerProvider, n: int) -> None:
    tracer = provider.get_tracer("test")
    for i in range(n):
        tracer.start_span(f"s{i}").end()


@_NEEDS_BATCH_METRICS
def test_spans_the_batch_processor_drops_while_its_queue_is_full_are_counted() -> None:
    """The SDK drops silently when its queue is full (the exporter busy with a backend that does not
    answer): those spans never reach an exporter, so only the processor side can count them."""
    reader = InMemoryMetricReader()
    gate = _Gate(accept=True)
    provider = TracerProvider()
    bsp = BatchSpanProcessor(gate, max_queue_size=8, max_export_batch_size=4, schedule_delay_millis=10)
    provider.add_span_processor(bsp)
    counted = CountingSpanExporter(gate, meter_provider=MeterProvider(metric_readers=[reader]))
    _sdk.set_processor_exporter(bsp, counted)
    assert count_export_failures(provider) == 0  # already counting: its drops are hooked, nothing rewrapped
    _end_spans(provider, 60)
    gate.open.set()
    provider.force_flush(10_000)
    provider.shutdown()
    lost = counted.failed.get("queue_full", 0)
    assert lost >= 60 - 8 - 4  # at most a queue and a batch could be kept
    assert gate.delivered + lost == 60, (gate.delivered, counted.failed)
    assert failures(reader) == {("_Gate", "queue_full"): lost}


@_NEEDS_BATCH_METRICS
def test_spans_still_queued_when_shutdown_gives_up_and_spans_ended_after_it_are_counted() -> None:
    gate = _Gate(accept=False)
    provider = TracerProvider()
    bsp = BatchSpanProcessor(gate, max_queue_size=64, max_export_batch_size=4, schedule_delay_millis=10)
    provider.add_span_processor(bsp)
    count_export_failures(provider)
    counted = _sdk.processor_exporter(bsp)
    assert isinstance(counted, CountingSpanExporter)
    _end_spans(provider, 20)
    deadline = time.monotonic() + 10
    while gate.calls == 0 and time.monotonic() < deadline:  # the worker holds one batch in the exporter
        time.sleep(0.01)
    # the batch processor's own shutdown takes a timeout (the span processor's waits 30 s): give up at once
    bsp._batch_processor.shutdown(timeout_millis=1)
    gate.open.set()  # the batch in the exporter is refused
    bsp.on_end(spans(1)[0])  # a span that ends after the shutdown
    deadline = time.monotonic() + 10
    while sum(counted.failed.values()) < 20 + AFTER_SHUTDOWN and time.monotonic() < deadline:
        time.sleep(0.01)
    assert sum(counted.failed.values()) == 20 + AFTER_SHUTDOWN, counted.failed
    assert counted.failed["failure"] == gate.received and counted.failed.get("already_shutdown", 0) == AFTER_SHUTDOWN
    assert counted.failed["shutdown"] == 20 - gate.received


@_NEEDS_BATCH_METRICS
def test_spans_dropped_by_the_batch_processor_that_configure_builds_for_an_exporter_are_counted() -> None:
    """``configure(exporter=...)`` wraps the exporter in a batch processor of its own: its queue's drops
    during an outage count like those of the processors the SDK builds from ``OTEL_*`` variables."""
    from streamjudge import runtime

    gate = _Gate(accept=True)
    provider = TracerProvider()
    rt = runtime.configure(tracer_provider=provider, exporter=gate, backends_from_env=False, set_global=False)
    try:
        counted = _sdk.processor_exporter(rt.processor.downstream)
        assert isinstance(counted, CountingSpanExporter)
        _end_spans(provider, 2048 + 512 + 200)  # more than the default queue and one batch can keep
        gate.open.set()
        provider.force_flush(30_000)
        lost = counted.failed.get("queue_full", 0)
        assert lost > 0
        assert gate.delivered + lost == 2048 + 512 + 200, (gate.delivered, counted.failed)
    finally:
        gate.open.set()
        rt.shutdown()
