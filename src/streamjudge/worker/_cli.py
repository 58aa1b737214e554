"""``streamjudge worker`` on the command line: options, signals, a ready line and a stop line on stdout."""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
import threading
from typing import Any

_DEFAULTS = {"http": "127.0.0.1:4318", "grpc": "127.0.0.1:4317"}
#: the bearer token exports must carry (``--bearer-token-file`` takes precedence)
TOKEN_ENV = "STREAMJUDGE_WORKER_BEARER_TOKEN"


def _token(args: argparse.Namespace) -> str | None:
    if args.bearer_token_file:
        with open(args.bearer_token_file, encoding="utf-8") as f:
            token = f.read().strip()
        if not token:
            raise ValueError(f"{args.bearer_token_file} holds no token")
        return token
    return os.environ.get(TOKEN_ENV, "").strip() or None


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The worker's options (judging itself follows the STREAMJUDGE_* / EVAL_* settings)."""
    p.add_argument("--http", default=_DEFAULTS["http"],
                   help="OTLP/HTTP listen address host:port, or 'none' (default %(default)s)")
    p.add_argument("--grpc", default=_DEFAULTS["grpc"],
                   help="OTLP/gRPC listen address host:port, or 'none' (default %(default)s)")
    p.add_argument("--max-spans", type=int, default=100_000,
                   help="spans held across traces before the oldest trace leaves as it is")
    p.add_argument("--max-bytes", type=int, default=256 * 1024 * 1024,
                   help="encoded span bytes held, likewise")
    p.add_argument("--decision-wait", type=float, default=30.0,
                   help="seconds a trace waits for its deferred answer span (default %(default)s)")
    p.add_argument("--shutdown-timeout", type=float, default=10.0,
                   help="on SIGTERM: seconds to flush held traces and finish or mark judgements")
    p.add_argument("--hold-traces", action="store_true",
                   help="hold a trace's other spans until its answer is judged (a tail sampler downstream "
                        "sees whole traces); held spans are lost if the worker is killed")
    p.add_argument("--max-connections", type=int, default=32,
                   help="connections (HTTP) / concurrent calls (gRPC) served at once; more get 503")
    p.add_argument("--max-request-bytes", type=int, default=32 * 1024 * 1024,
                   help="largest export request, compressed and once inflated (413 beyond)")
    p.add_argument("--read-timeout", type=float, default=10.0,
                   help="seconds an HTTP connection may take for each read (headers, body, idle)")
    p.add_argument("--request-timeout", type=float, default=30.0,
                   help="seconds a whole HTTP request (line, headers, body) may take to arrive")
    p.add_argument("--tls-cert-file", default=None, help="PEM certificate: the receivers speak TLS")
    p.add_argument("--tls-key-file", default=None, help="PEM private key of --tls-cert-file")
    p.add_argument("--tls-client-ca-file", default=None,
                   help="PEM CA: only clients with a certificate it signed are served (mutual TLS)")
    p.add_argument("--bearer-token-file", default=None,
                   help=f"exports must carry 'Authorization: Bearer <the file's token>' (or set {TOKEN_ENV})")


def _endpoint(raw: str) -> str | None:
    return None if raw.strip().lower() in ("", "none", "off") else raw.strip()


def run(args: argparse.Namespace) -> int:
    """Run until SIGTERM/SIGINT, then shut down within the deadline."""
    from streamjudge.config import ConfigError, load_settings
    from streamjudge.worker.worker import Worker, WorkerOptions, otlp_metric_readers

    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        settings = load_settings()
        options = WorkerOptions(
            http_endpoint=_endpoint(args.http), grpc_endpoint=_endpoint(args.grpc),
            max_spans=args.max_spans, max_bytes=args.max_bytes, decision_wait_s=args.decision_wait,
            shutdown_timeout_s=args.shutdown_timeout, max_connections=args.max_connections,
            max_request_bytes=args.max_request_bytes, read_timeout_s=args.read_timeout,
            request_timeout_s=args.request_timeout,
            bearer_token=_token(args), hold_traces=args.hold_traces, tls_cert_file=args.tls_cert_file,
            tls_key_file=args.tls_key_file, tls_client_ca_file=args.tls_client_ca_file,
        )
        worker = Worker(settings, options, metric_readers=otlp_metric_readers())
    except (ConfigError, ValueError, OSError) as exc:
        print(f"streamjudge worker: {exc}", file=sys.stderr)
        return 2
    stop = threading.Event()

    def on_signal(signum: int, _frame: Any) -> None:
        stop.set()

    # before the receivers: once /healthz answers, a SIGTERM must reach the drain, not the default action
    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        worker.start()
    except OSError as exc:
        print(f"streamjudge worker: cannot listen: {exc}", file=sys.stderr)
        return 2
    _say({"event": "ready", "http_port": worker.http_port, "grpc_port": worker.grpc_port,
          "judge": settings.judge, "auth": "bearer" if options.bearer_token else "none"})
    while not stop.wait(1.0):
        pass
    summary = worker.shutdown()
    _say({"event": "stopped", **summary, "answers": worker.answer_counts()})
    return 0


def _say(payload: dict[str, Any]) -> None:
    print(json.dumps(payload), flush=True)
