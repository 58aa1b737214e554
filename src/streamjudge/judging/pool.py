"""The judge pool: runs judge calls on its own event-loop thread, never on the application's.

One small class owns one job, like the SDK's BatchProcessor: a bounded queue, one worker thread with its own
event loop, a wake-up, a fixed number of concurrent judge calls. Every submitted job gets exactly one
:class:`JobOutcome` through its callback — judged, or the reason it was not — so a span held for its scores
is always released.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import itertools
import logging
import random
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from opentelemetry import context as otel_context
from opentelemetry import metrics

from streamjudge import _sdk, semconv
from streamjudge._fork import after_fork_in_child
from streamjudge._redact import redact
from streamjudge._wakefd import WakeFd, new_pool_loop
from streamjudge.judging._admission import Admission
from streamjudge.judging._lag import LoopLag, LoopProbe
from streamjudge.judging.base import EvalInput, Judge, JudgeResult, Score, TransientJudgeError
from streamjudge.results import JobOutcome, JobStatus

if TYPE_CHECKING:
    from streamjudge.config import Settings

__all__ = ["JobOutcome", "JobStatus", "JudgeJob", "JudgePool"]

_log = logging.getLogger(__name__)

_MAX_BACKOFF_S = 10.0
_POLL_S = 0.001  # the idle dispatcher's polling period while it lingers
# the CPU share follows the app's loops (see _share_now): read their lateness this often, raise the share by
# a step while every loop keeps time, halve it (down to the floor) when one runs late
_ADAPT_S = 0.05
_SHARE_STEP = 0.1
# for a judge whose calls go out in batches (``batches_calls``: a worker process's), a throttled dispatcher
# sleeps until its debt is this much below the burst, not just back at it: it then starts the several jobs
# queued meanwhile in one pass, whose calls go out in one pipe write and come back together. Woken at the
# burst line it would start one job per sleep, and each job would pay its own write, reply read and loop
# passes, about doubling the pool thread's CPU per call under a full queue. A judge in this thread gains
# nothing from it (each call is its own CPU) and would hold the GIL for several calls in a row: it keeps
# waking at the line
_RESUME_S = 0.002
# what every judge call runs in (see JudgePool._run)
_QUIET = _sdk.quiet_context()
# how often the deadlines of calls made without a task (a judge's ``begin``) are checked: one timer for all
# of them, not one each
_SWEEP_S = 0.05
# a job submitted while the dispatcher sleeps with calls out to a worker waits for their next reply (or the
# sweep) instead of a wake-up, where those calls come back this fast (their recent mean): the worker would
# judge it after them anyway, and the wake-up costs the submitting thread - the app's, streaming tokens - a
# syscall and a GIL hand-off per checkpoint
_REPLY_SOON_S = 0.005


@dataclass(slots=True)
class JudgeJob:
    """One judge call to make. ``callback`` is called exactly once, on the pool's thread."""

    judge: Judge
    item: EvalInput
    metrics: tuple[str, ...]
    callback: Callable[[JobOutcome], None]
    stream_key: int = 0  # jobs of one stream share it (0 = none)
    sample_key: int = 0  # trace id: all jobs of a trace are sampled in or out together
    coalesce: bool = False  # a newer coalescing job of the same stream replaces this one while queued
    # builds the job that replaces a queued older one and covers its work too (None: cannot be joined)
    merge: Callable[[JudgeJob], JudgeJob | None] | None = None
    tag: Any = None  # the submitter's own reference (the judging service keeps its request here)
    # a stream is waiting for this one (a checkpoint, a pre-flight gate): it runs before queued background
    # work (final passes), so a backlog of whole answers never delays a warning the reader still needs
    live: bool = False
    size: int = 0  # chars of text the job holds, counted against the queue's byte bound
    enqueued_at: float = field(default=0.0)


class _Slot:
    """A queue entry whose job can be swapped in place (coalescing keeps the queue position)."""

    __slots__ = ("job",)

    def __init__(self, job: JudgeJob) -> None:
        self.job: JudgeJob | None = job


class _Call:
    """A running job whose judge took it with ``begin`` (see ``ProcessJudge.begin``): what ``_run`` does
    for a coroutine judge, done by callbacks on the pool's loop instead of a task.

    The judge calls ``replied`` once with the result or the error, unless the call was cancelled first;
    the pool's sweep gives the call up at its deadline (``timeout``) and lets the judge check its own
    (``tick``). A transient error's retries run as ``_run`` does, in a task."""

    __slots__ = ("_deadline", "_handle", "_job", "_pool", "_started", "over")

    def __init__(self, pool: JudgePool, job: JudgeJob) -> None:
        self._pool, self._job = pool, job
        self._handle: Any = None
        self._started = self._deadline = 0.0
        self.over = False  # its outcome is delivered (or it went on in a task)

    def start(self, begin: Callable[..., Any]) -> bool:
        """Hand the job to ``begin``; False when the judge declined (the job is untouched)."""
        job = self._job
        self._started = time.monotonic()
        token = otel_context.attach(_QUIET)  # as _run: a judge's own I/O never lands in a judged trace
        try:
            handle = begin(job.item, job.metrics, self.replied)
        except Exception as exc:  # as an error from evaluate(): the job's outcome, never the pool's end
            self.replied(None, exc)
            return True
        finally:
            otel_context.detach(token)
        if handle is None:
            return False
        # from after the send: a call given up at its deadline has waited a whole judge timeout, which is
        # when a worker's group takes it for stuck
        self._deadline = time.monotonic() + self._pool._timeout_s
        if not self.over:
            self._handle = handle
        return True

    def replied(self, result: JudgeResult | None, error: BaseException | None) -> None:
        """The judge's answer (on the pool's loop)."""
        if self.over:
            return
        self._handle = None
        pool = self._pool
        if error is None:
            try:
                _check_result(result)
            except TypeError as exc:
                error = exc
            else:
                assert result is not None
                took = time.monotonic() - self._started
                pool._m_duration.record(took, {semconv.METRIC_ATTR_JUDGE: result.judge})
                pool._call_s = took if pool._call_s == float("inf") else 0.8 * pool._call_s + 0.2 * took
                self._end(JobOutcome("judged", result, attempts=1))
                return
        if isinstance(error, TransientJudgeError) and pool._max_retries >= 1:
            # retried as _run retries (after its backoff, each attempt with its own timeout): a rare path
            self._retry(error)
            return
        self._end(JobOutcome("error", error=_describe(error), attempts=1))

    def tick(self, now: float) -> None:
        """The pool's sweep: past the deadline the call is given up as timed out."""
        handle = self._handle
        if self.over or handle is None:
            return
        if now >= self._deadline:
            self._handle = None
            handle.cancel()
            self._end(JobOutcome("timeout", error=f"judge call exceeded {self._pool._timeout_s:g}s",
                                 attempts=1))
        else:
            handle.tick(now)

    def cancel(self) -> None:
        """Cancel the call (cancel_stream, shutdown): its outcome says so."""
        if self.over:
            return
        handle, self._handle = self._handle, None
        if handle is not None:
            handle.cancel()
        self._end(JobOutcome("shutdown" if self._pool._closed else "cancelled"))

    def _retry(self, error: TransientJudgeError) -> None:
        pool, job = self._pool, self._job
        self.over = True
        task = pool._spawn(job, error)
        with pool._lock:
            pool._running.pop(self, None)
            pool._calls -= 1
            pool._running[task] = job
        pool._watch(task)
        pool._wake_for_queued()  # one call fewer out: a job queued behind it may wait for no reply

    def _end(self, outcome: JobOutcome) -> None:
        pool = self._pool
        self.over = True
        if outcome.status == "error":
            pool._m_errors.add(1, {semconv.METRIC_ATTR_JUDGE: getattr(self._job.judge, "name", "?")})
        # the outcome goes out before the job stops counting as running (as _task_done): force_flush
        # never returns while a callback is still owed
        pool._finish(self._job, outcome, outcome.attempts)
        assert pool._sem is not None
        pool._sem.release()
        with pool._lock:
            if pool._running.pop(self, None) is not None:
                pool._calls -= 1
            pool._active -= 1  # once: `over` keeps a call from ending twice
            if pool._taken is self._job:  # failed inside begin(), before _begin registered it
                pool._taken = None
            pool._notify_if_idle()
        pool._wake_for_queued()


class JudgePool:
    """Bounded, concurrent, fork-safe executor for judge calls.

    ``submit`` is cheap and thread-safe and never blocks; it may be called from any thread (the span
    processor calls it from whichever thread ended the span).
    """

    def __init__(
        self,
        *,
        concurrency: int = 4,
        queue_size: int = 4096,
        timeout_s: float = 30.0,
        max_retries: int = 2,
        backoff_s: float = 0.2,
        sample_rate: float = 1.0,
        per_stream_budget: int = 0,
        global_budget_per_minute: int = 0,
        max_queue_wait_s: float = 60.0,
        max_queue_bytes: int = 0,
        cpu_share: float = 0.0,
        cpu_share_max: float = 0.0,
        cpu_burst_s: float = 0.05,
        linger_s: float = 0.0,
        meter_provider: metrics.MeterProvider | None = None,
    ) -> None:
        self._concurrency = concurrency
        self._queue_size = queue_size
        self._timeout_s = timeout_s
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._admission_args = (sample_rate, per_stream_budget, global_budget_per_minute)
        self._max_queue_wait_s = max_queue_wait_s
        # queued text is bounded by size too: a few huge answers must not hold gigabytes (0 = no bound)
        self._max_queue_bytes = max_queue_bytes
        # the pool thread's CPU (judges, callbacks) is taken from the application under the GIL: cap its
        # share of wall time, allowing a burst so an isolated checkpoint is judged at once. The cap is
        # `cpu_share` while an app's loop runs late or no loop serving a judged stream says otherwise, and
        # rises towards `cpu_share_max` while those loops keep time: CPU the app leaves idle is used
        self._cpu_share = cpu_share if 0.0 < cpu_share < 1.0 else 0.0
        self._cpu_share_max = min(max(cpu_share_max, self._cpu_share), 0.95) if self._cpu_share else 0.0
        self._cpu_burst = cpu_burst_s
        self._resume_s = 0.0  # _RESUME_S while the last job's judge batches its calls
        # a loop is late when a timer runs later than two GIL switch intervals: one is what any thread
        # that computes makes a waking loop wait (the app's own included), more is a backlog
        self._lag_limit_s = max(0.01, 2 * sys.getswitchinterval())
        # after a job the dispatcher polls for `linger_s` before sleeping until woken: a wake-up of a
        # sleeping thread costs the submitting (token-streaming) thread a syscall and, on an idle CPU, a
        # millisecond or more of latency; polling costs GIL hand-offs, which a CPU-bound server feels
        self._linger_s = linger_s
        self._judges: set[Judge] = set()
        meter = metrics.get_meter(semconv.METER_NAME, meter_provider=meter_provider)
        self._m_duration = meter.create_histogram(
            semconv.METRIC_JUDGE_DURATION, unit="s", description="Judge call latency"
        )
        self._m_drops = meter.create_counter(
            semconv.METRIC_DROPS, description="Judge jobs not judged, by reason"
        )
        self._m_errors = meter.create_counter(semconv.METRIC_JUDGE_ERRORS, description="Judge call failures")
        meter.create_observable_gauge(
            semconv.METRIC_QUEUE_DEPTH,
            callbacks=[self._observe_depth],
            description="Judge jobs queued or running",
        )
        # alert rules compare the depth with this rather than with a hard-coded default size
        meter.create_observable_gauge(
            semconv.METRIC_QUEUE_CAPACITY,
            callbacks=[lambda _o: [metrics.Observation(self._queue_size)]],
            description="Judge jobs the queue holds before it drops",
        )
        self._init_state()
        # a forked worker must not share the parent's loop thread, queue or locks
        after_fork_in_child(self, JudgePool._init_state)

    @classmethod
    def from_settings(
        cls, settings: Settings, meter_provider: metrics.MeterProvider | None = None, *, in_app: bool = True
    ) -> JudgePool:
        """A pool configured by ``settings``. ``in_app=False`` is for a process that does nothing but judge
        (``streamjudge worker``): whole answers of many streams, so no per-stream budget, and no CPU cap
        against an application it does not share a GIL with."""
        return cls(
            concurrency=settings.concurrency,
            queue_size=settings.queue_size,
            timeout_s=settings.judge_timeout_s,
            max_retries=settings.max_retries,
            backoff_s=settings.retry_backoff_s,
            sample_rate=settings.sample_rate,
            per_stream_budget=settings.per_stream_budget if in_app else 0,
            global_budget_per_minute=settings.global_budget_per_minute,
            max_queue_wait_s=settings.hold_timeout_s,
            max_queue_bytes=settings.max_queue_chars,
            cpu_share=settings.judge_cpu_share if in_app else 0.0,
            cpu_share_max=settings.judge_cpu_share_max if in_app else 0.0,
            linger_s=settings.judge_linger_s if in_app else 0.0,
            meter_provider=meter_provider,
        )

    # --- state ---------------------------------------------------------------------------------

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._idle = threading.Condition(self._lock)
        self._queue: deque[_Slot] = deque()  # live jobs: a stream waits for their verdicts
        self._later: deque[_Slot] = deque()  # background jobs (final passes): run when no live job waits
        self._queued = 0
        self._queued_bytes = 0
        self._coalescable: dict[int, _Slot] = {}
        rate, per_stream, per_minute = self._admission_args
        self._admission = Admission(sample_rate=rate, per_stream_budget=per_stream,
                                    global_budget_per_minute=per_minute)
        # running jobs by their task, or by their _Call (a judge's ``begin``): either has cancel()
        self._running: dict[asyncio.Task[None] | _Call, JudgeJob] = {}
        self._calls = 0  # of them _Calls
        # the recent mean time of a _Call (see _REPLY_SOON_S); none measured yet: never "soon"
        self._call_s = float("inf")
        self._sweep: asyncio.TimerHandle | None = None
        # the job the pool's thread took from the queue and has not started yet, and whether its stream was
        # cancelled meanwhile: neither queued nor running, it would be missed by cancel_stream
        self._taken: JudgeJob | None = None
        self._cancel_taken = False
        self._active = 0  # taken off the queue (or decided at submit), outcome not yet delivered
        # outcomes decided off the pool's thread, and calls left for it (see call_soon), in order
        self._deferred: deque[tuple[JudgeJob, JobOutcome] | Callable[[], None]] = deque()
        self._closed = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the ident of the thread that runs it
        # made by the pool's thread (see _spawn and _watch), as is the dispatcher's semaphore
        self._task_context: contextvars.Context | None = None
        self._callback_context: contextvars.Context | None = None
        self._sem: asyncio.Semaphore | None = None
        self._thread: threading.Thread | None = None
        self._wake: asyncio.Event | None = None
        self._bell: WakeFd | None = None  # sets _wake from any thread
        self._sleeping = False
        self._last_work = 0.0
        self._cpu_debt = 0.0
        self._cpu_seen = 0.0
        self._cpu_at = 0.0
        self._lag = LoopLag()  # a forked child's loops are its own
        self._share = self._cpu_share
        self._share_at = 0.0

    @property
    def tracked_streams(self) -> int:
        """Streams with per-stream state (budgets); ended streams are forgotten."""
        return self._admission.streams

    @property
    def depth(self) -> int:
        """Jobs queued or running."""
        return self._queued + self._active

    def _observe_depth(self, _options: metrics.CallbackOptions) -> list[metrics.Observation]:
        return [metrics.Observation(self.depth)]

    # --- submit (any thread) ---------------------------------------------------------------------

    def samples(self, trace_id: int) -> bool:
        """Whether jobs of ``trace_id`` are judged (the same answer every time for one trace)."""
        return self._admission.samples(trace_id)

    def submit(self, job: JudgeJob) -> bool:
        """Queue ``job``; False when it was refused (its callback has then already been called)."""
        job.enqueued_at = time.monotonic()
        self._judges.add(job.judge)
        refused: JobStatus | None = None
        superseded: JudgeJob | None = None
        superseded_waits = False
        with self._lock:
            if self._closed:
                refused = "shutdown"
            elif job.sample_key and not self.samples(job.sample_key):
                refused = "sampled_out"
            elif not self._admission.take(job.stream_key):
                refused = "budget_exhausted"
            else:
                slot = self._coalescable.get(job.stream_key) if job.coalesce and job.stream_key else None
                merged = None
                if slot is not None and slot.job is not None:
                    older = slot.job
                    merged = job.merge(older) if job.merge is not None else job
                if merged is not None and slot is not None:
                    # the newer job takes the older one's place in the queue and covers its work
                    assert slot.job is not None
                    superseded = slot.job
                    self._queued_bytes += merged.size - superseded.size
                    merged.enqueued_at = superseded.enqueued_at
                    slot.job = merged
                    # its outcome waits for the dispatcher in the same locked step that queues the merged
                    # job: deferred after the lock, the dispatcher could take the merged job, finish it and
                    # fall asleep in between, and nothing would wake it for this outcome (its stream then
                    # waited out end_wait_s for the verdict, force_flush its whole deadline)
                    superseded_waits = self._leave_locked((superseded, JobOutcome("superseded")))
                elif self._queued >= self._queue_size or (
                    self._max_queue_bytes and self._queued_bytes + job.size > self._max_queue_bytes
                ):
                    refused = "dropped"
                else:
                    slot = _Slot(job)
                    (self._queue if job.live else self._later).append(slot)
                    self._queued += 1
                    self._queued_bytes += job.size
                    if job.coalesce and job.stream_key:
                        self._coalescable[job.stream_key] = slot
            if refused is None:
                self._ensure_worker()
        if superseded is not None:
            # its outcome was left for the dispatcher with the merge (above); delivered here only when no
            # dispatcher can (none alive, or too many outcomes undelivered)
            if not superseded_waits:
                self._finish(superseded, JobOutcome("superseded"))
            return True
        if refused is not None:
            self._finish_later(job, JobOutcome(refused))
            return False
        self._wake_unless_a_reply_comes_soon()
        return True

    def _finish_later(self, job: JudgeJob, outcome: JobOutcome) -> None:
        # outcomes decided at submit time (superseded, sampled out, over budget...) are delivered from the
        # pool's thread like all others: their callbacks (span enrichment, export) then cost the caller -
        # usually the thread streaming tokens - nothing, and count against the pool's CPU share
        with self._lock:
            alive = self._leave_locked((job, outcome))
        if alive:
            self._wake_if_sleeping()
        else:
            self._finish(job, outcome)

    def _leave_locked(self, entry: tuple[JudgeJob, JobOutcome] | Callable[[], None]) -> bool:
        """With the lock held: leave a job's outcome for the dispatcher to deliver, or a call for it to run.
        False when the caller must do it itself (no live dispatcher, or past a queue's worth left)."""
        if (self._thread is None or not self._thread.is_alive() or self._closed
                or len(self._deferred) >= self._queue_size):
            return False
        self._deferred.append(entry)
        self._active += 1  # force_flush waits for it as for a job
        return True

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` on the pool's thread before it takes its next job, or here and now when no dispatcher
        can (none alive, shut down, too much left for it). :meth:`force_flush` waits for it as for a job.

        For work a stream would otherwise do on its own thread between two tokens (a checkpoint's span and
        request): the pool's thread runs it next to the judging it leads to, with that path's code and data
        still in its cache. ``fn`` must not block, and whatever it submits counts before it stops counting."""
        with self._lock:
            if not self._closed:
                self._ensure_worker()
            left = self._leave_locked(fn)
        if not left:
            fn()
            return
        self._wake_unless_a_reply_comes_soon()

    def _wake_unless_a_reply_comes_soon(self) -> None:
        # after a job or a call was left for a sleeping dispatcher: while calls are out to a worker that
        # answers them this fast, their next reply (or the sweep) takes it, without a wake-up's syscall and
        # GIL hand-off on the caller's thread - the app's, streaming tokens
        if not (self._calls and self._call_s < _REPLY_SOON_S):
            self._wake_if_sleeping()

    def _wake_if_sleeping(self) -> None:
        bell = self._bell
        # a busy dispatcher finds the job on its own; only a sleeping one needs the (costly) wake-up, and
        # only once: until it runs again (it may wait for the GIL while this thread streams on), another
        # wake-up would be another syscall for nothing. The flag is only a hint; the event is the signal.
        # Rung without handing the GIL to the pool's thread (see WakeFd): the caller is usually the thread
        # streaming tokens. A closed loop (shutdown racing us) is fine: the job gets "shutdown" from the drain
        if self._sleeping and bell is not None:
            self._sleeping = False
            bell.ring()

    def _wake_for_queued(self) -> None:
        # after a _Call ended (on the pool's loop), or at the sweep: a job submit() queued without waking the
        # sleeping dispatcher (a call was out) is taken now
        if not self._sleeping or not (self._queue or self._later or self._deferred):
            return
        wake = self._wake
        if wake is not None and threading.get_ident() == self._loop_thread:
            self._sleeping = False
            wake.set()  # the dispatcher's own loop: no syscall
        else:
            self._wake_if_sleeping()

    def watch_loop(self) -> LoopProbe | None:
        """A judged stream starts on the running loop: measure its lateness while it is live (the CPU share
        follows it). Returns the probe to :meth:`~streamjudge.judging._lag.LoopProbe.close` when the stream
        ends; None when there is nothing to measure (no cap to adapt, or no running loop)."""
        if self._cpu_share_max <= self._cpu_share:
            return None
        return self._lag.watch()

    @property
    def cpu_share(self) -> float:
        """The share of a core the pool's thread may take now (0 = no cap)."""
        return self._share

    def prepare_for_load(self, judge: Judge) -> bool:
        """Call ``judge.prepare_for_load()`` (if it has one) on the pool's thread soon; the pool closes the
        judge at shutdown as if it had judged here. False when nothing was scheduled."""
        prepare = getattr(judge, "prepare_for_load", None)
        if prepare is None:
            return False
        with self._lock:
            if self._closed:
                return False
            self._judges.add(judge)
            self._ensure_worker()
            loop = self._loop
        if loop is None:
            return False
        try:
            loop.call_soon_threadsafe(prepare)
        except RuntimeError:  # closed meanwhile
            return False
        return True

    def end_stream(self, stream_key: int) -> None:
        """Forget the per-stream budget of a finished stream (its queued jobs still run)."""
        with self._lock:
            self._admission.forget(stream_key)

    def cancel_stream(self, stream_key: int) -> int:
        """Cancel queued and running jobs of a stream (client went away). Returns how many."""
        cancelled: list[JudgeJob] = []
        with self._lock:
            for slot in itertools.chain(self._queue, self._later):
                if slot.job is not None and slot.job.stream_key == stream_key:
                    cancelled.append(slot.job)
                    slot.job = None
            self._coalescable.pop(stream_key, None)
            self._admission.forget(stream_key)
            self._queued -= len(cancelled)
            self._queued_bytes -= sum(j.size for j in cancelled)
            running = [t for t, j in self._running.items() if j.stream_key == stream_key]
            taken = self._taken is not None and self._taken.stream_key == stream_key
            if taken:
                self._cancel_taken = True  # cancelled as soon as its task exists (see _dispatch)
            loop = self._loop
        for job in cancelled:
            self._finish(job, JobOutcome("cancelled"))
        if running and loop is not None:
            with contextlib.suppress(RuntimeError):  # the pool shut down meanwhile: nothing runs
                for task in running:
                    loop.call_soon_threadsafe(task.cancel)
        return len(cancelled) + len(running) + taken

    # --- worker (pool thread) --------------------------------------------------------------------

    def _ensure_worker(self) -> None:
        # called with the lock held
        if self._thread is not None and self._thread.is_alive():
            return
        ready = threading.Event()
        self._thread = threading.Thread(
            target=self._thread_main, args=(ready,), name="streamjudge-judge-pool", daemon=True
        )
        self._thread.start()
        ready.wait()

    def _thread_main(self, ready: threading.Event) -> None:
        # its polls that cannot block keep the GIL: each release would hand it to the app's thread and back
        loop = new_pool_loop()
        self._loop = loop
        self._loop_thread = threading.get_ident()
        quiet = self._task_context = contextvars.Context()
        quiet.run(otel_context.attach, _QUIET)  # never detached: the context is only ever copied
        self._callback_context = contextvars.Context()
        wake = self._wake = asyncio.Event()
        bell = self._bell = WakeFd(loop, wake.set)
        ready.set()
        try:
            loop.run_until_complete(self._dispatch())
        finally:
            try:
                loop.run_until_complete(self._close_judges())
            finally:
                bell.detach(loop)
                loop.close()

    def _deliver_deferred(self) -> None:
        while self._deferred:
            try:
                entry = self._deferred.popleft()
            except IndexError:
                break
            if isinstance(entry, tuple):
                self._finish(*entry)
            else:
                try:
                    entry()
                except Exception:  # a broken call must not kill the pool thread
                    _log.exception("streamjudge: a call left for the judge pool failed")
            with self._lock:
                self._active -= 1
                self._notify_if_idle()

    def _pop(self) -> JudgeJob | None:
        with self._lock:
            while self._queue or self._later:
                slot = (self._queue or self._later).popleft()
                job = slot.job
                if job is None:
                    continue
                slot.job = None
                self._queued -= 1
                self._queued_bytes -= job.size
                self._active += 1
                if self._coalescable.get(job.stream_key) is slot:
                    del self._coalescable[job.stream_key]
                self._taken = job
                self._cancel_taken = False
                return job
            return None

    def _share_now(self, now: float) -> float:
        if self._cpu_share_max <= self._cpu_share or now - self._share_at < _ADAPT_S:
            return self._share
        self._share_at = now
        late = self._lag.take()
        if late is None:  # no judged stream on a loop: nothing says the app has CPU to spare
            self._share = self._cpu_share
        elif late > self._lag_limit_s:
            self._share = max(self._cpu_share, self._share / 2)
        else:
            self._share = min(self._cpu_share_max, self._share + _SHARE_STEP)
        return self._share

    async def _throttle(self) -> None:
        now, cpu = time.monotonic(), time.thread_time()
        share = self._share_now(now)
        self._cpu_debt += cpu - self._cpu_seen
        self._cpu_seen = cpu
        self._cpu_debt = max(0.0, self._cpu_debt - (now - self._cpu_at) * share)
        self._cpu_at = now
        if self._cpu_debt > self._cpu_burst:
            await asyncio.sleep((self._cpu_debt - self._cpu_burst + self._resume_s) / share)

    async def _dispatch(self) -> None:
        assert self._wake is not None
        sem = self._sem = asyncio.Semaphore(self._concurrency)
        self._cpu_debt, self._cpu_seen, self._cpu_at = 0.0, time.thread_time(), time.monotonic()
        while True:
            await sem.acquire()
            if self._cpu_share:
                await self._throttle()
            self._deliver_deferred()
            job = self._pop()
            while job is None:
                if self._closed:
                    sem.release()
                    self._deliver_deferred()
                    pending = [t for t in self._running if isinstance(t, asyncio.Task)]
                    if pending:
                        await asyncio.gather(*pending, return_exceptions=True)
                    while self._calls:  # shutdown() cancels them, or their replies come
                        await asyncio.sleep(_POLL_S)
                    return
                # while streams are active, poll for a little while before sleeping: a cross-thread
                # wake-up costs the submitting (token-streaming) thread a syscall and a GIL hand-off
                # per checkpoint, a poll tick costs this thread alone
                if time.monotonic() - self._last_work < self._linger_s:
                    await asyncio.sleep(_POLL_S)
                    self._deliver_deferred()
                    job = self._pop()
                    continue
                self._wake.clear()
                self._sleeping = True
                # re-check after announcing sleep: a submit in between is not lost
                if self._deferred:
                    self._sleeping = False
                    self._deliver_deferred()
                    continue
                job = self._pop()
                if job is not None:
                    self._sleeping = False
                    break
                await self._wake.wait()  # submit() and shutdown() set it
                self._sleeping = False
                self._deliver_deferred()
                job = self._pop()
            now = time.monotonic()
            self._last_work = now
            self._resume_s = _RESUME_S if getattr(job.judge, "batches_calls", False) else 0.0
            if now - job.enqueued_at > self._max_queue_wait_s:
                sem.release()
                with self._lock:
                    self._taken = None
                self._finish(job, JobOutcome("timeout", error="waited in queue past its deadline"))
                with self._lock:
                    self._active -= 1
                    self._notify_if_idle()
                continue
            begin = getattr(job.judge, "begin", None)
            if begin is not None and self._begin(job, begin):
                continue
            task = self._spawn(job)
            with self._lock:
                self._running[task] = job
                self._taken = None
                cancel, self._cancel_taken = self._cancel_taken, False
            self._watch(task)
            if cancel:  # its stream was cancelled between the queue and here: it never starts
                task.cancel()

    def _begin(self, job: JudgeJob, begin: Callable[..., Any]) -> bool:
        """Start ``job`` with its judge's ``begin`` (a call whose reply runs a callback, no task). False
        when the judge cannot take it that way now: the caller runs it in a task."""
        call = _Call(self, job)
        if not call.start(begin):
            return False
        # no reply can come before this (replies are read by this loop), only a failure inside begin()
        with self._lock:
            self._taken = None
            cancel, self._cancel_taken = self._cancel_taken, False
            if not call.over:
                self._running[call] = job
                self._calls += 1
        if cancel:  # its stream was cancelled between the queue and here
            call.cancel()
        if self._sweep is None and not call.over:
            self._sweep = asyncio.get_running_loop().call_later(_SWEEP_S, self._sweep_calls)
        return True

    def _sweep_calls(self) -> None:
        # the deadlines of calls made with ``begin`` (a timer each would cost as much as the task saved)
        self._sweep = None
        now = time.monotonic()
        with self._lock:
            calls = [c for c in self._running if isinstance(c, _Call)]
        for call in calls:
            call.tick(now)
        # a job queued while calls were out waits for no more than this tick (their replies take it sooner)
        self._wake_for_queued()
        if self._calls:
            self._sweep = asyncio.get_running_loop().call_later(_SWEEP_S, self._sweep_calls)

    def _spawn(self, job: JudgeJob, first_error: TransientJudgeError | None = None) -> asyncio.Task[None]:
        # the call's task runs in a copy of a context made once with the quiet context attached: a copy
        # shares its mapping, where attaching per call made a token and a new mapping, objects the GC
        # tracks for as long as the call is out (a model's whole latency)
        assert self._loop is not None and self._task_context is not None
        return self._loop.create_task(self._run(job, first_error), context=self._task_context.copy())

    def _watch(self, task: asyncio.Task[None]) -> None:
        # a bound method run in one empty context: a closure and a copy of the current context per call
        # were three more objects per call in flight
        task.add_done_callback(self._task_done, context=self._callback_context)

    def _task_done(self, task: asyncio.Task[None]) -> None:
        assert self._sem is not None
        self._sem.release()
        job = self._running.get(task)
        # the outcome goes out before the job stops counting as running, so force_flush never
        # returns while a callback is still owed
        if job is not None and task.cancelled():
            self._finish(job, JobOutcome("shutdown" if self._closed else "cancelled"))
        with self._lock:
            if self._running.pop(task, None) is not None:
                self._active -= 1
            self._notify_if_idle()

    def _notify_if_idle(self) -> None:
        # with the lock held. Only force_flush waits on _idle, and only for an idle pool: woken per job, a
        # waiting thread took the GIL from this one on every call (its next write to a worker's pipe then
        # waited for it), which cost the pool's thread more than the call itself
        if not self._queued and not self._active:
            self._idle.notify_all()

    async def _run(self, job: JudgeJob, first_error: TransientJudgeError | None = None) -> None:
        # run (see _spawn) in an empty context with instrumentation suppressed: instrumentations (httpx,
        # openai, requests...) create no spans, so the judge's own I/O never lands in a judged trace
        attempts = 0
        outcome: JobOutcome
        if first_error is not None:  # a _Call's first attempt failed: its retries, from its backoff
            attempts = 1
            await asyncio.sleep(self._backoff(attempts, first_error.retry_after))
        while True:
            attempts += 1
            started = time.monotonic()
            try:
                # asyncio.timeout, not wait_for: no extra task per call
                async with asyncio.timeout(self._timeout_s):
                    result = await job.judge.evaluate(job.item, job.metrics)
                _check_result(result)
                elapsed = time.monotonic() - started
                self._m_duration.record(elapsed, {semconv.METRIC_ATTR_JUDGE: result.judge})
                outcome = JobOutcome("judged", result, attempts=attempts)
                break
            except TimeoutError:
                outcome = JobOutcome(
                    "timeout", error=f"judge call exceeded {self._timeout_s:g}s", attempts=attempts
                )
                break
            except TransientJudgeError as exc:
                if attempts > self._max_retries:
                    outcome = JobOutcome("error", error=_describe(exc), attempts=attempts)
                    break
                await asyncio.sleep(self._backoff(attempts, exc.retry_after))
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # a judge failure never breaks a response
                outcome = JobOutcome("error", error=_describe(exc), attempts=attempts)
                break
            except BaseException as exc:  # SystemExit / KeyboardInterrupt from a judge: not ours to obey
                outcome = JobOutcome("error", error=_describe(exc), attempts=attempts)
                break
        if outcome.status == "error":
            self._m_errors.add(1, {semconv.METRIC_ATTR_JUDGE: getattr(job.judge, "name", "?")})
        self._finish(job, outcome, attempts)

    def _backoff(self, attempt: int, retry_after: float | None) -> float:
        delay = self._backoff_s * (2 ** (attempt - 1)) * (0.5 + random.random())
        if retry_after is not None:
            delay = max(delay, retry_after)
        return float(min(delay, _MAX_BACKOFF_S))

    def _finish(self, job: JudgeJob, outcome: JobOutcome, attempts: int | None = None) -> None:
        if outcome.status != "judged":
            self._m_drops.add(1, {semconv.METRIC_ATTR_REASON: outcome.status})
        latency = time.monotonic() - job.enqueued_at if job.enqueued_at else 0.0
        final = JobOutcome(
            outcome.status, outcome.result, outcome.error,
            attempts if attempts is not None else outcome.attempts, latency,
        )
        try:
            job.callback(final)
        except Exception:  # a broken callback must not kill the pool thread
            _log.exception("streamjudge: judge job callback failed")

    async def _close_judges(self) -> None:
        for judge in list(self._judges):
            try:
                await judge.aclose()
            except Exception:
                _log.debug("streamjudge: closing judge %r failed", judge, exc_info=True)

    # --- flush / shutdown ------------------------------------------------------------------------

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until every queued and running job has its outcome; False if the deadline came first."""
        deadline = time.monotonic() + timeout_millis / 1000
        with self._lock:
            while self._queued or self._active:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    return False
                self._idle.wait(min(remaining, 0.05))
        return True

    def shutdown(self, timeout_millis: int = 30_000) -> bool:
        """Stop accepting jobs, drain within the deadline, then give what is left a ``shutdown`` outcome."""
        with self._lock:
            if self._closed:
                return True
            self._closed = True
        drained = self.force_flush(timeout_millis)
        leftover: list[JudgeJob] = []
        with self._lock:
            for slot in itertools.chain(self._queue, self._later):
                if slot.job is not None:
                    leftover.append(slot.job)
                    slot.job = None
            self._queue.clear()
            self._later.clear()
            self._queued = 0
            self._queued_bytes = 0
            running = list(self._running)
            loop, thread, wake = self._loop, self._thread, self._wake
        for job in leftover:
            self._finish(job, JobOutcome("shutdown"))
        # the dispatcher may close its loop on its own at any moment once it sees `_closed`
        if loop is not None:
            with contextlib.suppress(RuntimeError):
                for task in running:
                    loop.call_soon_threadsafe(task.cancel)
                if wake is not None:
                    loop.call_soon_threadsafe(wake.set)
        if thread is not None:
            thread.join(timeout=5.0)
        self._deliver_deferred()  # anything the worker did not get to: every job has its outcome
        return drained


def _check_result(result: object) -> None:
    """Reject what a judge returned unless it is a :class:`JudgeResult` of :class:`Score` objects: a wrong
    type found later would raise into the stream that reads the verdict."""
    if not isinstance(result, JudgeResult):
        raise TypeError(f"judge returned {type(result).__name__}, not a JudgeResult")
    if not isinstance(result.scores, tuple | list):
        raise TypeError(f"JudgeResult.scores is {type(result.scores).__name__}, not a tuple of Score")
    for s in result.scores:
        if not isinstance(s, Score):
            raise TypeError(f"JudgeResult.scores holds a {type(s).__name__}, not a Score")


def _describe(exc: BaseException) -> str:
    # an error body may echo a key (a gateway's 401): it goes onto span attributes, so redact first
    text = redact(str(exc)).strip().replace("\n", " ")
    if len(text) > 300:
        text = text[:297] + "..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

