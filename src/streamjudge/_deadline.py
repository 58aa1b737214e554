"""One deadline for the whole shutdown (or flush) of a process, shared by every part that takes time.

Shutting down waits in several places one after the other: the judge pool drains, held spans are
exported, each sink (Langfuse scores, Phoenix annotations) flushes, each span exporter sends its last
batch. With a timeout of their own each, the waits add up (14.9 s against an unresponsive Langfuse,
35 s after a 3,000-stream run). Instead, whoever starts the shutdown opens :func:`shutdown_deadline`
and every part asks :func:`bounded_millis` / :func:`current_deadline` how long it may still take.

The deadline is process-wide, not a context variable: the waits happen on other threads (a batch
processor's worker, a bridge's loop) than the one that opened it.
"""

from __future__ import annotations

import contextlib
import math
import threading
import time
from collections.abc import Iterator, Mapping

from streamjudge.config import option_from_env

#: seconds a shutdown may take in all (judge pool, held spans, sinks, exporters)
DEFAULT_SHUTDOWN_TIMEOUT_S = 5.0
ENV_SHUTDOWN_TIMEOUT = "STREAMJUDGE_SHUTDOWN_TIMEOUT"
#: share of a shutdown deadline the judge pool may use to finish judgements in flight
POOL_SHARE = 0.7
#: time kept after the judge pool's drain to export what it judged, at least
EXPORT_RESERVE_S = 1.0


class Deadline:
    """A point in monotonic time; ``Deadline(None)`` never passes."""

    __slots__ = ("_at",)

    def __init__(self, timeout_s: float | None) -> None:
        self._at = math.inf if timeout_s is None else time.monotonic() + max(0.0, timeout_s)

    @classmethod
    def at(cls, monotonic: float) -> Deadline:
        """The deadline at ``monotonic`` (a ``time.monotonic()`` value)."""
        d = cls(None)
        d._at = monotonic
        return d

    @property
    def when(self) -> float:
        """The ``time.monotonic()`` value of the deadline (``inf`` for none)."""
        return self._at

    def remaining(self) -> float:
        """Seconds left, at least 0 (``inf`` for none)."""
        return max(0.0, self._at - time.monotonic())

    def remaining_millis(self) -> int:
        """Milliseconds left, for the SDK's ``timeout_millis`` parameters (capped at one day)."""
        return int(min(self.remaining(), 86_400.0) * 1000)

    @property
    def expired(self) -> bool:
        return time.monotonic() >= self._at

    def cap_millis(self, timeout_millis: float | None) -> int:
        """``timeout_millis`` cut to what is left of this deadline (``None`` = no timeout of its own)."""
        left = self.remaining_millis()
        if timeout_millis is None:
            return left
        return int(max(0.0, min(float(timeout_millis), left)))

    def part(self, fraction: float, *, keep_s: float = 0.0) -> Deadline:
        """An earlier deadline for one step: ``fraction`` of what is left, but leaving at least ``keep_s``
        for the steps after it (the judge pool's drain leaves time to export what it judged)."""
        left = self.remaining()
        if math.isinf(left):
            return Deadline(None)
        return Deadline(max(0.0, min(left * fraction, left - keep_s)))

    def __repr__(self) -> str:
        return f"Deadline(remaining={self.remaining():.3f}s)"


_lock = threading.Lock()
_active: list[Deadline] = []


def current_deadline() -> Deadline | None:
    """The earliest shutdown deadline open in this process, or None."""
    with _lock:
        return min(_active, key=lambda d: d.when) if _active else None


def bounded_millis(timeout_millis: float | None, default_millis: float | None = None) -> int | None:
    """``timeout_millis`` (or ``default_millis`` when it is None) cut to the open shutdown deadline.

    None when neither a timeout nor a deadline bounds the wait.
    """
    own = default_millis if timeout_millis is None else timeout_millis
    deadline = current_deadline()
    if deadline is None:
        return None if own is None else int(max(0.0, own))
    return deadline.cap_millis(own)


def pool_budget_millis(default_millis: float) -> int:
    """How long the judge pool may drain: ``default_millis``, cut to :data:`POOL_SHARE` of the open
    shutdown deadline while keeping :data:`EXPORT_RESERVE_S` for the export after it."""
    deadline = current_deadline()
    if deadline is None:
        return int(max(0.0, default_millis))
    return deadline.part(POOL_SHARE, keep_s=EXPORT_RESERVE_S).cap_millis(default_millis)


@contextlib.contextmanager
def shutdown_deadline(timeout_s: float | None = None) -> Iterator[Deadline]:
    """Open a process-wide deadline ``timeout_s`` from now (default :func:`shutdown_timeout_s`) for
    everything done inside the block, on any thread; nested blocks keep the earliest."""
    deadline = Deadline(shutdown_timeout_s() if timeout_s is None else timeout_s)
    with _lock:
        _active.append(deadline)
    try:
        yield deadline
    finally:
        with _lock, contextlib.suppress(ValueError):
            _active.remove(deadline)


def keep_open(deadline: Deadline) -> None:
    """Leave ``deadline`` open after its block ends: once a shutdown ran out of time, every later wait
    of the process (the SDK's atexit shutdown after a timed-out drain) returns at once instead of taking
    its own timeout again."""
    with _lock:
        _active.append(deadline)


def shutdown_timeout_s(env: Mapping[str, str] | None = None) -> float:
    """``STREAMJUDGE_SHUTDOWN_TIMEOUT`` in seconds (default 5); an unusable value is logged once and gives
    the default."""
    return float(option_from_env(ENV_SHUTDOWN_TIMEOUT, env))
