"""A real OTLP/HTTP receiver for tests: decodes protobuf exports with opentelemetry-proto.

Listens on 127.0.0.1 (a free port); ``/v1/traces`` requests are decoded into flat span records, logs and
metrics requests are accepted and counted. Gzip bodies (the SDK exporter's default may compress) are
inflated.
"""

from __future__ import annotations

import gzip
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from opentelemetry.proto.collector.logs.v1.logs_service_pb2 import ExportLogsServiceRequest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind) if kind else None


@dataclass
class Event:
    name: str
    attributes: dict[str, Any]


@dataclass
class SpanRecord:
    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: list[Event]
    status_code: int
    resource: dict[str, Any] = field(default_factory=dict)
    links: list[tuple[str, str]] = field(default_factory=list)


class OTLPReceiver:
    """Collects spans and log records; :meth:`wait_for` polls until a predicate holds."""

    def __init__(self) -> None:
        self.spans: list[SpanRecord] = []
        self.logs: list[dict[str, Any]] = []
        self.requests: dict[str, int] = {}
        self._lock = threading.Lock()
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                receiver._handle(self.path, body, dict(self.headers))
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self._server.server_address[1]
        self.headers_seen: list[dict[str, str]] = []
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> OTLPReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _handle(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        with self._lock:
            self.requests[path] = self.requests.get(path, 0) + 1
            self.headers_seen.append(headers)
        if path == "/v1/traces":
            req = ExportTraceServiceRequest()
            req.ParseFromString(body)
            out = []
            for rs in req.resource_spans:
                resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        out.append(SpanRecord(
                            name=s.name,
                            trace_id=s.trace_id.hex(),
                            span_id=s.span_id.hex(),
                            parent_span_id=s.parent_span_id.hex(),
                            start_ns=s.start_time_unix_nano,
                            end_ns=s.end_time_unix_nano,
                            attributes={kv.key: _value(kv.value) for kv in s.attributes},
                            events=[Event(e.name, {kv.key: _value(kv.value) for kv in e.attributes})
                                    for e in s.events],
                            status_code=s.status.code,
                            resource=resource,
                            links=[(ln.trace_id.hex(), ln.span_id.hex()) for ln in s.links],
                        ))
            with self._lock:
                self.spans.extend(out)
        elif path == "/v1/logs":
            req_l = ExportLogsServiceRequest()
            req_l.ParseFromString(body)
            with self._lock:
                for rl in req_l.resource_logs:
                    for sl in rl.scope_logs:
                        for r in sl.log_records:
                            self.logs.append({
                                "event_name": r.event_name,
                                "trace_id": r.trace_id.hex(),
                                "span_id": r.span_id.hex(),
                                "attributes": {kv.key: _value(kv.value) for kv in r.attributes},
                            })

    def snapshot(self) -> list[SpanRecord]:
        with self._lock:
            return list(self.spans)

    def wait_for(
        self, predicate: Callable[[list[SpanRecord]], bool], timeout: float = 30.0
    ) -> list[SpanRecord]:
        """Poll until ``predicate(spans)`` is true; returns the spans (raises AssertionError on timeout)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.snapshot()
            if predicate(spans):
                return spans
            if time.monotonic() > deadline:
                names = sorted({s.name for s in spans})
                raise AssertionError(f"timed out waiting for spans; have {len(spans)}: {names}")
            time.sleep(0.1)
