"""The judge span processor beside an application's own exporters, and the metrics it records."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

try:
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
except ImportError:  # SDK 1.38 knows it by its older name only
    from opentelemetry.sdk._logs.export import InMemoryLogExporter as InMemoryLogRecordExporter
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from _fakes import KeywordJudge, SyncKeywordJudge
from streamjudge import semconv
from streamjudge.config import Settings

CONTEXTS = ["The sky is blue. Grass is green."]
BAD = "The sky is blue. Grass is green. Then HALLUCINATED facts appear. More text here. The end."


async def words(text: str) -> AsyncIterator[str]:
    for w in text.split(" "):
        yield w + " "
        await asyncio.sleep(0.002)


def run(**kw: object) -> None:
    async def main() -> None:
        async for _ in streamjudge.guard(words(BAD), question="sky", contexts=CONTEXTS, **kw):  # type: ignore[arg-type]
            pass

    asyncio.run(main())


def test_beside_an_app_provider_results_go_out_as_evaluator_spans_and_log_events() -> None:
    # the application (or the Langfuse SDK) set tracing up and exports spans itself
    app_exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(app_exporter))
    logs = InMemoryLogRecordExporter()
    logger_provider = LoggerProvider()
    logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
    rt = streamjudge.configure(
        Settings(), tracer_provider=provider, judge=SyncKeywordJudge(), logger_provider=logger_provider,
        set_global=False,
    )
    try:
        assert not rt.processor.owns_export
        run()
        rt.force_flush(10_000)
        spans = app_exporter.get_finished_spans()
        # the app's exporter got every span exactly once, unchanged, plus the evaluator spans
        ids = [s.context.span_id for s in spans]
        assert len(ids) == len(set(ids))
        targets = {s.context.span_id: s for s in spans if s.name in (semconv.SPAN_CHECKPOINT, semconv.SPAN_STREAM)}
        assert all(semconv.EVAL_STATUS not in s.attributes for s in targets.values())
        evaluators = [s for s in spans if s.name == semconv.SPAN_EVALUATOR]
        assert evaluators
        for ev in evaluators:
            target = ev.links[0].context
            assert target.span_id in targets and ev.parent.span_id == target.span_id
            assert ev.context.trace_id == target.trace_id
            assert ev.attributes[semconv.SPAN_TYPE] == semconv.SPAN_TYPE_EVALUATOR
        failing = [e for s in evaluators for e in s.events
                   if e.attributes.get(semconv.GEN_AI_EVALUATION_SCORE_LABEL) == "fail"]
        assert failing
        records = logs.get_finished_logs()
        assert records
        rec = records[0].log_record
        assert rec.event_name == semconv.EVENT_EVALUATION_RESULT
        assert rec.trace_id in {s.context.trace_id for s in targets.values()}
        assert rec.span_id in targets
    finally:
        rt.shutdown()


def test_metrics_scores_alerts_latency_queue_depth_drops() -> None:
    reader = InMemoryMetricReader()
    rt = streamjudge.configure(
        Settings(queue_size=1), downstream=SimpleSpanProcessor(InMemorySpanExporter()),
        judge=KeywordJudge(), metric_readers=[reader], set_global=False,
    )
    try:
        run()
        rt.force_flush(10_000)
        data = reader.get_metrics_data()
        names = {m.name for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        assert {semconv.METRIC_SCORE, semconv.METRIC_ALERTS, semconv.METRIC_JUDGE_DURATION,
                semconv.METRIC_QUEUE_DEPTH, semconv.METRIC_QUEUE_CAPACITY} <= names
        # one vocabulary: the span type as on the spans, and what was judged
        labels = {(p.attributes[semconv.SPAN_TYPE], p.attributes[semconv.EVAL_KIND])
                  for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
                  if m.name == semconv.METRIC_SCORE for p in m.data.data_points}
        assert labels <= {("checkpoint", "checkpoint"), ("stream", "answer"), ("stream", "preflight")}
        assert ("stream", "answer") in labels
    finally:
        rt.shutdown()


def test_global_budget_per_minute_refuses_with_a_reason() -> None:
    exporter = InMemorySpanExporter()
    rt = streamjudge.configure(
        Settings(global_budget_per_minute=2, preflight=False), downstream=SimpleSpanProcessor(exporter),
        judge=SyncKeywordJudge(), set_global=False,
    )
    try:
        for _ in range(3):
            run()
        rt.force_flush(10_000)
        statuses = [s.attributes[semconv.EVAL_STATUS] for s in exporter.get_finished_spans()
                    if s.name in (semconv.SPAN_CHECKPOINT, semconv.SPAN_STREAM)]
        assert statuses.count("judged") == 2
        assert "budget_exhausted" in statuses
    finally:
        rt.shutdown()


def test_a_forked_worker_judges_its_own_streams() -> None:
    import os

    exporter = InMemorySpanExporter()
    rt = streamjudge.configure(
        Settings(), downstream=SimpleSpanProcessor(exporter), judge=SyncKeywordJudge(), set_global=False
    )
    try:
        run()  # the parent has used the pool and the stores: threads, locks, a registry
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # a gunicorn/uvicorn worker
            try:
                exporter.clear()
                run()
                rt.force_flush(10_000)
                statuses = sorted({str(s.attributes.get(semconv.EVAL_STATUS)) for s in exporter.get_finished_spans()
                                   if s.name == semconv.SPAN_STREAM})
                os.write(w, ",".join(statuses).encode())
            finally:
                os._exit(0)
        os.close(w)
        os.waitpid(pid, 0)
        assert os.read(r, 100).decode() == "judged"
    finally:
        rt.shutdown()


def test_a_span_whose_result_never_comes_is_exported_after_the_hold_timeout() -> None:
    # a judge that blocks its thread (or ignores cancellation) never delivers: the span must still go out
    import time as _time

    from streamjudge.judging.processor import JudgeSpanProcessor
    from streamjudge.results import EvalInput, JobOutcome, JudgeRequest

    exporter = InMemorySpanExporter()
    processor = JudgeSpanProcessor(downstream=SimpleSpanProcessor(exporter), hold_timeout_s=0.05)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    tracer = provider.get_tracer("t")
    stuck = tracer.start_span("stuck")
    processor.expect(stuck.get_span_context().span_id)
    stuck.end()
    assert exporter.get_finished_spans() == ()  # held for its result
    _time.sleep(0.1)
    later = tracer.start_span("later")
    processor.expect(later.get_span_context().span_id)  # any later request sweeps overdue spans
    (out,) = exporter.get_finished_spans()
    assert out.name == "stuck" and out.attributes[semconv.EVAL_STATUS] == "timeout"
    # the result that finally comes is dropped, not exported a second time
    ctx = stuck.get_span_context()
    req = JudgeRequest(item=EvalInput("q", (), "a"), metrics=(), thresholds={}, target_span_id=ctx.span_id,
                       target_trace_id=ctx.trace_id)
    processor.resolve(req, JobOutcome("judged"), ())
    assert len(exporter.get_finished_spans()) == 1


def test_shutdown_ends_the_hold_timeout_sweeper_at_once() -> None:
    # asleep for its period (up to a second), it kept the processor, and the runtime around it, alive after
    # shutdown; held spans go out with the shutdown either way
    import time as _time

    from streamjudge.judging.processor import JudgeSpanProcessor

    exporter = InMemorySpanExporter()
    processor = JudgeSpanProcessor(downstream=SimpleSpanProcessor(exporter), hold_timeout_s=30.0)
    provider = TracerProvider()
    provider.add_span_processor(processor)
    span = provider.get_tracer("t").start_span("held")
    processor.expect(span.get_span_context().span_id)
    span.end()
    sweeper = processor._sweeper
    assert sweeper is not None and sweeper.is_alive()  # a span waits: it sleeps 1 s at a time
    started = _time.monotonic()
    processor.shutdown()
    assert not sweeper.is_alive()
    assert _time.monotonic() - started < 0.9
    (out,) = exporter.get_finished_spans()
    assert out.attributes[semconv.EVAL_STATUS] == "shutdown"
