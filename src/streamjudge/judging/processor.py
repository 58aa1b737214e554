"""The judge span processor: the export side of judging. Spans are only the vehicle of results.

The judging service tells the processor which span will carry a judgement (:meth:`expect`) before that span
ends, and hands it the result (:meth:`resolve`) when the judge is done; whichever of the span's end and the
result comes second sends the span on. When the processor owns the export path (``downstream`` given) a
judged span is held until its result arrives and forwarded once, enriched — scores as attributes and
``gen_ai.evaluation.result`` events. Beside an application's own exporters the span has already gone out
unchanged, and results leave as an EVALUATOR span linked to (and parented by) the target, plus a log event in
the target's context. Every other span passes straight through.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from opentelemetry import metrics, trace
from opentelemetry._logs import Logger, LoggerProvider, get_logger
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Link, SpanContext, TraceFlags
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv
from streamjudge._deadline import pool_budget_millis
from streamjudge._fork import after_fork_in_child
from streamjudge._spans import copy_span
from streamjudge.exporters._content import scrub_explanation
from streamjudge.exporters.base import EvaluationRecord, EvaluationSink
from streamjudge.results import JobOutcome, JudgeRequest, Score, SentenceScore

_log = logging.getLogger(__name__)

_KIND_SPAN_TYPE = {
    "checkpoint": semconv.SPAN_TYPE_CHECKPOINT,
    "answer": semconv.SPAN_TYPE_STREAM,
    "preflight": semconv.SPAN_TYPE_STREAM,
}


class _Drainable(Protocol):
    """The judging service, as the SDK's flush and shutdown reach it through this processor."""

    def force_flush(self, timeout_millis: int = 30_000) -> bool: ...

    def shutdown(self, timeout_millis: int = 30_000) -> bool: ...


@dataclass(slots=True)
class _Slot:
    """A span expected to carry a judgement: whichever of span and result arrives first waits here."""

    span: ReadableSpan | None = None
    extra: dict[str, AttributeValue] | None = None
    events: list[Event] | None = None
    expected_at: float = 0.0


class JudgeSpanProcessor(SpanProcessor):
    """Holds judged spans until their results arrive and exports them once, enriched."""

    def __init__(
        self,
        *,
        downstream: SpanProcessor | None = None,
        sinks: Sequence[EvaluationSink] = (),
        tracer_provider: trace.TracerProvider | None = None,
        logger_provider: LoggerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
        capture_content: bool = True,
        shutdown_timeout_millis: int = 7_000,
        hold_timeout_s: float = 60.0,
    ) -> None:
        self._hold_timeout = hold_timeout_s
        self._downstream = downstream
        self._judging: _Drainable | None = None
        self._shutdown_timeout = shutdown_timeout_millis
        self._sinks = tuple(sinks)
        self._capture = capture_content
        self._slots: dict[int, _Slot] = {}  # in order of expect(): the oldest first
        self._sweeper: threading.Thread | None = None
        self._stop_sweeping = threading.Event()
        self._lock = threading.Lock()
        self._closed = False
        after_fork_in_child(self, JudgeSpanProcessor._after_fork)
        self._tracer_provider = tracer_provider
        self._tracer: trace.Tracer | None = None
        self._logger: Logger = get_logger(semconv.TRACER_NAME, logger_provider=logger_provider)
        meter = metrics.get_meter(semconv.METER_NAME, meter_provider=meter_provider)
        self._m_score = meter.create_histogram(
            semconv.METRIC_SCORE, unit="1", description="Evaluation scores by evaluation name"
        )
        self._m_alerts = meter.create_counter(semconv.METRIC_ALERTS, description="Failed evaluations")

    def _after_fork(self) -> None:
        # spans held in the parent are exported by the parent; the child starts clean
        self._lock = threading.Lock()
        self._slots = {}
        self._sweeper = None
        self._stop_sweeping = threading.Event()

    @property
    def owns_export(self) -> bool:
        """True when judged spans reach the exporter only through this processor (enriched)."""
        return self._downstream is not None

    @property
    def downstream(self) -> SpanProcessor | None:
        """The export path this processor owns (None beside an application's own exporters)."""
        return self._downstream

    def set_downstream(self, downstream: SpanProcessor | None) -> None:
        """Own ``downstream`` from now on (the distro moves the configured exporters behind us)."""
        self._downstream = downstream

    def set_judging(self, judging: _Drainable) -> None:
        """The judging service whose verdicts this processor exports: flushed and drained before the
        export path (the SDK's ``force_flush`` / ``shutdown`` reach judging only through here)."""
        self._judging = judging

    def set_shutdown_timeout(self, timeout_millis: int) -> None:
        """How long :meth:`shutdown` lets queued judgements finish before the rest goes out marked."""
        self._shutdown_timeout = timeout_millis

    def set_tracer_provider(self, provider: trace.TracerProvider) -> None:
        """The provider used for EVALUATOR spans in non-owning mode."""
        self._tracer_provider = provider
        self._tracer = None

    @property
    def sinks(self) -> tuple[EvaluationSink, ...]:
        """Where evaluation records go besides the spans."""
        return self._sinks

    def add_sink(self, sink: EvaluationSink) -> None:
        """Send evaluation records to ``sink`` as well, from the next judgement on."""
        self._sinks = (*self._sinks, sink)  # one assignment: the pool thread sees the old or the new tuple

    @property
    def held(self) -> int:
        """Spans (or results) waiting for their counterpart."""
        return len(self._slots)

    # --- the judging service's side ------------------------------------------------------------------

    def expect(self, span_id: int) -> None:
        """``span_id`` will carry a judgement: hold it at its end until :meth:`resolve` (owning mode)."""
        if self._downstream is None or not span_id:
            return
        now = time.monotonic()
        with self._lock:
            self._slots[span_id] = _Slot(expected_at=now)
            first = next(iter(self._slots.values()))
            if self._sweeper is None or not self._sweeper.is_alive():
                self._start_sweeper()
        if now - first.expected_at > self._hold_timeout:
            self._expire(now)

    def _start_sweeper(self) -> None:
        # called with the lock held. A judge that blocks its thread stops the pool, so the hold timeout
        # needs a clock of its own: a daemon thread that wakes once per quarter timeout while spans wait,
        # and ends when none does
        self._sweeper = threading.Thread(target=self._sweep, name="streamjudge-hold-timeout", daemon=True)
        self._sweeper.start()

    def _sweep(self) -> None:
        period = max(0.01, min(self._hold_timeout / 4, 1.0))
        # woken by close(): a sweeper asleep for its period kept the processor (and the runtime around it)
        # alive for up to a second after shutdown
        while not self._stop_sweeping.wait(period):
            with self._lock:
                if not self._slots:
                    self._sweeper = None
                    return
            self._expire(time.monotonic())

    def _expire(self, now: float) -> None:
        """Export spans whose result is overdue (a judge that blocks its thread or ignores cancellation):
        ``hold_timeout_s`` bounds how long any span waits, whatever the judge does."""
        overdue: list[ReadableSpan] = []
        with self._lock:
            while self._slots:
                span_id, slot = next(iter(self._slots.items()))
                if now - slot.expected_at <= self._hold_timeout:
                    break
                del self._slots[span_id]  # a result arriving later finds no slot and is dropped
                if slot.span is not None:
                    overdue.append(slot.span)
        marks: dict[str, AttributeValue] = {
            semconv.EVAL_STATUS: "timeout",
            semconv.EVAL_SKIP_REASON: "timeout: held past hold_timeout_s",
        }
        for span in overdue:
            self._export(span, marks, [])

    def resolve(self, request: JudgeRequest, outcome: JobOutcome, scores: tuple[Score, ...]) -> None:
        """Record the result of ``request``: enrich (or annotate) its span, metrics, sinks.

        ``scores`` are already labelled with the request's thresholds. Called once per request, on the
        judge pool's thread.
        """
        extra, events = self._result_telemetry(request, outcome, scores)
        span_id = request.target_span_id
        if self._downstream is not None:
            if span_id:
                self._deliver(span_id, extra, events)
        elif span_id:
            self._emit_evaluator(request, extra, events)
        if scores:
            self._record(request, outcome, scores)

    def _deliver(self, span_id: int, extra: dict[str, AttributeValue], events: list[Event]) -> None:
        with self._lock:
            slot = self._slots.get(span_id)
            if slot is None:
                return  # never expected (or already released at shutdown)
            span = slot.span
            if span is None:  # the result came first: the span picks it up at its end
                slot.extra, slot.events = extra, events
                return
            del self._slots[span_id]
        self._export(span, extra, events)

    # --- SpanProcessor -------------------------------------------------------------------------------

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._downstream is not None:
            self._downstream.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        downstream = self._downstream
        if downstream is None:
            return
        ctx = span.context
        slot = self._slots.get(ctx.span_id) if ctx is not None and self._slots else None
        if slot is None:
            downstream.on_end(span)
            return
        with self._lock:
            slot = self._slots.get(ctx.span_id)  # type: ignore[union-attr]
            if slot is not None and slot.extra is None:
                slot.span = span  # held until its result arrives
                return
            if slot is not None:
                del self._slots[ctx.span_id]  # type: ignore[union-attr]
        if slot is None:
            downstream.on_end(span)
        else:
            self._export(span, slot.extra or {}, slot.events or [])

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        if self._slots:
            self._expire(time.monotonic())
        deadline = time.monotonic() + timeout_millis / 1000
        ok = self._judging.force_flush(timeout_millis) if self._judging is not None else True
        left = max(1, int((deadline - time.monotonic()) * 1000))
        ok = self.flush_sinks(left) and ok
        if self._downstream is not None:
            left = max(1, int((deadline - time.monotonic()) * 1000))
            ok = self._downstream.force_flush(left) and ok
        return ok

    def flush_sinks(self, timeout_millis: int) -> bool:
        """Deliver what the sinks have queued within ``timeout_millis``."""
        deadline = time.monotonic() + timeout_millis / 1000
        ok = True
        for sink in self._sinks:
            left = max(1, int((deadline - time.monotonic()) * 1000))
            ok = sink.force_flush(left) and ok
        return ok

    def release_held(self, status: str = "shutdown") -> int:
        """Export every span still waiting for a result, marked with ``status``. Returns how many."""
        with self._lock:
            slots = list(self._slots.values())
            self._slots.clear()
        n = 0
        for slot in slots:
            if slot.span is not None:
                self._export(slot.span, {semconv.EVAL_STATUS: status, semconv.EVAL_SKIP_REASON: status}, [])
                n += 1
        return n

    def shutdown(self) -> None:
        self.close(close_downstream=True)

    def close(self, *, close_downstream: bool) -> None:
        """Drain judging within the shutdown timeout, export what is held (marked ``shutdown`` when its
        result did not come), close the sinks, and the export path too unless another processor takes it
        over (a second ``configure()`` on the same provider)."""
        if self._closed:
            return
        self._closed = True
        self._stop_sweeping.set()
        sweeper = self._sweeper
        if sweeper is not None and sweeper is not threading.current_thread():
            sweeper.join(1.0)  # it wakes at once; what it would have expired, release_held exports below
        if self._judging is not None:
            try:
                # within a process-wide shutdown deadline, the pool gets most of what is left, not all
                self._judging.shutdown(pool_budget_millis(self._shutdown_timeout))
            except Exception:
                _log.exception("streamjudge: draining the judge pool failed")
        self.release_held("shutdown")
        for sink in self._sinks:
            try:
                sink.shutdown()
            except Exception:
                _log.exception("streamjudge: sink shutdown failed")
        if self._downstream is not None and close_downstream:
            self._downstream.shutdown()
        elif self._downstream is not None:
            self._downstream.force_flush(max(1, self._shutdown_timeout))

    # --- telemetry -----------------------------------------------------------------------------------

    def _export(
        self, span: ReadableSpan, extra: Mapping[str, AttributeValue], events: Sequence[Event]
    ) -> None:
        assert self._downstream is not None
        try:
            self._downstream.on_end(_enriched(span, extra, events))
        except Exception:
            _log.exception("streamjudge: exporting judged span %s failed", span.name)

    def _result_telemetry(
        self, request: JudgeRequest, outcome: JobOutcome, scores: tuple[Score, ...]
    ) -> tuple[dict[str, AttributeValue], list[Event]]:
        extra: dict[str, AttributeValue] = {semconv.EVAL_STATUS: outcome.status}
        events: list[Event] = []
        now = time.time_ns()
        if outcome.status != "judged":
            extra[semconv.EVAL_SKIP_REASON] = (
                f"{outcome.status}: {outcome.error}" if outcome.error else outcome.status
            )
        if outcome.attempts:
            extra[semconv.EVAL_ATTEMPTS] = outcome.attempts
        extra[semconv.EVAL_LATENCY_MS] = round(outcome.latency_s * 1000, 3)
        result = outcome.result
        if result is None:
            # a failed evaluation still says so in the evaluation vocabulary, one event per metric asked
            if outcome.status not in ("skipped", "sampled_out", "superseded"):
                for metric in request.metrics:
                    events.append(Event(semconv.EVENT_EVALUATION_RESULT, {
                        semconv.GEN_AI_EVALUATION_NAME: metric,
                        semconv.ERROR_TYPE: outcome.status,
                    }, now))
            return extra, events
        extra[semconv.EVAL_JUDGE] = result.judge
        usage = result.usage
        if usage.calls:
            extra[semconv.EVAL_CALLS] = usage.calls
            extra[semconv.EVAL_INPUT_TOKENS] = usage.input_tokens
            extra[semconv.EVAL_OUTPUT_TOKENS] = usage.output_tokens
            extra[semconv.EVAL_COST_USD] = usage.cost_usd
        passed = True
        for s in scores:
            ev: dict[str, AttributeValue] = {semconv.GEN_AI_EVALUATION_NAME: s.name}
            if s.value is not None:
                extra[semconv.score_attribute(s.name)] = s.value
                ev[semconv.GEN_AI_EVALUATION_SCORE_VALUE] = s.value
            if s.label is not None:
                extra[semconv.label_attribute(s.name)] = s.label
                ev[semconv.GEN_AI_EVALUATION_SCORE_LABEL] = s.label
                passed = passed and s.label == "pass"
            if s.sentences:
                failing = [x for x in s.sentences if x.label == "fail"]
                worst = s.worst
                assert worst is not None
                extra[semconv.sentences_attribute(s.name, "worst")] = worst.value
                extra[semconv.sentences_attribute(s.name, "failed")] = len(failing)
                extra[semconv.sentences_attribute(s.name, "judged")] = len(s.sentences)
                if failing:
                    # flat int arrays (OTLP attributes cannot nest): [start0, end0, start1, end1, ...]
                    ranges = [v for x in failing for v in (x.start, x.end)]
                    ev[semconv.EVAL_SENTENCE_RANGES] = ranges
                    extra[semconv.sentences_attribute(s.name, "ranges")] = ranges
                if any(x.verdict is not None for x in s.sentences):
                    _add_verdicts(s.sentences, ev, extra, s.name)
            if s.skipped:
                ev[semconv.EVAL_SKIP_REASON] = s.skipped
            # without content capture an explanation keeps its structure, not the quoted answer text
            explanation = scrub_explanation(s.explanation, self._capture) or (
                f"skipped: {s.skipped}" if s.skipped else "")
            if explanation:
                ev[semconv.GEN_AI_EVALUATION_EXPLANATION] = explanation
            events.append(Event(semconv.EVENT_EVALUATION_RESULT, ev, now))
        extra[semconv.EVAL_PASSED] = passed
        return extra, events

    def _record(self, request: JudgeRequest, outcome: JobOutcome, scores: tuple[Score, ...]) -> None:
        kind = request.kind
        for s in scores:
            if s.value is None:
                continue
            # the span type as on the spans (the collector's metrics use it too); what was judged beside it
            labels = {semconv.METRIC_ATTR_EVALUATION: s.name, semconv.SPAN_TYPE: _KIND_SPAN_TYPE[kind],
                      semconv.EVAL_KIND: kind}
            self._m_score.record(s.value, labels)
            if s.label == "fail":
                self._m_alerts.add(1, labels)
        if not self._sinks or outcome.result is None or not request.target_span_id:
            return
        record = EvaluationRecord(
            trace_id=request.target_trace_id,
            span_id=request.target_span_id,
            span_name=request.target_name,
            span_type=_KIND_SPAN_TYPE[kind],
            judge=outcome.result.judge,
            scores=scores,
            timestamp_ns=time.time_ns(),
            usage=outcome.result.usage,
            attributes=dict(request.attributes),
        )
        for sink in self._sinks:
            try:
                sink.emit(record)
            except Exception:  # sinks must not raise; if one does, the others still get the record
                _log.exception("streamjudge: evaluation sink %r failed", sink)

    def _emit_evaluator(
        self, request: JudgeRequest, extra: Mapping[str, AttributeValue], events: Sequence[Event]
    ) -> None:
        ctx = SpanContext(request.target_trace_id, request.target_span_id, is_remote=False,
                          trace_flags=TraceFlags(TraceFlags.SAMPLED))
        if self._tracer is None:
            provider = self._tracer_provider or trace.get_tracer_provider()
            self._tracer = provider.get_tracer(semconv.TRACER_NAME)
        parent = trace.set_span_in_context(trace.NonRecordingSpan(ctx))
        attributes: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_EVALUATOR,
            semconv.OPENINFERENCE_SPAN_KIND: semconv.OPENINFERENCE_KIND_EVALUATOR,
            semconv.GEN_AI_OPERATION_NAME: "evaluate",
            semconv.EVAL_TARGET_TRACE_ID: format(ctx.trace_id, "032x"),
            semconv.EVAL_TARGET_SPAN_ID: format(ctx.span_id, "016x"),
            **extra,
        }
        span = self._tracer.start_span(
            semconv.SPAN_EVALUATOR, context=parent, links=[Link(ctx)], attributes=attributes
        )
        for ev in events:
            span.add_event(ev.name, ev.attributes, ev.timestamp)
        span.end()
        for ev in events:
            try:
                self._logger.emit(
                    event_name=semconv.EVENT_EVALUATION_RESULT, context=parent, attributes=ev.attributes
                )
            except Exception:
                _log.debug("streamjudge: log event emit failed", exc_info=True)


def _enriched(
    span: ReadableSpan, extra: Mapping[str, AttributeValue], events: Sequence[Event]
) -> ReadableSpan:
    """A copy of an ended span with attributes added and events appended (an ended span is immutable)."""
    attributes = dict(span.attributes or {})
    attributes.update(extra)
    return copy_span(span, attributes, events)


def _add_verdicts(sentences: Sequence[SentenceScore], ev: dict[str, AttributeValue],
                  extra: dict[str, AttributeValue], metric: str) -> None:
    """A three-way judge's verdicts: per sentence on the event, and the uncertain ones on the span (they do
    not alert by default, so the failed ranges alone would hide them)."""
    ev[semconv.EVAL_SENTENCE_VERDICTS] = [x.verdict or "" for x in sentences]
    ev[semconv.EVAL_SENTENCE_TIERS] = [x.tier or "" for x in sentences]
    ev[semconv.EVAL_SENTENCE_KINDS] = [x.kind or "" for x in sentences]
    ev[semconv.EVAL_SENTENCE_BOUNDS] = [v for x in sentences for v in (x.start, x.end)]
    uncertain = [x for x in sentences if x.verdict == "uncertain"]
    extra[semconv.sentences_attribute(metric, "uncertain")] = len(uncertain)
    if uncertain:
        extra[semconv.sentences_attribute(metric, "uncertain_ranges")] = [
            v for x in uncertain for v in (x.start, x.end)]
