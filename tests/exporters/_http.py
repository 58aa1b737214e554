"""A scripted HTTP server on 127.0.0.1 that records requests (the backend side of the bridge tests), and
helpers to decode what it received and to run a test application in its own process."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest


@dataclass
class Seen:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Reply:
    status: int = 200
    body: bytes = b"{}"
    headers: dict[str, str] = field(default_factory=lambda: {"Content-Type": "application/json"})
    hang: threading.Event | None = None  # hold the request until this is set


Script = Callable[[Seen, int], Reply]  # (request, 0-based index) -> reply


class Recorder:
    def __init__(self, script: Script) -> None:
        self.script = script
        self.seen: list[Seen] = []
        self.lock = threading.Lock()
        self.url = ""

    def wait_for(self, n: int, timeout: float = 10.0) -> list[Seen]:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            with self.lock:
                if len(self.seen) >= n:
                    return list(self.seen)
            time.sleep(0.01)
        with self.lock:
            raise AssertionError(f"expected {n} requests, got {len(self.seen)}")


@contextmanager
def serve(script: Script) -> Iterator[Recorder]:
    rec = Recorder(script)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go in two writes: avoid 40 ms delayed-ACK stalls

        def do_POST(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length)
            headers = {k.lower(): v for k, v in self.headers.items()}
            seen = Seen("POST", self.path, headers, body, time.monotonic())
            with rec.lock:
                index = len(rec.seen)
                rec.seen.append(seen)
            reply = rec.script(seen, index)
            if reply.hang is not None:
                reply.hang.wait(30)
            self.send_response(reply.status)
            for k, v in reply.headers.items():
                self.send_header(k, v)
            self.send_header("Content-Length", str(len(reply.body)))
            self.end_headers()
            self.wfile.write(reply.body)

        def log_message(self, format: str, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    rec.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield rec
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def always(reply: Reply) -> Script:
    return lambda _seen, _i: reply


def sequence(*replies: Reply) -> Script:
    """The i-th request gets the i-th reply; later ones get the last."""
    return lambda _seen, i: replies[min(i, len(replies) - 1)]


def otlp_spans(seen: list[Seen], path: str) -> list[Any]:
    """The spans of every OTLP/HTTP protobuf export posted to ``path`` (gzip or not), in arrival order."""
    out: list[Any] = []
    for s in seen:
        if s.path != path:
            continue
        body = gzip.decompress(s.body) if s.headers.get("content-encoding") == "gzip" else s.body
        req = ExportTraceServiceRequest.FromString(body)
        out += [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
    return out


def run_app(script: Path, *args: str, env: dict[str, str] | None = None) -> None:
    """Run a test application script in its own process (one global tracer provider per process), with no
    OTEL_/STREAMJUDGE_/LANGFUSE_/PHOENIX_ variable of this process leaking in; fail with its stderr."""
    own = ("OTEL_", "STREAMJUDGE_", "LANGFUSE_", "PHOENIX_")
    clean = {k: v for k, v in os.environ.items() if not k.startswith(own)}
    proc = subprocess.run(
        [sys.executable, str(script), *args],
        env=clean | (env or {}),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
