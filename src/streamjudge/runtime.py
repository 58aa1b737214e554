"""The runtime: one per process; holds settings, tracer provider, judge processor, judging service, judges.

``configure()`` builds it. Where it sits in the export path decides how results leave:
- it owns the export path (an ``exporter``/``downstream`` is given, or the distro took over the provider's
  exporters): judged spans are held and exported once, enriched with their scores;
- it sits beside processors that already export (an application or the Langfuse SDK set up the provider):
  results go out as EVALUATOR spans and log events, and the application's setup is left as it was.

Calling ``configure()`` again replaces the runtime cleanly: on the same provider the new judge processor
takes the old one's place (and its export path, unless a new one is given), the old pool is drained, and
judging goes on.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Sequence

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from streamjudge import _sdk, semconv
from streamjudge._context import ContextStore, default_store
from streamjudge._deadline import shutdown_deadline
from streamjudge._shutdown import install_signal_drain
from streamjudge._vendors import VendorBackend, default_backends
from streamjudge._version import __version__
from streamjudge.config import Settings, load_settings
from streamjudge.exporters._counting import count_export_failures
from streamjudge.exporters.base import EvaluationSink
from streamjudge.judging import _backend
from streamjudge.judging.base import EvalKind, Judge
from streamjudge.judging.judges import Tier, create_judge
from streamjudge.judging.pool import JudgePool
from streamjudge.judging.processor import JudgeSpanProcessor
from streamjudge.judging.service import JudgingService

_log = logging.getLogger(__name__)


class _Discard(SpanProcessor):
    """Downstream of a provider streamjudge created without an exporter: spans are judged, then dropped."""

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # nothing is held; the SDK's base class says None before 1.42, which reads as failed


class Runtime:
    """Everything one process needs to judge streams. Build it with :func:`configure`."""

    def __init__(
        self,
        settings: Settings,
        *,
        tracer_provider: SDKTracerProvider,
        processor: JudgeSpanProcessor,
        pool: JudgePool,
        contexts: ContextStore,
        owns_provider: bool,
        meter_provider: MeterProvider | None = None,
        backends: Sequence[VendorBackend] = (),
    ) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider
        self.processor = processor
        self.pool = pool
        self.contexts = contexts
        self.owns_provider = owns_provider
        self.service = JudgingService(pool=pool, processor=processor, judges=self.judge_for)
        processor.set_judging(self.service)
        self._meter_provider = meter_provider
        self._backends = tuple(backends)
        self.tracer = tracer_provider.get_tracer(semconv.TRACER_NAME, __version__)
        #: checkpoint spans made already ended where the provider's set-up allows (see EndedSpans)
        self.ended_spans = _sdk.EndedSpans(tracer_provider, self.tracer, processor)
        self._judges: dict[str, Judge] = {}
        self._judge_lock = threading.Lock()
        self._join_lock = threading.Lock()
        self._closed = False

    def judge_for(self, kind: EvalKind) -> Judge:
        """The judge for checkpoints and the pre-flight gate (fast tier) or the final answer."""
        tier: Tier = "final" if kind == "answer" else "checkpoint"
        name = self.settings.judge if tier == "final" else self.settings.checkpoint_judge_name
        key = f"{tier}:{name}"
        judge = self._judges.get(key)
        if judge is not None:
            return judge
        with self._judge_lock:
            judge = self._judges.get(key)
            if judge is None:
                try:
                    judge = create_judge(name, self.settings, tier=tier)
                except Exception as exc:
                    # a missing or broken judge package never breaks the app: judge locally and say so
                    _log.error("streamjudge: judge %r unavailable (%s); using the local judge", name, exc)
                    judge = create_judge("local", self.settings, tier=tier)
                self._judges[key] = judge
            return judge

    def use_judges(self, *, final: Judge | None = None, checkpoint: Judge | None = None) -> None:
        """Use these judge instances instead of the ones named in the settings."""
        with self._judge_lock:
            if final is not None:
                self._judges[f"final:{self.settings.judge}"] = final
            if checkpoint is not None:
                self._judges[f"checkpoint:{self.settings.checkpoint_judge_name}"] = checkpoint

    def _on_processor_added(self, processor: SpanProcessor) -> None:
        """A processor joined the provider (now or later): join it if it is a vendor SDK's."""
        if processor is self.processor or self._closed:
            return
        with self._join_lock:  # streams and SDK set-up may run on several threads
            for backend in self._backends:
                try:
                    sink = backend.join(processor, self.processor.sinks)
                except Exception:
                    _log.exception("streamjudge: joining %s failed", backend.name)
                    continue
                if sink is not None:
                    self.processor.add_sink(sink)

    def take_over_export(self, provider: SDKTracerProvider | None = None) -> None:
        """Put the judge processor in front of the processors ``provider`` already has.

        For the distro: the SDK's configurator builds the provider and its exporters from ``OTEL_*``
        variables; afterwards judged spans must reach those exporters only through the judge processor
        (enriched, exactly once). Other spans still reach them unchanged.
        """
        provider = provider or self.tracer_provider
        existing = tuple(p for p in _sdk.span_processors(provider) if p is not self.processor)
        downstream = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
        for p in existing:
            downstream.add_span_processor(p)
        _sdk.set_span_processors(provider, (self.processor,))
        self.processor.set_downstream(downstream)
        count_export_failures(downstream)  # the exporters the SDK built from OTEL_*: losses become a metric

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait for queued judgements and export what is pending."""
        ok = self.tracer_provider.force_flush(timeout_millis)
        if self._meter_provider is not None:
            ok = self._meter_provider.force_flush(timeout_millis) and ok
        return ok

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Drain the judge pool within the deadline, export everything, release resources."""
        global _runtime
        if self._closed:
            return
        self._closed = True
        _sdk.unwatch_span_processors(self.tracer_provider, self._on_processor_added)
        if timeout_millis is not None:
            self.processor.set_shutdown_timeout(timeout_millis)
        # one deadline for everything below (pool, sinks, bridges, exporters), whatever each would wait
        with shutdown_deadline(None if timeout_millis is None else timeout_millis / 1000):
            if self.owns_provider:
                self.tracer_provider.shutdown()  # -> processor.shutdown: drain the pool, then export
            else:
                self.processor.shutdown()
            if self._meter_provider is not None:
                self._meter_provider.shutdown()
        with _lock:
            if _runtime is self:
                _runtime = None

    def _replaced(self) -> None:
        """A new runtime took this one's place in the same provider: drain, keep the export path open."""
        self._closed = True
        _sdk.unwatch_span_processors(self.tracer_provider, self._on_processor_added)
        self.processor.close(close_downstream=False)
        if self._meter_provider is not None:
            self._meter_provider.shutdown()


_lock = threading.Lock()
_runtime: Runtime | None = None


def get_runtime(create: bool = False) -> Runtime:
    """The process's runtime; with ``create`` a default one is configured on first use."""
    rt = _runtime
    if rt is not None:
        return rt
    if not create:
        raise RuntimeError("streamjudge is not configured: call streamjudge.configure() first")
    return configure(set_global=False)


def current_runtime() -> Runtime | None:
    """The process's runtime, or None when none was configured."""
    return _runtime


_backend.set_default(lambda: get_runtime(create=True))


def _add_span_processor(provider: SDKTracerProvider, processor: SpanProcessor) -> None:
    """Add ``processor`` beside the provider's own.

    ``phoenix.otel``'s TracerProvider shuts its exporting processor down when another one is added, unless
    told to keep it: joining it must not silence the application's Phoenix tracing.
    """
    try:
        params = inspect.signature(provider.add_span_processor).parameters
        keeps_default = "replace_default_processor" in params
    except (TypeError, ValueError):
        keeps_default = False
    if keeps_default:
        provider.add_span_processor(processor, replace_default_processor=False)  # type: ignore[call-arg]
    else:
        provider.add_span_processor(processor)


def _install(provider: SDKTracerProvider, processor: JudgeSpanProcessor, old: SpanProcessor | None) -> None:
    """Put ``processor`` in ``provider``: in ``old``'s place (a runtime it replaces), else beside the rest."""
    if old is not None:
        present = _sdk.span_processors(provider)
        _sdk.set_span_processors(provider, tuple(processor if p is old else p for p in present))
    if processor not in _sdk.span_processors(provider):
        _add_span_processor(provider, processor)


def _add_exporters(
    provider: SDKTracerProvider, processor: JudgeSpanProcessor, exporters: Sequence[SpanExporter]
) -> None:
    """Export to the vendor backends the environment asks for.

    Owning the export path, the backends get the enriched spans; beside an app's processors, the raw spans
    like the app's own exporters (the distro's take_over_export later moves them behind the processor).
    """
    for exp in exporters:
        batch = BatchSpanProcessor(exp)
        count_export_failures(batch)  # its queue's drops too, not only the exporter's failures
        if processor.downstream is not None:
            multi = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
            multi.add_span_processor(processor.downstream)
            multi.add_span_processor(batch)
            processor.set_downstream(multi)
        else:
            _add_span_processor(provider, batch)


def configure(
    settings: Settings | None = None,
    *,
    tracer_provider: SDKTracerProvider | None = None,
    exporter: SpanExporter | None = None,
    downstream: SpanProcessor | None = None,
    sinks: Sequence[EvaluationSink] | None = None,
    backends_from_env: bool = True,
    meter_provider: metrics.MeterProvider | None = None,
    metric_readers: Sequence[MetricReader] = (),
    logger_provider: LoggerProvider | None = None,
    resource: Resource | None = None,
    judge: Judge | None = None,
    checkpoint_judge: Judge | None = None,
    set_global: bool = True,
) -> Runtime:
    """Set streamjudge up for this process and return its :class:`Runtime`.

    - ``tracer_provider``: an SDK provider to join. Without ``exporter``/``downstream`` the judge
      processor is added beside its processors (non-owning: EVALUATOR spans + log events).
    - ``exporter`` (wrapped in a ``BatchSpanProcessor``) or ``downstream`` (any span processor): the
      export path the judge processor owns; judged spans reach it once, enriched with their scores.
    - With neither a provider nor a global SDK provider, streamjudge creates one (resource from
      ``OTEL_SERVICE_NAME`` / ``OTEL_RESOURCE_ATTRIBUTES``) and, with ``set_global``, installs it.
    - ``sinks``: where evaluation records also go (Langfuse scores, Phoenix annotations); by default
      those configured by ``LANGFUSE_PUBLIC_KEY``/``LANGFUSE_SECRET_KEY`` and ``PHOENIX_COLLECTOR_ENDPOINT``.
    - ``backends_from_env``: also export spans to Langfuse / Phoenix when those variables are set.
    - ``metric_readers``: export streamjudge's metrics (a MeterProvider is created for them).
    - ``judge`` / ``checkpoint_judge``: judge instances to use instead of building them from the settings
      (``checkpoint_judge`` defaults to ``judge``).

    Calling it again replaces the previous runtime (which is shut down).
    """

    global _runtime
    settings = settings or load_settings()
    owned_meter: MeterProvider | None = None
    if meter_provider is None and metric_readers:
        owned_meter = MeterProvider(
            metric_readers=list(metric_readers), resource=resource or Resource.create()
        )
        meter_provider = owned_meter
    if downstream is None and exporter is not None:
        downstream = BatchSpanProcessor(exporter)
        count_export_failures(downstream)  # a lost span is counted whichever way the export path was built
    if tracer_provider is None:
        current = trace.get_tracer_provider()
        if isinstance(current, SDKTracerProvider):
            tracer_provider = current
    previous = _runtime
    # the same provider as the runtime before: take its place, and its export path unless given a new one
    replaces = previous is not None and not previous._closed and tracer_provider is previous.tracer_provider
    owns_provider = tracer_provider is None
    if replaces:
        assert previous is not None
        owns_provider = previous.owns_provider
        if downstream is None:
            downstream = previous.processor.downstream
    if tracer_provider is None:
        tracer_provider = SDKTracerProvider(resource=resource or Resource.create())
        if downstream is None:
            downstream = _Discard()
    backends = default_backends() if backends_from_env else []
    existing = _sdk.span_processors(tracer_provider)
    env_exporters = [e for b in backends for e in b.exporters(existing)]
    if sinks is None:
        sinks = [s for b in backends for s in b.sinks()]
    processor = JudgeSpanProcessor(
        downstream=downstream,
        sinks=sinks,
        tracer_provider=tracer_provider,
        logger_provider=logger_provider,
        meter_provider=meter_provider,
        capture_content=settings.capture_content,
        shutdown_timeout_millis=int(settings.end_wait_s * 1000) + 5_000,
        hold_timeout_s=settings.hold_timeout_s,
    )
    _install(tracer_provider, processor, previous.processor if replaces and previous else None)
    _add_exporters(tracer_provider, processor, env_exporters)
    rt = Runtime(
        settings,
        tracer_provider=tracer_provider,
        processor=processor,
        pool=JudgePool.from_settings(settings, meter_provider),
        contexts=default_store(),
        owns_provider=owns_provider,
        meter_provider=owned_meter,
        backends=backends,
    )
    for p in _sdk.span_processors(tracer_provider):  # vendor SDKs set up before us
        rt._on_processor_added(p)
    _sdk.watch_span_processors(tracer_provider, rt._on_processor_added)  # ... and after us
    if judge is not None or checkpoint_judge is not None:
        rt.use_judges(final=judge, checkpoint=checkpoint_judge or judge)
    # build the judges now, not on the first request's token path
    rt.judge_for("checkpoint")
    rt.judge_for("answer")
    if owns_provider and set_global and not replaces:
        trace.set_tracer_provider(tracer_provider)
    with _lock:
        previous, _runtime = _runtime, rt
    if previous is not None and previous is not rt:
        if replaces:
            previous._replaced()
        else:
            previous.shutdown()
    # uvicorn re-raises SIGTERM after its graceful shutdown and the SDK's atexit never runs: drain on it
    install_signal_drain()
    return rt
