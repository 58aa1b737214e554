"""Pins every piece of the OpenTelemetry SDK's private API streamjudge uses (all of it in streamjudge._sdk):
an SDK upgrade that changes one fails here, loudly, instead of silently in production."""

from __future__ import annotations

from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamjudge import _sdk


def _minor(dist: str) -> int:
    from importlib.metadata import version

    return int(version(dist).split(".")[1])


SDK_MINOR = _minor("opentelemetry-sdk")
API_MINOR = _minor("opentelemetry-api")


class _Named(SpanProcessor):
    def __init__(self, name: str) -> None:
        self.name = name
        self.ended: list[str] = []

    def on_end(self, span: ReadableSpan) -> None:
        self.ended.append(span.name)


def test_the_provider_still_keeps_its_processors_where_streamjudge_reads_them() -> None:
    provider = TracerProvider()
    active = provider._active_span_processor
    assert hasattr(active, "_span_processors") and isinstance(active._span_processors, tuple)
    assert hasattr(active, "_lock") and hasattr(active._lock, "__enter__")


def test_list_set_and_remove_span_processors() -> None:
    provider = TracerProvider()
    a, b = _Named("a"), _Named("b")
    provider.add_span_processor(a)
    provider.add_span_processor(b)
    assert _sdk.span_processors(provider) == (a, b)
    _sdk.set_span_processors(provider, (b, a))
    assert _sdk.span_processors(provider) == (b, a)
    assert _sdk.remove_span_processor(provider, a) and _sdk.span_processors(provider) == (b,)
    assert not _sdk.remove_span_processor(provider, a)
    provider.get_tracer("t").start_span("s").end()
    assert b.ended == ["s"] and a.ended == []  # the provider calls exactly what is set


def test_watching_processors_sees_one_added_later_and_keeps_the_method_working() -> None:
    provider = TracerProvider()
    seen: list[SpanProcessor] = []
    _sdk.watch_span_processors(provider, seen.append)
    exporter = InMemorySpanExporter()
    later = SimpleSpanProcessor(exporter)
    provider.add_span_processor(later)
    assert seen == [later]
    provider.get_tracer("t").start_span("s").end()
    assert [s.name for s in exporter.get_finished_spans()] == ["s"]
    _sdk.unwatch_span_processors(provider, seen.append)
    provider.add_span_processor(_Named("c"))
    assert seen == [later]


def test_suppression_is_the_public_one() -> None:
    assert _sdk.is_instrumentation_enabled()
    with _sdk.suppress_instrumentation():
        assert not _sdk.is_instrumentation_enabled()
    assert _sdk.is_instrumentation_enabled()


def test_the_quiet_context_suppresses_instrumentation_and_joins_no_trace() -> None:
    from opentelemetry import context, trace

    provider = TracerProvider()
    with provider.get_tracer("t").start_as_current_span("request"):
        quiet = _sdk.quiet_context()  # made inside a span: it still carries none
        assert _sdk.is_instrumentation_enabled()  # making it changed nothing around it
    token = context.attach(quiet)
    try:
        assert not _sdk.is_instrumentation_enabled()
        assert not trace.get_current_span().get_span_context().is_valid
    finally:
        context.detach(token)
    assert _sdk.is_instrumentation_enabled()


def test_what_ended_spans_read_off_the_tracer_is_still_there() -> None:
    from opentelemetry.sdk.trace import SpanLimits, SynchronousMultiSpanProcessor
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    tracer = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=7)).get_tracer("t", "1.0")
    assert tracer._span_limits.max_span_attribute_length == 7  # type: ignore[attr-defined]
    assert tracer._span_limits.max_span_attributes == 128  # type: ignore[attr-defined]
    assert tracer._instrumentation_scope.name == "t"  # type: ignore[attr-defined]
    if SDK_MINOR >= 40:
        assert tracer._is_enabled()  # type: ignore[attr-defined]
        end = tracer._tracer_metrics.start_span(None, _sdk.Decision.RECORD_AND_SAMPLE)  # type: ignore[attr-defined]
        assert callable(end)
    else:  # the span metrics are started only where the SDK has them
        assert not hasattr(tracer, "_tracer_metrics")
        assert _sdk._start_span_metrics(tracer, None, _sdk.Decision.RECORD_AND_SAMPLE)() is None
    # the hooks a processor behind streamjudge's may have, and where a multi-processor keeps its own
    multi = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    multi.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    assert _sdk.acts_only_on_end(multi)
    assert _sdk.acts_only_on_end(BatchSpanProcessor(InMemorySpanExporter()))
    # the SDK's default sampler, whose answer for a root or a sampled parent's child is known
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF, ALWAYS_ON, ParentBased, StaticSampler

    pb = ParentBased(ALWAYS_OFF)
    assert pb._root is ALWAYS_OFF and pb._local_parent_sampled is ALWAYS_ON  # type: ignore[attr-defined]
    assert pb._remote_parent_sampled is ALWAYS_ON  # type: ignore[attr-defined]
    assert pb._local_parent_not_sampled is ALWAYS_OFF and pb._remote_parent_not_sampled is ALWAYS_OFF  # type: ignore[attr-defined]
    assert type(ALWAYS_ON) is StaticSampler and ALWAYS_ON._decision is _sdk.Decision.RECORD_AND_SAMPLE  # type: ignore[attr-defined]
    assert _sdk._records_and_samples(TracerProvider().sampler, None)

    class Hooked(SpanProcessor):
        def _on_ending(self, span: object) -> None:
            return None

    multi.add_span_processor(Hooked())
    # an SDK without the hook never calls it: the processor still acts only on a span's end
    assert _sdk.acts_only_on_end(multi) is not _sdk.HAS_ON_ENDING


def test_the_sdk_features_probed_per_version_match_the_installed_sdk() -> None:
    """Each SDK minor of the supported range takes the path its features allow (docs/compatibility.md)."""
    from opentelemetry.trace import TraceFlags

    assert SDK_MINOR >= 38 and API_MINOR >= 38  # the oldest of the range in pyproject.toml
    assert _sdk.HAS_ON_ENDING is (SDK_MINOR >= 40)
    assert _sdk._SPAN_END_METRICS is (SDK_MINOR >= 40)
    assert _sdk.BATCH_TAKES_METER_PROVIDER is (SDK_MINOR >= 41)
    assert bool(_sdk.RANDOM_TRACE_ID_FLAG) is (API_MINOR >= 42)
    if API_MINOR >= 42:
        assert _sdk.RANDOM_TRACE_ID_FLAG == TraceFlags.RANDOM_TRACE_ID  # type: ignore[attr-defined]
        assert _sdk._random_root_id(TracerProvider().get_tracer("t"))


def test_a_live_span_has_every_field_of_the_sdks_span() -> None:
    """``LiveSpan`` sets the SDK span's fields itself: an SDK that adds or renames one fails here."""
    provider = TracerProvider()
    tracer = provider.get_tracer("t")
    sdk_span = tracer.start_span("s", attributes={"a": 1})
    live = _sdk.LiveSpan(tracer, "s", sdk_span.get_span_context(), None, {"a": 1}, 1,  # type: ignore[arg-type]
                         lambda: None)
    assert set(vars(live)) == set(vars(sdk_span))
    assert type(live._attributes) is type(sdk_span._attributes)  # type: ignore[attr-defined]
    assert type(live._events) is type(sdk_span._events)  # type: ignore[attr-defined]
    assert live._attributes._dict == {"a": 1}  # type: ignore[attr-defined]  # the store LiveSpan fills
    assert not live._attributes._immutable  # type: ignore[attr-defined]
    if API_MINOR >= 42:
        assert callable(tracer.id_generator.is_trace_id_random)  # type: ignore[attr-defined]


def test_streamjudges_discarding_downstream_reports_its_flush_done_on_every_sdk() -> None:
    # the SDK's base processor returns None from force_flush before 1.42: a runtime without an exporter
    # would report every flush as failed there
    from streamjudge.runtime import _Discard

    assert _Discard().force_flush(1) is True


def test_where_exporters_sit_and_the_batch_processors_drops_are_still_reachable() -> None:
    if SDK_MINOR < 41:  # no metrics object on the batch processor: its drops cannot be reported
        from opentelemetry.sdk.trace.export import BatchSpanProcessor as _BSP

        assert not _sdk.report_batch_losses(_BSP(InMemorySpanExporter()), lambda n, why: None)
        return
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    assert _sdk.active_processor(provider) is provider._active_span_processor
    assert _sdk.active_processor(object()) is None
    inner, other = InMemorySpanExporter(), InMemorySpanExporter()
    bsp = BatchSpanProcessor(inner, max_queue_size=2, max_export_batch_size=2, schedule_delay_millis=60_000)
    simple = SimpleSpanProcessor(inner)
    provider.add_span_processor(bsp)
    provider.add_span_processor(simple)
    assert _sdk.child_processors(_sdk.active_processor(provider)) == (bsp, simple)
    assert _sdk.child_processors(bsp) == ()
    assert _sdk.processor_exporter(bsp) is inner and _sdk.processor_exporter(simple) is inner
    assert _sdk.processor_exporter(_Named("x")) is None
    _sdk.set_processor_exporter(simple, other)
    provider.get_tracer("t").start_span("s").end()
    assert [s.name for s in other.get_finished_spans()] == ["s"]
    # the batch processor reports what it drops through its metrics object's drop_items
    lost: list[tuple[int, str]] = []
    assert _sdk.report_batch_losses(bsp, lambda n, why: lost.append((n, why)))
    assert _sdk.report_batch_losses(bsp, lambda n, why: lost.append((n, why)))  # idempotent
    batch = bsp._batch_processor
    batch._worker_awaken.set = lambda: None  # type: ignore[method-assign]  # no export before the drop
    for _ in range(3):
        bsp.on_end(provider.get_tracer("t").start_span("q"))  # type: ignore[arg-type]
    assert lost == [(1, "queue_full")] * 2  # "s" and two of these three fill the queue of 2


def test_a_vendor_processors_filter_is_where_it_is_read() -> None:
    import inspect

    import pytest

    processor_module = pytest.importorskip("langfuse._client.span_processor")
    LangfuseSpanProcessor = processor_module.LangfuseSpanProcessor
    # the SDK keeps the filter it reads on every span start and end in this attribute
    assert "self._should_export_span = " in inspect.getsource(LangfuseSpanProcessor.__init__)
    p = LangfuseSpanProcessor.__new__(LangfuseSpanProcessor)
    p._should_export_span = bool  # type: ignore[attr-defined]
    assert _sdk.vendor_export_filter(p) is bool
    _sdk.set_vendor_export_filter(p, callable)
    assert p._should_export_span is callable  # type: ignore[attr-defined]


def test_counting_the_batch_queue_keeps_what_was_queued_and_its_order() -> None:
    if SDK_MINOR < 41:  # no metrics object on the batch processor: its drops cannot be reported
        from opentelemetry.sdk.trace.export import BatchSpanProcessor as _BSP

        assert not _sdk.report_batch_losses(_BSP(InMemorySpanExporter()), lambda n, why: None)
        return
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    provider = TracerProvider()
    inner = InMemorySpanExporter()
    bsp = BatchSpanProcessor(inner, max_queue_size=10, max_export_batch_size=10, schedule_delay_millis=60_000)
    provider.add_span_processor(bsp)
    tracer = provider.get_tracer("t")
    tracer.start_span("a").end()
    tracer.start_span("b").end()
    batch = bsp._batch_processor
    assert hasattr(batch._export_lock, "acquire") and len(batch._queue) == 2  # where the swap happens
    assert _sdk.report_batch_losses(bsp, lambda n, why: None)
    tracer.start_span("c").end()
    bsp.force_flush()
    assert [s.name for s in inner.get_finished_spans()] == ["a", "b", "c"]
    provider.shutdown()
