"""A failing trace backend behind the real collector: the other backend is unaffected, the loss is visible."""

from __future__ import annotations

import base64
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from integration.infra import Collector, HttpSink, Jaeger, run_collector, run_http_sink, run_jaeger

pytestmark = pytest.mark.integration

SECRET = "sk-lf-never-in-a-log-7f3a"
AUTH = base64.b64encode(f"pk-lf-faults:{SECRET}".encode()).decode()


@pytest.fixture(scope="module")
def backends(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[HttpSink, Jaeger, Collector]]:
    log_dir: Path = tmp_path_factory.mktemp("faults")
    with run_http_sink() as langfuse, run_jaeger(log_dir) as jaeger:
        env = {
            "STREAMJUDGE_TRACES_EXPORTERS": "[otlp_grpc/jaeger, otlp_http/langfuse]",
            "LANGFUSE_OTLP_ENDPOINT": f"{langfuse.url}/api/public/otel",
            "LANGFUSE_AUTH": AUTH,
        }
        with run_collector(log_dir, jaeger.otlp_grpc_endpoint, env) as collector:
            yield langfuse, jaeger, collector


def _send_span(collector: Collector, name: str) -> str:
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-faults"}))
    provider.add_span_processor(
        SimpleSpanProcessor(OTLPSpanExporter(endpoint=f"{collector.otlp_http_url}/v1/traces"))
    )
    with provider.get_tracer("faults").start_as_current_span(name) as span:
        trace_id = format(span.get_span_context().trace_id, "032x")
    provider.shutdown()
    return trace_id


def _failed_spans(collector: Collector, exporter: str) -> float:
    pattern = re.compile(
        r'^otelcol_exporter_send_failed_spans(?:_total)?\{[^}]*exporter="'
        + re.escape(exporter)
        + r'"[^}]*\} (\S+)$'
    )
    return sum(
        float(m.group(1)) for line in collector.telemetry_text().splitlines() if (m := pattern.match(line))
    )


def _wait(predicate: object, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():  # type: ignore[operator]
            return
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_langfuse_rejecting_the_credentials_loses_only_langfuse_spans_and_says_so(
    backends: tuple[HttpSink, Jaeger, Collector],
) -> None:
    langfuse, jaeger, collector = backends
    langfuse.status = 401
    before = len(langfuse.requests)
    trace_id = _send_span(collector, "rejected-by-langfuse")

    jaeger.wait_for_trace(trace_id, lambda t: bool(t.get("spans")))
    _wait(lambda: _failed_spans(collector, "otlp_http/langfuse") >= 1, 30, "the failed-spans metric")
    # 401 is permanent: dropped at once, not retried against a backend that will keep refusing
    time.sleep(2)
    assert len(langfuse.requests) - before == 1
    assert _failed_spans(collector, "otlp_grpc/jaeger") == 0
    log = collector.process.log_tail(10**6)
    assert "otlp_http/langfuse" in log and "401" in log and "dropped_items" in log
    assert SECRET not in log and AUTH not in log


def test_langfuse_failing_with_5xx_is_retried_and_recovers(
    backends: tuple[HttpSink, Jaeger, Collector],
) -> None:
    langfuse, jaeger, collector = backends
    langfuse.status = 503
    before = len(langfuse.requests)
    trace_id = _send_span(collector, "retried-until-langfuse-recovers")

    def attempts() -> int:
        return sum(1 for r in langfuse.requests[before:] if r.path == "/api/public/otel/v1/traces")

    _wait(lambda: attempts() >= 2, 30, "a retry after 503")
    langfuse.status = 200
    failed_before = _failed_spans(collector, "otlp_http/langfuse")
    served = attempts()
    _wait(lambda: attempts() > served, 30, "the retry that succeeds")
    jaeger.wait_for_trace(trace_id, lambda t: bool(t.get("spans")))
    time.sleep(1)
    # the retry delivered it: nothing more was counted as lost
    assert _failed_spans(collector, "otlp_http/langfuse") == failed_before
