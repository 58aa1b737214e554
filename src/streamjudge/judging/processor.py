"""The judge span processor: the only bridge between spans and judges.

On ``on_end`` of a checkpoint or stream (answer) span it hands (question, contexts, running text) to the judge
pool; every other span passes straight through. When it owns the export path (``downstream`` given) it holds
a judged span until its scores arrive and forwards an enriched copy — scores as attributes and
``gen_ai.evaluation.result`` events — so each span is exported exactly once. Otherwise the span has already
gone out through the application's own processors, and results leave as an EVALUATOR span linked to (and
parented by) the target, plus a log event in the target's context.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Protocol

from opentelemetry import metrics, trace
from opentelemetry._logs import Logger, LoggerProvider, get_logger
from opentelemetry.context import Context
from opentelemetry.sdk.trace import Event, ReadableSpan, Span, SpanProcessor
from opentelemetry.trace import Link, SpanContext
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv
from streamjudge._context import ContextStore
from streamjudge._fork import after_fork_in_child
from streamjudge._spans import copy_span
from streamjudge.config import Settings
from streamjudge.exporters.base import EvaluationRecord, EvaluationSink
from streamjudge.judging.base import EvalInput, EvalKind, Judge, Score
from streamjudge.judging.pool import JobOutcome, JudgeJob, JudgePool

_log = logging.getLogger(__name__)


class StreamListener(Protocol):
    """What the processor needs from a live stream (implemented by the guard's session)."""

    question: str | None
    contexts: tuple[str, ...] | None
    reference: str | None
    hold_back: bool

    def text_until(self, end: int) -> str:
        """The running total text up to char ``end``."""
        ...

    def post(self, kind: EvalKind, index: int, outcome: JobOutcome, scores: tuple[Score, ...]) -> None:
        """Deliver a verdict (called on the pool's thread)."""
        ...


class StreamRegistry:
    """Live streams by stream-span id, so verdicts reach the stream they belong to."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._streams: dict[int, StreamListener] = {}
        after_fork_in_child(self, StreamRegistry._after_fork)

    def _after_fork(self) -> None:
        # the parent's streams are not this process's; a lock held at fork time would never be released
        self._lock = threading.Lock()
        self._streams = {}

    def add(self, span_id: int, listener: StreamListener) -> None:
        with self._lock:
            self._streams[span_id] = listener

    def get(self, span_id: int) -> StreamListener | None:
        return self._streams.get(span_id)

    def remove(self, span_id: int) -> None:
        with self._lock:
            self._streams.pop(span_id, None)

    def __len__(self) -> int:
        return len(self._streams)


class JudgeSpanProcessor(SpanProcessor):
    """Routes finished checkpoint and stream spans through the judge pool; passes the rest through."""

    def __init__(
        self,
        *,
        settings: Settings,
        pool: JudgePool,
        judges: Callable[[EvalKind], Judge],
        contexts: ContextStore,
        streams: StreamRegistry,
        downstream: SpanProcessor | None = None,
        sinks: Sequence[EvaluationSink] = (),
        tracer_provider: trace.TracerProvider | None = None,
        logger_provider: LoggerProvider | None = None,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._settings = settings
        self._pool = pool
        self._judges = judges
        self._contexts = contexts
        self._streams = streams
        self._downstream = downstream
        self._sinks = tuple(sinks)
        self._held: dict[int, ReadableSpan] = {}
        self._held_lock = threading.Lock()
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
        self._held_lock = threading.Lock()
        self._held = {}

    @property
    def owns_export(self) -> bool:
        """True when judged spans reach the exporter only through this processor (enriched)."""
        return self._downstream is not None

    def set_tracer_provider(self, provider: trace.TracerProvider) -> None:
        """The provider used for EVALUATOR spans in non-owning mode."""
        self._tracer_provider = provider
        self._tracer = None

    # --- SpanProcessor -----------------------------------------------------------------------------

    @property
    def sinks(self) -> tuple[EvaluationSink, ...]:
        """Where evaluation records go besides the spans."""
        return self._sinks

    def add_sink(self, sink: EvaluationSink) -> None:
        """Send evaluation records to ``sink`` as well, from the next judgement on."""
        self._sinks = (*self._sinks, sink)  # one assignment: the pool thread sees the old or the new tuple

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        if self._downstream is not None:
            self._downstream.on_start(span, parent_context=parent_context)

    def on_end(self, span: ReadableSpan) -> None:
        attrs = span.attributes or {}
        span_type = attrs.get(semconv.SPAN_TYPE)
        if span_type == semconv.SPAN_TYPE_CHECKPOINT:
            kind: EvalKind = "checkpoint"
        elif span_type == semconv.SPAN_TYPE_STREAM and self._settings.final_reconcile:
            kind = "answer"
        else:
            self._forward(span)
            return
        try:
            self._submit(span, kind, attrs)
        except Exception:  # a span is never lost, whatever goes wrong on the way to the judge
            _log.exception("streamjudge: could not submit span %s for judging", span.name)
            self._forward(span, status="error", reason="submit_failed")

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        deadline = time.monotonic() + timeout_millis / 1000
        ok = self._pool.force_flush(timeout_millis)
        left = max(0, int((deadline - time.monotonic()) * 1000))
        for sink in self._sinks:
            ok = sink.force_flush(left) and ok
        if self._downstream is not None:
            ok = self._downstream.force_flush(max(left, 1)) and ok
        return ok

    def shutdown(self) -> None:
        # every held span gets its outcome (judged or "shutdown") before the exporter closes
        self._pool.shutdown(int(self._settings.end_wait_s * 1000) + 5_000)
        with self._held_lock:
            leftover = list(self._held.values())
            self._held.clear()
        for span in leftover:
            self._forward(span, status="shutdown", reason="shutdown")
        for sink in self._sinks:
            try:
                sink.shutdown()
            except Exception:
                _log.exception("streamjudge: sink shutdown failed")
        if self._downstream is not None:
            self._downstream.shutdown()

    # --- judging -----------------------------------------------------------------------------------

    def _submit(self, span: ReadableSpan, kind: EvalKind, attrs: Mapping[str, AttributeValue]) -> None:
        ctx = span.context
        assert ctx is not None
        stream_key = ctx.span_id if kind == "answer" else (span.parent.span_id if span.parent else 0)
        listener = self._streams.get(stream_key)
        skip = attrs.get(semconv.EVAL_SKIP_REASON)
        if isinstance(skip, str) and skip:
            # the guard decided not to judge it (pre-flight policy, disconnect...): say so and export
            self._forward(span, status="skipped", reason=skip)
            self._notify(listener, kind, attrs, JobOutcome("cancelled", error=skip), ())
            return
        stored = self._contexts.get(ctx.trace_id)
        question = (listener.question if listener else None) or (stored.question if stored else None)
        contexts = (listener.contexts if listener else None) or (stored.contexts if stored else None)
        reference = (listener.reference if listener else None) or (stored.reference if stored else None)
        text = self._text_of(span, kind, attrs, listener)
        if text is None:
            self._forward(span, status="error", reason="no_text")
            self._notify(listener, kind, attrs, JobOutcome("error", error="no_text"), ())
            return
        metrics_ = self._settings.checkpoint_metrics if kind == "checkpoint" else self._settings.final_metrics
        item = EvalInput(
            question=question or "",
            contexts=tuple(contexts or ()),
            answer=text,
            kind=kind,
            reference=reference,
        )
        if self._downstream is not None:
            with self._held_lock:
                self._held[ctx.span_id] = span

        def done(outcome: JobOutcome) -> None:
            self._on_outcome(span, kind, attrs, outcome)

        self._pool.submit(
            JudgeJob(
                judge=self._judges(kind),
                item=item,
                metrics=tuple(metrics_),
                callback=done,
                stream_key=stream_key,
                sample_key=ctx.trace_id,
                # hold-back releases a window only on its own verdict: no coalescing there
                coalesce=kind == "checkpoint" and not (listener is not None and listener.hold_back),
            )
        )

    @staticmethod
    def _text_of(
        span: ReadableSpan,
        kind: EvalKind,
        attrs: Mapping[str, AttributeValue],
        listener: StreamListener | None,
    ) -> str | None:
        if kind == "checkpoint":
            end = attrs.get(semconv.CHECKPOINT_CHAR_END)
            if listener is not None and isinstance(end, int):
                return listener.text_until(end)
            text = attrs.get(semconv.CHECKPOINT_TEXT)
        else:
            if listener is not None:
                return listener.text_until(-1)
            text = attrs.get(semconv.STREAM_ANSWER)
        return text if isinstance(text, str) else None

    def _on_outcome(
        self, span: ReadableSpan, kind: EvalKind, attrs: Mapping[str, AttributeValue], outcome: JobOutcome
    ) -> None:
        ctx = span.context
        assert ctx is not None
        scores: tuple[Score, ...] = ()
        if outcome.result is not None:
            scores = tuple(s.with_label(self._settings.threshold_for(s.name)) for s in outcome.result.scores)
        extra, events = self._result_telemetry(outcome, scores)
        if self._downstream is not None:
            with self._held_lock:
                held = self._held.pop(ctx.span_id, None)
            if held is not None:
                self._downstream.on_end(_enriched(held, extra, events))
        else:
            self._emit_evaluator(span, extra, events)
        if scores:
            self._record(span, kind, attrs, outcome, scores)
        stream_key = ctx.span_id if kind == "answer" else (span.parent.span_id if span.parent else 0)
        self._notify(self._streams.get(stream_key), kind, attrs, outcome, scores)

    def _notify(
        self,
        listener: StreamListener | None,
        kind: EvalKind,
        attrs: Mapping[str, AttributeValue],
        outcome: JobOutcome,
        scores: tuple[Score, ...],
    ) -> None:
        if listener is None:
            return
        index = attrs.get(semconv.CHECKPOINT_INDEX, -1)
        try:
            listener.post(kind, index if isinstance(index, int) else -1, outcome, scores)
        except Exception:
            _log.exception("streamjudge: posting a verdict to its stream failed")

    def _result_telemetry(
        self, outcome: JobOutcome, scores: tuple[Score, ...]
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
            if s.skipped:
                ev[semconv.EVAL_SKIP_REASON] = s.skipped
            explanation = s.explanation or (f"skipped: {s.skipped}" if s.skipped else "")
            if explanation:
                ev[semconv.GEN_AI_EVALUATION_EXPLANATION] = explanation
            events.append(Event(semconv.EVENT_EVALUATION_RESULT, ev, now))
        extra[semconv.EVAL_PASSED] = passed
        return extra, events

    def _record(
        self,
        span: ReadableSpan,
        kind: EvalKind,
        attrs: Mapping[str, AttributeValue],
        outcome: JobOutcome,
        scores: tuple[Score, ...],
    ) -> None:
        ctx = span.context
        assert ctx is not None and outcome.result is not None
        for s in scores:
            if s.value is None:
                continue
            labels = {semconv.METRIC_ATTR_EVALUATION: s.name, semconv.SPAN_TYPE: kind}
            self._m_score.record(s.value, labels)
            if s.label == "fail":
                self._m_alerts.add(1, labels)
        if not self._sinks:
            return
        extra: dict[str, str | int | float | bool] = {}
        for key in (semconv.CHECKPOINT_INDEX, semconv.STREAM_ID, semconv.SESSION_ID):
            v = attrs.get(key)
            if isinstance(v, str | int | float | bool):
                extra[key] = v
        record = EvaluationRecord(
            trace_id=ctx.trace_id,
            span_id=ctx.span_id,
            span_name=span.name,
            span_type=semconv.SPAN_TYPE_CHECKPOINT if kind == "checkpoint" else semconv.SPAN_TYPE_STREAM,
            judge=outcome.result.judge,
            scores=scores,
            timestamp_ns=time.time_ns(),
            usage=outcome.result.usage,
            attributes=extra,
        )
        for sink in self._sinks:
            try:
                sink.emit(record)
            except Exception:  # sinks must not raise; if one does, the others still get the record
                _log.exception("streamjudge: evaluation sink %r failed", sink)

    # --- export ------------------------------------------------------------------------------------

    def _forward(self, span: ReadableSpan, *, status: str | None = None, reason: str | None = None) -> None:
        if self._downstream is None:
            return
        if status is None:
            self._downstream.on_end(span)
            return
        extra: dict[str, AttributeValue] = {semconv.EVAL_STATUS: status}
        if reason:
            extra[semconv.EVAL_SKIP_REASON] = reason
        self._downstream.on_end(_enriched(span, extra, []))

    def _emit_evaluator(
        self, target: ReadableSpan, extra: Mapping[str, AttributeValue], events: Sequence[Event]
    ) -> None:
        ctx = target.context
        assert ctx is not None
        if self._tracer is None:
            provider = self._tracer_provider or trace.get_tracer_provider()
            self._tracer = provider.get_tracer(semconv.TRACER_NAME)
        parent = trace.set_span_in_context(trace.NonRecordingSpan(_remote(ctx)))
        attributes: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_EVALUATOR,
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


def _remote(ctx: SpanContext) -> SpanContext:
    return SpanContext(ctx.trace_id, ctx.span_id, is_remote=False, trace_flags=ctx.trace_flags,
                       trace_state=ctx.trace_state)


def _enriched(
    span: ReadableSpan, extra: Mapping[str, AttributeValue], events: Sequence[Event]
) -> ReadableSpan:
    """A copy of an ended span with attributes added and events appended (an ended span is immutable)."""
    attributes = dict(span.attributes or {})
    attributes.update(extra)
    return copy_span(span, attributes, events)
