"""Soak: many concurrent streams for minutes. Does memory stay flat, is every span exported exactly once?

    python benchmarks/soak.py [--streams 300] [--seconds 180] [--token-delay-ms 20] [--sample-every 10]
                              [--json out.json]

``--streams`` answers stream at the same time in one event loop, one token every ``--token-delay-ms``; when
one ends, the next starts on the same task, until ``--seconds`` are up. Every answer has its own text and
its own contexts (random facts; one answer in five contradicts its contexts), judged by the local judge
with the default settings (checkpoints and the final pass, pool queue and CPU share as shipped). Each
stream runs inside a request span, as under a web framework.

Reported: RSS and live objects (``gc``) over time, streams and tokens, the automatic GC's collections and
pauses and the objects only the cyclic GC freed (those in reference cycles: ~0 per stream when a finished
stream is freed by refcounting), checkpoint and stream spans by ``streamjudge.eval.status``, judge jobs not
judged by reason (the ``streamjudge.judge.drops`` metric), the span ledger (every span that ended against
every span the exporter received: lost, exported twice), and at the end the processor's held spans, the
judge pool's depth and the bound streams. Not part of the timed tests (``tests/reliability`` holds those).
"""

from __future__ import annotations

import argparse
import asyncio
import gc
import json
import random
import sys
import threading
import time
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from opentelemetry.context import Context  # noqa: E402
from opentelemetry.sdk.metrics.export import InMemoryMetricReader  # noqa: E402
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor  # noqa: E402
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult  # noqa: E402

import streamjudge  # noqa: E402
from streamjudge import semconv  # noqa: E402
from streamjudge.config import Settings  # noqa: E402
from streamjudge.instrumentation import _binding  # noqa: E402

_PAGE = 4096
_CITIES = ("Paris", "Lyon", "Oslo", "Lima", "Quito", "Kyoto", "Cairo", "Perth", "Porto", "Turin")
_THINGS = ("bridge", "library", "tower", "museum", "station", "harbour", "cathedral", "market")


def rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * _PAGE / 1e6


class Ledger:
    """Matches every span that ended with what the exporter received, whichever sees it first.

    Memory is bounded by the spans in flight: a matched pair is forgotten. Left over at the end: spans that
    ended and were never exported (lost), and exports that matched no ended span (exported twice).
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._ended: set[int] = set()
        self._exported: set[int] = set()
        self.ended = 0
        self.exported = 0
        self.twice = 0
        self.statuses: Counter[str] = Counter()

    def end(self, span_id: int) -> None:
        with self._lock:
            self.ended += 1
            if span_id in self._exported:
                self._exported.discard(span_id)
            else:
                self._ended.add(span_id)

    def export(self, span: ReadableSpan) -> None:
        ctx = span.context
        assert ctx is not None
        span_id = ctx.span_id
        with self._lock:
            self.exported += 1
            if span.name in (semconv.SPAN_STREAM, semconv.SPAN_CHECKPOINT):
                status = str((span.attributes or {}).get(semconv.EVAL_STATUS, "none"))
                self.statuses[f"{span.name.rsplit('.', 1)[-1]}:{status}"] += 1
            if span_id in self._ended:
                self._ended.discard(span_id)
            elif span_id in self._exported:
                self.twice += 1
            else:
                self._exported.add(span_id)

    @property
    def lost(self) -> int:
        return len(self._ended)

    @property
    def unmatched(self) -> int:
        return len(self._exported)


class _Ends(SpanProcessor):
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        assert span.context is not None
        self._ledger.end(span.context.span_id)


class CountingExporter(SpanExporter):
    def __init__(self, ledger: Ledger) -> None:
        self._ledger = ledger

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for s in spans:
            self._ledger.export(s)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _fact(rng: random.Random) -> tuple[str, str]:
    city, thing = rng.choice(_CITIES), rng.choice(_THINGS)
    year, size = rng.randint(1200, 2020), rng.randint(10, 900)
    fact = f"The {thing} of {city} was built in {year} and is {size} metres long."
    wrong = f"The {thing} of {city} was built in {year + rng.randint(3, 300)} and is {size} metres long."
    return fact, wrong


def _answer(rng: random.Random, n: int) -> tuple[str, list[str], str]:
    facts = [_fact(rng) for _ in range(6)]
    contexts = [" ".join(f for f, _ in facts[:3]), " ".join(f for f, _ in facts[3:])]
    lie = rng.random() < 0.2
    sentences = [w if lie and i == 3 else f for i, (f, w) in enumerate(facts)]
    return f"Question {n} about {facts[0][0].split()[1]}?", contexts, " ".join(sentences)


async def _tokens(text: str, delay_s: float) -> AsyncIterator[str]:
    words = text.split(" ")
    for i, w in enumerate(words):
        await asyncio.sleep(delay_s)
        yield w if i == 0 else " " + w


def _drops(reader: InMemoryMetricReader) -> dict[str, int]:
    out: Counter[str] = Counter()
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == semconv.METRIC_DROPS:
                    for p in m.data.data_points:  # type: ignore[union-attr]
                        out[str((p.attributes or {}).get(semconv.METRIC_ATTR_REASON))] += int(p.value)  # type: ignore[union-attr]
    return dict(out)


def soak(streams: int, seconds: float, token_delay_s: float, sample_every: float) -> dict[str, Any]:
    ledger = Ledger()
    reader = InMemoryMetricReader()
    rt = streamjudge.configure(Settings(), downstream=SimpleSpanProcessor(CountingExporter(ledger)),
                               metric_readers=[reader], set_global=False, backends_from_env=False, sinks=())
    rt.tracer_provider.add_span_processor(_Ends(ledger))
    samples: list[dict[str, float]] = []
    counts = {"streams": 0, "tokens": 0, "warned": 0, "lies": 0}
    # the collections the interpreter ran by itself (not the sampler's): per generation their count and
    # pauses (CPU of the collecting thread), and the objects any collection freed, which only a reference
    # cycle leaves to the GC (a finished stream freed by refcounting leaves none)
    auto = {"collections": [0, 0, 0], "pause_ms": [0.0, 0.0, 0.0]}
    cyclic = [0]
    sampling = [False]
    started = [0.0]

    def on_gc(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            started[0] = time.thread_time()
            return
        cyclic[0] += info["collected"]
        if not sampling[0]:
            auto["collections"][info["generation"]] += 1
            auto["pause_ms"][info["generation"]] += (time.thread_time() - started[0]) * 1000

    t0 = time.monotonic()

    def sample() -> None:
        sampling[0] = True
        try:
            gc.collect()
        finally:
            sampling[0] = False
        samples.append({"t_s": round(time.monotonic() - t0, 1), "rss_mb": round(rss_mb(), 1),
                        "objects": len(gc.get_objects()), "held": rt.processor.held,
                        "pool_depth": rt.pool.depth, "streams": counts["streams"]})
        s = samples[-1]
        print(f"  t={s['t_s']:>6.1f}s  rss={s['rss_mb']:>7.1f} MB  objects={s['objects']:>8}  "
              f"held={s['held']:>4}  depth={s['pool_depth']:>4}  streams={s['streams']}", flush=True)

    async def worker(k: int) -> None:
        rng = random.Random(k)
        n = 0
        while time.monotonic() - t0 < seconds:
            question, contexts, text = _answer(rng, n)
            n += 1
            warned = False
            with rt.tracer.start_as_current_span("request"):
                async for ev in streamjudge.guard(_tokens(text, token_delay_s), question=question,
                                                  contexts=contexts):
                    if ev.type == "token":
                        counts["tokens"] += 1
                    elif ev.type == "warning":
                        warned = True
            counts["streams"] += 1
            counts["warned"] += warned

    async def sampler() -> None:
        while time.monotonic() - t0 < seconds:
            await asyncio.sleep(sample_every)
            sample()

    async def main() -> None:
        await asyncio.gather(sampler(), *(worker(k) for k in range(streams)))

    sample()
    cyclic[0] = 0  # from here on: configure's own garbage is not the streams'
    gc.callbacks.append(on_gc)
    try:
        asyncio.run(main())
        elapsed = time.monotonic() - t0
        flushed = rt.force_flush(60_000)
        sample()
    finally:
        gc.callbacks.remove(on_gc)
    result = {
        "streams_concurrent": streams, "seconds": round(elapsed, 1), "token_delay_ms": token_delay_s * 1000,
        "streams_done": counts["streams"], "tokens": counts["tokens"],
        "tokens_per_s": round(counts["tokens"] / elapsed), "streams_warned": counts["warned"],
        "flushed": flushed, "spans_ended": ledger.ended, "spans_exported": ledger.exported,
        "spans_lost": ledger.lost, "spans_exported_twice": ledger.twice + ledger.unmatched,
        "statuses": dict(sorted(ledger.statuses.items())), "drops_by_reason": _drops(reader),
        "held_at_end": rt.processor.held, "pool_depth_at_end": rt.pool.depth,
        "bound_streams_at_end": _binding.active_count(), "samples": samples,
        "gc_collections": auto["collections"], "gc_pause_ms": [round(x, 1) for x in auto["pause_ms"]],
        "gc_freed_objects": cyclic[0],
    }
    rt.shutdown(10_000)
    return result


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--streams", type=int, default=300)
    p.add_argument("--seconds", type=float, default=180.0)
    p.add_argument("--token-delay-ms", type=float, default=20.0)
    p.add_argument("--sample-every", type=float, default=10.0)
    p.add_argument("--json", type=Path, default=None, help="also write the result here")
    args = p.parse_args()
    print(f"soak: {args.streams} concurrent streams for {args.seconds:g} s, a token every "
          f"{args.token_delay_ms:g} ms, local judge, default settings", flush=True)
    r = soak(args.streams, args.seconds, args.token_delay_ms / 1000, args.sample_every)
    s = r["samples"]
    warm = s[min(1, len(s) - 1)]
    print(f"\nstreams done {r['streams_done']} ({r['tokens_per_s']} tokens/s), warned {r['streams_warned']}")
    print(f"RSS {s[0]['rss_mb']} MB at start, {warm['rss_mb']} MB at {warm['t_s']} s, "
          f"{s[-1]['rss_mb']} MB at the end (max {max(x['rss_mb'] for x in s)} MB)")
    print(f"live objects {warm['objects']} at {warm['t_s']} s, {s[-1]['objects']} at the end")
    print(f"GC (automatic collections): {r['gc_collections']} per generation, pauses {r['gc_pause_ms']} ms; "
          f"objects only the cyclic GC freed {r['gc_freed_objects']} "
          f"({r['gc_freed_objects'] / max(1, r['streams_done']):.1f} per stream)")
    print(f"spans ended {r['spans_ended']}, exported {r['spans_exported']}, lost {r['spans_lost']}, "
          f"exported twice {r['spans_exported_twice']}")
    print(f"span statuses {r['statuses']}")
    print(f"judge drops by reason {r['drops_by_reason']}")
    print(f"at the end: held {r['held_at_end']}, pool depth {r['pool_depth_at_end']}, "
          f"bound streams {r['bound_streams_at_end']}, flushed {r['flushed']}")
    if args.json is not None:
        args.json.write_text(json.dumps(r, indent=2) + "\n")


if __name__ == "__main__":
    main()
