"""OTLP receivers of the worker: HTTP (protobuf on ``/v1/traces``) and gRPC (``TraceService/Export``).

Both hand each decoded request to :meth:`Worker.ingest` and answer only after it returned, so a span is
acknowledged once it is exported or held. While the worker shuts down they answer "unavailable" (HTTP 503,
gRPC ``UNAVAILABLE``): the collector keeps the request in its queue and retries it. The HTTP server also
serves ``GET /metrics`` (Prometheus text) and ``GET /healthz``.

Limits, so that a client (or anything that reaches the port) cannot take the worker down: at most
``max_connections`` connections are served at once (one more is answered 503 and closed); every read
from a connection (headers, body, the wait for the next keep-alive request) gives up after
``read_timeout_s``, and a request that has not fully arrived ``request_timeout_s`` after it began (a
client trickling bytes) is cut off; a body over ``max_request_bytes`` is refused with 413, before it is
read when its ``Content-Length`` says so, and while it is inflated when compressed (the cap is on the
inflated size).
With a bearer token configured, an export without ``Authorization: Bearer <token>`` gets 401 (gRPC:
``UNAUTHENTICATED``); with a certificate, both receivers speak TLS, and with a client CA only clients
holding a certificate it signed get through (mutual TLS). A client that leaves mid-request is counted,
not logged with a traceback.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
import socket
import ssl
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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

MAX_BODY_BYTES = 32 * 1024 * 1024  # default cap of one export request, compressed and inflated
_PROTOBUF = "application/x-protobuf"
_CHUNK = 64 * 1024
_BUSY = (b"HTTP/1.1 503 Service Unavailable\r\nRetry-After: 1\r\nContent-Length: 0\r\n"
         b"Connection: close\r\n\r\n")


@dataclass(frozen=True, slots=True)
class Limits:
    """What one receiver accepts."""

    max_connections: int = 32
    max_request_bytes: int = MAX_BODY_BYTES
    read_timeout_s: float = 10.0
    request_timeout_s: float = 30.0
    bearer_token: str | None = field(default=None, repr=False)
    #: TLS: the receivers' certificate and key (PEM); with a client CA, clients must present a certificate
    #: it signed (mutual TLS). The senders use the standard OTEL_EXPORTER_OTLP_CERTIFICATE /
    #: _CLIENT_CERTIFICATE / _CLIENT_KEY settings.
    tls_cert_file: str | None = None
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None

    def __post_init__(self) -> None:
        if self.max_connections < 1 or self.max_request_bytes < 1:
            raise ValueError("max_connections and max_request_bytes must be >= 1")
        if not (self.read_timeout_s > 0 and self.request_timeout_s > 0):  # nan fails too
            raise ValueError("read_timeout_s and request_timeout_s must be > 0")
        if bool(self.tls_cert_file) != bool(self.tls_key_file) or (self.tls_client_ca_file
                                                                    and not self.tls_cert_file):
            raise ValueError("TLS needs both a certificate and a key (and them for a client CA too)")

    def ssl_context(self) -> ssl.SSLContext | None:
        """The HTTP receiver's TLS context (None: plain text)."""
        if not self.tls_cert_file or not self.tls_key_file:
            return None
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        ctx.load_cert_chain(self.tls_cert_file, self.tls_key_file)
        if self.tls_client_ca_file:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(self.tls_client_ca_file)
        return ctx

    def grpc_credentials(self) -> Any:
        """The gRPC receiver's server credentials (None: plain text)."""
        if not self.tls_cert_file or not self.tls_key_file:
            return None
        import grpc

        with open(self.tls_key_file, "rb") as k, open(self.tls_cert_file, "rb") as c:
            pair = (k.read(), c.read())
        ca = None
        if self.tls_client_ca_file:
            with open(self.tls_client_ca_file, "rb") as f:
                ca = f.read()
        return grpc.ssl_server_credentials([pair], root_certificates=ca, require_client_auth=ca is not None)

    def authorized(self, header: str | None) -> bool:
        """Whether an ``Authorization`` header value carries the token (always, without a token)."""
        if not self.bearer_token:
            return True
        scheme, _, value = (header or "").strip().partition(" ")
        return scheme.lower() == "bearer" and hmac.compare_digest(value.strip().encode(),
                                                                    self.bearer_token.encode())


def split_endpoint(endpoint: str) -> tuple[str, int]:
    """``host:port`` (``[v6]:port`` too) -> (host, port)."""
    host, sep, port = endpoint.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"endpoint {endpoint!r} is not host:port")
    return host.strip("[]") or "127.0.0.1", int(port)


class TooLarge(ValueError):
    """The request body is over the cap (compressed or inflated)."""


def inflate(body: bytes, encoding: str, limit: int) -> bytes:
    """``body`` decoded per its ``Content-Encoding`` (gzip, deflate or none), never more than ``limit``
    bytes of output: the inflation runs in bounded steps and stops at the cap (:class:`TooLarge`)."""
    if encoding in ("", "identity"):
        return body
    if encoding not in ("gzip", "deflate"):
        raise ValueError(f"unsupported Content-Encoding {encoding!r}")
    d = zlib.decompressobj(47 if encoding == "gzip" else 15)  # gzip; zlib (deflate)
    out: list[bytes] = []
    size = 0
    data = body
    while not d.eof:
        piece = d.decompress(data, min(_CHUNK, limit + 1 - size))  # never 0: that would mean no limit
        size += len(piece)
        if size > limit:
            raise TooLarge(f"inflated body over {limit} bytes")
        out.append(piece)
        data = d.unconsumed_tail
        if not piece and not data:  # all input taken and nothing more comes out
            break
    if not d.eof:
        raise ValueError("truncated compressed body")
    return b"".join(out)


class _Deadlines:
    """Closes a connection whose request has not fully arrived within its deadline: a client trickling a
    byte now and then passes every per-read timeout, not this one. One thread for all connections."""

    def __init__(self, worker: Worker, period_s: float) -> None:
        self._worker = worker
        self._period = period_s
        self._due: dict[Any, float] = {}
        self.reaped: set[Any] = set()
        self._lock = threading.Lock()
        self._closed = threading.Event()
        threading.Thread(target=self._run, name="streamjudge-worker-http-deadlines", daemon=True).start()

    def arm(self, conn: Any, seconds: float) -> None:
        with self._lock:
            self._due[conn] = time.monotonic() + seconds

    def disarm(self, conn: Any) -> None:
        with self._lock:
            self._due.pop(conn, None)

    def forget(self, conn: Any) -> bool:
        """The connection ended; returns whether it was closed for being late."""
        with self._lock:
            self._due.pop(conn, None)
            if conn in self.reaped:
                self.reaped.discard(conn)
                return True
            return False

    def was_reaped(self, conn: Any) -> bool:
        with self._lock:
            return conn in self.reaped

    def close(self) -> None:
        self._closed.set()

    def _run(self) -> None:
        while not self._closed.wait(self._period):
            now = time.monotonic()
            with self._lock:
                late = [c for c, due in self._due.items() if due <= now]
                for c in late:
                    del self._due[c]
                    self.reaped.add(c)
            for c in late:
                self._worker.count_rejected("timeout")
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)  # the handler's blocked read returns at once


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 128
    worker: Worker
    limits: Limits

    def start_limits(self, worker: Worker, limits: Limits) -> None:
        self.worker = worker
        self.limits = limits
        self.slots = threading.BoundedSemaphore(limits.max_connections)
        self.deadlines = _Deadlines(worker, min(0.5, limits.request_timeout_s / 4))
        self.tls = limits.ssl_context()

    def process_request(self, request: Any, client_address: Any) -> None:
        if not self.slots.acquire(blocking=False):
            # over the bound: a thread per connection is what is being limited, so answer from here
            self.worker.count_rejected("busy")
            try:
                request.settimeout(1.0)
                request.sendall(_BUSY)
            except OSError:
                pass
            self.shutdown_request(request)
            return
        try:
            super().process_request(request, client_address)
        except BaseException:
            self.slots.release()
            raise

    def process_request_thread(self, request: Any, client_address: Any) -> None:
        try:
            super().process_request_thread(request, client_address)
        finally:
            self.deadlines.forget(request)
            self.slots.release()

    def server_close(self) -> None:
        super().server_close()
        self.deadlines.close()

    def handle_error(self, request: Any, client_address: Any) -> None:
        # a client that went away or stalled: counted, logged without a traceback
        import sys

        exc = sys.exc_info()[1]
        if not self.deadlines.was_reaped(request):  # counted as a timeout already
            reason = "aborted"
            if isinstance(exc, ssl.SSLError):
                reason = "tls"  # no client certificate, one the CA did not sign, or not TLS at all
            elif isinstance(exc, TimeoutError):
                reason = "timeout"
            self.worker.count_rejected(reason)
        _log.debug("streamjudge worker: request from %s ended early (%s)", client_address, exc)


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    protocol_version = "HTTP/1.1"  # keep-alive: the collector's exporter reuses its connection

    def setup(self) -> None:
        limits = self.server.limits
        self.raw = self.request  # the TCP socket: deadlines are kept by it
        self.served = 0
        self.raw.settimeout(limits.read_timeout_s)  # every read, idle waits too
        if self.server.tls is not None:
            # the handshake in this connection's thread, never in the accepting one, within the deadline
            self.server.deadlines.arm(self.raw, limits.request_timeout_s)
            self.request = self.server.tls.wrap_socket(self.raw, server_side=True)
        super().setup()

    def handle_one_request(self) -> None:
        # the whole request (line, headers, body) must arrive within request_timeout_s; handling it and
        # replying are not bounded by it
        self.server.deadlines.arm(self.raw, self.server.limits.request_timeout_s)
        super().handle_one_request()
        self.served += 1

    def _late(self) -> bool:
        # cut off at its deadline (counted then): what was read is partial, nothing can be answered
        if self.server.deadlines.was_reaped(self.raw):
            self.close_connection = True
            return True
        return False

    def log_error(self, format: str, *args: Any) -> None:
        # the server's own reads timing out (a request line or headers that never finished); an idle
        # keep-alive connection closing after its requests is normal
        if format.startswith("Request timed out") and not self.served:
            self.server.worker.count_rejected("timeout")

    def log_message(self, format: str, *args: Any) -> None:
        return None

    def do_GET(self) -> None:
        self.server.deadlines.disarm(self.raw)
        if self._late():
            return
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
        limits = self.server.limits
        if self._late():
            return
        if not limits.authorized(self.headers.get("Authorization")):
            self._refuse(401, "unauthorized", b"missing or wrong bearer token\n",
                         {"WWW-Authenticate": "Bearer"})
            return
        raw = (self.headers.get("Content-Length") or "").strip()
        if not raw:
            self._refuse(411, "bad_request", b"Content-Length required\n")
            return
        if not raw.isdigit():  # a sign, spaces or letters: nothing to read the body by
            self._refuse(400, "bad_request", b"bad Content-Length\n")
            return
        length = int(raw)
        if length > limits.max_request_bytes:
            self._refuse(413, "too_large", b"request too large\n")
            return
        body = self.rfile.read(length)
        self.server.deadlines.disarm(self.raw)
        if self._late():
            return
        if len(body) < length:  # the client closed before sending its whole body
            worker.count_rejected("aborted")
            self.close_connection = True
            return
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
            body = inflate(body, encoding, limits.max_request_bytes)
            request = ExportTraceServiceRequest()
            request.ParseFromString(body)
        except TooLarge:
            self._refuse(413, "too_large", b"request too large once inflated\n")
            return
        except (ValueError, zlib.error, DecodeError, RecursionError) as exc:
            worker.count_rejected("bad_request")
            self._reply(400, f"cannot decode the request: {exc}\n".encode(), "text/plain")
            return
        worker.ingest(request)
        self._reply(200, ExportTraceServiceResponse().SerializeToString(), _PROTOBUF)

    def _refuse(self, status: int, reason: str, body: bytes, headers: dict[str, str] | None = None) -> None:
        # the body was not read: the connection cannot carry another request
        self.server.worker.count_rejected(reason)
        self.close_connection = True
        self._reply(status, body, "text/plain", {"Connection": "close", **(headers or {})})

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

    def __init__(self, worker: Worker, endpoint: str, limits: Limits | None = None) -> None:
        host, port = split_endpoint(endpoint)
        self._server = _Server((host, port), _Handler)
        self._server.start_limits(worker, limits or Limits())
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

    def __init__(self, worker: Worker, endpoint: str, limits: Limits | None = None) -> None:
        import grpc
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc

        lim = limits or Limits()

        class Servicer(trace_service_pb2_grpc.TraceServiceServicer):  # type: ignore[misc]
            def Export(self, request: ExportTraceServiceRequest, context: Any) -> ExportTraceServiceResponse:
                metadata = dict(context.invocation_metadata() or ())
                if not lim.authorized(metadata.get("authorization")):
                    worker.count_rejected("unauthorized")
                    context.abort(grpc.StatusCode.UNAUTHENTICATED, "missing or wrong bearer token")
                if worker.stopping:
                    context.abort(grpc.StatusCode.UNAVAILABLE, "worker shutting down")
                worker.ingest(request)
                return ExportTraceServiceResponse()

        self._server = grpc.server(
            ThreadPoolExecutor(max_workers=4, thread_name_prefix="streamjudge-worker-grpc"),
            # gRPC checks the size after decompression too; calls past the bound get RESOURCE_EXHAUSTED
            options=[("grpc.max_receive_message_length", lim.max_request_bytes)],
            maximum_concurrent_rpcs=lim.max_connections,
        )
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            Servicer(), self._server
        )
        host, port = split_endpoint(endpoint)
        address = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        credentials = lim.grpc_credentials()
        bound = (self._server.add_insecure_port(address) if credentials is None
                 else self._server.add_secure_port(address, credentials))
        if not bound:
            raise OSError(f"cannot listen for OTLP/gRPC on {endpoint}")
        self.port = int(bound)

    def start(self) -> GrpcReceiver:
        self._server.start()
        return self

    def stop(self) -> None:
        # requests in flight finish (their spans are held); new ones are refused
        self._server.stop(grace=2.0).wait(3.0)


def grpc_receiver(worker: Worker, endpoint: str, limits: Limits | None = None) -> GrpcReceiver | None:
    """The gRPC receiver, or None (with a warning) when grpcio is not installed."""
    try:
        import grpc  # noqa: F401
        from opentelemetry.proto.collector.trace.v1 import trace_service_pb2_grpc  # noqa: F401
    except ImportError:
        _log.warning("streamjudge worker: grpcio is not installed; OTLP/gRPC is off (HTTP still serves)")
        return None
    return GrpcReceiver(worker, endpoint, limits)
