"""Checkpoint spans made already ended (``streamjudge._sdk.EndedSpans``) and stream spans started without the
SDK's start work (``streamjudge._sdk.LiveSpan``) where nobody could tell them from the SDK's, and through the
tracer wherever someone could: a processor beside streamjudge's, a processor behind it with a start hook, a
sampler that drops them, an attribute length limit."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import (
    ReadableSpan,
    Span,
    SpanLimits,
    SpanProcessor,
    SynchronousMultiSpanProcessor,
    TracerProvider,
)
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import (
    ALWAYS_ON,
    Decision,
    ParentBased,
    Sampler,
    SamplingResult,
)
from opentelemetry.trace import Link, NonRecordingSpan, SpanContext, SpanKind, StatusCode
from opentelemetry.util.types import Attributes

import streamjudge
from _fakes import KeywordJudge
from streamjudge import _sdk, semconv
from streamjudge._sdk import LiveSpan
from streamjudge.config import Settings
from streamjudge.runtime import Runtime

ANSWER = ("The tower is 330 metres tall. It was completed in 1889. It stands in Paris. "
          "It was built for the World's Fair. It is made of wrought iron.")
CONTEXTS = ["The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889 for the World's Fair "
            "and is made of wrought iron."]


class _StartHook(SpanProcessor):
    """A processor behind streamjudge's that acts when a span starts."""

    def __init__(self) -> None:
        self.started: list[str] = []

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        self.started.append(span.name)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True  # the SDK's base class returns None before 1.42, which reads as a failed flush


class _DropCheckpoints(Sampler):
    """Samples everything but checkpoint spans."""

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: Any = None) -> SamplingResult:
        if name == semconv.SPAN_CHECKPOINT:
            return SamplingResult(Decision.DROP)
        return ParentBased(ALWAYS_ON).should_sample(parent_context, trace_id, name, kind, attributes, links)

    def get_description(self) -> str:
        return "drop-checkpoints"


@pytest.fixture()
def runtimes() -> Iterator[list[Runtime]]:
    made: list[Runtime] = []
    yield made
    for rt in made:
        rt.shutdown()


def _configure(runtimes: list[Runtime], provider: TracerProvider, downstream: SpanProcessor) -> Runtime:
    settings = Settings(preflight=False, final_reconcile=False, window_sentences=2, window_chars=10_000,
                        judge_processes=0)
    rt = streamjudge.configure(settings, tracer_provider=provider, downstream=downstream, judge=KeywordJudge(),
                               backends_from_env=False, set_global=False)
    runtimes.append(rt)
    return rt


def _stream(rt: Runtime) -> Any:
    tokens = [w + " " for w in ANSWER.split(" ")]
    stream = streamjudge.guard(tokens, question="How tall is the tower?", contexts=CONTEXTS, runtime=rt,
                               attributes={"app.tags": ["a", "b"], "app.user": "u1"})
    list(stream)
    assert rt.force_flush(30_000)
    return stream.session.span


def _run(runtimes: list[Runtime], provider: TracerProvider, downstream: SpanProcessor) -> Runtime:
    rt = _configure(runtimes, provider, downstream)
    _stream(rt)
    return rt


def _stream_span(exporter: InMemorySpanExporter) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_STREAM]
    return span


def _checkpoints(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return sorted((s for s in exporter.get_finished_spans() if s.name == semconv.SPAN_CHECKPOINT),
                  key=lambda s: s.attributes[semconv.CHECKPOINT_INDEX])  # type: ignore[index]


# what the session puts on a checkpoint span (the rest is its verdict's, which depends on timing: a queued
# checkpoint may be merged into the next one of its stream, "superseded")
_OWN = (semconv.SPAN_TYPE, semconv.OPENINFERENCE_SPAN_KIND, semconv.CHECKPOINT_INDEX,
        semconv.CHECKPOINT_CHAR_START, semconv.CHECKPOINT_CHAR_END, semconv.CHECKPOINT_SENTENCES,
        semconv.CHECKPOINT_FINAL, semconv.CHECKPOINT_TEXT, semconv.CHECKPOINT_TEXT_LENGTH,
        semconv.CHECKPOINT_TEXT_SHA256)


def _stable(span: ReadableSpan) -> dict[str, Any]:
    """The attributes the session put on a checkpoint span (its stream's id aside)."""
    return {k: v for k, v in (span.attributes or {}).items() if k in _OWN}


def _count_tracer_checkpoints(rt: Runtime, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    made: list[str] = []
    real = rt.tracer.start_span

    def start_span(name: str, *args: Any, **kwargs: Any) -> Any:
        made.append(name)
        return real(name, *args, **kwargs)

    monkeypatch.setattr(rt.tracer, "start_span", start_span)
    return made


def test_ended_checkpoint_spans_export_as_the_sdks_do(
    runtimes: list[Runtime], monkeypatch: pytest.MonkeyPatch
) -> None:
    # made ended: streamjudge's processor is the provider's only one and the exporter behind it has no hooks
    fast_out = InMemorySpanExporter()
    fast_provider = TracerProvider()
    rt = _configure(runtimes, fast_provider, SimpleSpanProcessor(fast_out))
    assert rt.ended_spans.usable()
    calls = _count_tracer_checkpoints(rt, monkeypatch)
    _stream(rt)
    assert semconv.SPAN_CHECKPOINT not in calls  # no live SDK span was made for a checkpoint
    fast = _checkpoints(fast_out)
    stream = next(s for s in fast_out.get_finished_spans() if s.name == semconv.SPAN_STREAM)

    # through the tracer: a processor beside streamjudge's would not see an ended span, so none is made
    slow_out = InMemorySpanExporter()
    slow_provider = TracerProvider()
    beside = InMemorySpanExporter()
    slow_provider.add_span_processor(SimpleSpanProcessor(beside))
    slow_rt = _run(runtimes, slow_provider, SimpleSpanProcessor(slow_out))
    assert not slow_rt.ended_spans.usable()
    slow = _checkpoints(slow_out)
    assert [s.name for s in beside.get_finished_spans()].count(semconv.SPAN_CHECKPOINT) == len(slow)

    assert len(fast) == len(slow) == 3
    for f, s in zip(fast, slow, strict=True):
        assert f.parent == stream.context
        assert f.context.trace_id == stream.context.trace_id and f.context.span_id != stream.context.span_id
        assert f.context.trace_flags == stream.context.trace_flags and f.context.trace_flags.sampled
        assert f.resource == stream.resource and f.instrumentation_scope == stream.instrumentation_scope
        assert f.kind == s.kind == SpanKind.INTERNAL and f.status.status_code == s.status.status_code
        assert f.start_time is not None and f.end_time is not None and f.start_time <= f.end_time
        assert _stable(f) == _stable(s) and len(_stable(f)) >= 7
        # enriched with its verdict, as the tracer's span is
        assert f.attributes[semconv.EVAL_STATUS] in ("judged", "superseded")  # type: ignore[index]
        assert s.attributes[semconv.EVAL_STATUS] in ("judged", "superseded")  # type: ignore[index]
        assert f.attributes[semconv.CHECKPOINT_TEXT]  # type: ignore[index]
    judged = [f for f in fast if f.attributes[semconv.EVAL_STATUS] == "judged"]  # type: ignore[index]
    assert judged and all(semconv.EVENT_EVALUATION_RESULT in [e.name for e in f.events] for f in judged)


def test_a_processor_behind_with_a_start_hook_gets_its_start(runtimes: list[Runtime]) -> None:
    out = InMemorySpanExporter()
    hook = _StartHook()
    behind = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    behind.add_span_processor(SimpleSpanProcessor(out))
    behind.add_span_processor(hook)
    rt = _run(runtimes, TracerProvider(), behind)
    assert not rt.ended_spans.usable()
    assert hook.started.count(semconv.SPAN_CHECKPOINT) == len(_checkpoints(out)) == 3


def test_a_sampler_that_drops_checkpoints_still_drops_them(runtimes: list[Runtime]) -> None:
    out = InMemorySpanExporter()
    rt = _run(runtimes, TracerProvider(sampler=_DropCheckpoints()), SimpleSpanProcessor(out))
    assert rt.ended_spans.usable()  # the set-up allows it; the sampler's answer sends it to the tracer
    names = [s.name for s in out.get_finished_spans()]
    assert semconv.SPAN_STREAM in names and semconv.SPAN_CHECKPOINT not in names


def test_an_attribute_length_limit_applies_to_checkpoint_text(runtimes: list[Runtime]) -> None:
    out = InMemorySpanExporter()
    provider = TracerProvider(span_limits=SpanLimits(max_span_attribute_length=12))
    rt = _run(runtimes, provider, SimpleSpanProcessor(out))
    assert not rt.ended_spans.usable()
    texts = [s.attributes[semconv.CHECKPOINT_TEXT] for s in _checkpoints(out)]  # type: ignore[index]
    assert texts and all(len(t) <= 12 for t in texts)  # type: ignore[arg-type]


# a stream span's attributes that differ from run to run: its ids, times and the answer's hash are the same
# text's, but the time to first token is not
_VARYING = (semconv.STREAM_ID, semconv.STREAM_TTFT_MS, semconv.STREAM_MODEL_TTFT_MS)


def test_stream_spans_export_as_the_sdks_do(runtimes: list[Runtime]) -> None:
    fast_out = InMemorySpanExporter()
    fast_rt = _configure(runtimes, TracerProvider(), SimpleSpanProcessor(fast_out))
    live = _stream(fast_rt)
    assert isinstance(live, LiveSpan) and isinstance(live, Span)  # the SDK's class, to whoever holds it
    assert not live.is_recording()

    slow_out = InMemorySpanExporter()
    slow_provider = TracerProvider()
    slow_provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    slow_rt = _configure(runtimes, slow_provider, SimpleSpanProcessor(slow_out))
    sdk = _stream(slow_rt)
    assert type(sdk) is not LiveSpan and isinstance(sdk, Span)

    f, s = _stream_span(fast_out), _stream_span(slow_out)
    assert f.parent is None and f.kind == s.kind == SpanKind.INTERNAL
    assert f.context.trace_flags == s.context.trace_flags and f.context.trace_flags.sampled
    assert f.resource == s.resource and f.instrumentation_scope == s.instrumentation_scope
    assert f.status.status_code == s.status.status_code
    assert f.start_time is not None and f.end_time is not None and f.start_time <= f.end_time
    fa = {k: v for k, v in (f.attributes or {}).items() if k not in _VARYING}
    sa = {k: v for k, v in (s.attributes or {}).items() if k not in _VARYING}
    assert fa == sa and len(fa) >= 15
    assert list(fa) == list(sa)  # in the same order
    assert fa["app.tags"] == ("a", "b")  # cleaned as the SDK cleans: a list becomes a tuple
    assert [e.name for e in f.events] == [e.name for e in s.events]
    assert [dict(e.attributes or {}) for e in f.events] == [dict(e.attributes or {}) for e in s.events]
    assert f.dropped_attributes == s.dropped_attributes == 0 and f.dropped_events == 0
    # the checkpoints are its children, in its trace
    cps = _checkpoints(fast_out)
    assert cps and all(c.parent == f.context for c in cps)
    # the flags are a value (an int): streams share one instance per value instead of a tracked object each
    again = _stream(fast_rt)
    assert again is not live and again.context.trace_flags is live.context.trace_flags
    assert f.context.trace_flags is live.context.trace_flags
    assert type(f.context.trace_flags) is type(s.context.trace_flags)


class _Counting(Sampler):
    """ParentBased(ALWAYS_ON), counting the spans it was asked about by name."""

    def __init__(self, decision: Decision = Decision.RECORD_AND_SAMPLE) -> None:
        self.asked: list[str] = []
        self.decision = decision

    def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                      kind: SpanKind | None = None, attributes: Attributes = None,
                      links: Sequence[Link] | None = None, trace_state: Any = None) -> SamplingResult:
        self.asked.append(name)
        if name == semconv.SPAN_STREAM:
            return SamplingResult(self.decision, attributes)
        return ParentBased(ALWAYS_ON).should_sample(parent_context, trace_id, name, kind, attributes, links)

    def get_description(self) -> str:
        return "counting"


@pytest.mark.parametrize("decision", [Decision.RECORD_AND_SAMPLE, Decision.RECORD_ONLY, Decision.DROP])
def test_a_stream_span_is_sampled_once_as_the_tracer_samples(
    runtimes: list[Runtime], decision: Decision
) -> None:
    sampler = _Counting(decision)
    out = InMemorySpanExporter()
    rt = _configure(runtimes, TracerProvider(sampler=sampler), SimpleSpanProcessor(out))
    span = _stream(rt)
    assert sampler.asked.count(semconv.SPAN_STREAM) == 1
    flags = span.get_span_context().trace_flags
    if decision is Decision.DROP:
        assert type(span) is NonRecordingSpan and not flags.sampled
        assert not out.get_finished_spans()
    elif decision is Decision.RECORD_ONLY:
        # recorded, not sampled: the processors get it (an exporter drops it), and nothing is judged
        assert isinstance(span, LiveSpan) and not flags.sampled
    else:
        assert isinstance(span, LiveSpan) and flags.sampled
        assert _stream_span(out).attributes[semconv.EVAL_STATUS] != "sampled_out"  # type: ignore[index]


def test_a_stream_span_under_a_start_hook_comes_from_the_tracer(runtimes: list[Runtime]) -> None:
    hook = _StartHook()
    behind = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    behind.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
    behind.add_span_processor(hook)
    rt = _configure(runtimes, TracerProvider(), behind)
    span = _stream(rt)
    assert type(span) is not LiveSpan and hook.started.count(semconv.SPAN_STREAM) == 1


def test_a_live_span_behaves_as_the_sdks(runtimes: list[Runtime]) -> None:
    """What a holder of ``session.span`` may do with it, side by side with the SDK's span."""
    limits = SpanLimits(max_span_attributes=4, max_events=2)
    linked = SpanContext(1, 2, is_remote=True)
    spans: list[ReadableSpan] = []
    for fast in (True, False):
        out = InMemorySpanExporter()
        provider = TracerProvider(span_limits=limits)
        if not fast:
            provider.add_span_processor(SimpleSpanProcessor(InMemorySpanExporter()))
        rt = _configure(runtimes, provider, SimpleSpanProcessor(out))
        span = rt.ended_spans.start("s", None, {"a": 1, "b": [1, 2]}, 1) if fast else None
        if span is None:
            span = rt.tracer.start_span("s", attributes={"a": 1, "b": [1, 2]}, start_time=1)
        assert isinstance(span, LiveSpan) is fast
        span.set_attributes({"c": "x", "a": 2})  # "a" set again: it moves to the end
        span.set_attributes({"d": 1.5, "e": True})  # past the count limit: the oldest ("b") is evicted
        span.set_attribute("f", ("p", "q"))
        span.set_attributes({"": 1, "g": None})  # an empty key is dropped and counted
        span.add_event("no attributes")
        span.add_event("with", {"k": ["v"]}, timestamp=5)
        span.add_event("third")  # past the event limit
        span.add_link(linked, {"why": "retry"})
        span.set_status(StatusCode.ERROR, "broken")
        span.update_name("renamed")
        span.record_exception(ValueError("bad"))
        span.end(end_time=10)
        span.set_attributes({"late": 1})  # ended: refused
        span.add_event("late")
        spans.append(_stream_span_named(out, "renamed"))
    f, s = spans
    assert dict(f.attributes or {}) == dict(s.attributes or {})
    assert list(f.attributes or {}) == list(s.attributes or {})
    assert f.dropped_attributes == s.dropped_attributes > 0
    assert [(e.name, dict(e.attributes or {}), e.timestamp if e.name == "with" else 0) for e in f.events] == [
        (e.name, dict(e.attributes or {}), e.timestamp if e.name == "with" else 0) for e in s.events]
    assert f.dropped_events == s.dropped_events > 0
    assert (f.status.status_code, f.status.description) == (s.status.status_code, s.status.description)
    assert (f.start_time, f.end_time) == (s.start_time, s.end_time) == (1, 10)
    assert [(k.context, dict(k.attributes or {})) for k in f.links] == [
        (k.context, dict(k.attributes or {})) for k in s.links] == [(linked, {"why": "retry"})]
    assert not _sdk._NONE_YET and _sdk._NONE_YET.dropped == 0  # the shared empty list stays empty


def _stream_span_named(exporter: InMemorySpanExporter, name: str) -> ReadableSpan:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == name]
    return span


@pytest.mark.parametrize("value_limit", [None, 3])
def test_a_live_spans_event_attributes_are_the_sdks(value_limit: int | None) -> None:
    """An event's plain attributes are stored without the SDK's cleaning; what the cleaning would change (a
    list, a count past the limit, a length limit, a bad key) still goes through it, with the same result."""
    limits = SpanLimits(max_event_attributes=3, max_attribute_length=value_limit)
    events = [
        ("plain", {"metric": "faithfulness", "score": 0.25, "index": 3, "ok": False}),
        ("plain", {"a": "x", "b": 1}),
        ("list", {"a": ["v", "w"], "b": 1}),
        ("bad key", {"": 1, "b": "long text"}),
        ("mixed", {"a": "long text", "b": (1, 2)}),
    ]
    spans: list[ReadableSpan] = []
    for fast in (True, False):
        out = InMemorySpanExporter()
        provider = TracerProvider(span_limits=limits)
        provider.add_span_processor(SimpleSpanProcessor(out))
        tracer = provider.get_tracer("t")
        span = tracer.start_span("s", start_time=1)
        if fast:  # the same span's context, as a LiveSpan (made directly: a length limit stops EndedSpans)
            span = LiveSpan(tracer, "s", span.get_span_context(), None, {}, 1, lambda: None)  # type: ignore[arg-type]
        for name, attributes in events:
            span.add_event(name, attributes, timestamp=2)
        span.end(end_time=10)
        spans.append(out.get_finished_spans()[-1])
    f, s = spans
    got = [(e.name, list((e.attributes or {}).items()), e.attributes.dropped) for e in f.events]  # type: ignore[union-attr]
    want = [(e.name, list((e.attributes or {}).items()), e.attributes.dropped) for e in s.events]  # type: ignore[union-attr]
    assert got == want
    assert got[0][2] == 1  # four attributes, three kept: the oldest dropped, as the SDK counts it
    for e in f.events:
        with pytest.raises(TypeError):
            e.attributes["new"] = 1  # type: ignore[index]  # immutable, as the SDK's


def test_a_checkpoint_span_is_sampled_as_the_sdks_sampler_samples(runtimes: list[Runtime]) -> None:
    """The SDK's default sampler is not asked about a checkpoint (its answer is known); a sampler of another
    class is, and so is a ParentBased whose delegate for a sampled local parent is not ALWAYS_ON."""
    from opentelemetry.sdk.trace.sampling import ALWAYS_OFF

    class Asking(ParentBased):
        def __init__(self, **kwargs: Any) -> None:
            super().__init__(ALWAYS_ON, **kwargs)
            self.asked: list[str] = []

        def should_sample(self, parent_context: Context | None, trace_id: int, name: str,
                          kind: SpanKind | None = None, attributes: Attributes = None,
                          links: Sequence[Link] | None = None, trace_state: Any = None) -> SamplingResult:
            self.asked.append(name)
            return super().should_sample(parent_context, trace_id, name, kind, attributes, links)

    asking = Asking()
    out = InMemorySpanExporter()
    _run(runtimes, TracerProvider(sampler=asking), SimpleSpanProcessor(out))
    assert asking.asked.count(semconv.SPAN_CHECKPOINT) == len(_checkpoints(out)) == 3

    asked: list[str] = []
    real = ParentBased.should_sample

    def counting(self: ParentBased, *a: Any, **k: Any) -> SamplingResult:
        asked.append(a[2])
        return real(self, *a, **k)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ParentBased, "should_sample", counting)
        out = InMemorySpanExporter()
        rt = _run(runtimes, TracerProvider(sampler=ParentBased(ALWAYS_ON)), SimpleSpanProcessor(out))
        assert rt.ended_spans.usable()
        assert not asked  # neither the checkpoints nor the stream span (a root: ALWAYS_ON decides it)
        cps = _checkpoints(out)
        stream = _stream_span(out)
        assert len(cps) == 3 and all(c.context.trace_state == stream.context.trace_state for c in cps)

    # a should_sample set on the instance (a wrapper, a counter) is asked, as the tracer asks it
    wrapped = ParentBased(ALWAYS_ON)
    seen: list[str] = []
    inner = wrapped.should_sample
    wrapped.should_sample = lambda *a, **k: seen.append(a[2]) or inner(*a, **k)  # type: ignore[method-assign]
    out = InMemorySpanExporter()
    _run(runtimes, TracerProvider(sampler=wrapped), SimpleSpanProcessor(out))
    assert seen.count(semconv.SPAN_CHECKPOINT) == len(_checkpoints(out)) == 3
    assert seen.count(semconv.SPAN_STREAM) == 1

    # the default class, told to drop a sampled parent's children: asked, and it drops them
    out = InMemorySpanExporter()
    _run(runtimes, TracerProvider(sampler=ParentBased(ALWAYS_ON, local_parent_sampled=ALWAYS_OFF)),
         SimpleSpanProcessor(out))
    names = [s.name for s in out.get_finished_spans()]
    assert semconv.SPAN_STREAM in names and semconv.SPAN_CHECKPOINT not in names


@pytest.mark.parametrize("remote", [False, True])
def test_a_stream_span_under_a_parent_is_sampled_as_the_sdks_sampler_samples(
    runtimes: list[Runtime], remote: bool
) -> None:
    """The default sampler's delegate for the stream span's parent decides, asked or not: a sampled parent's
    child is recorded in its trace with its trace state; an unsampled parent's is dropped."""
    from opentelemetry import trace as trace_api
    from opentelemetry.trace import TraceFlags, TraceState

    for sampled in (True, False):
        out = InMemorySpanExporter()
        rt = _configure(runtimes, TracerProvider(), SimpleSpanProcessor(out))
        parent = SpanContext(0x1234, 0x5678, is_remote=remote, trace_flags=TraceFlags(int(sampled)),
                             trace_state=TraceState([("vendor", "v1")]))
        ctx = trace_api.set_span_in_context(NonRecordingSpan(parent))
        tokens = [w + " " for w in ANSWER.split(" ")]
        list(streamjudge.guard(tokens, question="q", contexts=CONTEXTS, runtime=rt, context=ctx))
        assert rt.force_flush(30_000)
        spans = [s for s in out.get_finished_spans() if s.name == semconv.SPAN_STREAM]
        if not sampled:
            assert not spans
            continue
        (span,) = spans
        assert span.parent == parent and span.context.trace_id == 0x1234
        assert span.context.trace_state == parent.trace_state and span.context.trace_flags.sampled
