"""Every touch of the OpenTelemetry SDK's private API, in one place.

The SDK has no public way to list, reorder or remove a provider's span processors, nor to learn that one
was added; streamjudge needs all four (to own the export path behind the distro, to join a vendor SDK's
processor, to replace itself on a second ``configure()``). ``tests/test_sdk_private_api.py`` pins what is
used here, so an SDK upgrade that changes it fails loudly in one test rather than silently in production.
Instrumentation suppression uses the public ``suppress_instrumentation`` / ``is_instrumentation_enabled``.

SDK minors inside the supported range (``pyproject.toml``) differ here; each difference is probed once,
below, and handled where it is used: 1.40 added the processors' ``_on_ending`` hook and the SDK's own span
metrics (``tracer._tracer_metrics``, a span's ``_record_end_metrics``); 1.42 the W3C random trace-id flag
(``TraceFlags.RANDOM_TRACE_ID``, ``IdGenerator.is_trace_id_random``).
"""

from __future__ import annotations

import inspect
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

from opentelemetry import trace
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.context import Context, attach, detach, get_current
from opentelemetry.instrumentation.utils import is_instrumentation_enabled, suppress_instrumentation
from opentelemetry.sdk.trace import (
    ConcurrentMultiSpanProcessor,
    Event,
    ReadableSpan,
    Span,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
)
from opentelemetry.sdk.trace import Tracer as SDKTracer
from opentelemetry.sdk.trace import TracerProvider as SDKTracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor, SpanExporter
from opentelemetry.sdk.trace.sampling import Decision, ParentBased, StaticSampler
from opentelemetry.sdk.util import BoundedList
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState
from opentelemetry.util.types import Attributes, AttributeValue

__all__ = [
    "EndedSpans",
    "LiveSpan",
    "is_instrumentation_enabled",
    "quiet_context",
    "remove_span_processor",
    "set_span_processors",
    "span_processors",
    "suppress_instrumentation",
    "watch_span_processors",
]


def quiet_context() -> Context:
    """An empty context with instrumentation suppressed (the public helper's key): code run in it makes no
    spans through instrumentations (httpx, openai, requests...) and joins no trace. Contexts are immutable,
    so one made once serves every attach: cheaper than entering the helper each time."""
    token = attach(Context())
    try:
        with suppress_instrumentation():
            return get_current()
    finally:
        detach(token)


def _active(provider: SDKTracerProvider) -> Any:
    return provider._active_span_processor


def span_processors(provider: SDKTracerProvider) -> tuple[SpanProcessor, ...]:
    """The processors ``provider`` calls, in order."""
    return tuple(getattr(_active(provider), "_span_processors", ()))


def set_span_processors(provider: SDKTracerProvider, processors: tuple[SpanProcessor, ...]) -> None:
    """Make ``provider`` call exactly ``processors``, in this order."""
    active = _active(provider)
    with active._lock:
        active._span_processors = tuple(processors)


def remove_span_processor(provider: SDKTracerProvider, processor: SpanProcessor) -> bool:
    """Stop ``provider`` calling ``processor`` (not shut down). False when it was not there."""
    active = _active(provider)
    with active._lock:
        current = tuple(active._span_processors)
        if processor not in current:
            return False
        active._span_processors = tuple(p for p in current if p is not processor)
        return True


_watch_lock = threading.Lock()


def watch_span_processors(provider: SDKTracerProvider, callback: Callable[[SpanProcessor], None]) -> None:
    """Call ``callback(processor)`` after each ``provider.add_span_processor`` from now on.

    A vendor SDK set up after streamjudge (``Langfuse()`` at import under ``opentelemetry-instrument``)
    adds its processor this way; joining it then costs nothing on each stream start. The wrapper keeps
    the original method's signature (``phoenix.otel``'s provider takes ``replace_default_processor``).
    """
    with _watch_lock:
        callbacks: list[Callable[[SpanProcessor], None]] | None = getattr(
            provider, "_streamjudge_watchers", None
        )
        if callbacks is not None:
            callbacks.append(callback)
            return
        callbacks = [callback]
        original = provider.add_span_processor

        def add_span_processor(span_processor: SpanProcessor, *args: Any, **kwargs: Any) -> None:
            original(span_processor, *args, **kwargs)
            for cb in tuple(callbacks):
                cb(span_processor)

        provider._streamjudge_watchers = callbacks  # type: ignore[attr-defined]
        provider.add_span_processor = add_span_processor  # type: ignore[method-assign]


def unwatch_span_processors(provider: SDKTracerProvider, callback: Callable[[SpanProcessor], None]) -> None:
    """Stop calling ``callback`` (a replaced runtime's)."""
    with _watch_lock:
        callbacks = getattr(provider, "_streamjudge_watchers", None)
        if callbacks is not None and callback in callbacks:
            callbacks.remove(callback)


#: whether the SDK calls a processor's ``_on_ending`` while a span ends (1.40+); before, only start and end
HAS_ON_ENDING: bool = hasattr(SpanProcessor, "_on_ending")
#: the W3C random trace-id flag's bit (API 1.42+); 0 where the API has none, so no span ever gets it
RANDOM_TRACE_ID_FLAG: int = int(getattr(TraceFlags, "RANDOM_TRACE_ID", 0))
# whether the SDK's span records the SDK's span metrics at its end (1.40+)
_SPAN_END_METRICS = "record_end_metrics" in inspect.signature(Span.__init__).parameters
#: whether the SDK's batch span processor takes a ``meter_provider`` for its own metrics (1.41+)
BATCH_TAKES_METER_PROVIDER: bool = (
    "meter_provider" in inspect.signature(BatchSpanProcessor.__init__).parameters)

# hooks that do nothing: the SDK's base processor's and its two exporting processors' own
_NOOP_HOOKS = frozenset(
    hook for cls in (SpanProcessor, BatchSpanProcessor, SimpleSpanProcessor)
    for hook in (cls.on_start, getattr(cls, "_on_ending", None)) if hook is not None
)


def _no_metrics() -> None:
    return None


def _start_span_metrics(tracer: Any, parent: SpanContext | None, decision: Decision) -> Callable[[], None]:
    """The SDK's span metrics for a span starting now (1.40+); what to call at its end."""
    metrics = getattr(tracer, "_tracer_metrics", None)
    return _no_metrics if metrics is None else metrics.start_span(parent, decision)  # type: ignore[no-any-return]


def _random_root_id(tracer: Any) -> bool:
    """Whether a root span's trace id from ``tracer``'s generator carries the random flag (API 1.42+)."""
    if not RANDOM_TRACE_ID_FLAG:
        return False
    is_random = getattr(tracer.id_generator, "is_trace_id_random", None)
    return bool(is_random()) if is_random is not None else False


def acts_only_on_end(processor: SpanProcessor | None) -> bool:
    """Whether ``processor`` (and every processor it calls) does nothing when a span starts or is ending:
    it would see no difference between an SDK span and an ended span handed to its ``on_end`` alone."""
    if processor is None:
        return True
    if isinstance(processor, (SynchronousMultiSpanProcessor, ConcurrentMultiSpanProcessor)):
        return all(acts_only_on_end(p) for p in processor._span_processors)
    cls = type(processor)
    return cls.on_start in _NOOP_HOOKS and (not HAS_ON_ENDING or cls._on_ending in _NOOP_HOOKS)


_SAMPLED = TraceFlags(TraceFlags.SAMPLED)
_SAMPLED_RANDOM = TraceFlags(TraceFlags.SAMPLED | RANDOM_TRACE_ID_FLAG)
# a span's flags, by value: TraceFlags is an int, as immutable as one, and the GC tracks each instance (an
# int subclass has a __dict__), so a stream span shares these instead of keeping one of its own
_FLAGS = {int(f): f for f in (TraceFlags(TraceFlags.DEFAULT), _SAMPLED,
                              TraceFlags(RANDOM_TRACE_ID_FLAG), _SAMPLED_RANDOM)}
_UNSET = Status(StatusCode.UNSET)
# what the SDK gives an event added without attributes: an empty mapping that can never change, so one
# serves every such event
_NO_EVENT_ATTRIBUTES = BoundedAttributes(0, None, immutable=True)
# values the SDK's attribute cleaning returns as they are (no length limit: see EndedSpans.usable)
_PLAIN = frozenset({str, int, float, bool})
# a live span's events and links until it has one (never added to: it holds nothing, ever)
_NONE_YET: BoundedList[Any] = BoundedList(0)  # type: ignore[no-untyped-call]


def _records_and_samples(sampler: Any, parent: SpanContext | None) -> bool:
    """Whether ``sampler`` records and samples a span under ``parent`` (None or invalid: a root) whatever its
    name and attributes, and gives it the attributes it was given and its parent's trace state (None for a
    root): the SDK's own ``ParentBased`` whose delegate for that parent is its ``ALWAYS_ON`` (the SDK's
    default sampler, for a root or a sampled parent), or ``ALWAYS_ON`` itself. Exact classes only, and no
    ``should_sample`` set on the instance: a subclass or a wrapper may decide otherwise. Asking costs a
    context, a span lookup in it and a result with its own mapping, per span."""
    if sampler.__class__ is ParentBased and "should_sample" not in sampler.__dict__:
        if parent is None or not parent.is_valid:
            sampler = sampler._root
        elif parent.is_remote:
            sampler = (sampler._remote_parent_sampled if parent.trace_flags.sampled
                       else sampler._remote_parent_not_sampled)
        else:
            sampler = (sampler._local_parent_sampled if parent.trace_flags.sampled
                       else sampler._local_parent_not_sampled)
    return (sampler.__class__ is StaticSampler and sampler._decision is Decision.RECORD_AND_SAMPLE
            and "should_sample" not in sampler.__dict__)


class EndedSpans:
    """Spans made already ended, for stretches of a trace whose attributes are all known by their end (a
    checkpoint's window): the ``ReadableSpan`` the SDK's span would hand its processors when it ends, made
    without that live span (its lock, its attribute mapping that cleans each value in a Python call, its
    processors' start and ending hooks, a context to parent it). Per checkpoint that was the largest part
    of streamjudge's own work on the app's loop (``benchmarks/run.py``'s per-window figures).

    Only where nothing could tell the difference: ``processor`` is the provider's one processor, and owns
    the export path (a processor beside it would see no such span); every processor behind it acts only on
    a span's end; the tracer is enabled and limits no attribute's length; the sampler records and samples
    the span (it is asked as for any span, with the same arguments). Anywhere else :meth:`make` returns
    None and the caller makes the span through the tracer, as before.
    """

    __slots__ = ("_processor", "_provider", "_tracer")

    def __init__(self, provider: SDKTracerProvider, tracer: trace.Tracer, processor: Any) -> None:
        self._provider = provider
        self._tracer = tracer
        self._processor = processor  # the judge processor (typed loosely: this module imports no judging)

    def usable(self) -> bool:
        """Whether :meth:`make` may make spans now (the provider's processors and limits allow it)."""
        tracer = self._tracer
        if not isinstance(tracer, SDKTracer) or span_processors(self._provider) != (self._processor,):
            return False
        if not self._processor.owns_export or not acts_only_on_end(self._processor.downstream):
            return False
        limits = tracer._span_limits
        if limits.max_span_attribute_length is not None:
            return False
        enabled = getattr(tracer, "_is_enabled", None)
        return enabled is None or bool(enabled())

    def make(
        self, name: str, parent: trace.Span, attributes: dict[str, AttributeValue], start_ns: int,
        end_ns: int, more: dict[str, AttributeValue] | None = None,
    ) -> ReadableSpan | None:
        """The ended span ``name``, child of ``parent``, with ``attributes`` (what the sampler sees, as at a
        span's start) and ``more`` (set after it), or None where it must come from the tracer (see the
        class). Hand it to :meth:`end` once whatever must precede its end (a judge request) is done."""
        if not self.usable():
            return None
        tracer: SDKTracer = self._tracer  # type: ignore[assignment]
        limit = tracer._span_limits.max_span_attributes
        if limit is not None and len(attributes) + len(more or ()) > limit:
            return None
        pctx = parent.get_span_context()
        if not pctx.is_valid:
            return None
        sampler = tracer.sampler
        if _records_and_samples(sampler, pctx):  # its answer is known without asking it
            trace_state: TraceState | None = pctx.trace_state
            final = dict(attributes)
        else:
            result = sampler.should_sample(
                trace.set_span_in_context(parent), pctx.trace_id, name, SpanKind.INTERNAL, attributes, ()
            )
            if result.decision is not Decision.RECORD_AND_SAMPLE:
                return None
            trace_state = result.trace_state
            final = dict(result.attributes)
        ctx = SpanContext(
            pctx.trace_id, tracer.id_generator.generate_span_id(), is_remote=False,
            trace_flags=_SAMPLED_RANDOM if pctx.trace_flags & RANDOM_TRACE_ID_FLAG else _SAMPLED,
            trace_state=trace_state,
        )
        # the SDK's own span metrics (started, live) see the span start and end, as a live one's would
        _start_span_metrics(tracer, pctx, Decision.RECORD_AND_SAMPLE)()
        if more:
            final.update(more)
        return ReadableSpan(
            name=name, context=ctx, parent=pctx, resource=tracer.resource, attributes=final,
            start_time=start_ns, end_time=end_ns, instrumentation_scope=tracer._instrumentation_scope,
        )

    def end(self, span: ReadableSpan) -> None:
        """Hand ``span`` (from :meth:`make`) to the processors, as the SDK does when a span ends."""
        self._processor.on_end(span)

    def start(
        self, name: str, context: Context | None, attributes: dict[str, AttributeValue], start_ns: int,
    ) -> trace.Span | None:
        """The stream span ``name``, started at ``start_ns`` under ``context``'s span: a :class:`LiveSpan`,
        the SDK's span without the start work nobody sees here, or None where it must come from the tracer
        (see the class). Sampled exactly as the tracer samples (asked once, with the same arguments, unless
        its answer is known: see _records_and_samples): a span its sampler drops is the tracer's
        non-recording span."""
        if not self.usable():
            return None
        tracer: SDKTracer = self._tracer  # type: ignore[assignment]
        parent = trace.get_current_span(context).get_span_context()
        if parent.is_valid:
            trace_id = parent.trace_id
            random_id = bool(parent.trace_flags & RANDOM_TRACE_ID_FLAG)
            parent_ctx: SpanContext | None = parent
        else:
            trace_id = tracer.id_generator.generate_trace_id()
            random_id = _random_root_id(tracer)
            parent_ctx = None
        sampler = tracer.sampler
        if _records_and_samples(sampler, parent_ctx):  # its answer is known without asking it
            decision = Decision.RECORD_AND_SAMPLE
            trace_state = parent_ctx.trace_state if parent_ctx is not None else None
            given: Attributes = attributes
        else:
            result = sampler.should_sample(context, trace_id, name, SpanKind.INTERNAL, attributes, ())
            decision, trace_state, given = result.decision, result.trace_state, result.attributes
        sampled = decision is Decision.RECORD_AND_SAMPLE
        flags = TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT
        if random_id:
            flags |= RANDOM_TRACE_ID_FLAG
        ctx = SpanContext(trace_id, tracer.id_generator.generate_span_id(), is_remote=False,
                          trace_flags=_FLAGS[flags], trace_state=trace_state)
        end_metrics = _start_span_metrics(tracer, parent_ctx, decision)
        if not sampled and decision is not Decision.RECORD_ONLY:
            return trace.NonRecordingSpan(ctx)
        return LiveSpan(tracer, name, ctx, parent_ctx, given, start_ns, end_metrics)


def _plain(attributes: Any) -> bool:
    # keys and values the SDK's cleaning keeps as they are
    for key, value in attributes.items():
        if key.__class__ is not str or not key or value.__class__ not in _PLAIN:
            return False
    return True


class LiveSpan(Span):
    """The SDK's span, started without the work that nobody sees where :class:`EndedSpans` may be used:
    the processors' start hooks (all do nothing there), the cleaning of values known to need none.

    A stream span lives as long as its answer and is streamjudge's largest cost per stream: made, given its
    dozen attributes at the end, an event and ended through the tracer, it costs 50-65 µs of the app's loop
    per stream with 500 streams live (``benchmarks/bench_scale.py``), where every stream's start is
    another's late token. It is the SDK's own class, so whoever holds it (``GuardSession.span`` is public)
    sees the SDK's span: every method but the three below is the SDK's, and its end is the SDK's end (the
    processors' ending and end hooks, the span metrics). Only:

    - it starts without calling the processors' ``on_start`` (none acts on it: ``EndedSpans.usable``);
    - ``set_attributes`` and ``add_event`` store plain values (str, int, float, bool: what the SDK's
      cleaning returns unchanged, with no length limit) without that cleaning; anything else is cleaned as
      the SDK does;
    - an event without attributes shares one empty, immutable mapping instead of making its own;
    - its lists of events and links are made by the first of each.
    """

    def __init__(
        self, tracer: SDKTracer, name: str, context: SpanContext, parent: SpanContext | None,
        attributes: Attributes, start_ns: int, end_metrics: Callable[[], None],
    ) -> None:
        # every field the SDK's constructor sets (tests/test_sdk_private_api.py compares the two), with the
        # tracer's values as its start_span passes them
        limits = tracer._span_limits
        self._name = name
        self._context = context
        self._kind = SpanKind.INTERNAL
        self._instrumentation_info = tracer.instrumentation_info
        self._instrumentation_scope = tracer._instrumentation_scope
        self._parent = parent
        self._start_time = start_ns
        self._end_time: int | None = None
        self._resource = tracer.resource
        self._status = _UNSET
        self._sampler = tracer.sampler
        self._trace_config = None
        self._record_exception = True
        self._set_status_on_exception = True
        self._span_processor = tracer.span_processor
        self._limits = limits
        self._lock = threading.Lock()
        self._attributes = BoundedAttributes(limits.max_span_attributes, immutable=False,
                                             max_value_len=limits.max_span_attribute_length)
        # made by the first event or link: most of a stream's life has none (each list is three objects
        # more for the cyclic GC to track per live stream)
        self._events = _NONE_YET
        self._links = _NONE_YET
        if _SPAN_END_METRICS:  # an older SDK's span has no such field (its end records no metrics)
            self._record_end_metrics = end_metrics
        if attributes:
            self.set_attributes(attributes)

    def set_attributes(self, attributes: Any) -> None:
        """As the SDK's; plain values under string keys are stored without its per-value cleaning."""
        bounded: BoundedAttributes = self._attributes  # type: ignore[assignment]
        stored = bounded._dict
        if (self._end_time is not None or bounded._immutable
                or (bounded.maxlen is not None and len(stored) + len(attributes) > bounded.maxlen)
                or not _plain(attributes)):
            super().set_attributes(attributes)  # cleaned, counted, evicted or refused as the SDK does
            return
        with self._lock:
            ended = self._end_time is not None
            if not ended:
                with bounded._lock:
                    for key in attributes:
                        if key in stored:  # a key set again moves to the end, as in the SDK's mapping
                            del stored[key]
                    stored.update(attributes)
        if ended:  # ended meanwhile, on another thread
            super().set_attributes(attributes)  # the SDK's warning; nothing is set

    def add_event(self, name: str, attributes: Attributes = None, timestamp: int | None = None) -> None:
        """As the SDK's."""
        if self._events is _NONE_YET:
            with self._lock:
                if self._events is _NONE_YET:
                    self._events = BoundedList(self._limits.max_events)
        if attributes:
            limits = self._limits
            maxlen = limits.max_event_attributes
            if (limits.max_attribute_length is None and (maxlen is None or len(attributes) <= maxlen)
                    and _plain(attributes)):
                # what the SDK's cleaning would store, stored without it (as set_attributes does): an
                # alert's six values cleaned one Python call each were most of its cost on the app's loop
                stored = BoundedAttributes(maxlen, None, immutable=True)
                stored._dict.update(attributes)
                self._add_event(Event(name=name, attributes=stored, timestamp=timestamp))
            else:
                super().add_event(name, attributes, timestamp)
        else:
            self._add_event(Event(name=name, attributes=_NO_EVENT_ATTRIBUTES, timestamp=timestamp))

    def add_link(self, context: SpanContext, attributes: Attributes = None) -> None:
        """As the SDK's."""
        if self._links is _NONE_YET:
            with self._lock:
                if self._links is _NONE_YET:
                    self._links = BoundedList(self._limits.max_links)
        super().add_link(context, attributes)


# --- where exporters sit, and what the batch processor drops -------------------------------------------
# The exporters' side of streamjudge (counting lost spans, joining vendor processors) reads the same
# private places; they are kept here so that the pins in tests/test_sdk_private_api.py cover them.


def active_processor(provider: object) -> object | None:
    """The processor an SDK provider calls (its composite), or None when ``provider`` is not one."""
    return getattr(provider, "_active_span_processor", None)


def child_processors(processor: object) -> tuple[SpanProcessor, ...]:
    """The processors an SDK composite (multi) processor calls; empty for any other processor."""
    return tuple(getattr(processor, "_span_processors", ()) or ())


def processor_exporter(processor: object) -> SpanExporter | None:
    """The exporter of the SDK's batch or simple span processor; None for any other processor."""
    if isinstance(processor, BatchSpanProcessor):
        exporter = getattr(getattr(processor, "_batch_processor", None), "_exporter", None)
    elif isinstance(processor, SimpleSpanProcessor):
        exporter = getattr(processor, "span_exporter", None)
    else:
        return None
    return exporter if isinstance(exporter, SpanExporter) else None


def set_processor_exporter(processor: SpanProcessor, exporter: SpanExporter) -> None:
    """Make the SDK's batch or simple span processor send through ``exporter`` from its next export on."""
    if isinstance(processor, BatchSpanProcessor):
        processor._batch_processor._exporter = exporter
    elif isinstance(processor, SimpleSpanProcessor):
        processor.span_exporter = exporter  # type: ignore[attr-defined]
    else:
        raise TypeError(f"{type(processor).__name__} is not the SDK's batch or simple span processor")


class _LossMetrics:
    """Stands in for the batch processor's own metrics object (the SDK's hook for what it drops): a span
    refused after shutdown is reported to ``on_lost``, and so is one dropped from a full queue unless
    :class:`_LossQueue` counts those (the SDK's own report races the exporting thread's pops); everything
    goes on to the SDK's metrics as before."""

    def __init__(self, inner: Any, on_lost: Callable[[int, str], None], *, queue_full: bool) -> None:
        self.inner = inner
        self.on_lost = on_lost
        self.queue_full = queue_full

    def register_queue_size(self, get_queue_size: Callable[[], int]) -> None:
        self.inner.register_queue_size(get_queue_size)

    # the SDK's arguments are passed on as given: 1.40-1.41 call drop_items(count) and
    # finish_items(count, error), later ones drop_items(count, error_type) and finish_items(count)
    def drop_items(self, count: int, *args: Any, **kwargs: Any) -> None:
        error_type = args[0] if args else kwargs.get("error_type", "queue_full")
        try:
            if error_type != "queue_full" or self.queue_full:
                self.on_lost(count, error_type)
        finally:
            self.inner.drop_items(count, *args, **kwargs)

    def finish_items(self, count: int, *args: Any, **kwargs: Any) -> None:
        self.inner.finish_items(count, *args, **kwargs)


class _LossQueue(deque[Any]):
    """The batch processor's bounded queue, counting what it pushes out: the SDK appends to a full deque,
    which silently drops the oldest span. Append and pop share a lock, so a span popped for export at the
    same moment is never counted as lost."""

    def __init__(self, maxlen: int | None, on_lost: Callable[[int, str], None]) -> None:
        super().__init__((), maxlen)
        self.on_lost = on_lost
        self.lock = threading.Lock()

    def appendleft(self, item: Any) -> None:
        with self.lock:
            full = len(self) == self.maxlen
            super().appendleft(item)
        if full:
            self.on_lost(1, "queue_full")

    def pop(self) -> Any:  # type: ignore[override]  # deque.pop takes no index
        with self.lock:
            return super().pop()


def _drain(queue: deque[Any]) -> int:
    n = 0
    while True:
        try:
            queue.pop()
        except IndexError:
            return n
        n += 1


def report_batch_losses(processor: BatchSpanProcessor, on_lost: Callable[[int, str], None]) -> bool:
    """Call ``on_lost(n, reason)`` for every span ``processor`` drops without exporting: ``queue_full``
    (the SDK drops silently while its queue is full, e.g. during a backend outage), ``already_shutdown``
    (ended after its shutdown) and ``shutdown`` (still queued when its shutdown gave up). Idempotent;
    False when this SDK keeps its queue elsewhere (nothing is reported then)."""
    batch = getattr(processor, "_batch_processor", None)
    metrics = getattr(batch, "_metrics", None)
    queue = getattr(batch, "_queue", None)
    lock = getattr(batch, "_export_lock", None)
    if batch is None or not hasattr(metrics, "drop_items") or not isinstance(queue, deque) or lock is None:
        return False
    if isinstance(metrics, _LossMetrics):
        return True
    # the exporting thread reads the queue's length, then pops that many: the queue is swapped while it
    # is not exporting (it holds this lock for a whole export; one stuck on a backend leaves the SDK's own,
    # racy count of full-queue drops in place)
    swapped = lock.acquire(timeout=2.0)
    if swapped:
        try:
            counted = _LossQueue(queue.maxlen, on_lost)
            batch._queue = counted
            while True:  # what was queued keeps its order, oldest at the right
                try:
                    counted.appendleft(queue.pop())
                except IndexError:
                    break
        finally:
            lock.release()
    batch._metrics = _LossMetrics(metrics, on_lost, queue_full=not swapped)
    shutdown = batch.shutdown

    def shutdown_counting(*args: Any, **kwargs: Any) -> None:
        # the SDK stops exporting once its shutdown timeout passed and clears nothing: what is still
        # queued then is never sent
        shutdown(*args, **kwargs)
        left = _drain(batch._queue)
        if left:
            on_lost(left, "shutdown")

    batch.shutdown = shutdown_counting
    return True


def vendor_export_filter(processor: object) -> Any:
    """The span filter a vendor SDK's processor (Langfuse's) keeps and reads on every span; None if none."""
    return getattr(processor, "_should_export_span", None)


def set_vendor_export_filter(processor: object, should_export_span: Callable[[Any], bool]) -> None:
    """Replace the span filter of a vendor SDK's processor (see :func:`vendor_export_filter`)."""
    processor._should_export_span = should_export_span  # type: ignore[attr-defined]
