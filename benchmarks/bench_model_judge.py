"""The ``model`` judge: throughput and batch latency on CPU, and accuracy where a real model is present.

Throughput uses the tests' tiny ONNX NLI model (``tests/judges/tiny_nli.py``, built into a temporary
directory), so it measures the judge's own machinery — sentence splitting, tokenising, windowing, the
batching worker, ONNX Runtime's call overhead — not a transformer's arithmetic. For each batch size
(1, 8, 32) it submits ``--claims`` concurrent ``evaluate`` calls, each one sentence of different text
against a different context, and reports:

- claims/s (wall) and claims per CPU-second of the whole process (all threads: the event loop, the
  worker, ONNX Runtime's), i.e. claims/s per core;
- p50/p99 latency of one batch (tokenising + model run, on the worker) and of one ``evaluate`` call
  (submit to scores, including the wait for a batch to fill);
- the spread (min..max) over ``--repeats`` runs, and claims per CPU-second against batch size 1 (the
  baseline of the same run).

It then measures what the judge takes from the application: a pure-Python thread (the app) counts loop
turns for ``--app-seconds`` alone, then while another thread keeps the judge busy (32 concurrent
evaluations at a time, as the judge pool would), with the tiny model (the judge's own Python work
dominates) and with a deliberately heavy ONNX graph (chained 512x512 MatMuls, batch size 8: inference
dominates, and ONNX Runtime runs it without the GIL). Reported: the app thread's pace as a share of its
pace alone, and the claims judged meanwhile. On a machine with other load the CPU share, not only the
GIL, sets this figure.

With ``STREAMJUDGE_TEST_MODEL_PATH`` (or ``--model``) naming a real NLI / HHEM-style model directory, it
also scores ``../shared/benchdata/halueval-qa-dev/cases.jsonl`` with that model and with the local judge:
balanced accuracy, TPR (hallucinated answers caught) and TNR (right answers passed) at threshold 0.5,
and the real model's throughput at ``--batch-size``.

    python benchmarks/bench_model_judge.py [--claims 512] [--repeats 5] [--model DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "judges"))

from tiny_nli import CONTENT, build_model_dir, build_slow_model_dir  # noqa: E402

from streamjudge import semconv  # noqa: E402
from streamjudge.config import Settings  # noqa: E402
from streamjudge.judging.base import EvalInput  # noqa: E402
from streamjudge.judging.judges import create_judge  # noqa: E402
from streamjudge.judging.judges.local import LocalJudge  # noqa: E402
from streamjudge.judging.judges.model import ModelJudge  # noqa: E402

FAITH = semconv.FAITHFULNESS
HALUEVAL = ROOT.parent / "shared" / "benchdata" / "halueval-qa-dev" / "cases.jsonl"
BATCH_SIZES = (1, 8, 32)


def _pct(values: Sequence[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * (len(ordered) - 1) + 0.5))] if ordered else float("nan")


def synthetic_items(n: int, seed: int) -> list[EvalInput]:
    """``n`` one-sentence answers, each against its own ~40-word context; about half are grounded."""
    rng = random.Random(seed)
    words = list(dict.fromkeys(CONTENT))
    items = []
    for _ in range(n):
        context_words = rng.sample(words, 40)
        claim_words = rng.sample(context_words, 6)
        if rng.random() < 0.5:
            claim_words[rng.randrange(6)] = rng.choice([w for w in words if w not in context_words])
        halves = (" ".join(context_words[:20]), " ".join(context_words[20:]))
        context = f"{halves[0].capitalize()}. {halves[1].capitalize()}."
        items.append(EvalInput("q", (context,), " ".join(claim_words).capitalize() + "."))
    return items


async def _timed(judge: ModelJudge, item: EvalInput, latencies: list[float]) -> None:
    t0 = time.perf_counter()
    await judge.evaluate(item, (FAITH,))
    latencies.append(time.perf_counter() - t0)


def throughput(judge: ModelJudge, items: list[EvalInput]) -> dict[str, Any]:
    """One run: all ``items`` as concurrent evaluate calls."""
    runtime = judge.runtime
    runtime.stats.batch_seconds.clear()
    pairs0, batches0 = runtime.stats.pairs, runtime.stats.batches
    latencies: list[float] = []

    async def go() -> None:
        await asyncio.gather(*(_timed(judge, it, latencies) for it in items))

    cpu0, t0 = time.process_time(), time.perf_counter()
    asyncio.run(go())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    batch = list(runtime.stats.batch_seconds)
    return {
        "claims_per_s": len(items) / wall,
        "claims_per_cpu_s": len(items) / cpu if cpu > 0 else float("nan"),
        "pairs": runtime.stats.pairs - pairs0,
        "batches": runtime.stats.batches - batches0,
        "batch_p50_ms": _pct(batch, 0.5) * 1000,
        "batch_p99_ms": _pct(batch, 0.99) * 1000,
        "eval_p50_ms": _pct(latencies, 0.5) * 1000,
        "eval_p99_ms": _pct(latencies, 0.99) * 1000,
    }


def bench_throughput(model_path: str, claims: int, repeats: int, batch_sizes: Sequence[int],
                     threads: int, max_batch_ms: float) -> dict[str, Any]:
    """Every batch size, ``repeats`` runs each (a warm-up run first), on fresh text every run."""
    out: dict[str, Any] = {}
    for b in batch_sizes:
        judge = create_judge("model", Settings(model_path=model_path, model_batch_size=b,
                                               model_max_batch_ms=max_batch_ms, model_threads=threads,
                                               model_queue_size=max(1024, 2 * claims), judge_timeout_s=600))
        assert isinstance(judge, ModelJudge)
        judge.runtime.preload()
        throughput(judge, synthetic_items(min(claims, 64), seed=-b))  # warm-up
        runs = [throughput(judge, synthetic_items(claims, seed=1000 * b + r)) for r in range(repeats)]
        asyncio.run(judge.aclose())
        summary: dict[str, Any] = {"runs": runs}
        for key in runs[0]:
            values = [r[key] for r in runs]
            summary[key] = {"median": statistics.median(values), "min": min(values), "max": max(values)}
        out[str(b)] = summary
    return out


def bench_idle(model_path: str, repeats: int, threads: int, n: int = 200) -> dict[str, Any]:
    """Latency of a lone evaluation (what a checkpoint sees on an idle runtime): one call at a time."""
    judge = create_judge("model", Settings(model_path=model_path, model_max_batch_ms=0.0,
                                           model_threads=threads))
    assert isinstance(judge, ModelJudge)
    judge.runtime.preload()
    p50: list[float] = []
    p99: list[float] = []

    async def go(items: list[EvalInput]) -> list[float]:
        latencies: list[float] = []
        for it in items:
            await _timed(judge, it, latencies)
        return latencies

    asyncio.run(go(synthetic_items(20, seed=-1)))  # warm-up
    for r in range(repeats):
        lat = asyncio.run(go(synthetic_items(n, seed=7 + r)))
        p50.append(_pct(lat, 0.5) * 1000)
        p99.append(_pct(lat, 0.99) * 1000)
    asyncio.run(judge.aclose())
    return {key: {"median": statistics.median(v), "min": min(v), "max": max(v)}
            for key, v in (("p50_ms", p50), ("p99_ms", p99))}


def _count_for(seconds: float) -> float:
    """Loop turns per second of pure-Python work on the calling thread (an app handling requests)."""
    n = 0
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        for _ in range(1000):
            n += 1
    return n / seconds


def _pace_beside(work: Any, seconds: float) -> tuple[float, int]:
    """The app thread's pace while ``work(stop, done)`` runs on another thread, and the units it did."""
    stop = threading.Event()
    done = [0]
    worker = threading.Thread(target=work, args=(stop, done), name="beside-the-app")
    worker.start()
    time.sleep(0.05)  # the worker is busy before the app starts counting
    before = done[0]
    pace = _count_for(seconds)
    did = done[0] - before
    stop.set()
    worker.join()
    return pace, did


def _python_busy(stop: threading.Event, done: list[int]) -> None:
    while not stop.is_set():
        for _ in range(1000):
            done[0] += 1


def _judge_busy(judge: ModelJudge, items: list[EvalInput], concurrency: int) -> Any:
    def work(stop: threading.Event, done: list[int]) -> None:
        async def drive() -> None:
            i = 0
            while not stop.is_set():
                wave = [items[(i + k) % len(items)] for k in range(concurrency)]
                i += concurrency
                await asyncio.gather(*(judge.evaluate(it, (FAITH,)) for it in wave))
                done[0] += concurrency

        asyncio.run(drive())

    return work


def app_share(model_path: str | None, seconds: float, repeats: int, threads: int, batch_size: int,
              concurrency: int = 32) -> dict[str, Any]:
    """The app thread's pace while the judge works beside it (``model_path`` None: a pure-Python busy
    thread instead, the reference), as a share of its pace alone."""
    judge: ModelJudge | None = None
    if model_path is not None:
        made = create_judge("model", Settings(model_path=model_path, model_batch_size=batch_size,
                                              model_threads=threads, model_max_batch_ms=5.0,
                                              judge_timeout_s=600))
        assert isinstance(made, ModelJudge)
        judge = made
        judge.runtime.preload()
    shares: list[float] = []
    rates: list[float] = []
    for r in range(repeats):
        if judge is None:
            work = _python_busy
        else:
            work = _judge_busy(judge, synthetic_items(concurrency * 64, seed=99 + r), concurrency)
        # alone before and after: the machine's other load drifts, the mean of the two brackets it
        before = _count_for(seconds)
        beside, did = _pace_beside(work, seconds)
        after = _count_for(seconds)
        shares.append(beside / ((before + after) / 2))
        rates.append(did / seconds)
    if judge is not None:
        asyncio.run(judge.aclose())
    return {
        "app_pace_share": {"median": statistics.median(shares), "min": min(shares), "max": max(shares)},
        "claims_per_s": {"median": statistics.median(rates), "min": min(rates), "max": max(rates)},
        "batch_size": batch_size,
    }


# --- accuracy on HaluEval (real model only) ------------------------------------------------------


def _rates(scores: Sequence[float], truth: Sequence[bool], threshold: float) -> dict[str, float]:
    pos = [s for s, t in zip(scores, truth, strict=True) if t]
    neg = [s for s, t in zip(scores, truth, strict=True) if not t]
    tpr = sum(s < threshold for s in pos) / len(pos) if pos else float("nan")
    tnr = sum(s >= threshold for s in neg) / len(neg) if neg else float("nan")
    return {"balanced_accuracy": (tpr + tnr) / 2, "tpr": tpr, "tnr": tnr}


def bench_accuracy(model_path: str, data: Path, threshold: float, batch_size: int,
                   threads: int) -> dict[str, Any]:
    """The real model and the local judge on every HaluEval case (a skip counts as "faithful")."""
    cases = [json.loads(line) for line in data.read_text(encoding="utf-8").splitlines() if line.strip()]
    items = [EvalInput(c["question"], tuple(c["contexts"]), c["answer"]) for c in cases]
    truth = [bool(c["expect_alert"]) for c in cases]

    local = LocalJudge()
    local_values = [local.evaluate_sync(it, (FAITH,)).scores[0].value for it in items]

    judge = create_judge("model", Settings(model_path=model_path, model_batch_size=batch_size,
                                           model_threads=threads, model_queue_size=100_000,
                                           judge_timeout_s=3600))
    assert isinstance(judge, ModelJudge)
    judge.runtime.preload()

    async def go() -> list[float | None]:
        results = await asyncio.gather(*(judge.evaluate(it, (FAITH,)) for it in items))
        return [r.scores[0].value for r in results]

    cpu0, t0 = time.process_time(), time.perf_counter()
    model_values = asyncio.run(go())
    wall, cpu = time.perf_counter() - t0, time.process_time() - cpu0
    claims = judge.runtime.stats.requests
    asyncio.run(judge.aclose())
    report: dict[str, Any] = {"cases": len(cases), "hallucinated": sum(truth), "threshold": threshold}
    for name, values in (("model", model_values), ("local", local_values)):
        scores = [1.0 if v is None else v for v in values]
        report[name] = {**_rates(scores, truth, threshold), "skipped": sum(v is None for v in values)}
    report["model"].update({"cases_per_s": len(cases) / wall, "cases_per_cpu_s": len(cases) / cpu,
                            "requests": claims, "spec": _spec(judge)})
    return report


def _spec(judge: ModelJudge) -> dict[str, Any]:
    spec = judge.runtime.spec
    return {"label": spec.label, "mode": spec.mode, "max_length": spec.max_length,
            "model_type": spec.model_type}


# --- report ----------------------------------------------------------------------------------------


def print_report(report: dict[str, Any]) -> None:
    """Human-readable tables of the report."""
    t = report["throughput"]
    print(f"model judge, tiny test model, CPU, {report['claims']} concurrent one-sentence evaluations "
          f"per run, {report['repeats']} runs per batch size (median, min..max), {report['threads']} "
          f"intra-op thread(s), max batch wait {report['max_batch_ms']:g} ms, {os.cpu_count()} CPUs")
    header = (f"{'batch':>5} {'claims/s':>22} {'claims/CPU-s':>22} {'batch p50 ms':>18} "
              f"{'batch p99 ms':>18} {'eval p50 ms':>20} {'eval p99 ms':>20} {'CPU-s vs 1':>10}")
    print(header)
    print("-" * len(header))

    def cell(d: dict[str, float], width: int, fmt: str = ".0f") -> str:
        return f"{format(d['median'], fmt)} ({format(d['min'], fmt)}..{format(d['max'], fmt)})".rjust(width)

    base = next(iter(t.values()))["claims_per_cpu_s"]["median"]
    for b, s in t.items():
        print(f"{b:>5} {cell(s['claims_per_s'], 22)} {cell(s['claims_per_cpu_s'], 22)} "
              f"{cell(s['batch_p50_ms'], 18, '.2f')} {cell(s['batch_p99_ms'], 18, '.2f')} "
              f"{cell(s['eval_p50_ms'], 20, '.1f')} {cell(s['eval_p99_ms'], 20, '.1f')} "
              f"{s['claims_per_cpu_s']['median'] / base:>9.2f}x")
    idle = report["idle"]
    print(f"one evaluation at a time (idle runtime, no batch wait): p50 {cell(idle['p50_ms'], 0, '.3f')} ms, "
          f"p99 {cell(idle['p99_ms'], 0, '.3f')} ms")
    print()
    print(f"a pure-Python app thread beside the busy judge ({report['app_seconds']:g} s per run, "
          f"{report['app_repeats']} runs; pace as a share of its pace alone; median (min..max)):")
    for name, r in report["app_share"].items():
        if not r["batch_size"]:
            print(f"  {name:<46}: app pace {cell(r['app_pace_share'], 0, '.0%')}")
            continue
        print(f"  {name:<37} batch {r['batch_size']:>2}: app pace "
              f"{cell(r['app_pace_share'], 0, '.0%')}, judged {cell(r['claims_per_s'], 0)} claims/s")
    acc = report.get("accuracy")
    print()
    if acc is None:
        print(f"accuracy: skipped ({report['accuracy_skipped']})")
        return
    print(f"HaluEval QA dev: {acc['cases']} cases, {acc['hallucinated']} hallucinated, "
          f"threshold {acc['threshold']}")
    print(f"{'judge':<8} {'bal.acc':>8} {'TPR':>6} {'TNR':>6} {'skipped':>8}")
    for name in ("model", "local"):
        r = acc[name]
        print(f"{name:<8} {r['balanced_accuracy']:>8.3f} {r['tpr']:>6.3f} {r['tnr']:>6.3f} {r['skipped']:>8}")
    m = acc["model"]
    print(f"real model: {m['cases_per_s']:.1f} cases/s, {m['cases_per_cpu_s']:.1f} cases/CPU-s; {m['spec']}")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--claims", type=int, default=512, help="concurrent evaluations per run")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1, help="ONNX Runtime intra-op threads")
    parser.add_argument("--app-seconds", type=float, default=0.5, help="app-thread measurement per run")
    parser.add_argument("--app-repeats", type=int, default=3, help="runs of each app-thread measurement")
    parser.add_argument("--max-batch-ms", type=float, default=5.0)
    parser.add_argument("--model", default=os.environ.get("STREAMJUDGE_TEST_MODEL_PATH"),
                        help="real model directory for the accuracy part (STREAMJUDGE_TEST_MODEL_PATH)")
    parser.add_argument("--data", type=Path, default=HALUEVAL)
    parser.add_argument("--batch-size", type=int, default=32, help="batch size of the accuracy run")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of tables")
    args = parser.parse_args(argv)

    report: dict[str, Any] = {"claims": args.claims, "repeats": args.repeats, "threads": args.threads,
                              "max_batch_ms": args.max_batch_ms, "app_seconds": args.app_seconds,
                              "app_repeats": args.app_repeats}
    with tempfile.TemporaryDirectory() as tmp:
        tiny = build_model_dir(Path(tmp) / "tiny-nli")
        report["throughput"] = bench_throughput(str(tiny), args.claims, args.repeats, BATCH_SIZES,
                                                args.threads, args.max_batch_ms)
        report["idle"] = bench_idle(str(tiny), args.repeats, args.threads)
        heavy = build_slow_model_dir(Path(tmp) / "heavy", nodes=4, size=256)
        report["app_share"] = {
            "reference: a pure-Python busy thread": app_share(None, args.app_seconds, args.app_repeats,
                                                              args.threads, 0),
            "tiny model (judge's Python work)": app_share(str(tiny), args.app_seconds, args.app_repeats,
                                                          args.threads, 32),
            "heavy graph (ONNX Runtime work)": app_share(str(heavy), args.app_seconds, args.app_repeats,
                                                         args.threads, 8),
        }
    if not args.model:
        report["accuracy"] = None
        report["accuracy_skipped"] = (
            "no real model: set STREAMJUDGE_TEST_MODEL_PATH to an NLI/HHEM model directory")
    elif not args.data.is_file():
        report["accuracy"] = None
        report["accuracy_skipped"] = f"no data at {args.data}"
    else:
        report["accuracy"] = bench_accuracy(args.model, args.data, 0.5, args.batch_size, args.threads)
    if args.json:
        print(json.dumps(report, sort_keys=True, default=str))
    else:
        print_report(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
