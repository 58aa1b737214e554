"""What a stream writes on its spans: end-of-stream attributes and text under the content-capture policy."""

from __future__ import annotations

import hashlib
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv

if TYPE_CHECKING:
    from streamjudge._sdk import EndedSpans


def capped(text: str, limit: int) -> str:
    """At most ``limit`` chars: the head and the tail of a longer text around an elision mark."""
    if len(text) <= limit:
        return text
    half = max(1, (limit - 3) // 2)
    return f"{text[:half]} … {text[-half:]}"


def sha256(text: str) -> str:
    """Hex digest of ``text`` (UTF-8): what stands for a text that is not captured."""
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


def text_attributes(
    keys: tuple[str, str, str], text: str, *, capture: bool, limit: int
) -> dict[str, AttributeValue]:
    """``text`` under ``keys`` = (text, length, sha256): the (capped) text when content is captured, its
    length and digest when it is not or when it was capped."""
    key, length_key, sha_key = keys
    out: dict[str, AttributeValue] = {}
    if capture:
        out[key] = capped(text, limit)
    if not capture or len(text) > limit:
        out[length_key] = len(text)
        out[sha_key] = sha256(text)
    return out


ANSWER_KEYS = (semconv.STREAM_ANSWER, semconv.STREAM_ANSWER_LENGTH, semconv.STREAM_ANSWER_SHA256)
CHECKPOINT_KEYS = (semconv.CHECKPOINT_TEXT, semconv.CHECKPOINT_TEXT_LENGTH, semconv.CHECKPOINT_TEXT_SHA256)


def skip_attributes(skips: Mapping[str, int]) -> dict[str, AttributeValue]:
    """Skip counts under static keys (two parallel arrays), never one attribute key per reason."""
    if not skips:
        return {}
    reasons = sorted(skips)
    return {semconv.SKIP_REASONS: reasons, semconv.SKIP_COUNTS: [skips[r] for r in reasons]}


def defer_final(
    span: trace.Span, text: str, question: str | None, contexts: tuple[str, ...] | None,
    reference: str | None, *, capture: bool, limit: int,
) -> None:
    """Leave the final pass to a ``streamjudge worker``: the answer span carries what it needs, once."""
    span.set_attribute(semconv.EVAL_STATUS, "deferred")
    if not capture:
        # the policy wins: a worker cannot judge what was not captured, and says so
        span.set_attribute(semconv.EVAL_SKIP_REASON, "deferred_without_content")
        return
    span.set_attribute(semconv.STREAM_ANSWER, text[:limit])  # whole, not capped for display
    span.set_attribute(semconv.STREAM_CONTEXTS, list(contexts or ()))
    if question is not None:
        span.set_attribute(semconv.STREAM_QUESTION, question)
    if reference is not None:
        span.set_attribute(semconv.STREAM_REFERENCE, reference)


class StreamSpans:
    """One stream's spans and timing: the stream span, its checkpoint spans and events, and the one time to
    first token (when the client's first token left; the model's first token is its own attribute).

    The session decides what happens; this object writes it down. End-of-stream attributes are kept in
    :attr:`late` and set in one call at :meth:`close` (each call takes the span's lock)."""

    __slots__ = ("_attributes", "_ended", "_name", "_parent", "_tracer", "first_ns", "late", "model_first_ns",
                 "recording", "request_ns", "skips", "span", "span_id", "start_ns", "stream_hex", "trace_id",
                 "ttft_ms")

    def __init__(self, tracer: trace.Tracer, ended: EndedSpans | None, name: str,
                 attributes: Mapping[str, AttributeValue] | None, parent: Context | None,
                 start_ns: int, request_ns: int) -> None:
        self._tracer = tracer
        self._ended = ended  # the process's maker of spans made ended (a runtime has one)
        self._name = name
        self._attributes = dict(attributes) if attributes else None
        self._parent = parent
        self.span: trace.Span | None = None
        self.span_id = 0
        self.trace_id = 0
        self.stream_hex = ""
        self.recording = False
        self.late: dict[str, AttributeValue] = {}
        #: when generation was requested (time to first token counts from here)
        self.start_ns = start_ns
        self.request_ns = request_ns  # when the request began (a second time to first token)
        self.first_ns = 0  # the client's first token (its event is added at close)
        self.model_first_ns = 0
        self.ttft_ms: float | None = None
        self.skips: dict[str, int] = {}

    @property
    def name(self) -> str:
        """The stream span's name."""
        return self._name

    def open_parent(self, parent: Context) -> None:
        """Where the stream began, for a span opened later (see ``GuardSession.prepare_late_start``)."""
        if self._parent is None:
            self._parent = parent

    @property
    def parent(self) -> Context | None:
        """The context the stream span is opened in."""
        return self._parent

    def open(self, mode: str, action: str) -> bool:
        """Start the stream span; True when it was made without the SDK's live span, so the checkpoints'
        spans can be made ended too."""
        self.start_ns = self.start_ns or time.time_ns()
        attrs: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM,
            semconv.OPENINFERENCE_SPAN_KIND: semconv.OPENINFERENCE_KIND_CHAIN,
            semconv.STREAM_MODE: mode,
            semconv.STREAM_ACTION: action,
        }
        if self._attributes:
            attrs.update(self._attributes)
        # where nobody could tell the difference, the SDK's span without its start hooks (see LiveSpan)
        ended = self._ended
        span = ended.start(self._name, self._parent, attrs, self.start_ns) if ended is not None else None
        made_ended = span is not None
        if span is None:
            span = self._tracer.start_span(self._name, context=self._parent, attributes=attrs,
                                           start_time=self.start_ns)
        self.span = span
        ctx = span.get_span_context()
        self.span_id = ctx.span_id
        self.trace_id = ctx.trace_id
        # a trace the tracing sampler dropped (a client's ``traceparent: ...-00``) reaches no processor
        self.recording = span.is_recording()
        self.stream_hex = format(ctx.span_id, "016x")
        self.late = {semconv.STREAM_ID: self.stream_hex}
        return made_ended

    # --- timing ------------------------------------------------------------------------------------
    def model_first(self, shown: bool) -> None:
        """The model's first token came; ``shown``: it goes to the client now (not held back)."""
        now = self.model_first_ns = time.time_ns()
        if shown:
            self.client_first(now)

    def client_first(self, now: int) -> None:
        """The client's first token left: the stream's time to first token."""
        self.first_ns = now
        self.ttft_ms = round((now - self.start_ns) / 1e6, 3)

    def timing_attributes(self) -> dict[str, AttributeValue]:
        """Time to first token (the client's, from the answer's start and from the request's) and the
        model's."""
        out: dict[str, AttributeValue] = {}
        if self.ttft_ms is not None:
            out[semconv.STREAM_TTFT_MS] = self.ttft_ms
            if self.request_ns:
                out[semconv.STREAM_TTFT_REQUEST_MS] = round((self.first_ns - self.request_ns) / 1e6, 3)
        if self.model_first_ns:
            out[semconv.STREAM_MODEL_TTFT_MS] = round((self.model_first_ns - self.start_ns) / 1e6, 3)
        return out

    # --- events --------------------------------------------------------------------------------------
    def event(self, name: str, attributes: Mapping[str, AttributeValue]) -> None:
        """An event on the stream span (alert, retract, stop)."""
        if self.span is not None:
            self.span.add_event(name, attributes)

    def skip(self, key: str) -> None:
        """Something was not judged: one event per distinct reason (a flood of drops must not push other
        events out of the span's bounded event list); the counts go on the span at the end."""
        n = self.skips.get(key, 0)
        self.skips[key] = n + 1
        if not n and self.span is not None:
            self.span.add_event(semconv.EVENT_SKIP, {semconv.SKIP_REASON: key})

    # --- checkpoint spans ------------------------------------------------------------------------------
    def checkpoint(self, attrs: dict[str, AttributeValue], text: dict[str, AttributeValue],
                   start_ns: int, end_ns: int) -> tuple[Any, trace.Span | None]:
        """A checkpoint span, child of the stream span: ``(span, live)``; ``live`` (the SDK's span, when
        one had to be made) is ended by :meth:`end_checkpoint`, after its judge request went out."""
        ended = self._ended
        if ended is not None and self.span is not None:
            # every attribute is known now: the span is made ended, without the SDK's live span (see
            # EndedSpans), where the provider's set-up lets nobody tell the difference
            cp = ended.make(semconv.SPAN_CHECKPOINT, self.span, attrs, start_ns, end_ns, text)
            if cp is not None:
                return cp, None
        parent = trace.set_span_in_context(self.span) if self.span is not None else None
        live = self._tracer.start_span(semconv.SPAN_CHECKPOINT, context=parent, attributes=attrs,
                                       start_time=start_ns)
        if live.is_recording():
            live.set_attributes(text)  # one call: each takes the span's lock
        return live, live

    def end_checkpoint(self, cp: Any, live: trace.Span | None, end_ns: int) -> None:
        """End a span :meth:`checkpoint` made."""
        if live is not None:
            live.end(end_time=end_ns)
        else:
            self._ended.end(cp)  # type: ignore[union-attr]

    # --- the end -------------------------------------------------------------------------------------
    def close(self, attrs: Mapping[str, AttributeValue], outcome: str) -> None:
        """Set the end-of-stream attributes (with :attr:`late`, the skips and the timing) in one call."""
        span = self.span
        assert span is not None
        late = self.late
        late.update(attrs)
        late.update(skip_attributes(self.skips))
        late.update(self.timing_attributes())
        ended_well = outcome in ("completed", "stopped")
        if not ended_well:
            late[semconv.EVAL_SKIP_REASON] = outcome
        span.set_attributes(late)
        if self.first_ns:
            span.add_event(semconv.EVENT_FIRST_TOKEN, timestamp=self.first_ns)
        if not ended_well:
            span.set_status(Status(StatusCode.ERROR, f"stream {outcome}"))
