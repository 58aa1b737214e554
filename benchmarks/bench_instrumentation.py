"""Per-request overhead of streamjudge's instrumentation on the example LangGraph app behind uvicorn.

Each variant is the same app (``examples/adaptive_rag``) in a fresh uvicorn process, streamed over SSE by
concurrent HTTP clients for a fixed time; variants are interleaved and each repeated:

- ``none``: no telemetry at all;
- ``openinference``: the OpenTelemetry SDK exporting OTLP/HTTP, FastAPI request spans (no per-chunk send
  spans) and openinference's LangChain instrumentation — the usual baseline of every ratio;
- ``openinference_inline``: the same, with openinference's tracer called inline (``run_inline``), as
  streamjudge sets it up: LangChain otherwise hands each of its callbacks to a thread pool. Against this
  one, streamjudge's ratio is what streamjudge itself adds, with the dispatch saving taken out;
- ``langfuse``: the Langfuse SDK's LangChain ``CallbackHandler`` on every graph run (its own OTLP export)
  and FastAPI request spans — the peer;
- ``streamjudge``: OpenTelemetry set up by streamjudge's configurator as ``opentelemetry-instrument`` does
  (node spans, context capture, stream and checkpoint spans, the judge processor in the export path, local
  judge on every checkpoint and the final answer) and FastAPI request spans;
- ``streamjudge_unjudged``: streamjudge with ``STREAMJUDGE_SAMPLE_RATE=0``: every span and the guard, no judge
  call — what the instrumentation costs apart from the local judge's own CPU (which an LLM judge moves to
  another machine).

Spans go to a local OTLP/HTTP sink that answers 200 without decoding (so the client process stays cheap).
Tokens are produced without delay, so the numbers measure CPU overhead per request (the worst case). Per
concurrency it prints requests/s and the server's CPU per request (user + system time of the server process
over the measured window), each as a ratio against ``openinference`` in the same repeat: the median and
the spread (min-max) over repeats. Goals: streamjudge's requests/s >= 0.95x openinference alone,
and its CPU per request <= the Langfuse handler's, at 4 and at 32 clients.

    python benchmarks/bench_instrumentation.py [--seconds 8] [--concurrency 4 32] [--repeat 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import socket
import statistics
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
MODES = ("none", "openinference", "openinference_inline", "langfuse", "streamjudge", "streamjudge_unjudged")

# runs inside the server process: set telemetry up for MODE, then serve the example app
_SERVER = r"""
import os, sys
mode, port, app_dir = sys.argv[1], int(sys.argv[2]), sys.argv[3]
if mode != "none":
    from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
    if mode == "langfuse":
        # the handler on every graph run without touching the app, as a global callback would be
        from contextvars import ContextVar
        from langchain_core.tracers.context import register_configure_hook
        from langfuse import Langfuse
        from langfuse.langchain import CallbackHandler
        Langfuse()  # from LANGFUSE_* (the sink); sets the global tracer provider
        handler_var = ContextVar("bench_langfuse_handler", default=None)
        register_configure_hook(handler_var, True)
        handler_var.set(CallbackHandler())
    elif mode.startswith("openinference"):
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
        if mode == "openinference_inline":
            from openinference.instrumentation.langchain._tracer import OpenInferenceTracer
            OpenInferenceTracer.run_inline = True
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


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of process ``pid`` and of its children so far: a judge worker process
    (``judge_processes``) does the server's judging, so its CPU is the server's too."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:  # a child that exited meanwhile: its parent's cutime has it once reaped
        return 0.0
    # utime, stime, and cutime, cstime of the children it reaped
    ticks = sum(int(fields[k]) for k in (11, 12, 13, 14))
    cpu = ticks / os.sysconf("SC_CLK_TCK")
    for task in Path(f"/proc/{pid}/task").glob("*/children"):
        try:
            kids = task.read_text().split()
        except OSError:
            continue
        cpu += sum(_cpu_s(int(k)) for k in kids)
    return cpu


async def _load(port: int, seconds: float, concurrency: int, pid: int) -> dict[str, float]:
    url = f"http://127.0.0.1:{port}/chat"
    done = tokens = 0
    latencies: list[float] = []
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        for q in QUESTIONS * 2:  # warm-up: imports, first-request paths, judge construction
            await _one(client, url, q)
        cpu0 = _cpu_s(pid)
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
        cpu = _cpu_s(pid) - cpu0
    latencies.sort()
    return {
        "requests": done,
        "seconds": round(elapsed, 3),
        "server_cpu_ms_per_request": round(cpu / max(1, done) * 1e3, 3),
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
        "LANGFUSE_PUBLIC_KEY": "pk-lf-bench",
        "LANGFUSE_SECRET_KEY": "sk-lf-bench",
        "LANGFUSE_BASE_URL": sink_endpoint,
        "LANGFUSE_TRACING_ENVIRONMENT": "bench",
    }
    if mode != "langfuse":
        for k in ("LANGFUSE_PUBLIC_KEY", "LANGFUSE_SECRET_KEY", "LANGFUSE_BASE_URL"):
            env.pop(k)
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
        return asyncio.run(_load(port, seconds, concurrency, proc.pid))
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _spread(values: list[float]) -> dict[str, float]:
    return {"median": round(statistics.median(values), 4), "min": round(min(values), 4),
            "max": round(max(values), 4)}


def main(argv: list[str] | None = None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(description="streamjudge instrumentation overhead")
    parser.add_argument("--seconds", type=float, default=8.0)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[4, 32])
    parser.add_argument("--repeat", type=int, default=2)
    parser.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    modes = [m for m in MODES if m in args.modes or m == "openinference"]
    sink = ThreadingHTTPServer(("127.0.0.1", 0), _Sink)
    threading.Thread(target=sink.serve_forever, daemon=True).start()
    endpoint = f"http://127.0.0.1:{sink.server_address[1]}"
    runs: dict[int, dict[str, list[dict[str, float]]]] = {c: {m: [] for m in modes} for c in args.concurrency}
    try:
        for rep in range(args.repeat):
            for c in args.concurrency:
                # interleaved, the order rotated per repeat: drift of the machine hits every variant alike
                k = rep % len(modes)
                for m in modes[k:] + modes[:k]:
                    runs[c][m].append(run_mode(m, endpoint, args.seconds, c))
    finally:
        sink.shutdown()
        sink.server_close()
    out: dict[str, Any] = {"benchmark": "instrumentation_overhead", "seconds_per_run": args.seconds,
                           "repeat": args.repeat, "by_concurrency": {}}
    goals: list[bool] = []
    for c in args.concurrency:
        r = runs[c]
        base = r["openinference"]
        summary: dict[str, Any] = {}
        for m in modes:
            rps = [x["requests_per_s"] / b["requests_per_s"] for x, b in zip(r[m], base, strict=True)]
            cpu = [x["server_cpu_ms_per_request"] / b["server_cpu_ms_per_request"]
                   for x, b in zip(r[m], base, strict=True)]
            summary[m] = {
                "requests_per_s": _spread([x["requests_per_s"] for x in r[m]]),
                "server_cpu_ms_per_request": _spread([x["server_cpu_ms_per_request"] for x in r[m]]),
                "p95_ms": _spread([x["p95_ms"] for x in r[m]]),
                "rps_vs_openinference": _spread(rps),
                "cpu_vs_openinference": _spread(cpu),
            }
        entry: dict[str, Any] = {"modes": summary}
        if "streamjudge" in summary:
            sj = summary["streamjudge"]
            entry["goal_rps"] = sj["rps_vs_openinference"]["median"] >= 0.95
            goals.append(entry["goal_rps"])
            if "langfuse" in summary:
                lf_cpu = summary["langfuse"]["server_cpu_ms_per_request"]["median"]
                entry["goal_cpu_vs_langfuse"] = sj["server_cpu_ms_per_request"]["median"] <= lf_cpu
                goals.append(entry["goal_cpu_vs_langfuse"])
            if "openinference_inline" in r:
                # what streamjudge adds on top of the tracer it sets up, dispatch for dispatch
                inl = r["openinference_inline"]
                entry["streamjudge_vs_openinference_inline"] = {
                    "rps": _spread([x["requests_per_s"] / b["requests_per_s"]
                                    for x, b in zip(r["streamjudge"], inl, strict=True)]),
                    "cpu": _spread([x["server_cpu_ms_per_request"] / b["server_cpu_ms_per_request"]
                                    for x, b in zip(r["streamjudge"], inl, strict=True)]),
                }
        out["by_concurrency"][str(c)] = entry
    out["goal"] = ("streamjudge requests/s >= 0.95x openinference and CPU per request <= Langfuse handler's, "
                   "at every concurrency")
    out["goal_met"] = all(goals) if goals else None
    if args.json:
        print(json.dumps(out))
        return out
    for c in args.concurrency:
        entry = out["by_concurrency"][str(c)]
        print(f"{c} clients ({args.repeat} repeats x {args.seconds:g} s; ratio vs openinference in the same "
              "repeat, median [min-max])")
        for m, v in entry["modes"].items():
            rr, cr = v["rps_vs_openinference"], v["cpu_vs_openinference"]
            print(f"  {m:21s} {v['requests_per_s']['median']:8.2f} req/s  x{rr['median']:.3f} "
                  f"[{rr['min']:.3f}-{rr['max']:.3f}]   CPU {v['server_cpu_ms_per_request']['median']:7.2f} "
                  f"ms/req  x{cr['median']:.3f} [{cr['min']:.3f}-{cr['max']:.3f}]   "
                  f"p95 {v['p95_ms']['median']:7.1f} ms")
        own = entry.get("streamjudge_vs_openinference_inline")
        if own:
            print(f"  streamjudge vs openinference_inline (what streamjudge adds): requests/s "
                  f"x{own['rps']['median']:.3f} [{own['rps']['min']:.3f}-{own['rps']['max']:.3f}], CPU per "
                  f"request x{own['cpu']['median']:.3f} [{own['cpu']['min']:.3f}-{own['cpu']['max']:.3f}]")
        for k in ("goal_rps", "goal_cpu_vs_langfuse"):
            if k in entry:
                print(f"  {k}: {entry[k]}")
    print(f"goal met: {out['goal_met']}")
    return out


if __name__ == "__main__":
    main()
