"""How late the application's event loops run while they serve judged streams.

The judge pool's thread takes the application's GIL for every judge call it runs in-process (and for the
hand-offs of calls it sends to a worker process). A fixed cap on its CPU share wastes the CPU an app leaves
idle and still takes from an app that has none to spare. :class:`LoopLag` tells the pool which case it is
in: while a loop serves a judged stream, a timer on that loop fires every :data:`TICK_S` and records how late
it ran. A loop that keeps time has CPU (and the GIL) to spare; a loop whose timers run late is behind on the
app's own work, and the pool falls back to its floor share (see :class:`~streamjudge.judging.pool.JudgePool`).

The probe costs the loop one timer callback per tick (a few microseconds, 0.05% of a core at 10 ms) and
only runs while streams are live on it. Loops are held weakly: a closed loop and its probe are forgotten.
"""

from __future__ import annotations

import asyncio
import threading
import time
import weakref

__all__ = ["TICK_S", "LoopLag", "LoopProbe"]

#: seconds between a probe's timer callbacks: short enough that a share raised too far is noticed within a
#: few ticks, long enough to cost the loop nothing it would notice
TICK_S = 0.01


class LoopProbe:
    """The lateness timer of one event loop, running while judged streams are live on it.

    :meth:`open` and :meth:`close` bracket a stream; both are meant for the loop's own thread (a close from
    another thread is passed to the loop).
    """

    __slots__ = ("__weakref__", "_due", "_handle", "_loop", "_thread", "live", "worst")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # weakly: the loop's pending timer holds the probe, the probe must not keep a closed loop alive
        self._loop = weakref.ref(loop)
        self._thread = threading.get_ident()
        self._due = 0.0
        self._handle: asyncio.TimerHandle | None = None
        self.live = 0  # streams open on the loop
        self.worst = 0.0  # seconds: the latest tick since the pool last read it

    def open(self) -> None:
        """A stream started on this loop (called on its thread): tick while any is live."""
        self.live += 1
        loop = self._loop()
        if self._handle is None and loop is not None:
            self._schedule(loop)

    def close(self) -> None:
        """A stream opened with :meth:`open` ended."""
        loop = self._loop()
        if threading.get_ident() == self._thread or loop is None or loop.is_closed():
            self.live -= 1
            return
        try:
            loop.call_soon_threadsafe(self._dec)
        except RuntimeError:  # closed meanwhile: nothing ticks any more
            self.live -= 1

    @property
    def serving(self) -> bool:
        """Streams are live on the loop and it can run (a loop closed under a stream that never ended is
        not serving anything)."""
        loop = self._loop()
        return self.live > 0 and loop is not None and not loop.is_closed()

    def _dec(self) -> None:
        self.live -= 1

    def take(self) -> float:
        """The worst lateness since the last call (seconds), and start a new window. A tick that is due
        and has not run yet counts too: a loop blocked for a whole window records nothing itself."""
        worst, self.worst = self.worst, 0.0
        loop = self._loop()
        # (a loop that was stopped or closed with its tick pending is not late: it is not serving)
        if self._handle is not None and self.live > 0 and loop is not None and loop.is_running():
            worst = max(worst, time.monotonic() - self._due)
        return worst

    def _schedule(self, loop: asyncio.AbstractEventLoop) -> None:
        # lateness in time.monotonic terms (not loop.time, which a loop may cache per pass): the pool's
        # thread compares the due time of a tick that has not run with its own clock
        self._due = time.monotonic() + TICK_S
        self._handle = loop.call_later(TICK_S, self._tick)

    def _tick(self) -> None:
        late = time.monotonic() - self._due
        if late > self.worst:
            self.worst = late
        loop = self._loop()
        if self.live > 0 and loop is not None:
            self._schedule(loop)
        else:
            self._handle = None


class LoopLag:
    """Probes of the loops that serve judged streams, read by the judge pool's thread."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._probes: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, LoopProbe] = (
            weakref.WeakKeyDictionary()
        )

    def watch(self) -> LoopProbe | None:
        """Count a stream starting on the running loop (its probe ticks while any is live); None when no
        loop runs in this thread (a synchronous stream: nothing to measure)."""
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        probe = self._probes.get(loop)
        if probe is None:
            with self._lock:
                probe = self._probes.get(loop)
                if probe is None:
                    probe = self._probes[loop] = LoopProbe(loop)
        probe.open()
        return probe

    def take(self) -> float | None:
        """The worst lateness of any loop with live streams since the last call, in seconds; None when no
        loop serves a judged stream (then nothing says whether the app has CPU to spare)."""
        with self._lock:
            probes = list(self._probes.values())
        worst: float | None = None
        for probe in probes:
            late = probe.take()
            if probe.serving:
                worst = late if worst is None else max(worst, late)
        return worst
