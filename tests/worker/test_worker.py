"""The worker judges deferred answers exactly as in-process judging does, once each, and forwards the rest
unchanged. Driven through :meth:`Worker.ingest` with real SDK spans and an in-memory export path."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from _fakes import GatedJudge, KeywordJudge
from conftest import Harness
from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.worker import Worker, WorkerOptions
from worker._spans import CONTEXTS, QUESTION, app_trace, deferred_attributes, ids, request

ANSWER = "The Eiffel Tower was completed in 1889. It is 330 metres tall. It was painted gold by Picasso."


class Out:
    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()

    def spans(self) -> list[ReadableSpan]:
        return list(self.exporter.get_finished_spans())

    def answers(self) -> list[ReadableSpan]:
        return [s for s in self.spans() if (s.attributes or {}).get(semconv.SPAN_TYPE) == "stream"]


@pytest.fixture
def out() -> Out:
    return Out()


@pytest.fixture
def make_worker(out: Out) -> Iterator[Any]:
    made: list[Worker] = []

    def make(judge: Any = None, options: WorkerOptions | None = None, **settings: Any) -> Worker:
        w = Worker(Settings(**settings), options or WorkerOptions(http_endpoint=None, grpc_endpoint=None),
                   export=SimpleSpanProcessor(out.exporter), judge=judge)
        made.append(w)
        return w

    yield make
    for w in made:
        if not w.stopping:
            w.shutdown(5.0)


async def _words(text: str) -> AsyncIterator[str]:
    for w in text.split(" "):
        yield w + " "


def _app_spans(harness: Harness, **settings: Any) -> list[ReadableSpan]:
    harness.configure(None, preflight=False, **settings)

    async def consume() -> None:
        async for _ in streamjudge.guard(_words(ANSWER), question=QUESTION, contexts=list(CONTEXTS)):
            pass

    asyncio.run(consume())
    return harness.spans()


def _until(condition: Any, limit_s: float = 10.0) -> None:
    import time

    deadline = time.monotonic() + limit_s
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def _stream(spans: list[ReadableSpan]) -> ReadableSpan:
    [s] = [s for s in spans if s.name == semconv.SPAN_STREAM]
    return s


def _plain(attrs: Any) -> dict[str, Any]:
    # a sequence attribute is a list or a tuple depending on the path it took; OTLP sends both as an array
    return {k: tuple(v) if isinstance(v, list | tuple) else v for k, v in dict(attrs or {}).items()}


def _verdict(span: ReadableSpan) -> tuple[dict[str, Any], list[tuple[str, dict[str, Any]]]]:
    timing = {semconv.EVAL_LATENCY_MS, semconv.EVAL_ATTEMPTS}
    attrs = {k: v for k, v in _plain(span.attributes).items()
             if k.startswith("streamjudge.eval.") and k not in timing}
    events = [(e.name, _plain(e.attributes)) for e in span.events
              if e.name == semconv.EVENT_EVALUATION_RESULT]
    return attrs, events


def test_a_deferred_answer_is_enriched_exactly_as_the_in_process_final_pass_does(
    harness: Harness, make_worker: Any, out: Out
) -> None:
    in_process = _stream(_app_spans(harness))  # final_pass="local": judged in the app
    deferred = _app_spans(harness, final_pass="deferred")
    assert _stream(deferred).attributes[semconv.EVAL_STATUS] == "deferred"
    worker = make_worker()
    worker.ingest(request(deferred))
    worker.service.force_flush(10_000)
    [judged] = out.answers()
    assert _verdict(judged) == _verdict(in_process)
    attrs, events = _verdict(judged)
    assert attrs[semconv.EVAL_STATUS] == "judged" and attrs[semconv.EVAL_PASSED] is False  # Picasso
    assert {e[1][semconv.GEN_AI_EVALUATION_NAME] for e in events} == set(Settings().final_metrics)
    # every other span of the trace left as the app sent it, and together with the judged answer
    sent = {ids(s): s for s in deferred}
    for span in out.spans():
        if span is judged:
            continue
        assert _plain(span.attributes) == _plain(sent[ids(span)].attributes)
        assert [(e.name, _plain(e.attributes)) for e in span.events] == [
            (e.name, _plain(e.attributes)) for e in sent[ids(span)].events]
    assert {ids(s) for s in out.spans()} == set(sent)


def test_a_retried_export_is_not_judged_or_exported_twice(make_worker: Any, out: Out) -> None:
    judge = KeywordJudge()
    worker = make_worker(judge)
    spans = app_trace()
    assert worker.ingest(request(spans)) == len(spans)
    assert worker.ingest(request(spans)) == 0  # the collector re-sent it
    worker.service.force_flush(10_000)
    assert len(judge.calls) == 1
    assert sorted(ids(s) for s in out.spans()) == sorted(ids(s) for s in spans)


def test_the_judge_sees_what_the_app_left_on_the_span(make_worker: Any) -> None:
    judge = KeywordJudge()
    worker = make_worker(judge, thresholds={"faithfulness": 0.9})
    worker.ingest(request(app_trace(deferred_attributes(answer="Paris. HALLUCINATED.", contexts=("c1", "c2"),
                                                        question="q?"))))
    worker.service.force_flush(10_000)
    [item] = judge.calls
    assert (item.answer, item.contexts, item.question, item.kind) == ("Paris. HALLUCINATED.", ("c1", "c2"),
                                                                      "q?", "answer")


def test_an_answer_deferred_without_content_says_it_could_not_be_judged(make_worker: Any, out: Out) -> None:
    judge = KeywordJudge()
    worker = make_worker(judge)
    attrs = {semconv.SPAN_TYPE: "stream", semconv.EVAL_STATUS: "deferred",
             semconv.EVAL_SKIP_REASON: "deferred_without_content"}
    worker.ingest(request(app_trace(attrs)))
    worker.service.force_flush(10_000)
    [span] = out.answers()
    assert span.attributes[semconv.EVAL_STATUS] == "skipped"
    assert span.attributes[semconv.EVAL_SKIP_REASON] == "skipped: deferred_without_content"
    assert judge.calls == []
    assert len(out.spans()) == 4  # the rest of its trace left with it


def test_spans_judged_in_the_app_pass_through_untouched(make_worker: Any, out: Out) -> None:
    worker = make_worker(KeywordJudge())
    local = {semconv.SPAN_TYPE: "stream", semconv.EVAL_STATUS: "judged", semconv.score_attribute("faithfulness"): 1.0}
    spans = app_trace(local)
    worker.ingest(request(spans))
    # the root arrived and the stream its checkpoints point at too: nothing to wait for
    assert {ids(s) for s in out.spans()} == {ids(s) for s in spans}
    [span] = out.answers()
    assert dict(span.attributes or {}) == local
    assert worker.answer_counts() == {}


def test_a_full_pool_still_gives_every_answer_exactly_one_outcome(make_worker: Any, out: Out) -> None:
    gate = threading.Event()
    worker = make_worker(GatedJudge(gate), concurrency=1, queue_size=1)
    traces = [app_trace() for _ in range(3)]
    worker.ingest(request(traces[0]))
    _until(lambda: worker.pool._queued == 0 and worker.pool.depth == 1)  # taken off the queue: running
    worker.ingest(request(traces[1]))  # queues
    worker.ingest(request(traces[2]))  # finds the queue full
    gate.set()
    worker.service.force_flush(10_000)
    statuses = sorted(s.attributes[semconv.EVAL_STATUS] for s in out.answers())
    assert statuses == ["dropped", "judged", "judged"]
    assert len(out.spans()) == sum(len(t) for t in traces)  # no span lost, none twice
    assert worker.answer_counts() == {"judged": 2, "dropped": 1}


HOLD = WorkerOptions(http_endpoint=None, grpc_endpoint=None, hold_traces=True)


def test_by_default_other_spans_are_handed_on_before_the_export_is_acknowledged(
    make_worker: Any, out: Out
) -> None:
    gate = threading.Event()  # a judge that has not answered yet
    worker = make_worker(GatedJudge(gate))
    trace = app_trace()
    others = [s for s in trace if s.name != semconv.SPAN_STREAM]
    assert worker.ingest(request(trace)) == len(trace)
    # when ingest returns the receiver acknowledges: the spans it does not judge have left already
    assert {ids(s) for s in out.spans()} == {ids(s) for s in others}
    assert worker.buffer.spans == 0
    gate.set()
    worker.service.force_flush(10_000)
    [answer] = out.answers()
    assert answer.attributes[semconv.EVAL_STATUS] == "judged"
    assert len(out.spans()) == len(trace)  # each once


def test_shutdown_flushes_held_traces_and_marks_judgements_it_cannot_wait_for(make_worker: Any, out: Out) -> None:
    gate = threading.Event()  # never opened: a judge that hangs
    worker = make_worker(GatedJudge(gate), HOLD)
    waiting = app_trace(answer=False)  # its answer is still streaming in the app
    judging = app_trace()
    worker.ingest(request(waiting))
    worker.ingest(request(judging))
    assert out.spans() == []  # both traces are held
    summary = worker.shutdown(1.0)
    assert summary["flushed_traces"] == 1 and summary["flushed_spans"] == len(waiting)
    assert summary["answers_marked_shutdown"] == 1
    [answer] = out.answers()
    assert answer.attributes[semconv.EVAL_STATUS] == "shutdown"
    assert {ids(s) for s in out.spans()} == {ids(s) for s in waiting + judging}
    gate.set()


def test_the_decision_wait_sends_a_trace_on_without_its_answer(make_worker: Any, out: Out) -> None:
    import time

    worker = make_worker(KeywordJudge(), WorkerOptions(http_endpoint=None, grpc_endpoint=None,
                                                        decision_wait_s=30.0, hold_traces=True))
    waiting = app_trace(answer=False)
    worker.ingest(request(waiting))
    assert worker.sweep(time.monotonic()) == 0
    assert worker.sweep(time.monotonic() + 30.0) == len(waiting)
    assert {ids(s) for s in out.spans()} == {ids(s) for s in waiting}
    text = worker.prometheus.render()
    assert f'{semconv.METRIC_WORKER_SPANS_RELEASED.replace(".", "_")}_total{{reason="decision_wait"}} 3' in text


def test_over_its_span_bound_the_worker_sends_the_oldest_trace_on_unchanged_and_counts_it(
    make_worker: Any, out: Out
) -> None:
    worker = make_worker(KeywordJudge(), WorkerOptions(http_endpoint=None, grpc_endpoint=None, max_spans=4,
                                                        hold_traces=True))
    full = app_trace()
    first = [s for s in full if s.name != semconv.SPAN_STREAM]  # 3 spans: its answer is still streaming
    second = app_trace(answer=False)
    worker.ingest(request(first))
    worker.ingest(request(second))
    assert {ids(s) for s in out.spans()} == {ids(s) for s in first}
    sent = {ids(s): s for s in first}
    assert all(dict(s.attributes or {}) == dict(sent[ids(s)].attributes or {}) for s in out.spans())
    text = worker.prometheus.render()
    assert f'{semconv.METRIC_WORKER_SPANS_RELEASED.replace(".", "_")}_total{{reason="evicted_spans"}} 3' in text
    # the evicted trace's answer, when it comes, is still judged: it carries what the judge needs
    late = [s for s in full if s.name == semconv.SPAN_STREAM]
    worker.ingest(request(late))
    worker.service.force_flush(10_000)
    assert [s.attributes[semconv.EVAL_STATUS] for s in out.answers()] == ["judged"]


class _StuckExport(SimpleSpanProcessor):
    """An export path whose flush hangs (the onward backend is down and the exporter keeps retrying)."""

    def __init__(self) -> None:
        super().__init__(InMemorySpanExporter())
        self.release = threading.Event()
        self.flush_returned = threading.Event()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        self.release.wait(60)
        self.flush_returned.set()
        return True


def test_shutdown_keeps_its_deadline_when_the_export_path_hangs() -> None:
    stuck = _StuckExport()
    worker = Worker(Settings(), HOLD, export=stuck, judge=KeywordJudge())
    worker.ingest(request(app_trace(answer=False)))
    try:
        summary = worker.shutdown(0.5)
        assert not stuck.flush_returned.is_set()  # it returned without waiting for the stuck flush
        assert summary["flushed_spans"] == 3
    finally:
        stuck.release.set()


class _Refusing(InMemorySpanExporter):
    """An onward backend that refuses every export."""

    def export(self, spans: Any) -> Any:
        from opentelemetry.sdk.trace.export import SpanExportResult

        return SpanExportResult.FAILURE


def test_spans_the_worker_cannot_deliver_onward_are_counted_on_its_metrics() -> None:
    worker = Worker(Settings(), WorkerOptions(http_endpoint=None, grpc_endpoint=None), exporter=_Refusing(),
                    judge=KeywordJudge())
    try:
        trace = app_trace(answer=False)
        worker.ingest(request(trace))  # handed on (and refused) before it returns
        text = worker.prometheus.render()
        assert f'streamjudge_export_failures_total{{exporter="_Refusing",reason="failure"}} {len(trace)}' in text, text
    finally:
        worker.shutdown(2.0)
