"""Checkpoint spans made already ended (``streamjudge._sdk.EndedSpans``) where nobody could tell them from the
SDK's, and through the tracer wherever someone could: a processor beside streamjudge's, a processor behind it
with a start hook, a sampler that drops them, an attribute length limit."""

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
from opentelemetry.trace import Link, SpanKind
from opentelemetry.util.types import Attributes

import streamjudge
from _fakes import KeywordJudge
from streamjudge import semconv
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


def _stream(rt: Runtime) -> None:
    tokens = [w + " " for w in ANSWER.split(" ")]
    list(streamjudge.guard(tokens, question="How tall is the tower?", contexts=CONTEXTS, runtime=rt))
    assert rt.force_flush(30_000)


def _run(runtimes: list[Runtime], provider: TracerProvider, downstream: SpanProcessor) -> Runtime:
    rt = _configure(runtimes, provider, downstream)
    _stream(rt)
    return rt


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
