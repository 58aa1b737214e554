"""Which judge jobs may run at all: sampling by trace and judge-call budgets. The pool asks; it executes.

Not thread-safe on its own: the pool calls it under its lock.
"""

from __future__ import annotations

import time


class Admission:
    """Sampling (the same answer for every job of a trace) and budgets (per stream, per minute)."""

    __slots__ = ("_global", "_per_stream", "_sample_threshold", "_stream_calls", "_window_calls",
                 "_window_start")

    def __init__(self, *, sample_rate: float = 1.0, per_stream_budget: int = 0,
                 global_budget_per_minute: int = 0) -> None:
        self._sample_threshold = int(sample_rate * (1 << 64))
        self._per_stream = per_stream_budget
        self._global = global_budget_per_minute
        self._stream_calls: dict[int, int] = {}
        self._window_start = time.monotonic()
        self._window_calls = 0

    def samples(self, trace_id: int) -> bool:
        """Whether jobs of ``trace_id`` are judged (0: not part of a trace, always)."""
        return not trace_id or (trace_id & 0xFFFFFFFFFFFFFFFF) < self._sample_threshold

    def take(self, stream_key: int) -> bool:
        """Spend one judge call of ``stream_key``'s and the global budget; False when either is used up."""
        if self._per_stream and stream_key:
            used = self._stream_calls.get(stream_key, 0)
            if used >= self._per_stream:
                return False
            self._stream_calls[stream_key] = used + 1
        if self._global:
            now = time.monotonic()
            if now - self._window_start >= 60.0:
                self._window_start, self._window_calls = now, 0
            if self._window_calls >= self._global:
                return False
            self._window_calls += 1
        return True

    def forget(self, stream_key: int) -> None:
        """A stream ended or went away: its budget is not kept."""
        self._stream_calls.pop(stream_key, None)

    @property
    def streams(self) -> int:
        """Streams whose per-stream budget is tracked (ended streams are forgotten)."""
        return len(self._stream_calls)
