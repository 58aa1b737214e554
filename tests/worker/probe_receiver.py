"""Probe the worker's OTLP/HTTP receiver the way an unfriendly client would; prints one JSON line.

    PYTHONPATH=src python tests/worker/probe_receiver.py bomb|half_open|bad_length|aborted

Runs a worker in this process on 127.0.0.1 (so its RSS, threads and stderr are this process's). Not a
test: the figures in docs/reliability.md come from it (before/after the receiver's limits).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
import zlib

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamjudge.config import Settings
from streamjudge.worker import Worker, WorkerOptions


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def bomb(port: int) -> dict[str, object]:
    c = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = bytes(1 << 20)
    body = b"".join(c.compress(zeros) for _ in range(1024)) + c.flush()  # 1 GiB inflated
    before = _rss_mb()
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/traces", data=body, headers={
        "Content-Type": "application/x-protobuf", "Content-Encoding": "gzip"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            status = resp.status
    except urllib.error.HTTPError as exc:
        status = exc.code
    return {"gzip_bytes": len(body), "status": status, "peak_rss_growth_mb": round(_rss_mb() - before),
            "seconds": round(time.monotonic() - t0, 2)}


def half_open(port: int, n: int = 1500) -> dict[str, object]:
    threads = threading.active_count()
    socks = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=30)
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n")
        socks.append(s)
    time.sleep(2.0)  # a probe, not a test: let the server take them in
    out = {"connections": n, "server_threads_added": threading.active_count() - threads,
           "open_fds": len(os.listdir("/proc/self/fd"))}
    for s in socks:
        s.close()
    return out


def bad_length(port: int) -> dict[str, object]:
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: -1\r\n\r\n")
        try:
            reply = s.recv(100).split(b"\r\n", 1)[0].decode()
        except TimeoutError:
            reply = "no reply in 5 s"
    return {"reply": reply}


def aborted(port: int, n: int = 10) -> dict[str, object]:
    for _ in range(n):
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(b"POST /v1/traces HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n" + b"x" * 10)
            s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    time.sleep(1.0)
    return {"clients": n}


def main() -> None:
    which = sys.argv[1]
    with tempfile.TemporaryFile() as err:
        saved = os.dup(2)
        os.dup2(err.fileno(), 2)
        worker = Worker(Settings(), WorkerOptions(http_endpoint="127.0.0.1:0", grpc_endpoint=None),
                        export=SimpleSpanProcessor(InMemorySpanExporter())).start()
        try:
            probe = {"bomb": bomb, "half_open": half_open, "bad_length": bad_length, "aborted": aborted}[which]
            result = probe(worker.http_port or 0)
        finally:
            os.dup2(saved, 2)
        err.seek(0)
        result["stderr_tracebacks"] = err.read().decode(errors="replace").count("Traceback")
    counts = getattr(worker, "rejected_counts", None)
    if counts is not None:
        result["rejected_counted"] = counts()
    print(json.dumps({"probe": which, **result}), flush=True)
    os._exit(0)  # half-open sockets and their threads: no orderly shutdown needed for a probe


if __name__ == "__main__":
    main()
