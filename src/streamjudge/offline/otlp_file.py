"""A small OTLP/HTTP trace receiver that writes what it receives as OTLP JSON lines.

Used by ``streamjudge demo`` to read back what an instrumented application exported, without a collector:
the application's standard OTLP exporter (``http/protobuf``) posts to it on 127.0.0.1; each export request
becomes one line of the file in the OTLP/JSON encoding (the form the collector's file exporter writes: hex
trace and span ids, integer enums), and its spans are kept in memory, flattened, for the caller to read.
Metrics and logs requests are accepted and discarded.
"""

from __future__ import annotations

import base64
import gzip
import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from google.protobuf.json_format import MessageToDict
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)
from opentelemetry.proto.common.v1.common_pb2 import AnyValue

_ID_KEYS = frozenset({"traceId", "spanId", "parentSpanId"})


def _value(v: AnyValue) -> Any:
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    if kind == "kvlist_value":
        return {kv.key: _value(kv.value) for kv in v.kvlist_value.values}
    if kind == "bytes_value":
        return v.bytes_value.hex()
    return getattr(v, kind) if kind else None


@dataclass(frozen=True, slots=True)
class SpanEvent:
    """An event of a received span."""

    name: str
    time_ns: int
    attributes: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ReceivedSpan:
    """A received span, flattened (resource attributes copied onto it)."""

    name: str
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict[str, Any]
    events: tuple[SpanEvent, ...]
    status_code: int
    resource: dict[str, Any] = field(default_factory=dict)

    @property
    def duration_ms(self) -> float:
        """End minus start, in milliseconds."""
        return (self.end_ns - self.start_ns) / 1e6


def otlp_json(request: ExportTraceServiceRequest) -> dict[str, Any]:
    """``request`` in the OTLP/JSON encoding: lowerCamelCase keys, hex ids, integer enums."""
    data: dict[str, Any] = MessageToDict(request, use_integers_for_enums=True)

    def fix(node: Any) -> None:
        if isinstance(node, dict):
            for key, val in node.items():
                if key in _ID_KEYS and isinstance(val, str):
                    node[key] = base64.b64decode(val).hex()
                else:
                    fix(val)
        elif isinstance(node, list):
            for item in node:
                fix(item)

    fix(data)
    return data


def flatten(request: ExportTraceServiceRequest) -> list[ReceivedSpan]:
    """The spans of one export request."""
    out: list[ReceivedSpan] = []
    for rs in request.resource_spans:
        resource = {kv.key: _value(kv.value) for kv in rs.resource.attributes}
        for ss in rs.scope_spans:
            for s in ss.spans:
                out.append(ReceivedSpan(
                    name=s.name,
                    trace_id=s.trace_id.hex(),
                    span_id=s.span_id.hex(),
                    parent_span_id=s.parent_span_id.hex(),
                    start_ns=s.start_time_unix_nano,
                    end_ns=s.end_time_unix_nano,
                    attributes={kv.key: _value(kv.value) for kv in s.attributes},
                    events=tuple(
                        SpanEvent(e.name, e.time_unix_nano, {kv.key: _value(kv.value) for kv in e.attributes})
                        for e in s.events
                    ),
                    status_code=s.status.code,
                    resource=resource,
                ))
    return out


class OTLPFileReceiver:
    """Receives OTLP/HTTP trace exports on 127.0.0.1 (a free port) and appends them to ``path``.

    ``with OTLPFileReceiver(path) as rx:`` starts and stops it; :attr:`traces_endpoint` is the URL for
    ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT``.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text("")
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self.requests = 0
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return  # the application's exporter needs no access log

            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.headers.get("Content-Encoding") == "gzip":
                    body = gzip.decompress(body)
                status = 200
                if self.path.rstrip("/").endswith("/v1/traces"):
                    try:
                        receiver._traces(body)
                    except Exception:  # a body that is not an export request
                        status = 400
                payload = ExportTraceServiceResponse().SerializeToString()
                self.send_response(status)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.port: int = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, name="otlp-file-receiver",
                                        daemon=True)

    @property
    def traces_endpoint(self) -> str:
        """Where an OTLP/HTTP exporter sends traces."""
        return f"http://127.0.0.1:{self.port}/v1/traces"

    def start(self) -> OTLPFileReceiver:
        """Serve in a background thread."""
        self._thread.start()
        return self

    def stop(self) -> None:
        """Stop serving and close the port."""
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> OTLPFileReceiver:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def _traces(self, body: bytes) -> None:
        req = ExportTraceServiceRequest()
        req.ParseFromString(body)
        line = json.dumps(otlp_json(req), ensure_ascii=False, separators=(",", ":"))
        spans = flatten(req)
        with self._lock:
            self.requests += 1
            with self.path.open("a", encoding="utf-8") as fh:
                fh.write(line + "\n")
            self._spans.extend(spans)

    def spans(self) -> list[ReceivedSpan]:
        """Every span received so far."""
        with self._lock:
            return list(self._spans)

    def wait_for(
        self, predicate: Callable[[list[ReceivedSpan]], bool], timeout: float
    ) -> tuple[bool, list[ReceivedSpan]]:
        """Poll until ``predicate(spans)`` holds or ``timeout`` seconds pass; (held, spans)."""
        deadline = time.monotonic() + timeout
        while True:
            spans = self.spans()
            if predicate(spans):
                return True, spans
            if time.monotonic() >= deadline:
                return False, spans
            time.sleep(0.05)
