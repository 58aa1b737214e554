"""The trace buffer: a trace's spans wait here until its deferred answer span has been judged.

Like the collector's tail sampling, a trace is held whole so that it leaves at once, its answer span
enriched: a consumer downstream (a tail sampler keeping failed answers, a trace UI) sees the complete trace
with its verdict. The buffer is bounded by span count, bytes and a decision wait; over a bound the oldest
trace leaves as it is, and the reason is counted. A trace leaves:

- ``judged``: every deferred answer span seen in it has its outcome (the worker tells :meth:`end_answer`);
- ``complete``: its root span arrived, no answer is being judged, and every stream a checkpoint span
  pointed at has arrived (a trace without a deferred answer does not wait for the decision wait);
- ``decision_wait``: no answer arrived within the decision wait;
- ``evicted_spans`` / ``evicted_bytes``: the buffer was over a bound (oldest trace first);
- ``shutdown``: the worker is stopping.

Spans of a trace that already left pass straight through (``late``): a trace's spans are held once, never
lost. The buffer has no thread and exports nothing itself: each call returns what leaves, and the caller
exports it outside the buffer's lock.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from opentelemetry.sdk.trace import ReadableSpan

from streamjudge import semconv
from streamjudge.worker._convert import Received

ReleaseReason = Literal[
    "judged", "complete", "decision_wait", "evicted_spans", "evicted_bytes", "shutdown", "late",
    "forwarded",  # not held at all (the worker's default): sent on as they came
]


@dataclass(frozen=True, slots=True)
class Release:
    """Spans leaving the buffer together, and why."""

    reason: ReleaseReason
    spans: tuple[ReadableSpan, ...]


@dataclass(slots=True)
class _Trace:
    first_at: float
    spans: list[ReadableSpan] = field(default_factory=list)
    size: int = 0
    judging: set[int] = field(default_factory=set)  # deferred answer spans awaiting their outcome
    root_seen: bool = False
    streams_expected: set[int] = field(default_factory=set)  # parents of checkpoint spans
    streams_seen: set[int] = field(default_factory=set)


class TraceBuffer:
    """Holds traces by id; thread-safe; every method returns the spans that leave."""

    def __init__(
        self,
        *,
        max_spans: int = 100_000,
        max_bytes: int = 256 * 1024 * 1024,
        decision_wait_s: float = 30.0,
        remember_traces: int = 200_000,
    ) -> None:
        if max_spans < 1 or max_bytes < 1 or decision_wait_s <= 0:
            raise ValueError("max_spans and max_bytes must be >= 1 and decision_wait_s > 0")
        self.max_spans = max_spans
        self.max_bytes = max_bytes
        self.decision_wait_s = decision_wait_s
        self._remember = remember_traces
        self._traces: OrderedDict[int, _Trace] = OrderedDict()  # oldest first
        self._left: OrderedDict[int, None] = OrderedDict()  # traces that left: later spans pass through
        self._spans = 0
        self._bytes = 0
        self._lock = threading.Lock()

    # --- sizes ---------------------------------------------------------------------------------------

    @property
    def traces(self) -> int:
        """Traces held."""
        return len(self._traces)

    @property
    def spans(self) -> int:
        """Spans held."""
        return self._spans

    @property
    def bytes(self) -> int:
        """Encoded bytes of the spans held."""
        return self._bytes

    @property
    def judging(self) -> int:
        """Traces waiting for an answer's outcome."""
        return sum(1 for t in self._traces.values() if t.judging)

    # --- arrivals ------------------------------------------------------------------------------------

    def add(self, received: Received, now: float) -> list[Release]:
        """Hold a span that is not a deferred answer; returns what leaves (itself when its trace left)."""
        span = received.span
        tid = received.trace_id
        with self._lock:
            if tid in self._left:
                return [Release("late", (span,))]
            t = self._traces.get(tid)
            if t is None:
                t = self._traces[tid] = _Trace(now)
            t.spans.append(span)
            t.size += received.size
            self._spans += 1
            self._bytes += received.size
            attrs = span.attributes or {}
            kind = attrs.get(semconv.SPAN_TYPE)
            if span.parent is None:
                t.root_seen = True
            if kind == semconv.SPAN_TYPE_CHECKPOINT and span.parent is not None:
                t.streams_expected.add(span.parent.span_id)
            elif kind == semconv.SPAN_TYPE_STREAM:
                t.streams_seen.add(received.span_id)
            out: list[Release] = []
            if self._complete(t):
                out.append(self._pop(tid, "complete"))
            out.extend(self._evict())
            return out

    def begin_answer(self, trace_id: int, span_id: int, now: float) -> bool:
        """A deferred answer span of ``trace_id`` is being judged: hold its trace until :meth:`end_answer`.

        False when the trace already left (the answer is judged on its own and leaves alone).
        """
        with self._lock:
            if trace_id in self._left:
                return False
            t = self._traces.get(trace_id)
            if t is None:
                t = self._traces[trace_id] = _Trace(now)
            t.judging.add(span_id)
            t.streams_seen.add(span_id)
            return True

    def end_answer(self, trace_id: int, span_id: int) -> list[Release]:
        """The answer span ``span_id`` has its outcome and left: its trace leaves once no answer is owed."""
        with self._lock:
            t = self._traces.get(trace_id)
            if t is None or span_id not in t.judging:
                return []
            t.judging.discard(span_id)
            if t.judging:
                return []
            return [self._pop(trace_id, "judged")]

    # --- time and shutdown ---------------------------------------------------------------------------

    def expire(self, now: float) -> list[Release]:
        """Traces that waited past the decision wait without an answer leave as they are."""
        out: list[Release] = []
        with self._lock:
            expired = [
                tid for tid, t in self._traces.items()
                if not t.judging and now - t.first_at >= self.decision_wait_s
            ]
            for tid in expired:
                out.append(self._pop(tid, "decision_wait"))
        return out

    def drain(self, *, judging: bool = True) -> list[Release]:
        """Held traces leave (shutdown); with ``judging=False`` only those not waiting for an answer's
        outcome (the others then leave with their answer, judged or marked)."""
        with self._lock:
            return [self._pop(tid, "shutdown") for tid, t in list(self._traces.items())
                    if judging or not t.judging]

    # --- inside the lock -----------------------------------------------------------------------------

    @staticmethod
    def _complete(t: _Trace) -> bool:
        return t.root_seen and not t.judging and t.streams_expected <= t.streams_seen

    def _evict(self) -> list[Release]:
        out: list[Release] = []
        while self._traces and (self._spans > self.max_spans or self._bytes > self.max_bytes):
            reason: ReleaseReason = "evicted_spans" if self._spans > self.max_spans else "evicted_bytes"
            oldest = next(iter(self._traces))
            out.append(self._pop(oldest, reason))
        return out

    def _pop(self, trace_id: int, reason: ReleaseReason) -> Release:
        t = self._traces.pop(trace_id)
        self._spans -= len(t.spans)
        self._bytes -= t.size
        self._left[trace_id] = None
        while len(self._left) > self._remember:
            self._left.popitem(last=False)
        return Release(reason, tuple(t.spans))


def spans_of(releases: Sequence[Release]) -> int:
    """How many spans ``releases`` carry."""
    return sum(len(r.spans) for r in releases)
