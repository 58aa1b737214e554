"""Received OTLP spans become SDK spans that encode back to the same protobuf: forwarding is lossless."""

from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import (
    Link,
    NonRecordingSpan,
    SpanContext,
    SpanKind,
    Status,
    StatusCode,
    TraceFlags,
    TraceState,
    set_span_in_context,
)

from streamjudge.worker._convert import spans
from worker._spans import app_trace, request


def _rich_spans() -> list:  # type: ignore[type-arg]
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": "svc", "deployment": "eu-1"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("scope.a", "1.2.3", schema_url="https://opentelemetry.io/schemas/1.30.0")
    remote = SpanContext(0xABC, 0xDEF, is_remote=True, trace_flags=TraceFlags(1),
                         trace_state=TraceState([("vendor", "v1")]))
    with tracer.start_as_current_span(
        "server", context=set_span_in_context(NonRecordingSpan(remote)), kind=SpanKind.SERVER,
        attributes={"s": "x", "b": True, "i": 7, "f": 0.5, "strs": ["a", "b"], "ints": [1, 2], "floats": [0.1]},
        links=[Link(SpanContext(0x1234, 0x5678, is_remote=True), {"why": "retry"})],
    ) as span:
        span.add_event("first", {"n": 1})
        span.set_status(Status(StatusCode.ERROR, "upstream failed"))
        with provider.get_tracer("scope.b").start_as_current_span("child", kind=SpanKind.CLIENT):
            pass
    provider.shutdown()
    return list(exporter.get_finished_spans())


def test_received_spans_encode_back_to_the_request_they_came_in() -> None:
    for original in (_rich_spans(), app_trace()):
        sent = encode_spans(original)
        received = [r.span for r in spans(sent)]
        assert encode_spans(received) == sent


def test_a_remote_parent_and_the_trace_state_survive() -> None:
    server = next(r.span for r in spans(encode_spans(_rich_spans())) if r.span.name == "server")
    assert server.parent is not None and server.parent.is_remote and server.parent.span_id == 0xDEF
    assert server.context is not None and server.context.trace_state.get("vendor") == "v1"
    assert server.kind is SpanKind.SERVER and server.status.status_code is StatusCode.ERROR
    assert server.attributes is not None and server.attributes["strs"] == ("a", "b")


def test_received_spans_count_as_sampled_whatever_their_flags_say() -> None:
    # the Python SDK's encoder sends only the is-remote bits: an unsampled span would be dropped by the
    # SDK's batch processor on the way out
    sent = request(app_trace())
    for rs in sent.resource_spans:
        for ss in rs.scope_spans:
            for s in ss.spans:
                assert s.flags & 0xFF == 0
    assert all(r.span.context is not None and r.span.context.trace_flags.sampled for r in spans(sent))


def test_each_span_costs_its_encoded_size() -> None:
    sent = request(app_trace())
    sizes = [r.size for r in spans(sent)]
    pb = [s.ByteSize() for rs in sent.resource_spans for ss in rs.scope_spans for s in ss.spans]
    assert sizes == pb and all(n > 0 for n in sizes)
