"""Span exports that fail are counted in ``streamjudge.export.failures`` (issue 10 #18): a backend that is
down, refusing, or restarting was visible only in the SDK's log lines."""

from __future__ import annotations

import socket
import threading
import time
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
from streamjudge import semconv
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
