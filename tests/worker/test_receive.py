"""The worker's receivers on loopback: OTLP/HTTP (protobuf) and OTLP/gRPC from the SDK's own exporters."""

from __future__ import annotations

import gzip
import urllib.error
import urllib.request
from collections.abc import Iterator

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from _fakes import KeywordJudge
from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.worker import Worker, WorkerOptions
from worker._spans import app_trace, ids, request


@pytest.fixture
def running() -> Iterator[tuple[Worker, InMemorySpanExporter]]:
    out = InMemorySpanExporter()
    worker = Worker(Settings(), WorkerOptions(http_endpoint="127.0.0.1:0", grpc_endpoint="127.0.0.1:0"),
                    export=SimpleSpanProcessor(out), judge=KeywordJudge()).start()
    try:
        yield worker, out
    finally:
        if not worker.stopping:
            worker.shutdown(5.0)


def _post(port: int, body: bytes, **headers: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body,
                                 headers={"Content-Type": "application/x-protobuf", **headers})
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def test_the_sdks_http_exporter_delivers_to_the_worker(running: tuple[Worker, InMemorySpanExporter]) -> None:
    worker, out = running
    spans = app_trace()
    exporter = HttpExporter(endpoint=f"http://127.0.0.1:{worker.http_port}/v1/traces")
    assert exporter.export(spans) is SpanExportResult.SUCCESS
    worker.service.force_flush(10_000)
    assert {ids(s) for s in out.get_finished_spans()} == {ids(s) for s in spans}


def test_the_sdks_grpc_exporter_delivers_to_the_worker(running: tuple[Worker, InMemorySpanExporter]) -> None:
    worker, out = running
    spans = app_trace()
    exporter = GrpcExporter(endpoint=f"127.0.0.1:{worker.grpc_port}", insecure=True)
    try:
        assert exporter.export(spans) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()
    worker.service.force_flush(10_000)
    exported = out.get_finished_spans()
    assert {ids(s) for s in exported} == {ids(s) for s in spans}
    [answer] = [s for s in exported if s.name == semconv.SPAN_STREAM]
    assert answer.attributes[semconv.EVAL_STATUS] == "judged"


def test_gzip_bodies_are_read_and_json_or_garbage_is_refused_with_a_reason(
    running: tuple[Worker, InMemorySpanExporter],
) -> None:
    worker, out = running
    body = request(app_trace()).SerializeToString()
    assert _post(worker.http_port or 0, gzip.compress(body), **{"Content-Encoding": "gzip"}) == 200
    assert _post(worker.http_port or 0, b"{}", **{"Content-Type": "application/json"}) == 415
    assert _post(worker.http_port or 0, b"\xff\xff\xff", **{"Content-Encoding": "gzip"}) == 400
    worker.service.force_flush(10_000)
    assert len(out.get_finished_spans()) == 4


def test_metrics_show_the_queue_depth_and_what_is_held(running: tuple[Worker, InMemorySpanExporter]) -> None:
    worker, _out = running
    assert _post(worker.http_port or 0, request(app_trace(answer=False)).SerializeToString()) == 200
    with urllib.request.urlopen(f"http://127.0.0.1:{worker.http_port}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert "streamjudge_judge_queue_depth 0" in text
    assert "streamjudge_worker_buffer_traces 0" in text  # not held: handed on at once
    assert 'streamjudge_worker_spans_released_total{reason="forwarded"} 3' in text
    assert "streamjudge_worker_spans_received_total 3" in text


def test_a_stopping_worker_asks_the_sender_to_retry(running: tuple[Worker, InMemorySpanExporter]) -> None:
    worker, out = running
    port = worker.http_port or 0
    worker._stopping.set()  # shutdown has begun; the receivers are about to close
    assert _post(port, request(app_trace()).SerializeToString()) == 503
    assert out.get_finished_spans() == ()


def test_the_worker_names_itself_unless_the_sdk_variables_do(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamjudge.worker.worker import _resource

    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    monkeypatch.delenv("OTEL_RESOURCE_ATTRIBUTES", raising=False)
    assert _resource().attributes["service.name"] == "streamjudge-worker"
    monkeypatch.setenv("OTEL_SERVICE_NAME", "judges-eu")
    assert _resource().attributes["service.name"] == "judges-eu"


def test_metrics_are_pushed_over_otlp_unless_the_sdk_variable_says_none(monkeypatch: pytest.MonkeyPatch) -> None:
    from streamjudge.worker.worker import otlp_metric_readers

    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "none")
    assert otlp_metric_readers() == []
    monkeypatch.setenv("OTEL_METRICS_EXPORTER", "otlp")
    [reader] = otlp_metric_readers()
    reader.shutdown()
