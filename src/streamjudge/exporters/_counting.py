"""Span exporters that count what they fail to deliver, and give up at the shutdown deadline.

When a backend is down or restarting, the SDK's exporters log a line and drop the batch: nothing a
dashboard or an alert can see. :class:`CountingSpanExporter` wraps the exporters streamjudge creates or
takes over (Langfuse, Phoenix, the OTLP exporter from ``OTEL_*``) and adds the spans of every failed
export to the ``streamjudge.export.failures`` counter, by exporter and reason:

- ``failure``: the exporter returned ``FAILURE`` (HTTP error, retries exhausted, connection refused);
- ``exception``: it raised (the exception still propagates, as the batch processor expects);
- ``deadline``: a shutdown deadline (:mod:`streamjudge._deadline`) passed while it was still sending;
- ``queue_full``: the SDK's batch processor in front of it dropped the span (its queue was full: the
  exporter was still busy with a backend that is down or slow); ``already_shutdown``: the span ended after
  that processor's shutdown; ``shutdown``: it was still queued when the processor's shutdown gave up.

While a shutdown deadline is open, an export runs on a helper thread and is waited for no longer than the
deadline: one unresponsive backend cannot hold the process past it.
"""

from __future__ import annotations

import contextvars
import inspect
import logging
import threading
from collections.abc import Sequence

from opentelemetry import metrics
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from streamjudge import _sdk, semconv
from streamjudge._deadline import Deadline, bounded_millis, current_deadline

_log = logging.getLogger(__name__)

REASON_FAILURE = "failure"
REASON_EXCEPTION = "exception"
REASON_DEADLINE = "deadline"


def exporter_name(exporter: SpanExporter) -> str:
    """A short label for ``exporter``: ``otlp_http``, ``otlp_grpc``, ``console`` or its class name."""
    cls = type(exporter)
    if cls.__name__ == "OTLPSpanExporter":
        return "otlp_grpc" if ".grpc" in cls.__module__ else "otlp_http"
    if cls.__name__ == "ConsoleSpanExporter":
        return "console"
    return cls.__name__


class CountingSpanExporter(SpanExporter):
    """Wraps ``exporter``; counts the spans of failed exports in ``streamjudge.export.failures``."""

    def __init__(
        self,
        exporter: SpanExporter,
        name: str | None = None,
        *,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self.exporter = exporter
        self.name = name or exporter_name(exporter)
        self._meter_provider = meter_provider
        self._counter: metrics.Counter | None = None
        self._lock = threading.Lock()
        self.failed: dict[str, int] = {}  # spans lost by reason, since creation

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        """Export through the wrapped exporter; a failure is counted, then returned (or raised) as is."""
        deadline = current_deadline()
        if deadline is not None:
            return self._export_by(spans, deadline)
        try:
            result = self.exporter.export(spans)
        except Exception:
            self._count(len(spans), REASON_EXCEPTION)
            raise
        if result != SpanExportResult.SUCCESS:
            self._count(len(spans), REASON_FAILURE)
        return result

    def _export_by(self, spans: Sequence[ReadableSpan], deadline: Deadline) -> SpanExportResult:
        if deadline.expired:
            self._count(len(spans), REASON_DEADLINE)
            return SpanExportResult.FAILURE
        outcome: list[SpanExportResult | BaseException] = []
        done = threading.Event()
        ctx = contextvars.copy_context()  # keeps the batch processor's "suppress instrumentation" flag

        def run() -> None:
            try:
                outcome.append(ctx.run(self.exporter.export, spans))
            except BaseException as exc:  # handed back to the waiting thread
                outcome.append(exc)
            finally:
                done.set()

        threading.Thread(target=run, name=f"streamjudge-export-{self.name}", daemon=True).start()
        if not done.wait(deadline.remaining()):
            self._count(len(spans), REASON_DEADLINE)
            _log.warning(
                "streamjudge: %s export of %d span(s) cut short by the shutdown deadline",
                self.name,
                len(spans),
            )
            return SpanExportResult.FAILURE
        result = outcome[0]
        if isinstance(result, BaseException):
            self._count(len(spans), REASON_EXCEPTION)
            raise result
        if result != SpanExportResult.SUCCESS:
            self._count(len(spans), REASON_FAILURE)
        return result

    def count_lost(self, n: int, reason: str) -> None:
        """Count ``n`` spans lost on the way to this exporter (its batch processor dropped them)."""
        if n > 0:
            self._count(n, reason)

    def _count(self, n: int, reason: str) -> None:
        with self._lock:
            self.failed[reason] = self.failed.get(reason, 0) + n
        try:
            if self._counter is None:
                meter = metrics.get_meter(semconv.METER_NAME, meter_provider=self._meter_provider)
                self._counter = meter.create_counter(
                    semconv.METRIC_EXPORT_FAILURES,
                    unit="{span}",
                    description="Spans an exporter could not deliver (backend down, refusing, or too slow)",
                )
            attrs = {semconv.METRIC_ATTR_EXPORTER: self.name, semconv.METRIC_ATTR_REASON: reason}
            self._counter.add(n, attrs)
        except Exception:
            _log.debug("streamjudge: could not record the export failure metric", exc_info=True)

    def shutdown(self, timeout_millis: float | None = None) -> None:  # type: ignore[override]
        """Shut the wrapped exporter down (with what is left of the deadline, when it takes a timeout)."""
        shutdown = self.exporter.shutdown
        try:
            takes_timeout = "timeout_millis" in inspect.signature(shutdown).parameters
        except (TypeError, ValueError):
            takes_timeout = False
        if takes_timeout:
            bounded = bounded_millis(timeout_millis)
            shutdown(**({} if bounded is None else {"timeout_millis": bounded}))  # type: ignore[call-arg]
        else:
            shutdown()

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Flush the wrapped exporter, within the shutdown deadline when one is open."""
        return self.exporter.force_flush(bounded_millis(timeout_millis) or 0)

    def __repr__(self) -> str:
        return f"<CountingSpanExporter {self.name} wrapping {type(self.exporter).__name__}>"


def counting(exporter: SpanExporter, name: str | None = None) -> CountingSpanExporter:
    """``exporter`` wrapped in a :class:`CountingSpanExporter` (returned as is when it already is one)."""
    if isinstance(exporter, CountingSpanExporter):
        return exporter
    return CountingSpanExporter(exporter, name)


def count_export_failures(root: object) -> int:
    """Wrap the exporters of the batch/simple span processors reachable from ``root`` (a provider, its
    active processor, a composite, or the judge processor's export path) in :class:`CountingSpanExporter`,
    and count what a batch processor drops before its exporter sees it (queue full, shutdown) in the same
    metric; returns how many exporters were wrapped. For the exporters the SDK built from ``OTEL_*``
    variables, which streamjudge takes over but does not create. Idempotent.
    """
    wrapped = 0
    seen: set[int] = set()
    todo = [_sdk.active_processor(root) or root]
    while todo:
        p = todo.pop()
        if p is None or id(p) in seen:
            continue
        seen.add(id(p))
        exporter = _sdk.processor_exporter(p)
        if exporter is not None:
            counted = _counter_of(exporter)
            if counted is None:
                counted = CountingSpanExporter(exporter)
                _sdk.set_processor_exporter(p, counted)  # type: ignore[arg-type]
                wrapped += 1
            if isinstance(p, BatchSpanProcessor):
                _sdk.report_batch_losses(p, counted.count_lost)
        todo.extend(_sdk.child_processors(p))
        todo.append(getattr(p, "downstream", None))  # the judge processor's export path
    return wrapped


def _counter_of(exporter: SpanExporter) -> CountingSpanExporter | None:
    # the Langfuse mapping exporter wraps a counting one
    if isinstance(exporter, CountingSpanExporter):
        return exporter
    inner = getattr(exporter, "counting", None)
    return inner if isinstance(inner, CountingSpanExporter) else None
