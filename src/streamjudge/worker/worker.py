"""``streamjudge worker``: the deferred final pass, behind the collector's ``load_balancing`` exporter.

The collector routes every span of a trace to one worker (routing key ``traceID``). The worker judges a
trace's deferred answer span — the app's stream span with ``streamjudge.eval.status`` = ``deferred``,
carrying question, contexts and answer — and exports it onward enriched exactly as in-process judging does:
the answer span goes through a :class:`~streamjudge.judging.processor.JudgeSpanProcessor` (held by id,
resolved by the :class:`~streamjudge.judging.service.JudgingService` and its
:class:`~streamjudge.judging.pool.JudgePool`) whose downstream is a ``BatchSpanProcessor`` with the OTLP
exporter the ``OTEL_EXPORTER_OTLP_*`` variables configure. Every other span leaves unchanged, at once:
it is handed to the export path before the request that brought it is acknowledged. With
``hold_traces`` the trace's other spans wait instead (:class:`~streamjudge.worker._buffer.TraceBuffer`)
and leave with the judged answer, for a tail sampler downstream that must see whole traces.

Exactly one outcome per answer: judged, or the pool's reason it was not (dropped, timeout, error,
sampled_out, shutdown...), or ``skipped`` with the reason the worker could not judge it. A span re-sent by a
collector retry is recognised by its ids and not exported twice.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from opentelemetry import metrics
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader, PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from streamjudge import _sdk, semconv
from streamjudge.config import Settings
from streamjudge.exporters._counting import CountingSpanExporter
from streamjudge.judging.base import EvalKind, Judge
from streamjudge.judging.judges import create_judge
from streamjudge.judging.pool import JudgePool
from streamjudge.judging.processor import JudgeSpanProcessor
from streamjudge.judging.service import JudgingService
from streamjudge.results import EvalInput, JudgeRequest
from streamjudge.worker._buffer import Release, TraceBuffer
from streamjudge.worker._convert import Received, spans
from streamjudge.worker._metrics import PrometheusText
from streamjudge.worker._receive import Limits

_log = logging.getLogger(__name__)

#: why a deferred answer span could not be judged here (its span says so, ``streamjudge.eval.status`` =
#: ``skipped``)
NO_CONTENT = "deferred_without_content"
TOO_LARGE = "answer_too_large"


@dataclass(frozen=True, slots=True)
class WorkerOptions:
    """How the worker listens and what it may hold. Judging itself follows :class:`Settings`."""

    http_endpoint: str | None = "127.0.0.1:4318"  # OTLP/HTTP (protobuf) on /v1/traces; None = off
    grpc_endpoint: str | None = "127.0.0.1:4317"  # OTLP/gRPC; None = off
    max_spans: int = 100_000  # spans held across traces before the oldest trace leaves as it is
    max_bytes: int = 256 * 1024 * 1024  # encoded bytes held, likewise
    decision_wait_s: float = 30.0  # longest a trace waits for its deferred answer span
    shutdown_timeout_s: float = 10.0  # SIGTERM: everything flushed or marked within this
    remember_spans: int = 200_000  # span ids remembered to recognise a retried export
    max_connections: int = 32  # per receiver: connections (HTTP) / concurrent calls (gRPC) served at once
    max_request_bytes: int = 32 * 1024 * 1024  # one export request, compressed and once inflated
    read_timeout_s: float = 10.0  # HTTP: each read of a connection (headers, body, keep-alive idle)
    request_timeout_s: float = 30.0  # HTTP: a whole request (line, headers, body) to arrive
    # exports must carry ``Authorization: Bearer <token>``; None = open. Kept out of the repr (logs).
    bearer_token: str | None = field(default=None, repr=False)
    tls_cert_file: str | None = None  # PEM certificate and key: the receivers speak TLS
    tls_key_file: str | None = None
    tls_client_ca_file: str | None = None  # clients must present a certificate this CA signed (mTLS)
    #: hold a trace's other spans until its answer is judged (a tail sampler downstream sees whole
    #: traces), instead of forwarding them before the export is acknowledged. Held spans are lost if the
    #: worker is killed (SIGKILL, out of memory) before they leave.
    hold_traces: bool = False

    def __post_init__(self) -> None:
        if self.shutdown_timeout_s <= 0:
            raise ValueError("shutdown_timeout_s must be > 0")
        self.limits()  # checks the receivers' bounds

    def limits(self) -> Limits:
        """The receivers' limits."""
        return Limits(max_connections=self.max_connections, max_request_bytes=self.max_request_bytes,
                      read_timeout_s=self.read_timeout_s, request_timeout_s=self.request_timeout_s,
                      bearer_token=self.bearer_token or None, tls_cert_file=self.tls_cert_file,
                      tls_key_file=self.tls_key_file, tls_client_ca_file=self.tls_client_ca_file)


def is_deferred_answer(span: ReadableSpan) -> bool:
    """The app left this span's final pass to a worker."""
    attrs = span.attributes or {}
    return (attrs.get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM
            and attrs.get(semconv.EVAL_STATUS) == "deferred")


def otlp_span_exporter() -> SpanExporter:
    """The OTLP exporter the SDK's variables describe (``OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL``: ``grpc``
    or ``http/protobuf``, the default; endpoint, headers, timeout and compression as the exporters read
    them)."""
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as Grpc

        return Grpc()
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as Http

    return Http()


def otlp_metric_readers() -> list[MetricReader]:
    """OTLP push of the worker's metrics unless ``OTEL_METRICS_EXPORTER`` says ``none`` (the SDK's rule);
    ``GET /metrics`` serves them either way."""
    names = (os.environ.get("OTEL_METRICS_EXPORTER") or "otlp").replace(" ", "").split(",")
    if "otlp" not in names:
        return []
    protocol = (os.environ.get("OTEL_EXPORTER_OTLP_METRICS_PROTOCOL")
                or os.environ.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip()
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter as Grpc

        return [PeriodicExportingMetricReader(Grpc())]
    from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter as Http

    return [PeriodicExportingMetricReader(Http())]


def batch_processor(exporter: SpanExporter, meter_provider: MeterProvider) -> BatchSpanProcessor:
    """The export path: the SDK's batch processor, its ``OTEL_BSP_*`` variables honoured. Unset, a worker
    sends within 200 ms (a judged answer should not wait the SDK's 5 s) and queues up to 64k spans (it
    forwards whole traces of many apps; the SDK's 2,048 would drop spans in a burst). Every span it cannot
    deliver, its own queue's drops included, is counted in ``streamjudge.export.failures``."""
    delay = None if os.environ.get("OTEL_BSP_SCHEDULE_DELAY") else 200
    queue = None if os.environ.get("OTEL_BSP_MAX_QUEUE_SIZE") else 65_536
    counted = exporter if isinstance(exporter, CountingSpanExporter) else CountingSpanExporter(
        exporter, meter_provider=meter_provider)
    # the SDK's own batch metrics go to the worker's meter provider where the SDK takes one (1.41+)
    if _sdk.BATCH_TAKES_METER_PROVIDER:
        bsp = BatchSpanProcessor(counted, schedule_delay_millis=delay, max_queue_size=queue,
                                 meter_provider=meter_provider)
    else:
        bsp = BatchSpanProcessor(counted, schedule_delay_millis=delay, max_queue_size=queue)
    _sdk.report_batch_losses(bsp, counted.count_lost)  # what its full queue drops is lost too
    return bsp


def pool_from_settings(settings: Settings, meter_provider: metrics.MeterProvider) -> JudgePool:
    """A judge pool configured like the application's, for a process that does nothing but judge."""
    return JudgePool.from_settings(settings, meter_provider, in_app=False)


class _Outbound(SpanProcessor):
    """The judge processor's downstream: the export path, and the moment a judged answer leaves (its
    trace's other spans then leave with it)."""

    def __init__(self, worker: Worker, export: SpanProcessor) -> None:
        self._worker = worker
        self.export = export

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        self.export.on_end(span)
        self._worker._answer_left(span)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return self.export.force_flush(timeout_millis)

    def shutdown(self) -> None:
        self.export.shutdown()


class Worker:
    """Receives spans (:meth:`ingest`), judges deferred answers, exports everything once.

    Thread-safe: receivers call :meth:`ingest` from their own threads, outcomes arrive on the pool's
    thread, a sweeper thread applies the decision wait. :meth:`start` / :meth:`shutdown` run the
    receivers; without them the worker is driven by direct :meth:`ingest` calls (tests, embedding).
    """

    def __init__(
        self,
        settings: Settings,
        options: WorkerOptions | None = None,
        *,
        exporter: SpanExporter | None = None,
        export: SpanProcessor | None = None,
        judge: Judge | None = None,
        metric_readers: Sequence[MetricReader] = (),
        resource: Resource | None = None,
    ) -> None:
        self.settings = settings
        self.options = options or WorkerOptions()
        self.prometheus = PrometheusText()
        self.meter_provider = MeterProvider(
            metric_readers=[self.prometheus, *metric_readers],
            resource=resource or _resource(),
        )
        if export is None:
            export = batch_processor(exporter or otlp_span_exporter(), self.meter_provider)
        self._outbound = _Outbound(self, export)
        self.processor = JudgeSpanProcessor(
            downstream=self._outbound,
            meter_provider=self.meter_provider,
            capture_content=settings.capture_content,
        )
        self.pool = pool_from_settings(settings, self.meter_provider)
        self._judge = judge if judge is not None else _final_judge(settings)
        self.service = JudgingService(pool=self.pool, processor=self.processor, judges=self._judge_for)
        self.processor.set_judging(self.service)
        o = self.options
        self.buffer = TraceBuffer(max_spans=o.max_spans, max_bytes=o.max_bytes,
                                  decision_wait_s=o.decision_wait_s)
        self._judging: dict[int, int] = {}  # answer span id -> trace id, while its trace is held for it
        self._seen: OrderedDict[tuple[int, int], None] = OrderedDict()
        self._outcomes: dict[str, int] = {}
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self._idle = threading.Condition()  # requests being ingested: shutdown waits for them
        self._inflight = 0
        self._sweeper: threading.Thread | None = None
        self._receivers: list[object] = []
        self.http_port: int | None = None
        self.grpc_port: int | None = None
        meter = self.meter_provider.get_meter(semconv.METER_NAME)
        self._m_received = meter.create_counter(semconv.METRIC_WORKER_SPANS_RECEIVED,
                                                description="Spans received over OTLP")
        self._m_duplicate = meter.create_counter(
            semconv.METRIC_WORKER_SPANS_DUPLICATE, description="Spans received again (a retried export)"
        )
        self._m_released = meter.create_counter(
            semconv.METRIC_WORKER_SPANS_RELEASED, description="Non-answer spans exported, by why they left"
        )
        self._m_answers = meter.create_counter(
            semconv.METRIC_WORKER_ANSWERS, description="Deferred answer spans exported, by outcome"
        )
        self._m_rejected = meter.create_counter(
            semconv.METRIC_WORKER_REQUESTS_REJECTED,
            description="OTLP requests refused or cut short (too_large, bad_request, unauthorized, busy, "
                        "aborted, timeout, tls)",
        )
        self._rejected: dict[str, int] = {}
        for name, get in (
            (semconv.METRIC_WORKER_BUFFER_TRACES, lambda: self.buffer.traces),
            (semconv.METRIC_WORKER_BUFFER_SPANS, lambda: self.buffer.spans),
            (semconv.METRIC_WORKER_BUFFER_BYTES, lambda: self.buffer.bytes),
        ):
            meter.create_observable_gauge(
                name, callbacks=[lambda _o, g=get: [metrics.Observation(g())]],  # type: ignore[misc]
            )

    def _judge_for(self, kind: EvalKind) -> Judge:
        return self._judge

    @property
    def stopping(self) -> bool:
        """True once shutdown began: receivers refuse new exports (the collector retries them)."""
        return self._stopping.is_set()

    # --- receiving -----------------------------------------------------------------------------------

    def count_rejected(self, reason: str) -> None:
        """A receiver refused a request or lost its client (``reason``)."""
        with self._lock:
            self._rejected[reason] = self._rejected.get(reason, 0) + 1
        self._m_rejected.add(1, {semconv.METRIC_ATTR_REASON: reason})

    def rejected_counts(self) -> dict[str, int]:
        """Requests the receivers refused or lost, by reason, so far."""
        with self._lock:
            return dict(self._rejected)

    def ingest(self, request: ExportTraceServiceRequest) -> int:
        """Take the spans of one OTLP export request. Returns how many were new."""
        with self._idle:
            self._inflight += 1
        try:
            return self._ingest(request)
        finally:
            with self._idle:
                self._inflight -= 1
                self._idle.notify_all()

    def _ingest(self, request: ExportTraceServiceRequest) -> int:
        now = time.monotonic()
        new = 0
        out: list[Release] = []
        answers: list[Received] = []
        forward: list[ReadableSpan] = []
        hold = self.options.hold_traces
        for received in spans(request):
            if not self._first_time(received):
                self._m_duplicate.add(1)
                continue
            new += 1
            if is_deferred_answer(received.span):
                answers.append(received)
            elif hold:
                out.extend(self.buffer.add(received, now))
            else:
                forward.append(received.span)
        if forward:
            out.append(Release("forwarded", tuple(forward)))
        # answers last: spans of their trace that came in the same request are held before it is judged
        for received in answers:
            self._take_answer(received, now)
        if new:
            self._m_received.add(new)
        self._export(out)
        if forward:
            # handed on before the sender is told they arrived: a worker killed after acknowledging has
            # no copy of them left to lose
            self._outbound.export.force_flush()
        return new

    def _first_time(self, received: Received) -> bool:
        key = (received.trace_id, received.span_id)
        with self._lock:
            if key in self._seen:
                return False
            self._seen[key] = None
            if len(self._seen) > self.options.remember_spans:
                self._seen.popitem(last=False)
            return True

    def _take_answer(self, received: Received, now: float) -> None:
        span = received.span
        tid, sid = received.trace_id, received.span_id
        if self.options.hold_traces and self.buffer.begin_answer(tid, sid, now):
            with self._lock:
                self._judging[sid] = tid
        request, skip = self._request(span, tid, sid)
        if skip is None:
            self.service.submit(request)
        else:
            self.service.skip(request, skip)
        # held by id until its outcome (or, when that came first, exported enriched at once)
        self.processor.on_end(span)

    def _request(self, span: ReadableSpan, trace_id: int, span_id: int) -> tuple[JudgeRequest, str | None]:
        s = self.settings
        a = span.attributes or {}
        answer = a.get(semconv.STREAM_ANSWER)
        skip: str | None = None
        if a.get(semconv.EVAL_SKIP_REASON) == NO_CONTENT or not isinstance(answer, str):
            skip, answer = NO_CONTENT, ""
        elif len(answer) > s.max_judge_input_chars:
            skip = TOO_LARGE
        contexts = a.get(semconv.STREAM_CONTEXTS) or ()
        question = a.get(semconv.STREAM_QUESTION)
        reference = a.get(semconv.STREAM_REFERENCE)
        item = EvalInput(
            question=question if isinstance(question, str) else "",
            contexts=tuple(str(c) for c in contexts) if isinstance(contexts, tuple | list) else (),
            answer=str(answer),
            kind="answer",
            reference=reference if isinstance(reference, str) else None,
        )
        attributes: dict[str, str | int | float | bool] = {}
        for key in (semconv.STREAM_ID, semconv.SESSION_ID):
            v = a.get(key)
            if isinstance(v, str | int | float | bool):
                attributes[key] = v
        request = JudgeRequest(
            item=item,
            metrics=tuple(s.final_metrics),
            thresholds=dict(s.thresholds),
            default_threshold=s.threshold,
            trace_id=trace_id,
            target_span_id=span_id,
            target_trace_id=trace_id,
            target_name=span.name,
            attributes=attributes,
        )
        return request, skip

    # --- leaving -------------------------------------------------------------------------------------

    def _answer_left(self, span: ReadableSpan) -> None:
        # only deferred answer spans go through the judge processor, so each span here is one outcome
        ctx = span.context
        if ctx is None:
            return
        status = str((span.attributes or {}).get(semconv.EVAL_STATUS))
        with self._lock:
            tid = self._judging.pop(ctx.span_id, None)
            self._outcomes[status] = self._outcomes.get(status, 0) + 1
        self._m_answers.add(1, {semconv.METRIC_ATTR_STATUS: status})
        if tid is not None:
            self._export(self.buffer.end_answer(tid, ctx.span_id))

    def _export(self, releases: Iterable[Release]) -> None:
        export = self._outbound.export
        for r in releases:
            if not r.spans:
                continue
            self._m_released.add(len(r.spans), {semconv.METRIC_ATTR_REASON: r.reason})
            for span in r.spans:
                try:
                    export.on_end(span)
                except Exception:
                    _log.exception("streamjudge worker: exporting span %s failed", span.name)

    def sweep(self, now: float | None = None) -> int:
        """Apply the decision wait now. Returns how many spans left."""
        releases = self.buffer.expire(time.monotonic() if now is None else now)
        self._export(releases)
        return sum(len(r.spans) for r in releases)

    # --- running -------------------------------------------------------------------------------------

    def start(self) -> Worker:
        """Start the receivers and the decision-wait sweeper."""
        from streamjudge.worker import _receive

        o = self.options
        if o.http_endpoint:
            http = _receive.HttpReceiver(self, o.http_endpoint, o.limits()).start()
            self._receivers.append(http)
            self.http_port = http.port
        if o.grpc_endpoint:
            grpc_receiver = _receive.grpc_receiver(self, o.grpc_endpoint, o.limits())
            if grpc_receiver is not None:
                self._receivers.append(grpc_receiver.start())
                self.grpc_port = grpc_receiver.port
        self._sweeper = threading.Thread(target=self._sweep_loop, name="streamjudge-worker-sweep",
                                         daemon=True)
        self._sweeper.start()
        return self

    def _sweep_loop(self) -> None:
        period = min(1.0, self.options.decision_wait_s / 4)
        while not self._stopping.wait(period):
            try:
                self.sweep()
            except Exception:
                _log.exception("streamjudge worker: decision-wait sweep failed")

    def shutdown(self, timeout_s: float | None = None) -> dict[str, float | int]:
        """Stop receiving, then within ``timeout_s`` (default: the options') flush every held trace, let
        queued judgements finish or mark their spans ``shutdown``, and export everything.

        Returns what happened: spans flushed from the buffer, answers marked, seconds taken.
        """
        started = time.monotonic()
        budget = self.options.shutdown_timeout_s if timeout_s is None else timeout_s
        deadline = started + budget
        self._stopping.set()
        for r in self._receivers:
            try:
                r.stop()  # type: ignore[attr-defined]
            except Exception:
                _log.exception("streamjudge worker: stopping a receiver failed")
        if self._sweeper is not None:
            self._sweeper.join(timeout=2.0)
        # a request that got past the receivers' check before the stop is held before the drain
        with self._idle:
            self._idle.wait_for(lambda: self._inflight == 0, timeout=max(0.0, deadline - time.monotonic()))
        flushed = self.buffer.drain(judging=False)  # traces whose answer has not arrived: as they are
        self._export(flushed)
        # judging gets what is left of the deadline but a reserve for the export path
        reserve = min(2.0, budget * 0.3)
        judging_ms = max(1, int((deadline - time.monotonic() - reserve) * 1000))
        before = dict(self.answer_counts())
        leftover: list[Release] = []

        def close() -> None:
            self.processor.set_shutdown_timeout(judging_ms)
            self.processor.close(close_downstream=False)  # drain the pool; the rest exported as `shutdown`
            leftover.extend(self.buffer.drain())  # nothing should be left: every answer had its outcome
            self._export(leftover)
            self._outbound.export.force_flush(max(1, int((deadline - time.monotonic()) * 1000)))
            self._outbound.export.shutdown()

        # the SDK's export path does not bound its own flush (an onward backend that is down holds it for
        # the exporter's timeout and retries): the deadline is kept by not waiting longer than it
        closer = threading.Thread(target=close, name="streamjudge-worker-close", daemon=True)
        closer.start()
        closer.join(timeout=max(0.0, deadline - time.monotonic()))
        if closer.is_alive():
            _log.warning("streamjudge worker: the export path did not finish within the shutdown deadline")
        flushed += leftover
        try:
            self.meter_provider.shutdown(timeout_millis=max(1, int((deadline - time.monotonic()) * 1000)))
        except Exception:
            _log.debug("streamjudge worker: metrics shutdown failed", exc_info=True)
        after = self.answer_counts()
        return {
            "flushed_spans": sum(len(r.spans) for r in flushed),
            "flushed_traces": len(flushed),
            "answers_marked_shutdown": after.get("shutdown", 0) - before.get("shutdown", 0),
            "seconds": round(time.monotonic() - started, 3),
        }

    def answer_counts(self) -> dict[str, int]:
        """Deferred answers exported so far, by outcome status."""
        with self._lock:
            return dict(self._outcomes)


def _resource() -> Resource:
    """The SDK's resource (``OTEL_SERVICE_NAME``, ``OTEL_RESOURCE_ATTRIBUTES``), named
    ``streamjudge-worker`` when those leave it unnamed. It labels the worker's metrics only: forwarded
    spans keep their own application's resource."""
    resource = Resource.create()
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(Resource({"service.name": "streamjudge-worker"}))
    return resource


def _final_judge(settings: Settings) -> Judge:
    try:
        return create_judge(settings.judge, settings, tier="final")
    except Exception as exc:
        # like the app: a missing judge package never stops judging; the spans name the judge used
        _log.error("streamjudge worker: judge %r unavailable (%s); using the local judge",
                   settings.judge, exc)
        return create_judge("local", settings, tier="final")
