"""Instructions per token, counted by valgrind's callgrind: the hot path's cost without this VM's noise.

    python benchmarks/bench_instructions.py [--streams N] [--json]

Wall and CPU time on a shared 2-core VM swing by 20-30% from one minute to the next, so a change of 0.1 µs
per token cannot be seen in ``run.py``'s figures. Instructions retired are the same from run to run for the
same code and inputs (callgrind counts them in a simulated CPU, whatever else the machine does), so this
benchmark can tell such a change apart. It does not say how long an instruction takes: cache misses and
the GIL are not in it, and ``run.py`` stays the benchmark of time.

Each variant runs in its own process under ``valgrind --tool=callgrind`` and streams the same answers
(several FaithBench summaries back to back, their sources as the contexts, a different text and context set
for every answer) through a minimal SSE loop: a token source, ``json.dumps`` of a token frame. The process
calls ``os.getppid()`` at each stream's start, at its last token and after its ``done`` event, and callgrind
dumps its counters on entry to that function (``--dump-before=os_getppid``), so the counts split into
"start to last token" and "last token to the end" per stream, on the event loop's thread. Variants:

- ``bare``: the loop alone (the baseline every ratio is against);
- ``span``: the loop plus one OpenTelemetry SDK span per answer, exported in batches (what one tracing span
  per answer costs: the issue's peer figure);
- ``sampled_out``: through ``streamjudge.guard`` with a zero sample rate (no judging work at all);
- ``judged``: through ``guard`` with a judge that answers at once on the pool's thread (streamjudge's own
  work per judged token: sentence windows, checkpoint spans, requests, verdicts, without a judge's cost);
- ``local``: through ``guard`` with the local judge in the pool's thread (``judge_processes=0``); its
  figure for all threads includes the judging itself.

Two token sources: one with every token at hand (a burst: windows close before the loop runs again and are
joined into one checkpoint) and one that lets the loop run before every token (as a model read over the
network is: every window its own checkpoint). The spread is over the streams of a run (per-stream
instructions per token, lowest to highest), since repeats give the same counts.
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "benchmarks"))

VARIANTS = ("bare", "span", "sampled_out", "judged", "local")
SOURCES = ("at_hand", "yielding")
# callgrind runs ~50x slower than the CPU; 12 answers of ~340 tokens take ~20 s per variant
DEFAULT_STREAMS = 12
SLOWDOWN = 50
WARM_STREAMS = 3  # streamed before counting: imports, caches and the judge pool's thread are warm


def _streams(n: int) -> list[tuple[tuple[str, ...], list[str], str]]:
    from run import chat_streams, load_samples

    return chat_streams(load_samples(5 * n + 5))[:n]


# --- the child: one variant, counted ------------------------------------------------------------------


class _InstantJudge:
    """Passes every metric at once: the judged variant then counts streamjudge's work, not a judge's."""

    name = "instant"
    # as the default (local) judge: a burst's windows are joined into one checkpoint
    scores_sentences = True

    async def evaluate(self, item: Any, metrics: Sequence[str]) -> Any:
        from streamjudge.judging.base import JudgeResult, Score

        return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))

    async def aclose(self) -> None:
        return None


def _child(variant: str, source_name: str, n: int) -> None:
    from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

    import run
    import streamjudge
    from streamjudge.config import Settings
    from streamjudge.judging import _drivers
    from streamjudge.runtime import _Discard

    # the driver races a token against verdicts in flight once its source's gaps pass a threshold in wall
    # time; under callgrind every gap is ~50x longer, and longer still when the machine is busy, so a
    # source that lets the loop run once per token looked slow in some runs and paid a task per token that
    # it does not pay at full speed (counts of the same code then varied 20-99k per token). Scaled as the
    # run is, the driver takes the paths the same code takes outside callgrind
    _drivers._RACE_GAP_S *= SLOWDOWN

    streams = _streams(WARM_STREAMS + n)
    warm, counted = streams[:WARM_STREAMS], streams[WARM_STREAMS:]
    src: Callable[[Sequence[str], float], AsyncIterator[str]] = (
        run.source if source_name == "at_hand" else run.yielding
    )
    mark = os.getppid  # callgrind dumps its counters on entry to it (see the module docstring)
    frame = run.frame

    settings = {
        "sampled_out": Settings(sample_rate=0.0),
        "local": Settings(judge_processes=0),
    }.get(variant, Settings())
    judge = _InstantJudge() if variant == "judged" else None
    rt = streamjudge.configure(settings, downstream=_Discard(), judge=judge, set_global=False)
    # what the judge answered: a judged variant that counted error verdicts (a judge that raised) would
    # measure the error path instead of the work a passing checkpoint costs
    outcomes: dict[str, int] = {}
    resolve = rt.processor.resolve

    def counting_resolve(request: Any, outcome: Any, scores: Any) -> None:
        outcomes[outcome.status] = outcomes.get(outcome.status, 0) + 1
        resolve(request, outcome, scores)

    rt.processor.resolve = counting_resolve  # type: ignore[method-assign]
    class _Dropped(SpanExporter):
        def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
            return SpanExportResult.SUCCESS

    peer = TracerProvider()
    peer.add_span_processor(BatchSpanProcessor(_Dropped()))
    tracer = peer.get_tracer("peer")

    async def guarded(batch: list[tuple[tuple[str, ...], list[str], str]], marks: bool) -> None:
        for ctx, toks, q in batch:
            left = len(toks)
            if marks:
                mark()
            async for ev in streamjudge.guard(src(toks, 0.0), question=q, contexts=ctx):
                if ev.type == "token":
                    frame(ev.text)
                    left -= 1
                    if not left and marks:
                        mark()
            if marks:
                mark()

    async def plain(batch: list[tuple[tuple[str, ...], list[str], str]], span: bool) -> None:
        for _ctx, toks, q in batch:
            left = len(toks)
            mark()
            sp = tracer.start_span("answer", attributes={"openinference.span.kind": "CHAIN",
                                                         "input.value": q}) if span else None
            parts: list[str] = []
            async for tok in src(toks, 0.0):
                frame(tok)
                if sp is not None:
                    parts.append(tok)
                left -= 1
                if not left:
                    mark()
            if sp is not None:
                sp.set_attribute("output.value", "".join(parts))
                sp.end()
            mark()

    asyncio.run(guarded(warm, False))
    rt.force_flush(30_000)
    gc.collect()
    if variant in ("bare", "span"):
        asyncio.run(plain(counted, variant == "span"))
    else:
        asyncio.run(guarded(counted, True))
    rt.force_flush(30_000)
    peer.force_flush()
    rt.shutdown()
    peer.shutdown()
    failed = {k: v for k, v in outcomes.items() if k not in ("judged", "superseded")}
    if variant in ("judged", "local") and failed:
        raise SystemExit(f"{variant}: verdicts that were not judged: {failed}")
    print(json.dumps([len(t) for _c, t, _q in counted]))


# --- the parent: run the children under callgrind, read their dumps -----------------------------------

_SUMMARY = re.compile(rb"^(?:summary|totals):\s*(\d+)", re.MULTILINE)
# cg.out.<part>-<thread> for each dump; cg.out-<thread> for what was left at exit
_PART = re.compile(r"cg\.out(?:\.(\d+))?-(\d+)$")


def _count(out_dir: Path) -> tuple[dict[int, dict[int, int]], int]:
    """{thread: {part: instructions}} from callgrind's dump files, and the total over all threads."""
    parts: dict[int, dict[int, int]] = {}
    total = 0
    for f in out_dir.iterdir():
        m = _PART.search(f.name)
        if m is None:
            continue
        s = _SUMMARY.search(f.read_bytes())
        if s is None:
            continue
        part, thread = int(m.group(1) or 1_000_000), int(m.group(2))
        parts.setdefault(thread, {})[part] = int(s.group(1))
        total += int(s.group(1))
    return parts, total


def _run_variant(valgrind: str, variant: str, source: str, n: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="sj-callgrind-") as tmp:
        out = Path(tmp)
        proc = subprocess.run(
            [valgrind, "--tool=callgrind", "--separate-threads=yes", "--dump-before=os_getppid",
             f"--callgrind-out-file={out / 'cg.out'}",
             sys.executable, __file__, "--child", variant, source, str(n)],
            capture_output=True, text=True, check=False,
            # string hashes decide set and dict layouts, and so some instruction counts: fixed, a run
            # repeats the last one's counts
            env={**os.environ, "PYTHONHASHSEED": "0"},
        )
        if proc.returncode != 0:
            raise RuntimeError(f"{variant}/{source}: callgrind run failed:\n{proc.stderr[-2000:]}")
        lengths: list[int] = json.loads(proc.stdout.strip().splitlines()[-1])
        parts, total = _count(out)
    loop = parts[1]  # thread 1: the main thread, which runs the event loop
    # part 1 is everything before the first mark; then per stream: start->last token, last token->end,
    # and the few instructions between one stream's end and the next one's start
    tokens_part = [loop.get(2 + 3 * i, 0) for i in range(len(lengths))]
    end_part = [loop.get(3 + 3 * i, 0) for i in range(len(lengths))]
    counted = sum(v for p, v in loop.items() if 2 <= p < 2 + 3 * len(lengths))
    other_threads = sum(sum(t.values()) for th, t in parts.items() if th != 1)
    return {"lengths": lengths, "tokens": tokens_part, "end": end_part, "loop_counted": counted,
            "other_threads": other_threads, "total": total}


def _ratio(a: float, b: float) -> float:
    return round(a / b, 3) if b else float("nan")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--streams", type=int, default=DEFAULT_STREAMS)
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    ap.add_argument("--child", nargs=3, metavar=("VARIANT", "SOURCE", "N"), help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        _child(args.child[0], args.child[1], int(args.child[2]))
        return 0
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        print("skipped: valgrind is not installed (apt-get install valgrind)")
        return 0
    jobs = [(v, s) for s in SOURCES for v in VARIANTS]
    # one child per core: instruction counts do not depend on what runs beside them
    with ThreadPoolExecutor(max_workers=max(1, os.cpu_count() or 1)) as ex:
        runs = dict(zip(jobs, ex.map(lambda j: _run_variant(valgrind, j[0], j[1], args.streams), jobs),
                        strict=True))
    results: dict[str, Any] = {"streams": args.streams}
    for s in SOURCES:
        base = runs[("bare", s)]
        tokens = sum(base["lengths"])
        bare_tok = sum(base["tokens"]) / tokens
        bare_all = base["loop_counted"] / tokens
        results[f"{s}_tokens"] = tokens
        results[f"{s}_bare_instructions_per_token"] = round(bare_tok)
        for v in VARIANTS[1:]:
            r = runs[(v, s)]
            assert r["lengths"] == base["lengths"], "every variant streams the same answers"
            per_stream = [(t - b) / n for t, b, n in zip(r["tokens"], base["tokens"], base["lengths"],
                                                         strict=True)]
            to_last = sum(r["tokens"]) / tokens - bare_tok
            whole = r["loop_counted"] / tokens - bare_all
            key = f"{s}_{v}"
            results[f"{key}_added_to_last_token"] = round(to_last)
            results[f"{key}_added_to_last_token_spread"] = f"[{min(per_stream):.0f}-{max(per_stream):.0f}]"
            results[f"{key}_cost_vs_bare_to_last_token"] = _ratio(bare_tok + to_last, bare_tok)
            results[f"{key}_added_whole_stream"] = round(whole)
            results[f"{key}_cost_vs_bare_whole_stream"] = _ratio(bare_all + whole, bare_all)
            if v == "local":
                # the judge's own work on the pool's thread, per token streamed
                results[f"{key}_other_threads_per_token"] = round(
                    (r["other_threads"] - base["other_threads"]) / tokens)
    # the CPU goals for the token path, counted: sampled out at most 1.5x the bare loop, judged (the
    # local judge on) at most 2x on the token's thread; to the last token, for both sources
    goals = {
        "goal_sampled_out_le_1.5x_bare": all(
            results[f"{s}_sampled_out_cost_vs_bare_to_last_token"] <= 1.5 for s in SOURCES),
        "goal_judged_loop_thread_le_2x_bare": all(
            results[f"{s}_local_cost_vs_bare_to_last_token"] <= 2.0 for s in SOURCES),
    }
    results.update(goals)
    if args.json:
        print(json.dumps(results))
        return 0
    for s in SOURCES:
        print(f"== token source: {s} ({results[f'{s}_tokens']} tokens in {args.streams} answers; the bare "
              f"loop {results[f'{s}_bare_instructions_per_token']} instructions per token)")
        print(f"   {'variant':<12} {'added/token to last token':>28} {'x bare':>7} "
              f"{'added/token whole stream':>25} {'x bare':>7}")
        for v in VARIANTS[1:]:
            key = f"{s}_{v}"
            print(f"   {v:<12} {results[key + '_added_to_last_token']:>9} "
                  f"{results[key + '_added_to_last_token_spread']:>18} "
                  f"{results[key + '_cost_vs_bare_to_last_token']:>7} "
                  f"{results[key + '_added_whole_stream']:>25} "
                  f"{results[key + '_cost_vs_bare_whole_stream']:>7}")
        print(f"   local judge's own work on other threads: "
              f"{results[f'{s}_local_other_threads_per_token']} instructions per token")
    from run import print_goals

    print_goals(goals, "== goals (CPU goals, counted instead of timed; instructions are not time -"
                       " cache\n   misses, the GIL - and run.py has the microseconds)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
