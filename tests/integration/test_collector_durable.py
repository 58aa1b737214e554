"""The no-loss deployment: a local collector with a persistent (file_storage) sending queue in front of
the trace backend (collector/otel-config-durable.yaml). The backend is down while the application
exports, the local collector is killed (SIGKILL) and restarted during the outage, then the backend comes
back: every span arrives, none is counted lost by the application."""

from __future__ import annotations

import signal
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from integration.infra import COLLECTOR_DIR, Process, collector_binary, free_port, http_get
from streamjudge import _sdk
from streamjudge.exporters._counting import CountingSpanExporter, count_export_failures

pytestmark = pytest.mark.integration

DURABLE_CONFIG = COLLECTOR_DIR / "otel-config-durable.yaml"
SPANS = 3000


class _Backend:
    """An OTLP/HTTP trace backend on a fixed port, started when the outage ends."""

    def __init__(self, port: int) -> None:
        import gzip

        self.seen: Counter[tuple[int, int]] = Counter()
        lock = threading.Lock()
        seen = self.seen

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return None

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                request = ExportTraceServiceRequest()
                request.ParseFromString(body)
                with lock:
                    for rs in request.resource_spans:
                        for ss in rs.scope_spans:
                            for s in ss.spans:
                                seen[(int.from_bytes(s.trace_id, "big"), int.from_bytes(s.span_id, "big"))] += 1
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self.server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        self.server.daemon_threads = True
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@contextmanager
def _collector(log_dir: Path, env: dict[str, str], name: str) -> Iterator[Process]:
    proc = Process(name, [str(collector_binary()), "--config", str(DURABLE_CONFIG)], log_dir, env)
    try:
        proc.wait_ready(lambda: http_get(f"http://{env['STREAMJUDGE_COLLECTOR_HEALTH_ENDPOINT']}/",
                                         timeout=1.0)[0] == 200)
        yield proc
    finally:
        proc.stop()


def _queued(env: dict[str, str]) -> float:
    status, body = http_get(f"http://127.0.0.1:{env['STREAMJUDGE_COLLECTOR_TELEMETRY_PORT']}/metrics")
    assert status == 200
    return sum(float(line.rsplit(" ", 1)[1]) for line in body.decode().splitlines()
               if line.startswith("otelcol_exporter_queue_size"))


def _wait(check: Any, timeout_s: float, what: str) -> None:
    import time

    deadline = time.monotonic() + timeout_s
    while not check():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


@pytest.mark.timeout(240)
def test_a_backend_outage_and_a_killed_local_collector_lose_no_span(tmp_path: Path) -> None:
    backend_port = free_port()
    storage = tmp_path / "queue"
    storage.mkdir()
    env = {
        "STREAMJUDGE_COLLECTOR_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_HEALTH_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_TELEMETRY_PORT": str(free_port()),
        "STREAMJUDGE_COLLECTOR_STORAGE_DIR": str(storage),
        "STREAMJUDGE_COLLECTOR_BACKEND_ENDPOINT": f"http://127.0.0.1:{backend_port}",
    }
    # the application: the SDK's batch processor and OTLP exporter, every loss counted
    provider = TracerProvider(resource=Resource.create({"service.name": "durable-app"}))
    bsp = BatchSpanProcessor(OTLPSpanExporter(endpoint=f"http://{env['STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT']}"
                                                       "/v1/traces", timeout=10))
    provider.add_span_processor(bsp)
    count_export_failures(provider)
    counted = _sdk.processor_exporter(bsp)
    assert isinstance(counted, CountingSpanExporter)
    sent: set[tuple[int, int]] = set()
    with _collector(tmp_path, env, "otelcol-durable-1") as first:
        tracer = provider.get_tracer("durable")
        for i in range(SPANS):  # the backend is down (nothing listens on its port)
            with tracer.start_as_current_span(f"s{i}") as span:
                ctx = span.get_span_context()
                sent.add((ctx.trace_id, ctx.span_id))
        assert provider.force_flush(60_000)
        _wait(lambda: _queued(env) > 0, 30, "the collector to queue the spans")
        first.popen.send_signal(signal.SIGKILL)  # no chance to flush anything
        first.popen.wait(10)
    assert counted.failed == {}, "the application lost spans"
    backend: _Backend | None = None
    try:
        with _collector(tmp_path, env, "otelcol-durable-2"):
            # the restarted collector found the queue the killed one left on disk
            _wait(lambda: _queued(env) > 0, 30, "the restarted collector to load its queue")
            backend = _Backend(backend_port)  # the outage ends
            _wait(lambda: set(backend.seen) >= sent, 120, "the backend to receive every span")
        lost = sent - set(backend.seen)
        print(f"\nproduced {len(sent)}, delivered {len(set(backend.seen))}, lost {len(lost)}, "
              f"delivered twice {sum(1 for n in backend.seen.values() if n > 1)}, "
              f"counted lost by the app {sum(counted.failed.values())}")
        assert not lost
        assert set(backend.seen) == sent
    finally:
        if backend is not None:
            backend.stop()
        provider.shutdown()
