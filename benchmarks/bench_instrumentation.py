"""Per-request overhead of streamjudge's instrumentation on the example LangGraph app behind uvicorn.

Three servers, one after the other, each the same app (``examples/adaptive_rag``) in its own uvicorn
process, streamed over SSE by concurrent HTTP clients for a fixed time:

- ``none``: no telemetry at all;
- ``openinference``: the OpenTelemetry SDK exporting OTLP/HTTP, FastAPI request spans (no per-chunk send
  spans) and openinference's LangChain instrumentation — the usual baseline;
- ``streamjudge``: the same plus streamjudge (node attributes, context capture, stream and checkpoint spans,
  the judge processor in the export path, local judge on every checkpoint and the final answer);
- ``streamjudge_unjudged``: streamjudge with ``STREAMJUDGE_SAMPLE_RATE=0``: every span and the guard, no judge
  call — what the instrumentation costs apart from the local judge's own CPU (which an LLM judge moves to
  another machine).

Spans go to a local OTLP/HTTP sink that answers 200 without decoding (so the client process stays cheap).
Tokens are produced without delay, so the numbers measure CPU overhead per request (the worst case).
Goal (issue 2): streamjudge adds <= 5 % over openinference alone.

    python benchmarks/bench_instrumentation.py [--seconds 10] [--concurrency 4] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
APP_DIR = ROOT / "examples" / "adaptive_rag"
QUESTIONS = (
    "How tall is the Eiffel Tower?",
    "Who made the first recorded ascent of Mount Kilimanjaro?",
    "How large is the Great Barrier Reef?",
    "Which capital cities does the Danube pass through?",
)
MODES = ("none", "openinference", "streamjudge", "streamjudge_unjudged")

# runs inside the server process: set telemetry up for MODE, then serve the example app
_SERVER = r"""
import os, sys
mode, port, app_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode != "none":
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    if mode == "openinference":
        from opentelemetry import trace
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from openinference.instrumentation.langchain import LangChainInstrumentor
        provider = TracerProvider(resource=Resource.create())
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        trace.set_tracer_provider(provider)
        LangChainInstrumentor().instrument(tracer_provider=provider)
    else:
        # what `opentelemetry-instrument` does with streamjudge's distro and configurator
        from streamjudge.instrumentation import StreamJudgeInstrumentor
        from streamjudge.instrumentation._setup import configure_from_env
        configure_from_env()
        StreamJudgeInstrumentor().instrument()
    FastAPIInstrumentor().instrument(exclude_spans=["send", "receive"])
sys.path.insert(0, app_dir)
import app as example
import uvicorn
uvicorn.run(example.app, host="127.0.0.1", port=port, log_level="warning")
"""


class _Sink(BaseHTTPRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        return

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self.send_response(200)
        self.send_header("Content-Length", "0")
        self.end_headers()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def _one(client: httpx.AsyncClient, url: str, q: str) -> int:
    tokens = 0
    async with client.stream("GET", url, params={"q": q}) as r:
        r.raise_for_status()
        async for line in r.aiter_lines():
            if line.startswith("event: token"):
                tokens += 1
    return tokens


async def _load(port: int, seconds: float, concurrency: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/chat"
    done = tokens = 0
    latencies: list[float] = []
    async with httpx.AsyncClient(timeout=60) as client:
        for q in QUESTIONS:  # warm-up: imports, first-request paths, judge construction
            await _one(client, url, q)
        start = time.perf_counter()
        stop_at = start + seconds

        async def worker(i: int) -> None:
            nonlocal done, tokens
            n = i
            while time.perf_counter() < stop_at:
                t0 = time.perf_counter()
                got = await _one(client, url, QUESTIONS[n % len(QUESTIONS)])
                tokens += got  # not `tokens += await ...`: that reads `tokens` before the await
                latencies.append(time.perf_counter() - t0)
                done += 1
                n += 1

        await asyncio.gather(*(worker(i) for i in range(concurrency)))
        elapsed = time.perf_counter() - start
    latencies.sort()
    return {
        "requests": done,
        "seconds": round(elapsed, 3),
        "requests_per_s": round(done / elapsed, 2),
        "tokens_per_s": round(tokens / elapsed, 1),
        "p50_ms": round(latencies[len(latencies) // 2] * 1e3, 2),
        "p95_ms": round(latencies[int(len(latencies) * 0.95)] * 1e3, 2),
    }


def run_mode(mode: str, sink_endpoint: str, seconds: float, concurrency: int) -> dict[str, float]:
    """Start the server for ``mode``, load it, stop it; the measured numbers."""
    port = _free_port()
    env = {
        **os.environ,
        "EXAMPLE_TOKEN_DELAY_MS": "0",
        "OTEL_EXPORTER_OTLP_ENDPOINT": sink_endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_SERVICE_NAME": f"bench-{mode}",
        "STREAMJUDGE_JUDGE": "local",
    }
    if mode == "streamjudge_unjudged":
        env["STREAMJUDGE_SAMPLE_RATE"] = "0"
    proc = subprocess.Popen([sys.executable, "-c", _SERVER, mode, str(port), str(APP_DIR)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"{mode} server exited: {proc.stderr.read() if proc.stderr else ''}")
            try:
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{mode} server did not start") from None
                time.sleep(0.1)
        return asyncio.run(_load(port, seconds, concurrency))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="streamjudge instrumentation overhead (one run)")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    try:
        results = {m: run_mode(m, endpoint, args.seconds, args.concurrency) for m in MODES}
    finally:
        sink.shutdown()
        sink.server_close()
    oi, sj, none = results["openinference"], results["streamjudge"], results["none"]
    unjudged = results["streamjudge_unjudged"]
    out: dict[str, Any] = {
        "benchmark": "instrumentation_overhead",
        "seconds_per_mode": args.seconds,
        "concurrency": args.concurrency,
        "modes": results,
        "ratios": {
            "streamjudge_vs_openinference_rps": round(sj["requests_per_s"] / oi["requests_per_s"], 4),
            "streamjudge_vs_openinference_tokens": round(sj["tokens_per_s"] / oi["tokens_per_s"], 4),
            "streamjudge_unjudged_vs_openinference_rps": round(
                unjudged["requests_per_s"] / oi["requests_per_s"], 4
            ),
            "streamjudge_vs_none_rps": round(sj["requests_per_s"] / none["requests_per_s"], 4),
            "openinference_vs_none_rps": round(oi["requests_per_s"] / none["requests_per_s"], 4),
        },
        "goal": "streamjudge_vs_openinference_rps >= 0.95",
    }
    out["goal_met"] = out["ratios"]["streamjudge_vs_openinference_rps"] >= 0.95
    if args.json:
        print(json.dumps(out))
    else:
        for m in MODES:
            r = results[m]
            print(f"{m:21s} {r['requests_per_s']:8.2f} req/s {r['tokens_per_s']:9.1f} tok/s "
                  f"p50 {r['p50_ms']:7.2f} ms p95 {r['p95_ms']:7.2f} ms ({r['requests']} requests)")
        for k, v in out["ratios"].items():
            print(f"{k:40s} {v:.4f}")
    return out


if __name__ == "__main__":
    main()
