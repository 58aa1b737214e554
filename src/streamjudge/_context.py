"""Per-trace inputs of a judgement: the question, the retrieved contexts, an optional reference.

Retrieval ends before generation starts, so the contexts are fixed for the whole stream. They are kept
here once per trace (bounded, expiring) where the processor and the guard can reach them, instead of being
copied onto every checkpoint span. Instrumentation registers; the processor and the guard read.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from collections.abc import Sequence
from typing import NamedTuple

from streamjudge._fork import after_fork_in_child


class TraceInputs(NamedTuple):
    """What is known about a trace's RAG inputs so far (a named tuple: one is made per stream, and a frozen
    dataclass's constructor sets each field through ``object.__setattr__``)."""

    question: str | None = None
    contexts: tuple[str, ...] | None = None
    reference: str | None = None
    session_id: str | None = None


class ContextStore:
    """A thread-safe LRU of :class:`TraceInputs` by trace id, bounded in entries, in chars and in age.

    Entries stay after their stream ended (nodes after the answer, the final pass and tests read them);
    the char bound keeps requests with huge contexts from holding memory past it.
    """

    def __init__(self, max_traces: int = 10_000, ttl_s: float = 900.0, max_chars: int = 32_000_000) -> None:
        self._max = max_traces
        self._ttl = ttl_s
        self._max_chars = max_chars
        self._chars = 0
        self._lock = threading.Lock()
        self._data: OrderedDict[int, tuple[float, TraceInputs]] = OrderedDict()
        # a lock held by another thread at fork time would stay held forever in the child
        after_fork_in_child(self, ContextStore._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()

    def register(
        self,
        trace_id: int,
        *,
        question: str | None = None,
        contexts: Sequence[str] | None = None,
        reference: str | None = None,
        session_id: str | None = None,
    ) -> TraceInputs:
        """Record what is known for ``trace_id``; fields left ``None`` keep their earlier value.

        Contexts registered twice (a retriever then a reranker) are replaced by the later list, which is
        the one the generator saw. A passage is kept once (by content, whitespace aside): a document
        returned twice is one piece of evidence, and counting it twice skews context precision.
        """
        now = time.monotonic()
        ctx = _distinct(contexts) if contexts is not None else None
        with self._lock:
            item = self._data.pop(trace_id, None)
            if item is None:  # the usual case: the trace's first registration
                new = TraceInputs(question, ctx, reference, session_id)
            else:
                old = item[1]
                self._chars -= _chars(old)
                new = TraceInputs(
                    question if question is not None else old.question,
                    ctx if ctx is not None else old.contexts,
                    reference if reference is not None else old.reference,
                    session_id if session_id is not None else old.session_id,
                )
            data = self._data
            data[trace_id] = (now, new)
            self._chars += _chars(new)
            # entries are in registration order: the oldest is the first to expire
            if (len(data) > self._max or self._chars > self._max_chars
                    or now - next(iter(data.values()))[0] > self._ttl):
                self._evict(now)
            return new

    def get(self, trace_id: int) -> TraceInputs | None:
        """The inputs of ``trace_id``, or None when unknown or expired."""
        with self._lock:
            item = self._data.get(trace_id)
            if item is None:
                return None
            if time.monotonic() - item[0] > self._ttl:
                del self._data[trace_id]
                self._chars -= _chars(item[1])
                return None
            return item[1]

    def discard(self, trace_id: int) -> None:
        """Forget ``trace_id``."""
        with self._lock:
            item = self._data.pop(trace_id, None)
            if item is not None:
                self._chars -= _chars(item[1])

    @property
    def chars(self) -> int:
        """Chars of question, contexts and references held."""
        return self._chars

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)

    def _evict(self, now: float) -> None:
        while len(self._data) > self._max or (self._chars > self._max_chars and len(self._data) > 1):
            self._chars -= _chars(self._data.popitem(last=False)[1][1])
        # entries are in insertion (= registration time) order, so expired ones sit at the front
        while self._data:
            first = next(iter(self._data.values()))
            if now - first[0] <= self._ttl:
                break
            self._chars -= _chars(self._data.popitem(last=False)[1][1])


def _distinct(contexts: Sequence[str]) -> tuple[str, ...]:
    """``contexts`` in order, each passage once (compared with runs of whitespace collapsed)."""
    seen: set[str] = set()
    out: list[str] = []
    for text in contexts:
        key = " ".join(text.split())
        if key not in seen:
            seen.add(key)
            out.append(text)
    return tuple(out) if len(out) != len(contexts) else tuple(contexts)


def _chars(inputs: TraceInputs) -> int:
    question, contexts, reference, _session = inputs
    return len(question or "") + (sum(map(len, contexts)) if contexts else 0) + len(reference or "")


_default = ContextStore()


def default_store() -> ContextStore:
    """The process-wide store used by instrumentation, the guard and the processor."""
    return _default
