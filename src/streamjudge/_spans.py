"""Copies of ended spans: an ended span is immutable, so enriching or re-mapping one means a new one."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.util.types import AttributeValue


def copy_span(
    span: ReadableSpan,
    attributes: Mapping[str, AttributeValue] | None = None,
    events: Sequence[Event] = (),
) -> ReadableSpan:
    """``span`` with its attributes replaced by ``attributes`` (when given) and ``events`` appended."""
    return ReadableSpan(
        name=span.name,
        context=span.context,
        parent=span.parent,
        resource=span.resource,
        attributes=dict(attributes) if attributes is not None else span.attributes,
        events=(*span.events, *events) if events else span.events,
        links=span.links,
        kind=span.kind,
        status=span.status,
        start_time=span.start_time,
        end_time=span.end_time,
        instrumentation_scope=span.instrumentation_scope,
    )
