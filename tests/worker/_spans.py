"""Spans as an application with a deferred final pass exports them, made with the real SDK."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from streamjudge import semconv

CONTEXTS = ("The Eiffel Tower was completed in 1889. It is 330 metres tall.",)
QUESTION = "When was the Eiffel Tower completed?"
GROUNDED = "The Eiffel Tower was completed in 1889. It is 330 metres tall."


def deferred_attributes(answer: str = GROUNDED, contexts: Sequence[str] = CONTEXTS,
                        question: str = QUESTION) -> dict[str, Any]:
    """What ``_defer_final`` leaves on the app's answer span."""
    return {
        semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM,
        semconv.EVAL_STATUS: "deferred",
        semconv.STREAM_ID: "00f067aa0ba902b7",
        semconv.STREAM_ANSWER: answer,
        semconv.STREAM_CONTEXTS: list(contexts),
        semconv.STREAM_QUESTION: question,
    }


def app_trace(
    answer_attributes: Mapping[str, Any] | None = None, *, checkpoints: int = 2, answer: bool = True,
    root: bool = True,
) -> list[ReadableSpan]:
    """request (root) > streamjudge.stream (the answer) > N checkpoint spans, in the order they end.

    ``answer=False`` leaves the answer span out (still streaming), ``root=False`` the root.
    """
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "rag-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("app")
    with (tracer.start_as_current_span("request", attributes={"http.route": "/chat"}),
          tracer.start_as_current_span(semconv.SPAN_STREAM) as stream):
        for i in range(checkpoints):
            with tracer.start_as_current_span(semconv.SPAN_CHECKPOINT, attributes={
                semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT, semconv.CHECKPOINT_INDEX: i,
                semconv.EVAL_STATUS: "judged",
            }):
                pass
        stream.set_attributes(dict(answer_attributes or deferred_attributes()))
    provider.shutdown()
    out = []
    for s in exporter.get_finished_spans():
        is_answer = (s.attributes or {}).get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM
        if (is_answer and not answer) or (s.parent is None and not root):
            continue
        out.append(s)
    return out


def request(spans: Sequence[ReadableSpan]) -> ExportTraceServiceRequest:
    """The OTLP request the SDK's exporter would send for ``spans``."""
    return encode_spans(list(spans))


def ids(span: ReadableSpan) -> tuple[int, int]:
    assert span.context is not None
    return span.context.trace_id, span.context.span_id
