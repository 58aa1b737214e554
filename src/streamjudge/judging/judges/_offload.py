"""``judge_processes="auto"``: the local judge in the app's process until it weighs on it, then in a worker.

The local judge is pure Python: run in the judge pool's thread it takes the application's GIL for every
call (0.4-0.7 ms of the pool thread's CPU per checkpoint with fresh contexts, measured), and under heavy
traffic that shows as event-loop lag and fewer tokens per second. In a worker process
(:class:`~streamjudge.judging.judges._process.ProcessJudge`) the app's side of a call is a pickle, a pipe
write and the reply (0.09-0.16 ms of the pool thread's CPU per call, measured). A worker costs a process
(~30 MB, 0.2 s to start) that a light app does not need, so :class:`AutoProcessJudge` starts one only
when the in-process judge is measured to need it:

- every in-process call's CPU time (on the pool's thread) is added to one process-wide meter, shared by
  the checkpoint and final tiers (they share the GIL too);
- once the judges took :data:`OFFLOAD_SHARE` of a core within one :data:`WINDOW_S` window, each auto
  judge starts its worker (both tiers share one: same settings, see ``_WorkerGroup.shared``) and keeps
  judging in-process until a first call came back from the worker (the worker is up and built its judge);
- a worker also starts before any of that when many judged streams are live at once
  (:data:`~streamjudge.judging.service.LOAD_STREAMS`, see :meth:`AutoProcessJudge.prepare_for_load`):
  their checkpoints are on their way, and measuring them in-process first would judge a second's worth
  of them under the app's GIL;
- from then on calls go to the worker. A call the worker cannot answer (it died, it cannot start) is
  judged in-process instead, so no verdict is lost; after :data:`_MAX_FAILURES` such calls in a row the
  worker is given up and judging stays in-process for :data:`_RETRY_S` before the meter may start one again;
- a worker that judged nothing for :data:`IDLE_S` is stopped (a burst does not keep a process for good):
  judging is back in-process, and the meter starts a worker again when the load comes back.

On one core too: there the worker takes CPU from the app's own core, but the kernel hands it back at once
(the worker runs niced and is preempted when the app's threads wake), while the pool's thread holds the GIL
until its call ends or the switch interval forces it off. Measured, 500 streams at 20 ms/token pinned to one
core: tokens/s 0.64-0.90x bare with the judge in-process (a third of the checkpoints merged), 0.96-0.99x
with a niced worker (all but a few judged; ``bench_scale.py --one-core``).

Not under a cgroup CPU quota of less than two cores: there a worker runs beside the app on another core and
spends the same quota, and once it is spent the kernel stops the whole group until the next period.
Measured, 500 streams at 20 ms/token under a one-core quota on a two-core host: ITL p99 27 ms with the judge
in-process, 37-55 ms with a worker kept to the pool's CPU share and 53-57 ms with one not kept to it. The
worker judges with the same deterministic code, so where a call is judged never changes its scores.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Sequence

from streamjudge._fork import after_fork_in_child
from streamjudge.config import Settings
from streamjudge.judging.base import EvalInput, Judge, JudgeError, JudgeResult, TransientJudgeError
from streamjudge.judging.judges._process import (
    Done,
    JudgeSpec,
    ProcessJudge,
    _Begun,
    cgroup_quota,
    small_quota,
)

__all__ = ["OFFLOAD_SHARE", "WINDOW_S", "AutoProcessJudge"]

_log = logging.getLogger(__name__)

#: share of one core the in-process judges may take within a window before a worker starts: a third of
#: the pool's default CPU cap (``judge_cpu_share``), so a worker starts before judging has to be throttled
OFFLOAD_SHARE = 0.05
#: seconds of the meter's window
WINDOW_S = 1.0
#: a worker that judged nothing for this many seconds is stopped
IDLE_S = 600.0
# a worker whose first call does not come back this soon is given up (it starts in ~0.2 s)
_WARM_UP_S = 15.0
_MAX_FAILURES = 3
# a call the worker has not answered in this long (plus a share per input char: the judge is linear in its
# input, ~0.5 us per char) is judged in-process instead and counts as a failure
_SLOW_S = 0.5
_SLOW_S_PER_CHAR = 2e-6
_RETRY_S = 60.0
# the first call a new worker answers: builds its judge and proves the pipes work
_WARM_UP_ITEM = EvalInput("", ("The worker is up.",), "The worker is up.", "checkpoint")


def _size(item: EvalInput) -> int:
    return len(item.answer) + len(item.prefix) + sum(len(c) for c in item.contexts)


class _Meter:
    """CPU the in-process auto judges took in the current window, process-wide."""

    def __init__(self) -> None:
        self.reset()
        after_fork_in_child(self, _Meter.reset)

    def reset(self) -> None:
        """Start afresh (a new window, no worker wanted); also a forked child's state."""
        self._lock = threading.Lock()
        self._since = time.monotonic()
        self._used = 0.0
        #: the judges took OFFLOAD_SHARE of a core within a window: every auto judge starts its worker
        self.wanted = False

    def add(self, cpu_s: float) -> bool:
        """Count ``cpu_s`` of judging in this process; True once a worker is wanted."""
        now = time.monotonic()
        with self._lock:
            if now - self._since > WINDOW_S:
                self._since, self._used = now, 0.0
            self._used += cpu_s
            if self._used >= OFFLOAD_SHARE * WINDOW_S:
                self.wanted = True
            return self.wanted


_METER = _Meter()


class AutoProcessJudge:
    """A judge in the judge pool's thread that moves to a worker process once its CPU weighs on the app.

    Implements the :class:`~streamjudge.judging.base.Judge` protocol (see the module docstring); results
    are the wrapped judge's, wherever it ran. ``evaluate`` must be awaited on one event loop at a time (the
    judge pool's).
    """

    def __init__(self, inner: Judge, spec: JudgeSpec) -> None:
        self.name = inner.name
        self.spec = spec
        self.scores_sentences = bool(getattr(inner, "scores_sentences", False))
        self._inner = inner
        self._remote: ProcessJudge | None = None
        self._ready = False  # the worker answered a call: calls go there
        self._warming: asyncio.Task[None] | None = None
        self._failures = 0
        self._not_before = 0.0  # no new worker before this (monotonic), after one was given up
        self._closed = False
        self._closing: set[asyncio.Task[None]] = set()
        self._last_call = 0.0  # monotonic time of the last call sent to the worker
        self._idle_timer: asyncio.TimerHandle | None = None
        after_fork_in_child(self, AutoProcessJudge._after_fork)

    @property
    def offloaded(self) -> bool:
        """Whether calls are judged in the worker process now."""
        return self._ready

    @property
    def batches_calls(self) -> bool:
        """Whether calls go out in batches now: once they go to the worker (see ``ProcessJudge``)."""
        return self._ready

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the worker (empty while judging in-process)."""
        return self._remote.pids if self._remote is not None else ()

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item``: in the worker once it is up, else in this thread (counted on the meter)."""
        remote = self._remote
        if self._ready and remote is not None:
            self._last_call = time.monotonic()
            try:
                # a worker that is slow to answer (stopped, starved of CPU) must not hold verdicts back
                # for the judge timeout: past a bound the call is judged here instead
                async with asyncio.timeout(_SLOW_S + _SLOW_S_PER_CHAR * _size(item)):
                    result = await remote.evaluate(item, metrics)
            except TransientJudgeError:
                raise
            except (JudgeError, TimeoutError) as exc:
                self._remote_failed(remote, exc if isinstance(exc, JudgeError) else JudgeError(
                    "no answer within its bound"))
            else:
                self._failures = 0
                return result
        return await self._judge_here(item, metrics)

    def begin(self, item: EvalInput, metrics: Sequence[str], done: Done) -> _AutoCall | None:
        """``evaluate`` without a task per call, once calls go to the worker (see
        :meth:`ProcessJudge.begin`): ``done`` gets the result or the error on the pool's loop, unless the
        returned call was cancelled first. None while judging in-process: the caller awaits ``evaluate``."""
        remote = self._remote
        if not self._ready or remote is None:
            return None
        self._last_call = time.monotonic()
        call = _AutoCall(self, remote, item, metrics, done, self._last_call)
        try:
            call.remote = remote.begin(item, metrics, call.replied)
        except JudgeError as exc:
            call.replied(None, exc)
        return call

    async def _judge_here(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        cpu = time.thread_time()
        try:
            return await self._inner.evaluate(item, metrics)
        finally:
            if _METER.add(time.thread_time() - cpu) and self._remote is None and not self._closed:
                self._start_worker()

    def prepare_for_load(self) -> None:
        """Start the worker now, before the load it is for is measured (the judging service calls this,
        on the pool's thread, when many judged streams are live at once)."""
        if self._remote is None and not self._closed:
            self._start_worker()

    def evaluate_sync(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """The wrapped judge's ``evaluate_sync``, in this thread (offline use; never offloaded)."""
        sync = getattr(self._inner, "evaluate_sync", None)
        if sync is None:
            raise TypeError(f"judge {self.name!r} has no evaluate_sync")
        return sync(item, metrics)  # type: ignore[no-any-return]

    def _start_worker(self) -> None:
        if time.monotonic() < self._not_before:
            return
        try:
            self._remote = ProcessJudge(self.spec, processes=1)
        except Exception as exc:  # cannot even start one: stay in-process for a while
            _log.warning("streamjudge: cannot start a judge worker (%s); judging in-process", exc)
            self._not_before = time.monotonic() + _RETRY_S
            return
        self._warming = asyncio.get_running_loop().create_task(self._warm_up(self._remote))

    async def _warm_up(self, remote: ProcessJudge) -> None:
        try:
            await asyncio.wait_for(remote.evaluate(_WARM_UP_ITEM, ("faithfulness",)), _WARM_UP_S)
        except (TimeoutError, JudgeError) as exc:
            self._give_up(remote, f"its first call failed: {exc or type(exc).__name__}")
            return
        finally:
            self._warming = None
        if self._remote is remote and not self._closed:
            self._ready = True
            self._failures = 0
            self._last_call = time.monotonic()
            self._idle_timer = asyncio.get_running_loop().call_later(IDLE_S, self._check_idle, remote)
            _log.info("streamjudge: the %s judge took over %d%% of a core in this process; judging in "
                      "worker process %s from now on", self.name, round(OFFLOAD_SHARE * 100),
                      ", ".join(map(str, remote.pids)) or "?")

    def _remote_failed(self, remote: ProcessJudge, exc: JudgeError) -> None:
        # the worker restarts itself after a death; judge this call here meanwhile
        self._failures += 1
        if self._failures >= _MAX_FAILURES:
            self._give_up(remote, f"{self._failures} calls in a row failed ({exc})")

    def _give_up(self, remote: ProcessJudge, why: str) -> None:
        if self._remote is not remote:
            return
        _log.warning("streamjudge: judge worker given up (%s); judging in-process for %gs", why, _RETRY_S)
        self._not_before = time.monotonic() + _RETRY_S
        # killed first: a stopped or stuck worker would make the polite stop wait on the pool's thread
        for pid in remote.pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
        self._drop(remote)

    def _check_idle(self, remote: ProcessJudge) -> None:
        self._idle_timer = None
        if self._remote is not remote or self._closed:
            return
        idle = time.monotonic() - self._last_call
        if idle < IDLE_S or remote.in_flight:  # look again when it would be idle long enough
            wait = IDLE_S - idle if idle < IDLE_S else IDLE_S
            self._idle_timer = asyncio.get_running_loop().call_later(wait, self._check_idle, remote)
            return
        _log.info("streamjudge: the %s judge's worker judged nothing for %gs; it stops, judging is back "
                  "in-process until the load is measured again", self.name, IDLE_S)
        self._drop(remote)

    def _drop(self, remote: ProcessJudge) -> None:
        """Judge in-process from now on and let ``remote`` go."""
        self._remote = None
        self._ready = False
        self._failures = 0
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        _METER.wanted = False  # the next worker only when the load is measured again
        with contextlib.suppress(RuntimeError):  # no running loop: the finalizer stops it
            task = asyncio.get_running_loop().create_task(remote.aclose())
            # the loop holds tasks weakly: keep this one until it ran
            self._closing.add(task)
            task.add_done_callback(self._closing.discard)

    async def aclose(self) -> None:
        """Stop the worker (if one started) and close the wrapped judge."""
        self._closed = True
        if self._idle_timer is not None:
            self._idle_timer.cancel()
            self._idle_timer = None
        warming, self._warming = self._warming, None
        if warming is not None:
            warming.cancel()
            # its outcome is moot now; a cancellation of this aclose itself still propagates
            await asyncio.gather(warming, return_exceptions=True)
        remote, self._remote = self._remote, None
        self._ready = False
        if remote is not None:
            await remote.aclose()
        await self._inner.aclose()

    def _after_fork(self) -> None:
        # the parent's worker is the parent's (its group already dropped our copies of the pipes): a forked
        # child judges in-process and measures its own load
        self._remote = None
        self._ready = False
        self._warming = None
        self._idle_timer = None  # the parent's loop's
        self._failures = 0

    def __repr__(self) -> str:
        where = "worker" if self._ready else "in-process"
        return f"AutoProcessJudge({self.name!r}, tier={self.spec.tier!r}, {where})"


class _AutoCall:
    """A call :meth:`AutoProcessJudge.begin` sent to the worker: judged in-process instead when the worker
    fails it or has not answered within its bound (as ``evaluate`` does), then ``done`` once."""

    __slots__ = (
        "_done",
        "_item",
        "_judge",
        "_metrics",
        "_over",
        "_remote_judge",
        "_slow_at",
        "_task",
        "remote",
    )

    def __init__(self, judge: AutoProcessJudge, remote_judge: ProcessJudge, item: EvalInput,
                 metrics: Sequence[str], done: Done, now: float) -> None:
        self._judge, self._remote_judge, self._item, self._metrics, self._done = (
            judge, remote_judge, item, metrics, done)
        self.remote: _Begun | None = None  # the worker's call (ProcessJudge.begin) while it is out
        self._slow_at = now + _SLOW_S + _SLOW_S_PER_CHAR * _size(item)
        self._task: asyncio.Task[None] | None = None
        self._over = False  # done called, or cancelled

    def replied(self, result: JudgeResult | None, error: BaseException | None) -> None:
        """The worker's answer (on the pool's loop)."""
        self.remote = None
        if self._over:
            return
        if error is None or isinstance(error, TransientJudgeError):
            if error is None:
                self._judge._failures = 0
            self._over = True
            self._done(result, error)
            return
        self._judge._remote_failed(self._remote_judge, error if isinstance(error, JudgeError)
                                   else JudgeError(str(error)))
        self._here()

    def tick(self, now: float) -> None:
        """Called by the pool while the call is out: past its bound, judge it here instead."""
        if self.remote is not None and now >= self._slow_at:
            remote, self.remote = self.remote, None
            remote.cancel()
            self._judge._remote_failed(self._remote_judge, JudgeError("no answer within its bound"))
            self._here()

    def cancel(self) -> None:
        """Give the call up: ``done`` is not called."""
        self._over = True
        remote, self.remote = self.remote, None
        if remote is not None:
            remote.cancel()
        task, self._task = self._task, None
        if task is not None:
            task.cancel()

    def _here(self) -> None:
        # the worker failed this call: judged in this thread, as evaluate() does (a task: the local judge
        # is a coroutine; this is the rare path)
        self._task = asyncio.get_running_loop().create_task(self._judge_in_process())

    async def _judge_in_process(self) -> None:
        try:
            result = await self._judge._judge_here(self._item, self._metrics)
        except asyncio.CancelledError:
            raise
        except BaseException as exc:  # given to the pool, which records it (SystemExit from a judge included)
            error: BaseException | None = exc
            result = None
        else:
            error = None
        self._task = None
        if not self._over:
            self._over = True
            self._done(result, error)


def auto_judge(name: str, settings: Settings, tier: str, inner: Judge) -> Judge:
    """``inner`` wrapped for ``judge_processes="auto"`` when offloading it can help, else ``inner``."""
    if name != "local" or small_quota(cgroup_quota()):
        return inner
    return AutoProcessJudge(inner, JudgeSpec(name, settings, tier))
