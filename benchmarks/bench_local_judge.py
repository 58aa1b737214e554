"""Micro-benchmark of the ``local`` judge as the live guard drives it.

    python benchmarks/bench_local_judge.py [--data DIR] [--repeat 5] [--clock cpu|wall] [--json]

A checkpoint (every 2 sentences) sends its new sentences with the text before them as the prefix
(``EvalInput(answer=<new sentences>, prefix=<text so far>, kind="checkpoint")``), judged against the same
contexts on the judge pool's thread, so every microsecond here is taken from the application's token
loop (the budget is 200 us per checkpoint, warm). Times are the judging thread's CPU time by default
(what the judge takes from the token loop, and stable on a busy machine; ``--clock wall`` for elapsed
time). Measured (best of ``--repeat`` runs, each
with fresh judges so no verdict is served from a previous run):

* ``streams``: chat-length answers as in ``benchmarks/run.py`` (five consecutive FaithBench dev
  summaries, their five sources as the contexts, read from ``../shared/benchdata/faithbench-dev``):
  the cold context index, the pre-flight gate (which builds the index), every checkpoint
  (faithfulness on its 2 new sentences, warm: the index exists) and the final pass (all metrics), per
  stream; the spread of the mean checkpoint cost over the repeats;
* ``growing``: one synthetic 400-sentence answer judged at every 2nd sentence; the cost of checkpoints
  1-10 against 191-200 shows whether a checkpoint pays for its prefix or only its new sentences;
* ``tiers``: a stream's checkpoints and its final pass judged by two judges, as the runtime runs them
  (one per tier, built with ``create_judge`` and sharing the process's index cache) against a baseline in
  the same run of two judges with a cache each (so the final pass indexes the contexts again and finds
  none of the checkpoints' sentence verdicts); judge time per stream, ratio and spread over the repeats;
* ``index``: building the context index of five distinct FaithBench sources, and of the same five each
  repeated 100 times (cold: contexts never seen before, so no per-context analysis is reused);
* ``per_sentence``: the cost of judging one sentence (three-way verdict, warm index, no cached verdict:
  each sentence of the FaithBench summaries is judged once by a fresh judge per repeat), against a
  baseline measured in the same run over the same sentences: the stream core's own per-sentence work,
  :func:`streamjudge.sentences.split_sentences` of the sentence. The ratio says what the judge costs in
  units of work the stream does anyway, whatever the machine.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import statistics
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.judging.base import METRICS, EvalInput, Judge
from streamjudge.judging.judges import create_judge
from streamjudge.judging.judges._local_index import ContextIndex
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.sentences import split_sentences

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "benchdata" / "faithbench-dev"
# has focus terms, so the pre-flight gate builds the context index (as a real question would)
QUESTION = "What happened to the people and companies in these reports?"
F = (semconv.FAITHFULNESS,)
WINDOW = 2  # sentences per checkpoint, the guard's default

SYNTHETIC_CONTEXT = (
    "The company was founded in 1998 in Palo Alto by two graduate students. Its first product was a "
    "search engine that ranked pages by the links pointing to them. Revenue reached $1.2 billion in "
    "2004, when it listed its shares on the Nasdaq exchange in August. It did not pay a dividend."
)


def _streams(data: Path) -> list[tuple[tuple[str, ...], str]]:
    files = sorted(data.glob("batch_*.json"), key=lambda p: (len(p.name), p.name))
    samples = [s for f in files for s in json.loads(f.read_text(encoding="utf-8"))["samples"]]
    out = []
    for g in range(0, len(samples) - 4, 5):
        group = samples[g : g + 5]
        out.append((tuple(s["source"] for s in group), " ".join(s["summary"].strip() for s in group)))
    return out


def _checkpoint_texts(answer: str) -> list[tuple[str, str]]:
    """(prefix, new sentences) of every checkpoint of ``answer``, as the guard sends them."""
    ends = [s.end for s in split_sentences(answer)]
    cuts = [0, *ends[WINDOW - 1 :: WINDOW]]
    if cuts[-1] < len(answer.rstrip()):
        cuts.append(len(answer))
    pairs = itertools.pairwise(cuts)
    return [(answer[:a], answer[a:b].strip()) for a, b in pairs if answer[a:b].strip()]


def _checkpoint(ctx: tuple[str, ...], prefix: str, new: str) -> EvalInput:
    return EvalInput(QUESTION, ctx, new, kind="checkpoint", prefix=prefix, offset=len(prefix))


_clock = time.thread_time_ns


def _us(judge: LocalJudge, item: EvalInput, metrics: Sequence[str]) -> float:
    t0 = _clock()
    judge.evaluate_sync(item, metrics)
    return (_clock() - t0) / 1000


def _index_us(contexts: tuple[str, ...]) -> float:
    t0 = _clock()
    ContextIndex(contexts)
    return (_clock() - t0) / 1000


def _bench_streams(streams: Sequence[tuple[tuple[str, ...], str]], repeat: int) -> dict[str, Any]:
    prepared = [(ctx, answer, _checkpoint_texts(answer)) for ctx, answer in streams]
    best: dict[str, list[float]] = {}
    per_checkpoint: list[float] = []
    run_means: list[float] = []
    for r in range(repeat):
        run: dict[str, list[float]] = {"index": [], "preflight": [], "checkpoints": [], "final": []}
        run_cp: list[float] = []
        for ctx, answer, texts in prepared:
            run["index"].append(_index_us(ctx))
            judge = LocalJudge()
            pre = EvalInput(QUESTION, ctx, "", kind="preflight")
            run["preflight"].append(_us(judge, pre, (semconv.CONTEXT_PRECISION,)))
            total = 0.0
            for prefix, new in texts:
                cost = _us(judge, _checkpoint(ctx, prefix, new), F)
                run_cp.append(cost)
                total += cost
            run["checkpoints"].append(total)
            final = EvalInput(QUESTION, ctx, answer)
            run["final"].append(_us(judge, final, METRICS))
        run_means.append(statistics.fmean(run_cp))
        if r == 0 or sum(run["checkpoints"]) < sum(best["checkpoints"]):
            best, per_checkpoint = run, run_cp
    return {
        "streams": len(prepared),
        "mean_sentences": statistics.fmean(len(split_sentences(a)) for _, a, _ in prepared),
        "mean_context_chars": statistics.fmean(sum(map(len, c)) for c, _, _ in prepared),
        "checkpoints": len(per_checkpoint),
        "index_cold_us": statistics.fmean(best["index"]),
        "preflight_us": statistics.fmean(best["preflight"]),
        "checkpoints_per_stream_us": statistics.fmean(best["checkpoints"]),
        "checkpoint_mean_us": statistics.fmean(per_checkpoint),
        "checkpoint_p95_us": sorted(per_checkpoint)[int(0.95 * (len(per_checkpoint) - 1))],
        "checkpoint_max_us": max(per_checkpoint),
        "checkpoint_mean_us_over_repeats": {
            "min": min(run_means), "median": statistics.median(run_means), "max": max(run_means),
        },
        "final_us": statistics.fmean(best["final"]),
    }


def _bench_tiers(streams: Sequence[tuple[tuple[str, ...], str]], repeat: int) -> dict[str, Any]:
    prepared = [(ctx, answer, _checkpoint_texts(answer)) for ctx, answer in streams]
    # the judges themselves, in this thread (the default, "auto", wraps them to move to a worker under load)
    settings = Settings(judge_processes=0)

    def tier(name: str) -> LocalJudge:
        judge: Judge = create_judge("local", settings, tier=name)  # type: ignore[arg-type]
        assert isinstance(judge, LocalJudge)
        return judge

    def per_stream(checkpoint: LocalJudge, final: LocalJudge, tag: str) -> float:
        total = 0.0
        for ctx, answer, texts in prepared:
            ctx = (f"[{tag}] {ctx[0]}", *ctx[1:])  # contexts never seen before in this process
            for prefix, new in texts:
                total += _us(checkpoint, _checkpoint(ctx, prefix, new), F)
            total += _us(final, EvalInput(QUESTION, ctx, answer), METRICS)
        return total / len(prepared)

    shared: list[float] = []
    own: list[float] = []
    for r in range(repeat):  # interleaved, fresh judges and fresh contexts every time
        pair = (tier("checkpoint"), tier("final"))
        shared.append(per_stream(*pair, tag=f"shared {r}"))
        for judge in pair:
            asyncio.run(judge.aclose())  # the last one frees the shared cache
        own.append(per_stream(LocalJudge(), LocalJudge(), tag=f"own {r}"))
    ratios = [a / b for a, b in zip(shared, own, strict=True)]
    return {
        "shared_us_per_stream": min(shared),
        "own_caches_us_per_stream": min(own),
        "ratio": statistics.median(ratios),
        "ratio_spread": [min(ratios), max(ratios)],
    }


def _bench_growing(repeat: int) -> dict[str, float]:
    facts = [
        "The company was founded in 1998 in Palo Alto.",
        "Two graduate students started it.",
        "Its first product was a search engine.",
        "Revenue reached $1.2 billion in 2004.",
        "It listed its shares on the Nasdaq in August 2004.",
        "It later opened an office in Tokyo in 2006.",
        "It did not pay a dividend.",
    ]
    answer = " ".join(f"{facts[k % len(facts)][:-1]}, says report {k}." for k in range(400))
    texts = _checkpoint_texts(answer)
    best: list[float] | None = None
    for _ in range(repeat):
        judge = LocalJudge()
        judge.evaluate_sync(EvalInput(QUESTION, (SYNTHETIC_CONTEXT,), "", kind="preflight"), METRICS)
        items = [_checkpoint((SYNTHETIC_CONTEXT,), prefix, new) for prefix, new in texts]
        costs = [_us(judge, item, F) for item in items]
        if best is None or sum(costs) < sum(best):
            best = costs
    assert best is not None
    return {
        "checkpoints": len(best),
        "first_10_mean_us": statistics.fmean(best[:10]),
        "last_10_mean_us": statistics.fmean(best[-10:]),
        "last_text_chars": len(texts[-1][0]) + len(texts[-1][1]),
    }


def _bench_index(streams: Sequence[tuple[tuple[str, ...], str]], repeat: int) -> dict[str, float]:
    distinct = list(dict.fromkeys(c for ctx, _ in streams for c in ctx))[:5]
    small = tuple(distinct) if len(distinct) == 5 else (SYNTHETIC_CONTEXT,) * 5
    large = tuple(c * 100 for c in small)
    out = {}
    for name, ctx in (("small", small), ("large", large)):
        # each run gets contexts it has never seen, so no per-context cache can serve it
        costs = []
        for r in range(repeat):
            fresh = tuple(f"Run {r} of {name}, part {k}. {c}" for k, c in enumerate(ctx))
            costs.append(_index_us(fresh))
        out[f"{name}_chars"] = float(sum(map(len, ctx)))
        out[f"{name}_us"] = min(costs)
    return out


def _bench_per_sentence(streams: Sequence[tuple[tuple[str, ...], str]], repeat: int) -> dict[str, float]:
    prepared = [(ctx, [x.text for x in split_sentences(answer)]) for ctx, answer in streams]
    n = sum(len(sents) for _, sents in prepared)
    judged: list[float] = []
    baseline: list[float] = []
    for _ in range(repeat):
        judge = LocalJudge()
        for ctx, _sents in prepared:  # warm the indexes: a stream's contexts are indexed once
            judge.evaluate_sync(EvalInput(QUESTION, ctx, "", kind="preflight"), (semconv.CONTEXT_PRECISION,))
        t0 = _clock()
        for ctx, sents in prepared:
            for sent in sents:
                judge.evaluate_sync(EvalInput(QUESTION, ctx, sent, kind="checkpoint"), F)
        judged.append((_clock() - t0) / 1000 / n)
        t0 = _clock()
        for _ctx, sents in prepared:
            for sent in sents:
                split_sentences(sent)
        baseline.append((_clock() - t0) / 1000 / n)
    ratios = [a / b for a, b in zip(judged, baseline, strict=True)]
    return {
        "sentences": float(n),
        "judge_us": min(judged),
        "baseline_split_us": min(baseline),
        "ratio": statistics.median(ratios),
        "ratio_min": min(ratios),
        "ratio_max": max(ratios),
    }


def main() -> None:
    """Run the benchmarks and print a table or JSON."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--clock", choices=("cpu", "wall"), default="cpu")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args()
    global _clock
    _clock = time.thread_time_ns if args.clock == "cpu" else time.perf_counter_ns
    streams = _streams(args.data) if args.data.is_dir() else []
    results: dict[str, Any] = {
        "clock": args.clock,
        "streams": _bench_streams(streams, args.repeat) if streams else None,
        "tiers": _bench_tiers(streams, args.repeat) if streams else None,
        "growing": _bench_growing(args.repeat),
        "index": _bench_index(streams, args.repeat),
        "per_sentence": _bench_per_sentence(streams, args.repeat) if streams else None,
    }
    if args.json:
        print(json.dumps(results, indent=2))
        return
    s = results["streams"]
    if s is None:
        print(f"streams: skipped (no data in {args.data})")
    else:
        print(f"FaithBench streams: {s['streams']} streams, {s['mean_sentences']:.1f} sentences and "
              f"{s['mean_context_chars']:.0f} context chars each, {s['checkpoints']} checkpoints")
        print(f"  context index, cold            {s['index_cold_us']:9.1f} us")
        print(f"  pre-flight                     {s['preflight_us']:9.1f} us")
        print(f"  all checkpoints of a stream    {s['checkpoints_per_stream_us']:9.1f} us")
        mean, p95, worst = s["checkpoint_mean_us"], s["checkpoint_p95_us"], s["checkpoint_max_us"]
        spread = s["checkpoint_mean_us_over_repeats"]
        print(f"  one checkpoint, mean / p95 / max {mean:7.1f} / {p95:.1f} / {worst:.1f} us (budget 200 us)")
        print(f"  mean over {args.repeat} repeats: min {spread['min']:.1f}, median {spread['median']:.1f}, "
              f"max {spread['max']:.1f} us")
        print(f"  final pass (all metrics)       {s['final_us']:9.1f} us")
    t = results["tiers"]
    if t is not None:
        print("tiers: a stream's checkpoints and final pass by the runtime's two judges (one index cache)")
        print(f"  judge time per stream          {t['shared_us_per_stream']:9.1f} us; a cache each "
              f"(baseline) {t['own_caches_us_per_stream']:.1f} us; ratio {t['ratio']:.2f} "
              f"[{t['ratio_spread'][0]:.2f}-{t['ratio_spread'][1]:.2f}]")
    g = results["growing"]
    print(f"growing text: {g['checkpoints']:.0f} checkpoints, up to {g['last_text_chars']:.0f} chars "
          f"(a checkpoint's cost should not grow with its prefix)")
    print(f"  checkpoints 1-10, mean         {g['first_10_mean_us']:9.1f} us")
    print(f"  last 10 checkpoints, mean      {g['last_10_mean_us']:9.1f} us")
    i = results["index"]
    print(f"context index, cold: {i['small_chars']:.0f} chars {i['small_us']:.1f} us, "
          f"{i['large_chars']:.0f} chars {i['large_us'] / 1000:.1f} ms")
    p = results["per_sentence"]
    if p is not None:
        print(f"one sentence's verdict ({p['sentences']:.0f} sentences, warm index): {p['judge_us']:.1f} us; "
              f"splitting it (baseline, same run) {p['baseline_split_us']:.1f} us; ratio {p['ratio']:.1f} "
              f"[{p['ratio_min']:.1f}-{p['ratio_max']:.1f}]")


if __name__ == "__main__":
    main()
