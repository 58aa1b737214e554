"""Many concurrent streams in one process: does judging keep up, and what does it cost the streams?

    python benchmarks/bench_scale.py [--streams 200 500] [--delay-ms 20] [--repeat 2] [--processes 1 2]
                                     [--one-core 500] [--capacity 2000] [--json]

N answers stream at the same time in one event loop, one token every ``delay`` ms, each with its own text and
its own contexts (FaithBench dev sources and summaries, read in place from ../shared/benchdata; a synthetic
set of distinct texts otherwise), so the local judge's caches only hit where a real app's would. Variants,
interleaved in fresh processes, each repeated:

- ``bare``: the same loop without streamjudge (the baseline of every ratio);
- ``bare (again)``: ``bare`` run a second time in each round: its ratio against ``bare`` is what this
  machine's noise alone does to a ratio (an A/A comparison), the floor under which no variant's difference
  means anything;
- ``judged``: streamjudge with its defaults, local judge on every checkpoint and the final answer
  (``judge_processes="auto"``: in the app's process until its CPU weighs on the app, then in one worker);
- ``in_process``: as ``judged`` with ``judge_processes=0``: the local judge never leaves the app's process;
- ``sampled_out``: streamjudge with a zero sample rate (the guard and its spans, no judging at all);
- ``model_judge``: streamjudge with a judge that answers every checkpoint after 300 ms, as a model over
  the network would (a fixed pass, so the figure is the guard's, not a judge's CPU), 128 calls in flight
  (``concurrency``, as an app sizes it for a model's latency; the default 4 would judge ~13 calls/s):
  verdicts are in flight for most of every answer, so nearly every token is raced against them (a warning
  goes out during a model's stall, not with its next token);
- ``processes=N`` (``--processes 1 2``; none with ``--processes``): as ``judged`` with the local judge in N
  worker processes (``judge_processes``), so judging runs on other cores instead of under the app's GIL.

(A CPU policy that let the judge use idle CPU, capping it only while the application's threads were busy,
was measured here and dropped: at 200 streams it kept every checkpoint judged either way, but its ITL p99
was 4.5x bare against 0.9x with the fixed share — the judge thread's GIL holds delay the loop's wake-ups.
The share that follows the loops' lateness instead, ``judge_cpu_share_max``, is opt-in for that reason;
the capacity section measures what it gives and costs.)

With ``--one-core N`` (500 by default, 0 to skip) it runs ``bare``, ``judged`` and ``in_process`` again
with N streams pinned to one core (the children and the judge workers they start): a one-core host or
container, where ``auto``'s worker takes the app's own core, niced, against the judge in the pool's thread.

With ``--capacity JOBS`` (2000 by default, 0 to skip) it also measures the judge's saturated throughput:
JOBS checkpoints (two per distinct contexts set) queued at once into a judge pool with the default CPU
share, in-process (``in_process``, the baseline), with ``auto`` and in worker processes, reporting
checkpoints/s, the pool thread's CPU per call, and checkpoints per CPU-second of the app's process and its
workers together (the judge's throughput per core) with the cores that used; and in-process again while 20
streams are live on the app's loop at 20 ms/token and the checkpoints come at a steady 800/s (``+live``),
with the fixed share and with a ceiling of 0.8 (``judge_cpu_share_max``), with those streams' ITL p99: what
using idle CPU gains and what the GIL it takes costs the streams.

Printed per N: tokens/s ratio (over the whole run, the streams' ``done`` included; and over the time to
the last token, apart from the wait for the final verdicts, with that wait's p50 and max) and ITL p99
ratio against bare, checkpoints judged / superseded (merged into a
newer request, which judges their sentences too) / dropped or not judged, judge checkpoints per second, the
CPU per token of the app's process (its loop, the guard's spans and requests, the judge pool's thread) and
of the judge's worker processes (where the judging cost lands, and what it competes with), the
cyclic GC's pauses during the run (all generations, and in brackets the whole-heap ones: a pause stops
every stream, so it shows in the ratio as it is) with the objects per stream the finished streams left to
it (in reference cycles: ~0 when a finished stream is freed by refcounting), the collections of each
generation during the run (each run starts from the same collector state: see the child's comment), and
the spread (min-max) over repeats. Then the scale goals, met or NOT met, from the medians over the repeats:
at 500 streams the defaults' tokens/s >= 0.99x bare over the whole run (``done`` included) and ITL p99
<= 1.2x bare; at 200, every checkpoint judged on its own (none dropped, failed or merged).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "benchdata" / "faithbench-dev"

CHILD = r"""
import asyncio, json, sys, time
sys.path.insert(0, sys.argv[1] + "/src")
sys.path.insert(0, sys.argv[1] + "/benchmarks")
from run import tokenize, pct
variant, n, delay, data = sys.argv[2], int(sys.argv[3]), float(sys.argv[4]) / 1000, sys.argv[5]
samples = json.load(open(data))
gaps, tokens = [], 0

async def source(toks):
    for t in toks:
        await asyncio.sleep(delay)
        yield t

if variant != "bare":
    import streamjudge
    from streamjudge.config import load_settings
    from streamjudge.runtime import _Discard
    # judged: the defaults (judge_processes="auto"); in_process: never a worker; processes=N: N from start;
    # built as from the environment (an empty one), so each gets what STREAMJUDGE_JUDGE_PROCESSES=N gives
    # an app (its default concurrency included)
    processes = (int(variant.partition("=")[2]) if variant.startswith("processes=")
                 else 0 if variant == "in_process" else "auto")
    settings = load_settings({}, preflight=False, end_wait_s=2.0,
                             sample_rate=0.0 if variant == "sampled_out" else 1.0, judge_processes=processes,
                             **({"concurrency": 128} if variant == "model_judge" else {}))
    judge = None
    if variant == "model_judge":
        from run import SlowJudge
        judge = SlowJudge(0.3)
    rt = streamjudge.configure(settings, downstream=_Discard(), set_global=False, judge=judge)
    if processes != "auto" and processes:  # they start at configure time, as an app configures before traffic
        time.sleep(1.0)
    statuses = {}
    real_resolve = rt.processor.resolve

    def resolve(request, outcome, scores):
        if request.kind == "checkpoint":
            statuses[outcome.status] = statuses.get(outcome.status, 0) + 1
        real_resolve(request, outcome, scores)

    rt.processor.resolve = resolve

# each stream's last token and its end (the guard's done: after the final verdict, or end_wait_s)
last_tokens, done_waits = [], []

async def one(i):
    global tokens
    ctx, answer = samples[i % len(samples)]
    toks = tokenize(f"[{i}] " + answer)
    last = None
    if variant == "bare":
        async for t in source(toks):
            now = time.perf_counter()
            if last is not None: gaps.append(now - last)
            last = now; tokens += 1
        last_tokens.append(last)
        done_waits.append(0.0)
        return
    async for ev in streamjudge.guard(source(toks), question="q", contexts=[f"[{i}] " + ctx]):
        if ev.type == "token":
            now = time.perf_counter()
            if last is not None: gaps.append(now - last)
            last = now; tokens += 1
    last_tokens.append(last)
    done_waits.append(time.perf_counter() - last)

t_start = [0.0]

async def main():
    t0 = t_start[0] = time.perf_counter()
    await asyncio.gather(*(one(i) for i in range(n)))
    return time.perf_counter() - t0

# the cyclic GC's pauses stop every stream at once: timed here (bare included) to tell them from
# per-token cost; the objects a stream keeps alive bring collections, and one of the whole heap (gen 2)
# is tens of ms. Timed as the collecting thread's CPU, not wall time: these callbacks are Python code, so
# the GIL may pass to another thread between "start" and the collection (the judge pool's thread often
# collects), and wall time would count that thread's run as a pause (measured: ~1.1 ms per young
# collection on the pool's thread against ~0.05 ms on the loop's)
import gc
gc_ms, gc_n, gc_t0 = [0.0, 0.0, 0.0], [0, 0, 0], [0.0]

def gc_timer(phase, info):
    if phase == "start":
        gc_t0[0] = time.thread_time()
    else:
        gc_ms[info["generation"]] += (time.thread_time() - gc_t0[0]) * 1000
        gc_n[info["generation"]] += 1

import os

def workers_cpu_s():
    # CPU seconds of this process's children (the judge's workers) so far, from /proc (they are alive, so
    # RUSAGE_CHILDREN would not count them yet)
    tick, me, total = os.sysconf("SC_CLK_TCK"), str(os.getpid()), 0.0
    for pid in os.listdir("/proc"):
        if pid.isdigit() and pid != me:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[1] == me:
                total += (int(fields[11]) + int(fields[12])) / tick
    return total

# every variant's run starts from the same collector state: its young generations empty and the count
# of middle-generation collections since the last whole-heap one at 0. Left as imports and configure()
# left them, that count stood at 7 of the 10 that bring a whole-heap collection, so a variant whose run made
# 4 middle-generation collections paid a whole-heap one (~25 ms, every stream stopped) and one that made 3
# did not: a step that decided its ITL p99, where a long-running process pays one every 10 of them. The
# collections each variant's run makes are printed instead (that rate is what its whole-heap ones follow)
gc.collect()
gc.callbacks.append(gc_timer)
# the split of a judged run's cost: this process's CPU (the loop, the guard's spans and requests, and the
# pool's thread) against its workers' (the judging itself, when auto's worker took it); a worker that
# started during the run counts its start too
app_c0, workers_c0 = time.process_time(), workers_cpu_s()
elapsed = asyncio.run(main())
app_cpu, workers_cpu = time.process_time() - app_c0, workers_cpu_s() - workers_c0
gc.callbacks.remove(gc_timer)
# what the finished streams left that only the cyclic GC can free (objects in reference cycles: in a server
# they outlive their stream, copied through the generations until a collection finds them); every stream
# ends with the run here, so no collection during it could have found them yet
left_to_gc = gc.collect()
out = {"tokens_per_s": tokens / elapsed, "itl_p99_ms": pct(gaps, 99) * 1000, "elapsed_s": elapsed,
       # the same tokens over the time to the last stream's last token: what the readers saw of the rate,
       # apart from the wait for the final verdicts
       "tokens_per_s_to_last_token": tokens / (max(last_tokens) - t_start[0]),
       "done_wait_p50_ms": pct(done_waits, 50) * 1000, "done_wait_max_ms": max(done_waits) * 1000,
       "gc_pause_ms": sum(gc_ms), "gc_full_pause_ms": gc_ms[2], "gc_left_per_stream": left_to_gc / n,
       "gc_young": gc_n[0], "gc_middle": gc_n[1], "gc_full": gc_n[2],
       "app_cpu_us_per_token": app_cpu / tokens * 1e6, "workers_cpu_us_per_token": workers_cpu / tokens * 1e6}
if variant != "bare":
    rt.force_flush(30_000)
    out["judged"] = statuses.get("judged", 0)
    out["superseded"] = statuses.get("superseded", 0)
    out["not_judged"] = sum(v for k, v in statuses.items() if k not in ("judged", "superseded"))
    out["checkpoints_per_s"] = out["judged"] / elapsed
    # where "auto" ended up judging: 1 once its worker took over
    out["offloaded"] = float(any(getattr(j, "offloaded", False) for j in rt._judges.values()))
print(json.dumps(out))
"""


CAPACITY = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, sys.argv[1] + "/src")
sys.path.insert(0, sys.argv[1] + "/benchmarks")
from run import pct
from streamjudge.config import load_settings
from streamjudge.judging.base import EvalInput
from streamjudge.judging.judges import create_judge
from streamjudge.judging.pool import JudgeJob, JudgePool
variant, jobs, data = sys.argv[2], int(sys.argv[3]), sys.argv[4]
samples = json.load(open(data))
# "<where>[+live][+share_max=X]": +live streams LIVE answers at 20 ms/token on the main loop meanwhile (their
# ITL is recorded, and the loop is probed as a judged stream's is); share_max= sets judge_cpu_share_max
where, *flags = variant.split("+")
live = "live" in flags
share_max = float(next((f.partition("=")[2] for f in flags if f.startswith("share_max=")), "0"))
LIVE = 20
processes = (int(where.partition("=")[2]) if where.startswith("processes=")
             else 0 if where == "in_process" else "auto")
settings = load_settings({}, judge_processes=processes)  # as from the environment (see CHILD)
items = []
for i in range(jobs // 2):
    ctx, answer = samples[i % len(samples)]
    parts = answer.split(". ")
    half = max(1, len(parts) // 2)
    head, tail = ". ".join(parts[:half]) + ".", ". ".join(parts[half:]) or answer
    contexts = (f"[{i}] " + ctx,)
    items.append(EvalInput("q", contexts, head, kind="checkpoint"))
    items.append(EvalInput("q", contexts, tail, kind="checkpoint", prefix=head))
judge = create_judge("local", settings, tier="checkpoint")
pool = JudgePool(concurrency=settings.concurrency, queue_size=len(items) + 1, max_queue_bytes=0,
                 cpu_share=settings.judge_cpu_share, cpu_share_max=share_max)
if processes != "auto" and processes:  # they start at configure time; let them come up before traffic
    time.sleep(1.0)
statuses, cpu = [], []

def done(outcome):
    statuses.append(outcome.status)
    cpu.append(time.thread_time())  # on the pool's thread

def cpu_s():
    # CPU seconds of this process and of its children (the judge's workers) so far, from /proc: only the
    # difference over the run counts, so a worker's start (its imports) before it is left out
    tick = os.sysconf("SC_CLK_TCK")
    me = str(os.getpid())
    total = 0.0
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if pid == me or fields[1] == me:  # fields[1]: the parent's pid
            total += (int(fields[11]) + int(fields[12])) / tick
    return total

gaps = []
# with live streams the checkpoints come at a steady RATE (what live streams would send, and more than the
# fixed share judges in-process) rather than all at once, and the streams' ITL is taken over the same
# submission window in every variant: over the time to judge them all instead, a faster judge's shorter run
# would give the one whole-heap GC pause of the run (it stops every stream at once) a larger weight
RATE = 800
window = [0.0, 0.0]

async def stream(stop):
    last = time.perf_counter()
    while not stop.is_set():
        await asyncio.sleep(0.02)
        now = time.perf_counter()
        if window[0] <= now <= window[1]:
            gaps.append(now - last)
        last = now

async def with_live_streams():
    probe = pool.watch_loop()  # as each judged stream's start does
    stop = asyncio.Event()
    tasks = [asyncio.create_task(stream(stop)) for _ in range(LIVE)]
    await asyncio.sleep(0.2)
    c0, t0 = cpu_s(), time.perf_counter()
    window[:] = [t0, t0 + len(items) / RATE]
    step = 0.01
    for i in range(0, len(items), int(RATE * step)):
        for it in items[i:i + int(RATE * step)]:
            pool.submit(JudgeJob(judge, it, ("faithfulness",), done))
        await asyncio.sleep(max(0.0, t0 + (i + int(RATE * step)) / RATE - time.perf_counter()))
    while len(statuses) < len(items):  # force_flush would block the streams' loop
        await asyncio.sleep(0.01)
    elapsed, used = time.perf_counter() - t0, cpu_s() - c0
    stop.set()
    await asyncio.gather(*tasks)
    if probe is not None:
        probe.close()
    return elapsed, used

if live:
    elapsed, used = asyncio.run(with_live_streams())
else:
    c0, t0 = cpu_s(), time.perf_counter()
    for it in items:
        pool.submit(JudgeJob(judge, it, ("faithfulness",), done))
    pool.force_flush(600_000)
    elapsed = time.perf_counter() - t0
    used = cpu_s() - c0
pool.shutdown()
judged = statuses.count("judged")
print(json.dumps({"checkpoints_per_s": judged / elapsed,
                  "itl_p99_ms": pct(gaps, 99) * 1000 if gaps else None,
                  "pool_cpu_us_per_call": (cpu[-1] - cpu[0]) / max(1, len(cpu) - 1) * 1e6,
                  # per core: checkpoints per CPU-second of the app's process and its workers together
                  "checkpoints_per_cpu_s": judged / used if used > 0 else float("nan"),
                  "cores_used": used / elapsed,
                  "not_judged": len(items) - judged}))
"""


def capacity(variant: str, jobs: int, data: Path) -> dict[str, Any]:
    proc = subprocess.run([sys.executable, "-c", CAPACITY, str(ROOT), variant, str(jobs), str(data)],
                          capture_output=True, text=True, input="", timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def load(limit: int) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for f in sorted(DATA.glob("batch_*.json")):
        for s in json.loads(f.read_text())["samples"]:
            out.append((s["source"], s["summary"].strip()))
    if not out:  # distinct synthetic texts: every answer and context its own
        for i in range(limit):
            ctx = f"Report {i}: the plant in town {i} produced {1000 + i} units in {1990 + i % 30}."
            answer = f"The plant in town {i} produced {1000 + i} units. It opened in {1990 + i % 30}."
            out.append((ctx, answer))
    return out[:limit]


# the A/A control: bare again, whose ratio against bare is the machine's noise alone
AGAIN = "bare (again)"


def _code_of(variant: str) -> str:
    """The child's variant for a row of the results (the A/A control runs bare's code)."""
    return "bare" if variant == AGAIN else variant


def child(variant: str, n: int, delay_ms: float, data: Path, cpu: int | None = None) -> dict[str, Any]:
    code = CHILD
    # cpu: the child (and the judge workers it starts, which inherit its affinity) runs on that core only
    pin = None if cpu is None else (lambda: os.sched_setaffinity(0, {cpu}))
    proc = subprocess.run([sys.executable, "-c", code, str(ROOT), variant, str(n), str(delay_ms), str(data)],
                          capture_output=True, text=True, input="", timeout=600, preexec_fn=pin)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-2000:])
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, nargs="*", default=[200, 500])
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--processes", type=int, nargs="*", default=[1, 2],
                    help="worker-process counts of the processes=N variants")
    ap.add_argument("--capacity", type=int, default=2000, metavar="JOBS",
                    help="also measure the judge's saturated checkpoints/s with JOBS checkpoints queued "
                    "(0: skip)")
    ap.add_argument("--one-core", type=int, default=500, metavar="N",
                    help="also run N streams pinned to one core: bare, judged, in_process (0: skip)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    samples = load(max([*args.streams, args.one_core, 1]))
    data = Path("/tmp") / f"streamjudge-bench-scale-{int(time.time())}.json"
    data.write_text(json.dumps(samples))
    results: dict[str, Any] = {}
    goals: dict[str, bool] = {}
    try:
        for n in args.streams:
            runs: dict[str, list[dict[str, Any]]] = {"bare": [], "judged": [], "in_process": [],
                                                     "sampled_out": [], "model_judge": [], AGAIN: []}
            runs.update({f"processes={p}": [] for p in args.processes})
            for _ in range(args.repeat):
                for variant in runs:  # interleaved: drift on a noisy machine hits every variant alike
                    runs[variant].append(child(_code_of(variant), n, args.delay_ms, data))
            results[str(n)] = summarize(runs)
            goals.update(scale_goals(n, runs))
        if args.one_core:
            # a one-core host or container: the judge's worker takes the app's own core, niced
            cpu = max(os.sched_getaffinity(0))
            one: dict[str, list[dict[str, Any]]] = {"bare": [], "judged": [], "in_process": []}
            for _ in range(args.repeat):
                for variant in one:
                    one[variant].append(child(variant, args.one_core, args.delay_ms, data, cpu))
            results[f"{args.one_core} on one core"] = summarize(one)
        if args.capacity:
            cap: dict[str, list[dict[str, Any]]] = {"in_process": [], "auto": []}
            cap.update({f"processes={p}": [] for p in args.processes})
            # the CPU share's ceiling (judge_cpu_share_max) against the fixed share, while streams are live
            cap.update({"in_process+live": [], "in_process+live+share_max=0.8": []})
            for _ in range(args.repeat):
                for variant in cap:
                    cap[variant].append(capacity(variant, args.capacity, data))
            results["capacity"] = summarize_capacity(cap)
    finally:
        data.unlink(missing_ok=True)
    if args.json:
        print(json.dumps({**results, "goals": goals}, indent=1))
        return 0
    for n, r in results.items():
        if n == "capacity":
            print(f"== judge capacity, {args.capacity} checkpoints queued at once, default CPU share "
                  f"({args.repeat} repeats, median [min-max])")
        elif n.endswith("on one core"):
            print(f"== {n.partition(' ')[0]} concurrent streams pinned to one core, "
                  f"{args.delay_ms:g} ms/token "
                  f"({args.repeat} repeats, median [min-max])")
        else:
            print(f"== {n} concurrent streams, {args.delay_ms:g} ms/token "
                  f"({args.repeat} repeats, median [min-max])")
        for k, v in r.items():
            print(f"   {k:<44} {v}")
    if goals:
        from run import print_goals

        print_goals(goals, "== goals (the defaults against bare, medians over the repeats)")
    return 0


def scale_goals(n: int, runs: dict[str, list[dict[str, Any]]]) -> dict[str, bool]:
    """Issue 13's goals at ``n`` streams, from the defaults' (``judged``) repeats against bare's: at 500,
    tokens/s >= 0.99x (over the whole run, ``done`` included) and ITL p99 <= 1.2x; at 200, no checkpoint
    dropped, failed or merged into a newer one."""
    bare, judged = runs["bare"], runs["judged"]
    out: dict[str, bool] = {}
    if n == 500:
        pairs = list(zip(judged, bare, strict=True))
        rate = statistics.median(r["tokens_per_s"] / b["tokens_per_s"] for r, b in pairs)
        itl = statistics.median(r["itl_p99_ms"] / b["itl_p99_ms"] for r, b in pairs)
        out["goal_500_streams_tokens_per_s_ge_0.99x_bare"] = rate >= 0.99
        out["goal_500_streams_itl_p99_le_1.2x_bare"] = itl <= 1.2
    if n == 200:
        out["goal_200_streams_every_checkpoint_judged"] = all(
            r["superseded"] == 0 and r["not_judged"] == 0 and r["judged"] > 0 for r in judged)
    return out


def _spread(values: list[float], digits: int = 3) -> str:
    return f"{statistics.median(values):.{digits}f} [{min(values):.{digits}f}-{max(values):.{digits}f}]"


def _gc(rs: list[dict[str, Any]]) -> str:
    return (f"{_spread([r['gc_pause_ms'] for r in rs], 1)} "
            f"({_spread([r['gc_full_pause_ms'] for r in rs], 1)}); "
            f"left to it per stream {_spread([r['gc_left_per_stream'] for r in rs], 1)}")


def _gc_collections(rs: list[dict[str, Any]]) -> str:
    # young / middle / whole heap: in a long-running process a whole-heap collection follows every 10
    # middle-generation ones (once enough objects survived), so the middle count sets how often it comes
    return " / ".join(_spread([float(r[k]) for r in rs], 0) for k in ("gc_young", "gc_middle", "gc_full"))


def summarize_capacity(runs: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    base = runs["in_process"]
    out: dict[str, str] = {}
    for variant, rs in runs.items():
        out[f"{variant}: checkpoints/s"] = _spread([r["checkpoints_per_s"] for r in rs], 0)
        out[f"{variant}: pool thread CPU us/call"] = _spread([r["pool_cpu_us_per_call"] for r in rs], 1)
        out[f"{variant}: checkpoints per CPU-second (app + workers)"] = _spread(
            [r["checkpoints_per_cpu_s"] for r in rs], 0)
        out[f"{variant}: cores used"] = _spread([r["cores_used"] for r in rs], 2)
        out[f"{variant}: not judged"] = _spread([float(r["not_judged"]) for r in rs], 0)
        if rs[0].get("itl_p99_ms") is not None:  # the live streams' (20 ms/token) ITL p99
            out[f"{variant}: live streams' ITL p99 ms"] = _spread([r["itl_p99_ms"] for r in rs], 1)
        if variant != "in_process":
            out[f"{variant}: checkpoints/s ratio vs in-process"] = _spread(
                [r["checkpoints_per_s"] / b["checkpoints_per_s"] for r, b in zip(rs, base, strict=True)])
    return out


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, str]:
    bare = runs["bare"]
    out: dict[str, str] = {
        "bare tokens/s": _spread([r["tokens_per_s"] for r in bare], 0),
        "bare ITL p99 ms": _spread([r["itl_p99_ms"] for r in bare], 2),
        "bare GC pauses ms (whole heap); objects left": _gc(bare),
        "bare GC collections, young / middle / whole heap": _gc_collections(bare),
        "bare CPU us/token": _spread([r["app_cpu_us_per_token"] for r in bare], 1),
    }
    for variant in runs:
        if variant == "bare":
            continue
        rs = runs[variant]
        out[f"{variant}: tokens/s ratio vs bare"] = _spread(
            [r["tokens_per_s"] / b["tokens_per_s"] for r, b in zip(rs, bare, strict=True)])
        out[f"{variant}: tokens/s to the last token, ratio"] = _spread(
            [r["tokens_per_s_to_last_token"] / b["tokens_per_s_to_last_token"]
             for r, b in zip(rs, bare, strict=True)])
        p50 = _spread([r["done_wait_p50_ms"] for r in rs], 1)
        out[f"{variant}: last token to done, p50 / max ms"] = (
            f"{p50} / {_spread([r['done_wait_max_ms'] for r in rs], 0)}")
        out[f"{variant}: ITL p99 ratio vs bare"] = _spread(
            [r["itl_p99_ms"] / b["itl_p99_ms"] for r, b in zip(rs, bare, strict=True)])
        # where the CPU went, per token: the app's process (bare's loop included) and the judge's workers
        out[f"{variant}: CPU us/token, app process / workers"] = (
            f"{_spread([r['app_cpu_us_per_token'] for r in rs], 1)} / "
            f"{_spread([r['workers_cpu_us_per_token'] for r in rs], 1)}")
        # what the GC's pauses took from the run against bare's: a stall delays every stream's next token
        out[f"{variant}: GC pauses ms (whole heap); objects left"] = _gc(rs)
        out[f"{variant}: GC collections, young / middle / whole heap"] = _gc_collections(rs)
        for key in ("judged", "superseded", "not_judged", "checkpoints_per_s", "offloaded"):
            if key in rs[0]:
                out[f"{variant}: {key}"] = _spread([float(r[key]) for r in rs], 1)
    return out


if __name__ == "__main__":
    raise SystemExit(main())
