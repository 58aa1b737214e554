"""Received OTLP protobuf spans -> SDK ``ReadableSpan`` objects, so the SDK's processors and exporters (and
the judge span processor) handle them exactly as they handle a process's own spans.

What the SDK span model cannot hold is not invented: dropped-attribute counts restart at 0 and span flags are
recomputed from the parent's ``is_remote`` by the SDK's encoder. Everything else (ids, parent, trace state,
times, kind, status, attributes of every OTLP value type, events, links, resource, scope) passes through.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.common.v1.common_pb2 import InstrumentationScope as PBScope
from opentelemetry.proto.trace.v1.trace_pb2 import Span as PBSpan
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

# OTLP: 0 unspecified, 1 internal, 2 server, 3 client, 4 producer, 5 consumer; the SDK has no "unspecified"
_KINDS = {
    0: SpanKind.INTERNAL, 1: SpanKind.INTERNAL, 2: SpanKind.SERVER, 3: SpanKind.CLIENT,
    4: SpanKind.PRODUCER, 5: SpanKind.CONSUMER,
}
_STATUS = {0: StatusCode.UNSET, 1: StatusCode.OK, 2: StatusCode.ERROR}
_IS_REMOTE_KNOWN = 0x100  # SPAN_FLAGS_CONTEXT_HAS_IS_REMOTE_MASK
_IS_REMOTE = 0x200  # SPAN_FLAGS_CONTEXT_IS_REMOTE_MASK


@dataclass(frozen=True, slots=True)
class Received:
    """One received span, converted, with its encoded size (what it costs to hold)."""

    span: ReadableSpan
    size: int

    @property
    def trace_id(self) -> int:
        assert self.span.context is not None
        return int(self.span.context.trace_id)

    @property
    def span_id(self) -> int:
        assert self.span.context is not None
        return int(self.span.context.span_id)


def value(v: AnyValue) -> Any:
    """An OTLP attribute value as the SDK holds it (arrays as tuples, maps as dicts, bytes as bytes)."""
    kind = v.WhichOneof("value")
    if kind is None:
        return None
    if kind == "array_value":
        return tuple(value(x) for x in v.array_value.values)
    if kind == "kvlist_value":
        return {kv.key: value(kv.value) for kv in v.kvlist_value.values}
    return getattr(v, kind)


def attributes(kvs: Any) -> dict[str, Any]:
    """Key-values -> a dict (an empty OTLP value is skipped, as the SDK never holds ``None``)."""
    out: dict[str, Any] = {}
    kv: KeyValue
    for kv in kvs:
        v = value(kv.value)
        if v is not None:
            out[kv.key] = v
    return out


def _trace_state(header: str) -> TraceState | None:
    return TraceState.from_header([header]) if header else None


def _scope(pb: PBScope, schema_url: str) -> InstrumentationScope:
    return InstrumentationScope(pb.name, pb.version or None, schema_url or None,
                                attributes(pb.attributes) or None)


def _span(pb: PBSpan, resource: Resource, scope: InstrumentationScope) -> ReadableSpan:
    trace_id = int.from_bytes(pb.trace_id, "big")
    # an exported span was sampled, whatever its flags say (the Python SDK sends only the is-remote bits);
    # unsampled, the SDK's batch processor would drop it
    flags = TraceFlags((pb.flags & 0xFF) | TraceFlags.SAMPLED)
    state = _trace_state(pb.trace_state)
    context = SpanContext(trace_id, int.from_bytes(pb.span_id, "big"), is_remote=False,
                          trace_flags=flags, trace_state=state)
    parent = None
    if pb.parent_span_id:
        remote = bool(pb.flags & _IS_REMOTE) if pb.flags & _IS_REMOTE_KNOWN else False
        parent = SpanContext(trace_id, int.from_bytes(pb.parent_span_id, "big"), is_remote=remote,
                             trace_flags=flags)
    events = tuple(Event(e.name, attributes(e.attributes), e.time_unix_nano) for e in pb.events)
    links = tuple(
        Link(SpanContext(int.from_bytes(ln.trace_id, "big"), int.from_bytes(ln.span_id, "big"),
                         is_remote=bool(ln.flags & _IS_REMOTE), trace_flags=TraceFlags(ln.flags & 0xFF),
                         trace_state=_trace_state(ln.trace_state)),
             attributes(ln.attributes))
        for ln in pb.links
    )
    status = Status(_STATUS.get(pb.status.code, StatusCode.UNSET), pb.status.message or None)
    return ReadableSpan(
        name=pb.name,
        context=context,
        parent=parent,
        resource=resource,
        attributes=attributes(pb.attributes),
        events=events,
        links=links,
        kind=_KINDS.get(pb.kind, SpanKind.INTERNAL),
        status=status,
        start_time=pb.start_time_unix_nano,
        end_time=pb.end_time_unix_nano,
        instrumentation_scope=scope,
    )


def spans(request: ExportTraceServiceRequest) -> Iterator[Received]:
    """The spans of one OTLP export request, in order. Spans of one resource share one ``Resource``
    object and spans of one scope one ``InstrumentationScope``, so the exporter groups them again."""
    for rs in request.resource_spans:
        resource = Resource(attributes(rs.resource.attributes), rs.schema_url or None)
        for ss in rs.scope_spans:
            scope = _scope(ss.scope, ss.schema_url)
            for pb in ss.spans:
                yield Received(_span(pb, resource, scope), pb.ByteSize())
