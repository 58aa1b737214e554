"""OTLP receivers of the worker: HTTP (protobuf on ``/v1/traces``) and gRPC (``TraceService/Export``).

Both hand each decoded request to :meth:`Worker.ingest` and answer only after it returned, so a span is
acknowledged once it is held or exported. While the worker shuts down they answer "unavailable" (HTTP 503,
gRPC ``UNAVAILABLE``): the collector keeps the request in its queue and retries it. The HTTP server also
serves ``GET /metrics`` (Prometheus text) and ``GET /healthz``.
"""

from __future__ import annotations

import gzip
import logging
import threading
import zlib
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import TYPE_CHECKING, Any

from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
    ExportTraceServiceRequest,
    ExportTraceServiceResponse,
)

if TYPE_CHECKING:
    from streamjudge.worker.worker import Worker

_log = logging.getLogger(__name__)

MAX_BODY_BYTES = 64 * 1024 * 1024
_PROTOBUF = "application/x-protobuf"


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    worker: Worker


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the collector's exporter reuses its connection

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        worker = self.server.worker
        if self.path == "/metrics":
            self._reply(200, worker.prometheus.render().encode(), "text/plain; version=0.0.4")
        elif self.path in ("/healthz", "/"):
            ok = not worker.stopping
            self._reply(200 if ok else 503, b"ok\n" if ok else b"stopping\n", "text/plain")
        else:
            self._reply(404, b"not found\n", "text/plain")

    def do_POST(self) -> None:
        worker = self.server.worker
        length = int(self.headers.get("Content-Length") or 0)
        if length > MAX_BODY_BYTES:
            self._reply(413, b"request too large\n", "text/plain")
            self.close_connection = True
            return
        body = self.rfile.read(length)
        if self.path != "/v1/traces":
            self._reply(404, b"only /v1/traces is served\n", "text/plain")
            return
        if worker.stopping:
            self._reply(503, b"worker shutting down\n", "text/plain", {"Retry-After": "1"})
            return
        ctype = (self.headers.get("Content-Type") or _PROTOBUF).split(";")[0].strip()
        if ctype != _PROTOBUF:
            self._reply(415, b"send OTLP protobuf (application/x-protobuf)\n", "text/plain")
            return
        try:
            encoding = (self.headers.get("Content-Encoding") or "").strip().lower()
            if encoding == "gzip":
                body = gzip.decompress(body)
            elif encoding == "deflate":
                body = zlib.decompress(body)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
        except (OSError, EOFError, zlib.error, DecodeError) as exc:
            self._reply(400, f"cannot decode the request: {exc}\n".encode(), "text/plain")
            return
        worker.ingest(request)
        self._reply(200, ExportTraceServiceResponse().SerializeToString(), _PROTOBUF)

    def _reply(self, status: int, body: bytes, ctype: str, headers: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(body)


class HttpReceiver:
    """OTLP/HTTP on ``endpoint`` (port 0: any free port, see :attr:`port`)."""

    def __init__(self, worker: Worker, endpoint: str) -> None:
        host, port = split_endpoint(endpoint)
        self._server = _Server((host, port), _Handler)
        self._server.worker = worker
        self.port = int(self._server.server_address[1])
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.1},
                                        name="streamjudge-worker-http", daemon=True)

    def start(self) -> HttpReceiver:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=5.0)


class GrpcReceiver:
    """OTLP/gRPC ``TraceService`` on ``endpoint``."""

    def __init__(self, worker: Worker, endpoint: str) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
                if worker.stopping:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "worker shutting down")
                worker.ingest(request)
                return ExportTraceServiceResponse()

        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="streamjudge-worker-grpc"),
            options=[("grpc.max_receive_message_length", MAX_BODY_BYTES)],
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            Servicer(), self._server
        )
        host, port = split_endpoint(endpoint)
        bound = self._server.add_insecure_port(f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
        if not bound:
            raise OSError(f"cannot listen for OTLP/gRPC on {endpoint}")
        self.port = int(bound)

    def start(self) -> GrpcReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        # requests in flight finish (their spans are held); new ones are refused
        self._server.stop(grace=2.0).wait(3.0)


def grpc_receiver(worker: Worker, endpoint: str) -> GrpcReceiver | None:
    """The gRPC receiver, or None (with a warning) when grpcio is not installed."""
    try:
        import grpc  # noqa: F401
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc  # noqa: F401
    except ImportError:
        _log.warning("streamjudge worker: grpcio is not installed; OTLP/gRPC is off (HTTP still serves)")
        return None
    return GrpcReceiver(worker, endpoint)
