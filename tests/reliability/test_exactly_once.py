"""A burst of 2,000 concurrent streams against a slow judge and a tiny queue: most judge jobs are refused,
yet every span that ended is exported exactly once, each unjudged span says why, and every refusal is
counted in the drops metric under the same reason."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from _fakes import KeywordJudge
from reliability.conftest import SpanLedger, atokens
from streamjudge import semconv
from streamjudge.config import Settings

CONTEXTS = ["The sky is blue. Grass is green. Water is wet. Fire is hot."]
STREAMS = 2_000
# the reasons an unjudged span may give (design, data flow 6, plus what the pool can decide)
REASONS = {"dropped", "timeout", "error", "sampled_out", "deferred", "superseded", "budget_exhausted",
           "cancelled", "shutdown", "skipped"}


def _answer(i: int) -> str:
    # distinct texts: 8 sentences, four checkpoints of two sentences; every 7th stream invents a fact
    bad = " HALLUCINATED" if i % 7 == 0 else ""
    return (f"The sky is blue {i}. Grass is green{bad}. Water is wet {i}. Fire is hot. "
            f"The sky is blue {i + 1}. Grass is green. Water is wet. Fire is hot {i}.")


def _drops(reader: InMemoryMetricReader) -> Counter[str]:
    out: Counter[str] = Counter()
    data = reader.get_metrics_data()
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == semconv.METRIC_DROPS:
                    for p in m.data.data_points:
                        out[str(p.attributes[semconv.METRIC_ATTR_REASON])] += int(p.value)
    return out


@pytest.mark.timeout(240)
def test_a_burst_with_a_slow_judge_and_a_tiny_queue_exports_every_span_exactly_once() -> None:
    exporter = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    rt = streamjudge.configure(
        Settings(preflight=False, sample_rate=0.5, queue_size=8, concurrency=2, end_wait_s=0.05, per_stream_budget=0,
                 judge_cpu_share=0.0),
        downstream=SimpleSpanProcessor(exporter), judge=KeywordJudge(delay_s=0.02),
        metric_readers=[reader], set_global=False,
    )
    ledger = SpanLedger()
    rt.tracer_provider.add_span_processor(ledger)  # sees each span as it ends, before it may be held
    try:
        async def one(i: int) -> None:
            with rt.tracer.start_as_current_span("request"):  # an unjudged parent: passes straight through
                async for _ in streamjudge.guard(atokens(_answer(i), 0.001 * (i % 3)), question="sky",
                                                 contexts=CONTEXTS):
                    pass

        async def burst() -> None:
            await asyncio.gather(*(one(i) for i in range(STREAMS)))

        asyncio.run(burst())
        assert rt.force_flush(60_000)
        assert rt.processor.held == 0
        spans = exporter.get_finished_spans()
        exported = Counter(s.context.span_id for s in spans)
        assert sum(ledger.ended.values()) == len(ledger.ended), "a span id ended twice"
        assert set(exported) == set(ledger.ended), "a span was lost (or one was exported that never ended)"
        assert max(exported.values()) == 1, "a span was exported twice"
        judged = [s for s in spans if s.name in (semconv.SPAN_CHECKPOINT, semconv.SPAN_STREAM)]
        names = Counter(s.name for s in spans)
        assert names["request"] == names[semconv.SPAN_STREAM] == STREAMS
        # a sampled stream has four checkpoints; a sampled-out one splits no sentences at all
        sampled = sum(1 for s in spans if s.name == semconv.SPAN_STREAM
                      and s.attributes.get(semconv.EVAL_STATUS) != "sampled_out")
        assert names[semconv.SPAN_CHECKPOINT] == 4 * sampled
        statuses: Counter[str] = Counter(str(s.attributes.get(semconv.EVAL_STATUS)) for s in judged)
        assert statuses["judged"] > 0 and statuses["dropped"] > 0 and statuses["sampled_out"] > 0, statuses
        for s in judged:
            status = s.attributes.get(semconv.EVAL_STATUS)
            assert status == "judged" or status in REASONS, (s.name, dict(s.attributes))
        print(f"\nburst: {STREAMS} streams, {len(spans)} spans ended and exported once, statuses "
              f"{dict(statuses)}, drops {dict(_drops(reader))}")
        # every job the pool did not judge was counted under the reason its span gives (sampling is
        # decided at stream start: a sampled-out stream sends no job, so it is no drop)
        drops = _drops(reader)
        for reason, n in statuses.items():
            if reason not in ("judged", "sampled_out"):
                assert drops[reason] == n, (reason, drops, statuses)
    finally:
        rt.shutdown()
