"""The worker's OTLP receivers against clients that break the rules: compressed bombs, connections that
never finish, a bad ``Content-Length``, clients that leave mid-request, and exports without the token.
Every check is a count or a size; a wait is a deadline for something that must happen, never a margin."""

from __future__ import annotations

import socket
import threading
import time
import tracemalloc
import urllib.error
import urllib.request
import zlib
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from _fakes import KeywordJudge
from streamjudge.config import Settings
from streamjudge.worker import Worker, WorkerOptions
from worker._spans import app_trace, request

CAP = 1024 * 1024
MAX_CONNECTIONS = 8


def _worker(**options: object) -> Worker:
    opts = WorkerOptions(http_endpoint="127.0.0.1:0", grpc_endpoint="127.0.0.1:0", **options)  # type: ignore[arg-type]
    return Worker(Settings(), opts, export=SimpleSpanProcessor(InMemorySpanExporter()),
                  judge=KeywordJudge()).start()


@pytest.fixture
def worker() -> Iterator[Worker]:
    # timeouts far away: a slow machine must not free a slot in the middle of a count
    w = _worker(max_request_bytes=CAP, max_connections=MAX_CONNECTIONS, read_timeout_s=300.0,
                request_timeout_s=300.0)
    try:
        yield w
    finally:
        w.shutdown(5.0)


def _post(port: int, body: bytes, **headers: str) -> int:
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body,
                                 headers={"Content-Type": "application/x-protobuf", **headers})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return int(resp.status)
    except urllib.error.HTTPError as exc:
        return int(exc.code)


def _raw(port: int, data: bytes, *, timeout_s: float = 30.0) -> bytes:
    """Send ``data`` and read the reply until the server closes or answers."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout_s) as s:
        s.sendall(data)
        return s.recv(4096)


def _eventually(check: Callable[[], bool], timeout_s: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while not check() and time.monotonic() < deadline:
        time.sleep(0.02)
    return check()


def _bomb(inflated: int) -> bytes:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    return b"".join(c.compress(zeros) for _ in range(inflated >> 20)) + c.flush()


def test_a_gzip_body_is_capped_at_its_inflated_size(worker: Worker) -> None:
    bomb = _bomb(64 * CAP)  # 64 KB on the wire
    assert len(bomb) < CAP
    tracemalloc.start()
    try:
        status = _post(worker.http_port or 0, bomb, **{"Content-Encoding": "gzip"})
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert status == 413
    assert peak < 4 * CAP, f"{peak / 1e6:.1f} MB to refuse it"
    assert worker.rejected_counts() == {"too_large": 1}
    # under the cap, compressed bodies are still read
    ok = zlib.compress(request(app_trace(answer=False)).SerializeToString())
    assert _post(worker.http_port or 0, ok, **{"Content-Encoding": "deflate"}) == 200


def test_a_declared_length_over_the_cap_is_refused_before_reading(worker: Worker) -> None:
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: {CAP + 1}\r\n\r\n".encode()
    assert _raw(worker.http_port or 0, head).startswith(b"HTTP/1.1 413")


@pytest.mark.parametrize("length", ["-1", "12abc", " -5"])
def test_a_bad_content_length_gets_400(worker: Worker, length: str) -> None:
    head = f"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: {length}\r\n\r\n".encode()
    assert _raw(worker.http_port or 0, head).startswith(b"HTTP/1.1 400")
    assert worker.rejected_counts() == {"bad_request": 1}


def test_half_open_connections_are_bounded_and_refused_beyond_the_bound(worker: Worker) -> None:
    port = worker.http_port or 0
    threads_before = threading.active_count()
    half_open = []
    try:
        for _ in range(300):  # headers never finished
            s = socket.create_connection(("127.0.0.1", port), timeout=30)
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
            half_open.append(s)
        # the server accepts in order: once this one is answered, all 300 were seen
        assert _raw(port, b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n").startswith(b"HTTP/1.1 503")
        assert threading.active_count() <= threads_before + MAX_CONNECTIONS
        assert worker.rejected_counts()["busy"] == 300 - MAX_CONNECTIONS + 1
    finally:
        for s in half_open:
            s.close()
    # the slots come back as those connections end
    assert _eventually(lambda: _post(port, request(app_trace(answer=False)).SerializeToString()) == 200)


def test_a_connection_that_never_finishes_its_headers_is_closed_after_the_read_timeout() -> None:
    w = _worker(read_timeout_s=0.3)
    try:
        with socket.create_connection(("127.0.0.1", w.http_port or 0), timeout=30) as s:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\n")
            assert s.recv(4096) == b""  # closed by the server, well before this socket's own 30 s
        assert _eventually(lambda: w.rejected_counts().get("timeout") == 1)
    finally:
        w.shutdown(5.0)


def test_a_client_leaving_mid_body_is_counted_not_logged(worker: Worker, capfd: pytest.CaptureFixture[str]) -> None:
    port = worker.http_port or 0
    for _ in range(3):
        with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")  # RST
    assert _eventually(lambda: worker.rejected_counts().get("aborted") == 3)
    err = capfd.readouterr().err
    assert "Traceback" not in err and "Exception occurred" not in err


def test_with_a_token_an_export_must_carry_it() -> None:
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    w = _worker(bearer_token="s3cret-token")
    assert "s3cret-token" not in repr(w.options) + repr(w.options.limits())  # options get logged
    try:
        body = request(app_trace(answer=False)).SerializeToString()
        port = w.http_port or 0
        assert _post(port, body) == 401
        assert _post(port, body, Authorization="Bearer wrong") == 401
        assert _post(port, body, Authorization="Bearer s3cret-token") == 200
        # the SDK's exporters with the standard header settings (OTEL_EXPORTER_OTLP_HEADERS)
        spans = app_trace(answer=False)
        http = HttpExporter(endpoint=f"http://127.0.0.1:{port}/v1/traces",
                            headers={"Authorization": "Bearer s3cret-token"})
        assert http.export(spans) is SpanExportResult.SUCCESS
        grpc_ok = GrpcExporter(endpoint=f"127.0.0.1:{w.grpc_port}", insecure=True,
                               headers={"authorization": "Bearer s3cret-token"})
        grpc_bad = GrpcExporter(endpoint=f"127.0.0.1:{w.grpc_port}", insecure=True)
        try:
            assert grpc_ok.export(spans) is SpanExportResult.SUCCESS
            assert grpc_bad.export(spans) is SpanExportResult.FAILURE
        finally:
            grpc_ok.shutdown()
            grpc_bad.shutdown()
        assert w.rejected_counts() == {"unauthorized": 3}
    finally:
        w.shutdown(5.0)


def test_grpc_caps_the_inflated_size_of_a_compressed_export_too(worker: Worker) -> None:
    from opentelemetry.exporter.otlp.proto.grpc.exporter import Compression
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SpanExportResult

    provider = TracerProvider()
    span = provider.get_tracer("t").start_span("big", attributes={"blob": "a" * (2 * CAP)})
    span.end()
    exporter = GrpcExporter(endpoint=f"127.0.0.1:{worker.grpc_port}", insecure=True,
                            compression=Compression.Gzip, timeout=3)
    small = app_trace(answer=False)
    try:
        assert exporter.export([span]) is SpanExportResult.FAILURE  # a few KB on the wire, 2 MB inflated
        assert exporter.export(small) is SpanExportResult.SUCCESS
    finally:
        exporter.shutdown()


def test_a_client_trickling_its_headers_is_cut_off_at_the_request_deadline() -> None:
    # each byte comes well within the read timeout: only a deadline on the whole request ends it
    w = _worker(read_timeout_s=30.0, request_timeout_s=0.5)
    try:
        with socket.create_connection(("127.0.0.1", w.http_port or 0), timeout=30) as s:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\n")
            closed = False
            for _ in range(600):  # a byte every 50 ms: 30 s of trickling at most
                try:
                    s.sendall(b"X")
                except OSError:
                    closed = True
                    break
                time.sleep(0.05)
            assert closed, "the server kept a trickling request open"
        assert _eventually(lambda: w.rejected_counts() == {"timeout": 1}), w.rejected_counts()
    finally:
        w.shutdown(5.0)


def _pki(d: Path) -> dict[str, str]:
    """A CA, a server certificate for 127.0.0.1 and a client certificate, made with the openssl CLI."""
    import subprocess

    def run(*args: str) -> None:
        subprocess.run(["openssl", *args], check=True, capture_output=True, cwd=d, timeout=60)

    run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem", "-days", "2",
        "-subj", "/CN=test-ca")
    (d / "san.ext").write_text("subjectAltName=IP:127.0.0.1\n")
    for name in ("server", "client"):
        run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
            "-subj", f"/CN={name}")
        run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
            "-out", f"{name}.pem", "-days", "2", "-extfile", "san.ext")
    return {k: str(d / v) for k, v in {"ca": "ca.pem", "cert": "server.pem", "key": "server.key",
                                        "client_cert": "client.pem", "client_key": "client.key"}.items()}


def _refused(exporter: object, spans: object) -> bool:
    """Whether the OTLP/HTTP exporter's export failed: it returns a failure, or (before 1.40) raises the
    refused connection's error."""
    from opentelemetry.sdk.trace.export import SpanExportResult

    try:
        return exporter.export(spans) is SpanExportResult.FAILURE  # type: ignore[attr-defined]
    except OSError:
        return True


def test_with_a_client_ca_only_clients_holding_a_certificate_it_signed_are_served(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import shutil

    import grpc
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
    from opentelemetry.sdk.trace.export import SpanExportResult

    if shutil.which("openssl") is None:
        pytest.skip("the openssl command makes the test certificates")
    # requests lets these replace the CA file a session was given (the SDK's exporter sets it that way)
    monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
    monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
    pki = _pki(tmp_path)
    w = _worker(tls_cert_file=pki["cert"], tls_key_file=pki["key"], tls_client_ca_file=pki["ca"])
    spans = app_trace(answer=False)
    url = f"https://127.0.0.1:{w.http_port}/v1/traces"
    try:
        # the SDK's exporters with the standard certificate settings (OTEL_EXPORTER_OTLP_CERTIFICATE, ...)
        mutual = HttpExporter(endpoint=url, certificate_file=pki["ca"], client_certificate_file=pki["client_cert"],
                              client_key_file=pki["client_key"], timeout=5)
        anonymous = HttpExporter(endpoint=url, certificate_file=pki["ca"], timeout=2)
        assert mutual.export(spans) is SpanExportResult.SUCCESS
        assert _refused(anonymous, spans)
        plain = HttpExporter(endpoint=url.replace("https", "http"), timeout=2)
        assert _refused(plain, spans)
        read = Path
        creds = grpc.ssl_channel_credentials(read(pki["ca"]).read_bytes(), read(pki["client_key"]).read_bytes(),
                                             read(pki["client_cert"]).read_bytes())
        grpc_mutual = GrpcExporter(endpoint=f"127.0.0.1:{w.grpc_port}", credentials=creds, timeout=5)
        grpc_anonymous = GrpcExporter(endpoint=f"127.0.0.1:{w.grpc_port}", timeout=2,
                                      credentials=grpc.ssl_channel_credentials(read(pki["ca"]).read_bytes()))
        try:
            assert grpc_mutual.export(spans) is SpanExportResult.SUCCESS
            assert grpc_anonymous.export(spans) is SpanExportResult.FAILURE
        finally:
            grpc_mutual.shutdown()
            grpc_anonymous.shutdown()
        assert _eventually(lambda: w.rejected_counts().get("tls", 0) >= 2), w.rejected_counts()
    finally:
        w.shutdown(5.0)


@pytest.mark.parametrize("size", [0, 1, 70_000, 3_000_000])
def test_inflating_in_steps_gives_the_body_back_and_stops_one_byte_over_the_cap(size: int) -> None:
    import gzip
    import os

    from streamjudge.worker._receive import TooLarge, inflate

    raw = os.urandom(size // 2) + bytes(size - size // 2)
    assert inflate(gzip.compress(raw), "gzip", size) == raw  # exactly at the cap
    assert inflate(zlib.compress(raw), "deflate", size) == raw
    if size:
        with pytest.raises(TooLarge):
            inflate(gzip.compress(raw), "gzip", size - 1)
    with pytest.raises(ValueError, match="truncated"):
        inflate(gzip.compress(raw)[:-9], "gzip", size + 1)
