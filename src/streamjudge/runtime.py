"""The runtime: one per process, wiring settings, tracer provider, judge processor, pool and judges.

``configure()`` builds it. Where it sits in the export path decides how results leave:
- it owns the export path (an ``exporter``/``downstream`` is given, or the distro took over the provider's
  exporters): judged spans are held and exported once, enriched with their scores;
- it sits beside processors that already export (an application or the Langfuse SDK set up the provider):
  results go out as EVALUATOR spans and log events, and the application's setup is left as it was.
"""

from __future__ import annotations

import inspect
import logging
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from opentelemetry import metrics, trace
from opentelemetry._logs import LoggerProvider
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import MetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from streamjudge import semconv
from streamjudge._context import ContextStore, default_store
from streamjudge._version import __version__
from streamjudge.config import Settings, load_settings
from streamjudge.exporters.base import EvaluationSink
from streamjudge.judging.base import EvalKind, Judge
from streamjudge.judging.judges import Tier, create_judge
from streamjudge.judging.pool import JudgePool
from streamjudge.judging.processor import JudgeSpanProcessor, StreamRegistry

if TYPE_CHECKING:
    from streamjudge.exporters.langfuse import LangfuseSpanExporter

_log = logging.getLogger(__name__)


class _Discard(SpanProcessor):
    """Downstream of a provider streamjudge created without an exporter: spans are judged, then dropped."""

    def on_end(self, span: ReadableSpan) -> None:
        return None

    def on_start(self, span: Span, parent_context: object = None) -> None:
        return None


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
        streams: StreamRegistry,
        owns_provider: bool,
        meter_provider: MeterProvider | None = None,
    ) -> None:
        self.settings = settings
        self.tracer_provider = tracer_provider
        self.processor = processor
        self.pool = pool
        self.contexts = contexts
        self.streams = streams
        self.owns_provider = owns_provider
        self._meter_provider = meter_provider
        self.tracer = tracer_provider.get_tracer(semconv.TRACER_NAME, __version__)
        self._judges: dict[str, Judge] = {}
        self._judge_lock = threading.Lock()
        self._closed = False
        # the Langfuse SDK may set itself up after streamjudge (an app calling Langfuse() at import, under
        # opentelemetry-instrument): each stream start compares the provider's processors with these
        self._seen_processors: object = None
        self._provider_lock = threading.Lock()
        self._langfuse_exporter: LangfuseSpanExporter | None = None
        self._langfuse_joined = False

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

    def check_provider(self) -> None:
        """Join a Langfuse SDK span processor added to the provider since the last look.

        Called at each stream start; costs one identity comparison while the provider's processors are
        unchanged.
        """
        active = getattr(self.tracer_provider, "_active_span_processor", None)
        current = getattr(active, "_span_processors", None)
        if current is self._seen_processors:
            return
        with self._provider_lock:  # streams may start on several threads (sync drivers)
            self._seen_processors = current
            if not self._langfuse_joined:
                self._join_langfuse_sdk()

    def _join_langfuse_sdk(self) -> bool:
        """Make the Langfuse SDK's processor export our spans, stop our own Langfuse exporter sending what
        the SDK sends, and send scores through the SDK client when no Langfuse score sink is set."""
        from streamjudge.exporters.langfuse import (
            LangfuseClientScoreSink,
            LangfuseScoreSink,
            adopt_langfuse_sdk,
        )

        sdk = adopt_langfuse_sdk(self.tracer_provider)
        if not sdk:
            return False
        self._langfuse_joined = True
        if self._langfuse_exporter is not None:
            self._langfuse_exporter.defer_to_sdk()
        if not any(isinstance(s, LangfuseScoreSink | LangfuseClientScoreSink) for s in self.processor.sinks):
            sink = LangfuseClientScoreSink.for_processor(sdk[0])
            if sink is not None:
                self.processor.add_sink(sink)
        _log.info("streamjudge: joined the Langfuse SDK's span processor")
        return True

    def take_over_export(self, provider: SDKTracerProvider | None = None) -> None:
        """Put the judge processor in front of the processors ``provider`` already has.

        For the distro: the SDK's configurator builds the provider and its exporters from ``OTEL_*``
        variables; afterwards judged spans must reach those exporters only through the judge processor
        (enriched, exactly once). Other spans still reach them unchanged.
        """
        provider = provider or self.tracer_provider
        active = provider._active_span_processor  # the SDK exposes no public way to re-order processors
        with active._lock:
            existing = tuple(p for p in active._span_processors if p is not self.processor)
            downstream = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
            for p in existing:
                downstream.add_span_processor(p)
            active._span_processors = (self.processor,)
        self.processor._downstream = downstream

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait for queued judgements and export what is pending."""
        ok = self.tracer_provider.force_flush(timeout_millis)
        if self._meter_provider is not None:
            ok = self._meter_provider.force_flush(timeout_millis) and ok
        return ok

    def shutdown(self) -> None:
        """Drain the judge pool within its deadline, export everything, release resources."""
        global _runtime
        if self._closed:
            return
        self._closed = True
        if self.owns_provider:
            self.tracer_provider.shutdown()
        else:
            self.processor.shutdown()
        if self._meter_provider is not None:
            self._meter_provider.shutdown()
        with _lock:
            if _runtime is self:
                _runtime = None


_lock = threading.Lock()
_runtime: Runtime | None = None


def _env_exporters(provider: SDKTracerProvider | None) -> list[SpanExporter]:
    """Span exporters to the backends configured by environment variables (Langfuse, Phoenix).

    None to a backend the application already exports to with its SDK (the Langfuse SDK's processor,
    ``phoenix.otel``'s): a second exporter would send every span there twice.
    """
    from streamjudge.exporters.langfuse import langfuse_exporter_from_env, langfuse_sdk_processors
    from streamjudge.exporters.phoenix import phoenix_exporter_from_env, phoenix_otel_processors

    active = provider._active_span_processor if provider is not None else None
    out: list[SpanExporter | None] = []
    if not langfuse_sdk_processors(active):
        out.append(langfuse_exporter_from_env())
    if not phoenix_otel_processors(active):
        out.append(phoenix_exporter_from_env())
    return [e for e in out if e is not None]


def _env_sinks() -> list[EvaluationSink]:
    """Evaluation sinks configured by environment variables (Langfuse scores, Phoenix annotations)."""
    from streamjudge.exporters.langfuse import langfuse_score_sink_from_env
    from streamjudge.exporters.phoenix import phoenix_annotation_sink_from_env

    return [s for s in (langfuse_score_sink_from_env(), phoenix_annotation_sink_from_env()) if s is not None]


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
    pool = JudgePool(
        concurrency=settings.concurrency,
        queue_size=settings.queue_size,
        timeout_s=settings.judge_timeout_s,
        max_retries=settings.max_retries,
        backoff_s=settings.retry_backoff_s,
        sample_rate=settings.sample_rate,
        per_stream_budget=settings.per_stream_budget,
        global_budget_per_minute=settings.global_budget_per_minute,
        max_queue_wait_s=settings.hold_timeout_s,
        cpu_share=settings.judge_cpu_share,
        linger_s=settings.judge_linger_s,
        meter_provider=meter_provider,
    )
    if downstream is None and exporter is not None:
        downstream = BatchSpanProcessor(exporter)
    if tracer_provider is None:
        current = trace.get_tracer_provider()
        if isinstance(current, SDKTracerProvider):
            tracer_provider = current
    from streamjudge.exporters.langfuse import LangfuseSpanExporter

    env_exporters = _env_exporters(tracer_provider) if backends_from_env else []
    if sinks is None:
        sinks = _env_sinks() if backends_from_env else []
    owns_provider = tracer_provider is None
    if tracer_provider is None:
        tracer_provider = SDKTracerProvider(resource=resource or Resource.create())
        if downstream is None:
            downstream = _Discard()
    streams = StreamRegistry()
    rt_holder: list[Runtime] = []

    def judges(kind: EvalKind) -> Judge:
        return rt_holder[0].judge_for(kind)

    processor = JudgeSpanProcessor(
        settings=settings,
        pool=pool,
        judges=judges,
        contexts=default_store(),
        streams=streams,
        downstream=downstream,
        sinks=sinks,
        tracer_provider=tracer_provider,
        logger_provider=logger_provider,
        meter_provider=meter_provider,
    )
    _add_span_processor(tracer_provider, processor)
    for exp in env_exporters:
        # owning: the backend gets the enriched spans; beside an app's processors: the raw spans, like
        # the app's own exporters (take_over_export later moves them behind the judge processor)
        if processor._downstream is not None:
            multi = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
            multi.add_span_processor(processor._downstream)
            multi.add_span_processor(BatchSpanProcessor(exp))
            processor._downstream = multi
        else:
            _add_span_processor(tracer_provider, BatchSpanProcessor(exp))
    rt = Runtime(
        settings,
        tracer_provider=tracer_provider,
        processor=processor,
        pool=pool,
        contexts=default_store(),
        streams=streams,
        owns_provider=owns_provider,
        meter_provider=owned_meter,
    )
    rt_holder.append(rt)
    rt._langfuse_exporter = next((e for e in env_exporters if isinstance(e, LangfuseSpanExporter)), None)
    rt.check_provider()
    if judge is not None or checkpoint_judge is not None:
        rt.use_judges(final=judge, checkpoint=checkpoint_judge or judge)
    # build the judges now, not on the first request's token path
    rt.judge_for("checkpoint")
    rt.judge_for("answer")
    if owns_provider and set_global:
        trace.set_tracer_provider(tracer_provider)
    with _lock:
        previous, _runtime = _runtime, rt
    if previous is not None and previous is not rt:
        previous.shutdown()
    return rt
