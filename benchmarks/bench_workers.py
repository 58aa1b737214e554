"""Scale-out final pass: throughput with 1, 2 and 3 ``streamjudge worker`` processes behind the collector
gateway, against a scripted LLM judge server that answers every model call after 300 ms.

Real processes on 127.0.0.1: app processes (``tests/integration/worker_app.py``, final pass deferred) ->
the collector built from ``collector/builder-config.yaml`` running ``collector/gateway-config.yaml`` ->
N workers (judge ``llm``, ``STREAMJUDGE_CONCURRENCY`` calls each) -> an OTLP sink in this process that
stamps each answer span's arrival. The scripted server runs in this process too.

Reported per N:
- burst: answers/s from the first answer's end to the last enriched answer at the sink, and its ratio
  to the ideal ``N x concurrency / 0.3 s`` (the judge's latency is the only work that cannot overlap);
- paced (about half the ideal rate): p50 / p99 added delay from the answer span's end in the app to the
  enriched span at the sink (includes the app's, the gateway's and the worker's batching);
- CPU seconds of the gateway and of each worker per 1,000 answers (utime+stime from /proc), and their
  peak RSS (VmHWM).

Not a test and not in the Makefile's BENCHES (it runs for a few minutes on a 2-core box):

    python benchmarks/bench_workers.py [--answers 240] [--concurrency 8] [--json]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "tests"), str(ROOT / "tests" / "judges"), str(ROOT / "tests" / "integration")]

from scripted_server import ScriptedLLMServer  # noqa: E402

from instrumentation.otlp_receiver import OTLPReceiver  # noqa: E402
from integration.infra import free_port  # noqa: E402
from integration.test_worker_scale_out import WorkerProc, _env, run_gateway  # noqa: E402
from streamjudge import semconv  # noqa: E402

LATENCY_S = 0.3
APP = ROOT / "tests" / "integration" / "worker_app.py"
TICK = os.sysconf("SC_CLK_TCK")


class StampingSink(OTLPReceiver):
    """An OTLP sink that remembers when each judged answer span arrived (wall clock, ns)."""

    def __init__(self) -> None:
        super().__init__()
        self.arrived: dict[str, tuple[int, int]] = {}  # span id -> (end_ns in the app, arrival ns)
        self._stamp_lock = threading.Lock()

    def _handle(self, path: str, body: bytes, headers: dict[str, str]) -> None:
        before = len(self.spans)
        super()._handle(path, body, headers)
        now = time.time_ns()
        with self._lock:
            new = self.spans[before:]
        with self._stamp_lock:
            for s in new:
                if s.attributes.get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM:
                    self.arrived[s.span_id] = (s.end_ns, now)

    def reset(self) -> None:
        with self._lock:
            self.spans.clear()
        with self._stamp_lock:
            self.arrived.clear()


def _cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK  # utime, stime


def _hwm_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return 0.0


def _answers(worker: WorkerProc) -> int:
    """Deferred answers this worker has exported so far (its own counter)."""
    prefix = semconv.METRIC_WORKER_ANSWERS.replace(".", "_") + "_total{"
    return sum(int(float(line.rsplit(" ", 1)[1])) for line in worker.metrics().splitlines()
               if line.startswith(prefix))


def _apps(gateway_url: str, out_dir: Path, apps: int, per_app: int, delay: float) -> None:
    env = {**os.environ, **_env(OTEL_EXPORTER_OTLP_ENDPOINT=gateway_url)}
    procs = [
        subprocess.Popen([sys.executable, str(APP), "--traces", str(per_app), "--seed", str(i),
                          "--delay", str(delay), "--out", str(out_dir / f"app{i}.jsonl")],
                         env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)
        for i in range(apps)
    ]
    for p in procs:
        if p.wait(timeout=600) != 0:
            raise RuntimeError("an app process failed")


def _wait(sink: StampingSink, n: int, limit_s: float) -> None:
    deadline = time.monotonic() + limit_s
    while len(sink.arrived) < n and time.monotonic() < deadline:
        time.sleep(0.05)


def _pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 else values[0]


def run(n_workers: int, answers: int, concurrency: int, server: ScriptedLLMServer, log_dir: Path,
        apps: int = 3) -> dict[str, Any]:
    sink = StampingSink().start()
    judge_env = {
        "STREAMJUDGE_JUDGE": "llm", "STREAMJUDGE_CONCURRENCY": str(concurrency),
        "STREAMJUDGE_QUEUE_SIZE": "10000", "EVAL_PROVIDER": "openai_compatible",
        "EVAL_BASE_URL": server.openai_base_url, "EVAL_MODEL": "scripted-judge", "EVAL_API_KEY": "bench",
    }
    ideal = n_workers * concurrency / LATENCY_S
    with contextlib.ExitStack() as stack:
        stack.callback(sink.stop)
        workers = []
        for i in range(n_workers):
            w = WorkerProc(f"bench-w{i}", free_port(), free_port(), sink, log_dir, extra_env=judge_env)
            stack.callback(w.stop)
            workers.append(w.start())
        gateway = stack.enter_context(run_gateway(log_dir, [w.endpoint for w in workers]))
        pids = {"gateway": gateway.process.popen.pid,
                **{w.name: w.process.popen.pid for w in workers if w.process is not None}}
        # warm-up: imports, judge clients, connections
        _apps(gateway.otlp_http_url, log_dir, 1, 5, 0.0)
        _wait(sink, 5, 60)
        sink.reset()
        cpu0 = {k: _cpu_s(p) for k, p in pids.items()}
        handled0 = {w.name: _answers(w) for w in workers}
        # burst: all answers at once, the workers' queues absorb them
        _apps(gateway.otlp_http_url, log_dir, apps, answers // apps, 0.0)
        total = apps * (answers // apps)
        _wait(sink, total, 600)
        cpu1 = {k: _cpu_s(p) for k, p in pids.items()}
        handled = {w.name: _answers(w) - handled0[w.name] for w in workers}
        stamps = list(sink.arrived.values())
        statuses: dict[str, int] = {}
        for span in sink.snapshot():
            if span.attributes.get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM:
                st = str(span.attributes.get(semconv.EVAL_STATUS))
                statuses[st] = statuses.get(st, 0) + 1
        span_s = (max(a for _, a in stamps) - min(e for e, _ in stamps)) / 1e9
        throughput = len(stamps) / span_s
        # paced at half the ideal rate: the added delay of the pipeline, not of a queue
        sink.reset()
        paced_n = min(total, max(30, int(ideal * 4)))
        per_app = max(1, paced_n // apps)
        _apps(gateway.otlp_http_url, log_dir, apps, per_app, delay=apps / (ideal * 0.5))
        _wait(sink, apps * per_app, 300)
        delays = [(a - e) / 1e6 for e, a in sink.arrived.values()]
        return {
            "workers": n_workers,
            "concurrency": concurrency,
            "answers": len(stamps),
            "statuses": statuses,
            "answers_per_s": round(throughput, 2),
            "ideal_answers_per_s": round(ideal, 2),
            "ratio_to_ideal": round(throughput / ideal, 3),
            "paced_answers": len(delays),
            "delay_p50_ms": round(_pct(delays, 50), 1),
            "delay_p99_ms": round(_pct(delays, 99), 1),
            # each process per 1,000 answers *it* handled (the gateway handles all of them)
            "cpu_s_per_1000_answers": {
                k: round((cpu1[k] - cpu0[k]) / max(1, handled.get(k, len(stamps))) * 1000, 2) for k in pids
            },
            "answers_per_worker": handled,
            "peak_rss_mb": {k: round(_hwm_mb(p), 1) for k, p in pids.items()},
        }


def _line(r: dict[str, Any]) -> str:
    return (
        f"{r['workers']} worker(s): {r['answers_per_s']:.1f} answers/s "
        f"(ideal {r['ideal_answers_per_s']:.1f}, "
        f"ratio {r['ratio_to_ideal']:.2f}); added delay p50 {r['delay_p50_ms']:.0f} ms, "
        f"p99 {r['delay_p99_ms']:.0f} ms; outcomes {r['statuses']}; "
        f"CPU s/1000 answers handled {r['cpu_s_per_1000_answers']} (answers {r['answers_per_worker']}); "
        f"peak RSS MB {r['peak_rss_mb']}"
    )


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--answers", type=int, default=240, help="answers per burst (split over 3 apps)")
    p.add_argument("--concurrency", type=int, default=8, help="judge calls in flight per worker")
    p.add_argument("--workers", default="1,2,3")
    p.add_argument("--json", action="store_true")
    args = p.parse_args()
    import tempfile

    rows = []
    with ScriptedLLMServer() as server, tempfile.TemporaryDirectory() as tmp:
        server.latency_s = LATENCY_S
        for n in (int(x) for x in args.workers.split(",")):
            rows.append(run(n, args.answers, args.concurrency, server, Path(tmp)))
            if not args.json:
                print(_line(rows[-1]), flush=True)
    if args.json:
        print(json.dumps(rows, indent=2))
    base = rows[0]["answers_per_s"]
    if not args.json:
        scaling = ", ".join(f"{r['workers']}: {r['answers_per_s'] / base:.2f}x" for r in rows)
        print(f"scaling vs 1 worker: {scaling}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
