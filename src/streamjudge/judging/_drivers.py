"""Drivers of a guarded stream: ``async for`` and ``for`` over a token source, and the end-of-stream wait.

The async driver checks one boolean before each yield; while verdicts are in flight and the source is slow it
races the next token against them, so a warning is not held back until the next token.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import functools
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Awaitable, Callable, Generator, Iterable, Iterator
from time import perf_counter
from typing import Any

from streamjudge._wakefd import WakeFd
from streamjudge.judging._session import _TOKEN_EVENTS, GuardSession, StreamEvent, TokenSource, token_event
from streamjudge.judging._windows import MAX_TOKEN_CHARS as _MAX_TOKEN
from streamjudge.results import JudgeResult

_log = logging.getLogger(__name__)


class _LoopBell:
    """One cross-thread wake-up for every stream of a loop with a verdict since the loop last ran it.

    ``call_soon_threadsafe`` writes to the loop's self-pipe on every call; the pool delivers a worker's
    replies for many streams at once, and each waiting stream would cost the pool's thread a syscall (tens
    of µs of CPU on a VM, under the app's GIL) and the loop a read. The streams ring this bell instead.

    Made on the loop's thread. It rings through a pipe of its own (:class:`~streamjudge._wakefd.WakeFd`)
    whose write keeps the GIL: the self-pipe's socket ``send`` released it, the app's thread took it, and
    the pool's thread then waited for the loop to give it back (640 µs of the pool's wall time a ring in
    ``benchmarks/run.py``'s loop-pass streams). The pipe is the bell's, closed only once nothing can ring
    it; the loop's own socket is closed with the loop, and a ring racing that close could write to a reused
    descriptor. A loop that cannot watch a descriptor (``add_reader``) is rung as before.
    """

    __slots__ = ("__weakref__", "_due", "_fd", "_lock", "_loop", "_ringing")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        # weakly: the bell is the value of its loop's entry in a WeakKeyDictionary, and a value that held
        # its key would keep every loop that ever ran a guarded stream (each ``asyncio.run``) alive
        self._loop = weakref.ref(loop)
        self._due: list[AsyncWaker] = []
        self._ringing = False
        self._lock = threading.Lock()
        self._fd: WakeFd | None = None
        try:
            # the pipe calls the bell weakly: bell -> pipe -> bound method -> bell would be a cycle that only
            # the cyclic GC frees, and the pipe's descriptors with it
            self._fd = WakeFd(loop, functools.partial(_run_bell, weakref.ref(self)))
        except (NotImplementedError, OSError):  # a proactor loop; out of descriptors
            _log.debug("streamjudge: a loop's verdict bell rings through call_soon_threadsafe", exc_info=True)

    def ring(self, waker: AsyncWaker) -> None:
        """Wake ``waker`` on its loop (from any thread)."""
        with self._lock:
            self._due.append(waker)
            if self._ringing:
                return  # a wake-up is scheduled and has not taken the list yet: it wakes this one too
            self._ringing = True
        loop = self._loop()
        try:
            if loop is None or loop.is_closed():
                raise RuntimeError("the loop is gone")
            fd = self._fd
            if fd is not None:
                fd.ring()  # a loop that closes after this check reads it never: nobody waits on it then
            else:
                loop.call_soon_threadsafe(self._run)
        except RuntimeError:  # the loop is closed: nobody is waiting any more
            with self._lock:
                self._ringing = False
                self._due.clear()

    def _run(self) -> None:
        with self._lock:
            due, self._due = self._due, []
            self._ringing = False
        for waker in due:
            waker._wake()


def _run_bell(ref: weakref.ref[_LoopBell]) -> None:
    bell = ref()
    if bell is not None:
        bell._run()


_bells: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _LoopBell] = weakref.WeakKeyDictionary()
_bells_lock = threading.Lock()


def _bell(loop: asyncio.AbstractEventLoop) -> _LoopBell:
    bell = _bells.get(loop)
    if bell is None:
        with _bells_lock:
            bell = _bells.get(loop)
            if bell is None:
                bell = _bells[loop] = _LoopBell(loop)
    return bell


def _forget_bells() -> None:
    # a lock held by the pool's thread at fork time would stay held in the child
    global _bells, _bells_lock, _starts
    _bells = weakref.WeakKeyDictionary()
    _bells_lock = threading.Lock()
    _starts = weakref.WeakKeyDictionary()  # the parent's queued starts are the parent's streams'


os.register_at_fork(after_in_child=_forget_bells)


class AsyncWaker:
    """Wakes the stream's event loop from the pool's thread when a verdict arrives.

    Only a driver that is actually waiting is woken (a cross-thread wake-up costs a pipe write and a loop
    iteration); a busy driver sees ``has_events`` before its next yield anyway. The driver publishes its
    future before it re-checks the flag, and the pool sets the flag before it reads the future, so one
    of the two always sees the other.
    """

    __slots__ = ("_bell", "_flag", "_fut", "_loop", "_waking")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._bell = _bell(loop)
        self._fut: asyncio.Future[None] | None = None
        self._flag = False
        # a wake-up is on its way to the loop: verdicts that follow it before it ran need none of their
        # own (the pool often posts several at once - a merged job's and the ones it superseded)
        self._waking = False

    def notify(self) -> None:
        self._flag = True
        fut = self._fut
        if fut is None or fut.done() or self._waking:
            return
        # set before scheduling: the loop may run the wake-up (and clear it) before this line returns
        self._waking = True
        self._bell.ring(self)

    def _wake(self) -> None:
        self._waking = False
        self._release()

    def take_flag(self) -> bool:
        """Whether a verdict arrived since the last :meth:`wait` ended or this was last asked; asking
        clears it, as the end of a wait does (a flag read and left set ended every later wait at once)."""
        flag = self._flag
        self._flag = False
        return flag

    async def wait(self, other: asyncio.Future[Any] | None, timeout: float | None) -> None:
        fut = self._fut = self._loop.create_future()
        # one future woken by either side (cheaper than asyncio.wait's per-call set and waiter)
        release = self._release
        timer = self._loop.call_later(timeout, release) if timeout is not None else None
        try:
            if self._flag:
                return
            if other is not None:
                if other.done():
                    return
                other.add_done_callback(release)
            await fut
        finally:
            if other is not None:
                other.remove_done_callback(release)
            if timer is not None:
                timer.cancel()
            self._fut = None
            if not fut.done():
                fut.cancel()
            self._flag = False

    def _release(self, *_: object) -> None:
        fut = self._fut
        if fut is not None and not fut.done():
            fut.set_result(None)


# the async driver's fast paths: a stream's start run while its source works on the first token (its
# tokens at hand sent before it), a stream nothing judges passing plain tokens with a list append, and a
# burst's tokens appended for the loop's next pass. Each does what the plain path does, at less cost per
# token; off, every token takes the plain path (set_fast_paths: tests run both, and a suspected fast-path
# bug can be ruled out in production)
_fast_paths = True


def set_fast_paths(on: bool) -> None:
    """Switch the async driver's fast paths on or off for streams started from now on."""
    global _fast_paths
    _fast_paths = on


# a source slower than this between tokens is raced against verdicts, so a warning is not held back
# until the next token; a faster one is awaited directly (a verdict then waits at most one token gap,
# and racing would cost every such token a task while a verdict is in flight)
_RACE_GAP_S = 0.0015
# while verdicts are in flight and the source is fast, one token in this many is timed
_GAP_SAMPLE = 8


def _open_stream(s: GuardSession, opened: list[list[StreamEvent] | Exception],
                 deferred: list[Callable[[], None]], at_once: bool) -> None:
    """Start ``s`` once, keeping start()'s events (or its failure, when run by the loop) in ``opened``."""
    if opened:
        return
    try:
        opened.append(s.start())
    except Exception as exc:  # raised in the driver, as a start() there would
        if not at_once:
            raise
        opened.append(exc)
        return
    if at_once:
        # run by the loop while the source works on its first token: the pre-flight request start() made
        # goes out now, not after that token
        while deferred:
            deferred.pop()()


# most of a loop pass the queued stream starts of one loop take (see _StartQueue)
_START_SLICE_S = 0.0005


class _QueuedStart:
    """A stream's start in its loop's :class:`_StartQueue`, in the context it was queued from."""

    __slots__ = ("args", "context")

    def __init__(self, args: tuple[Any, ...]) -> None:
        self.args: tuple[Any, ...] | None = args
        self.context = contextvars.copy_context()  # as call_soon would run it

    def cancel(self) -> None:
        """The driver started the stream itself: the queue skips this entry (and lets the session go)."""
        self.args = None


class _StartQueue:
    """The starts of one loop's streams that asked their source for the first token, run a slice a pass.

    A stream's start (its span, inputs, sampling, pre-flight: ~30 µs) runs on the loop's next pass while
    the source works on the first token. Streams that begin together (a burst of requests, a load test,
    clients reconnecting after a deploy) each queued their start for the same pass, and one pass ran them
    all: 500 starts held the loop for ~15 ms, and every live stream's token due in that time waited behind
    them (measured, ``bench_scale.py``'s 500 streams: the first tokens 10-18 ms late, tokens/s 0.985-0.993x
    bare). Here a pass runs starts for at most :data:`_START_SLICE_S`, then lets the loop run its due timers
    and ready callbacks before the next slice. A stream whose first token comes before its start ran sends
    it first, as a source with its token at hand does (see ``_run_async``'s late start).
    """

    __slots__ = ("_due", "_queue")

    def __init__(self) -> None:
        self._queue: deque[_QueuedStart] = deque()
        self._due = False  # a slice is scheduled on the loop

    def add(self, loop: asyncio.AbstractEventLoop, *args: Any) -> _QueuedStart:
        """Queue ``_open_stream(*args)`` on ``loop`` (its own thread); cancel the entry to skip it."""
        entry = _QueuedStart(args)
        self._queue.append(entry)
        if not self._due:
            self._due = True
            loop.call_soon(self._run, loop)
        return entry

    def _run(self, loop: asyncio.AbstractEventLoop) -> None:
        queue = self._queue
        end = perf_counter() + _START_SLICE_S
        try:
            while queue:
                entry = queue.popleft()
                args, entry.args = entry.args, None
                if args is None:
                    continue
                entry.context.run(_open_stream, *args)
                if perf_counter() >= end:
                    break
        finally:  # the rest on the next pass (a BaseException from a start still leaves the queue running)
            if queue and not loop.is_closed():
                loop.call_soon(self._run, loop)
            else:
                self._due = False


_starts: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _StartQueue] = weakref.WeakKeyDictionary()


def _start_queue(loop: asyncio.AbstractEventLoop) -> _StartQueue:
    # on the loop's thread only: no lock (a loop's queue is only touched from it)
    queue = _starts.get(loop)
    if queue is None:
        queue = _starts[loop] = _StartQueue()
    return queue


_BARE: Any = object()  # a step's blocker after a bare ``yield`` (asyncio.sleep(0)): one loop pass, then on


class SourceStep:
    """The source's next token, asked for and not come yet, its awaitable stepped by the stream's own task.

    Racing the next token against verdicts used to run it as a task of its own: the source's steps then ran
    in other tasks, each with a copy of the context. A context variable the source set in one step was gone
    in the next (its ``reset`` raised), a timeout it entered was bound to a task gone by the time it fired,
    and every raced token paid for a task. Stepped here, as a task steps a coroutine, the source runs as
    under a plain ``await``: in the stream's task and context, while the driver waits on the future the
    source waits on and on its verdicts at once.
    """

    __slots__ = ("_error", "_it", "_value", "blocker", "ready")

    def __init__(self, awaitable: Awaitable[Any]) -> None:
        it = awaitable.__await__()
        # an __await__ that returns a plain iterator: stepped through a generator, as ensure_future would
        self._it: Generator[Any, None, Any] = it if hasattr(it, "send") else _delegate(it)
        self.blocker: Any = None  # the future the source waits on, or _BARE
        self.ready = False  # the token came (or the source raised): take() it
        self._value: Any = None
        self._error: BaseException | None = None

    def advance(self, exc: BaseException | None = None) -> bool:
        """Run the source on until it waits on a future that is not done (False) or its step ended (True).

        ``exc`` is thrown into the source at its await (a cancellation), as a task would."""
        if self.ready:
            return True
        b = self.blocker
        if exc is None and b is not None and b is not _BARE and not b.done():
            return False
        it = self._it
        while True:
            try:
                y = it.send(None) if exc is None else it.throw(exc)
            except StopIteration as stop:
                self._value = stop.value
                self.blocker = exc = None
                self.ready = True
                return True
            except (KeyboardInterrupt, SystemExit):
                raise
            except BaseException as err:  # StopAsyncIteration at the end, or the source's failure
                self._error = err
                # (``exc``, when thrown, is in err's traceback, which holds this frame)
                self.blocker = exc = None
                self.ready = True
                return True
            exc = None
            if y is None:  # a bare yield: the source lets the loop run once
                self.blocker = _BARE
                return False
            if getattr(y, "_asyncio_future_blocking", None):
                y._asyncio_future_blocking = False  # taken, as a task takes it
                self.blocker = y
                if not y.done():
                    return False
            else:  # what a task would say to such a yield
                exc = RuntimeError(f"the token source yielded {y!r}, not an asyncio future")

    def take(self) -> Any:
        """The token (raises what the source raised, StopAsyncIteration at its end)."""
        err = self._error
        if err is not None:
            # neither the step nor this frame keeps it: its traceback holds both frames, and a cycle
            # through them would keep the whole stream for the cyclic GC
            self._error = None
            try:
                raise err
            finally:
                del err
        return self._value

    def __await__(self) -> Generator[Any, None, Any]:
        # the rest of the step, awaited without racing (the task awaiting it waits on the source's future)
        while not self.advance():
            b = self.blocker
            try:
                if b is _BARE:
                    yield None
                else:
                    b._asyncio_future_blocking = True
                    yield b
            except GeneratorExit:  # the awaiting coroutine is being destroyed: so is this step
                raise
            except BaseException as exc:  # the awaiting task was cancelled: so is the source's step
                self.advance(exc)
        return self.take()

    def abandon(self) -> None:
        """The stream no longer wants this token: the source's step is cancelled, as cancelling its task
        would (the source sees CancelledError at its await and runs its cleanup)."""
        if self.ready:
            self._error = None
            return
        b = self.blocker
        if b is not None and b is not _BARE and b.cancel():
            done = self.advance()  # the source's await raises CancelledError, as under a task
        else:
            done = self.advance(asyncio.CancelledError())
        if done:
            self._error = None
        else:
            # the source awaits in its cleanup: a task runs the rest of it, so aclose() finds it ended
            try:
                task = asyncio.ensure_future(self._finish())
            except RuntimeError:  # no loop runs any more (a stream closed at exit): nothing can run it
                return
            _finishing.add(task)
            task.add_done_callback(_finishing.discard)

    async def _finish(self) -> None:
        try:
            await self
        except BaseException:  # the cancellation it was given, or its cleanup's failure: nobody waits
            _log.debug("streamjudge: an abandoned token source step ended", exc_info=True)


def _delegate(it: Iterator[Any]) -> Generator[Any, None, Any]:
    return (yield from it)


_finishing: set[asyncio.Future[None]] = set()  # abandoned steps being finished (a task only the loop holds
# weakly would be collected mid-step)


async def wait_step(step: SourceStep, waker: AsyncWaker, timeout: float | None) -> None:
    """Step the source until its token came, a verdict arrived or ``timeout`` passed."""
    while not step.ready:
        b = step.blocker
        try:
            if b is _BARE:
                await asyncio.sleep(0)
            else:
                await waker.wait(b, timeout)
                if not b.done():
                    return  # a verdict (or the timeout): the step stays where it is
        except asyncio.CancelledError as exc:
            # the stream's task was cancelled while the source waited: under a plain await the source's own
            # await would raise it (and a timeout the source entered would turn it into TimeoutError there),
            # so the source gets it, and the driver what the source makes of it
            if b is not _BARE:
                b.cancel()
            step.advance(exc)
            continue
        step.advance()
        # a verdict that came during the loop's pass: the driver drains it, the step goes on from here. The
        # flag is taken, not just read: left set (a wait() clears it, and a bare yield has none), it ended
        # every later pass here before the step went on, and a stream whose source yields bare while a
        # checkpoint was out spun in this loop until that checkpoint's verdict came
        if b is _BARE and waker.take_flag():
            return


class GuardedStream:
    """What :func:`guard` returns: iterate it (``async for`` or ``for``) to get :class:`StreamEvent`s."""

    def __init__(self, source: TokenSource, session: GuardSession) -> None:
        self._source = source
        self.session = session

    @property
    def final(self) -> concurrent.futures.Future[JudgeResult | None]:
        """Resolves with the final reconciliation result (None when it was skipped or failed)."""
        return self.session.final

    def __aiter__(self) -> AsyncIterator[StreamEvent]:
        return self._run_async()

    def __iter__(self) -> Iterator[StreamEvent]:
        return self._run_sync()

    async def _run_async(self) -> AsyncIterator[StreamEvent]:
        s = self.session
        loop = asyncio.get_running_loop()
        waker = AsyncWaker(loop)
        s.set_notify(waker.notify)
        # checkpoint-span work waits here until the next token has been asked for: scheduled before that, it
        # would run ahead of a racing source task's first step and push back the source's own timer
        deferred: list[Callable[[], None]] = []
        s.set_deferral(deferred.append)
        source: AsyncIterator[Any] = _to_async(self._source)
        step: SourceStep | None = None  # the next token, asked for and not taken yet
        outcome = "completed"
        slow = False  # measured while verdicts are in flight
        timer = 1  # tokens until the next timed one: the first token awaited with verdicts in flight
        step_started = 0.0
        first: Any = _NO_TOKEN  # the source's first token, when it was asked for before start()
        fast = _fast_paths  # see set_fast_paths
        late = fast and s.prepare_late_start()
        # a token's event: the shared one of its text where there is one (see token_event), looked up here
        shared = _TOKEN_EVENTS.get
        burst = 0  # tokens appended to the session's held list by the main loop, not yet counted by it
        # the frame of this generator lives as long as the stream: what it keeps is kept per live stream for
        # the cyclic GC to track (with hundreds live, a whole-heap collection comes sooner). So no closure
        # (its cells), and what only the start needs is dropped after it
        try:
            if late:
                # the source is asked for its first token before the stream's span and its inputs are made:
                # that work (~0.1 ms) then runs while the model works on the token instead of before the
                # request for it, and streams that start together do not queue their first tokens behind
                # each other's start. The start waits in the loop's queue, which runs a slice of starts a
                # pass (see _StartQueue): a burst of new streams does not hold back live streams' tokens
                opened: list[list[StreamEvent] | Exception] = []  # start()'s events (or its failure)
                opening = _start_queue(loop).add(loop, s, opened, deferred, True)
                early = 0  # plain tokens sent before the start, after the first
                try:
                    first = await source.__anext__()
                    if (not opened and first.__class__ is str and first and first.isascii()
                            and not s.hold_back):
                        # the first token came before the start ran: it was at hand, or the loop's
                        # queue of starts has not reached this stream yet (many began together, see
                        # _StartQueue). So may the next ones (a burst: a replayed or cached answer, a chunk
                        # of many tokens). They go out before the start, which waits for its turn in that
                        # queue as a model's first token would have let it run: a list append each, as a
                        # stream nothing judges sends them. The start takes them as the answer's first (see
                        # GuardSession.early_sink). It ends with the source's end, a token of another kind,
                        # or the start's turn (it ran)
                        tok, first = first, _NO_TOKEN
                        s.accept(tok)  # times the first token
                        yield shared(tok) or token_event(tok)
                        pre = s.early_sink()
                        if pre is not None:
                            async for tok in source:
                                if (not opened and tok.__class__ is str and tok and tok.isascii()
                                        and len(tok) <= _MAX_TOKEN):
                                    pre.append(tok)
                                    early += 1
                                    yield shared(tok) or token_event(tok)
                                    continue
                                first = tok  # goes through after the start
                                break
                            else:
                                source = _EXHAUSTED
                        del pre
                except StopAsyncIteration:
                    source = _EXHAUSTED
                finally:
                    opening.cancel()
                    del opening
                    s.passed(early)
                    # the source had its token at hand, or failed, or the client left: start() runs now
                    _open_stream(s, opened, deferred, False)
                events = opened.pop()
                del opened
                if isinstance(events, Exception):
                    raise events
            else:
                events = s.start()
            for ev in events:
                yield ev
            del events
            hold = s.hold_back  # decided by start(): an unjudged stream holds nothing back
            if s.preflight_blocks and not s.stopped:
                # the gate may stop the answer: not even the first token is asked for before its verdict
                deadline = loop.time() + s.settings.preflight_wait_s
                while s.preflight_pending and loop.time() < deadline:
                    await waker.wait(None, deadline - loop.time())
                    for ev in s.drain():
                        yield ev
            if s.preflight_pending and not s.stopped and not late:
                step = SourceStep(source.__anext__())
                # the source's first step runs now: a source with its first token at hand is done then,
                # and needs no future, timer and callbacks to race the gate's verdict
                step.advance()
                if deferred and not step.ready:
                    # the pre-flight request, after the source's first step: out at once while the model
                    # works on its first token, else kept for when the loop next waits (a source that
                    # already has its tokens would have the pool's thread judge under its feet)
                    loop.call_soon(deferred.pop())
                deadline = loop.time() + s.settings.preflight_wait_s
                # the first token waits only when the gate's policy may stop the answer before it
                while (s.preflight_pending and (s.preflight_blocks or not step.ready)
                       and loop.time() < deadline):
                    await wait_step(step, waker, deadline - loop.time())
                    for ev in s.drain():
                        yield ev
            if fast and step is None and not s.judging and not hold and not s.stopped and not s.has_events:
                # nothing will judge this stream (sampled out, skipped at start), so no verdict can come
                # and a token needs no more than the text kept for the answer span: after the first one
                # (which accept() times) a plain token is a list append here, not a call into the session
                # and its windows. With hundreds of streams live, every object a token touches is likely
                # out of the CPU's cache, so touching none of them is most of the saving. Nor does it need a
                # wake-up or deferred work: the session lets go of both (two objects fewer per live stream)
                s.set_notify(None)
                s.set_deferral(None)
                sink: list[str] | None = None
                plain = 0  # tokens appended to the sink and not yet counted by the session
                if first is not _NO_TOKEN:
                    tok, first = first, _NO_TOKEN
                    try:
                        text = s.accept(tok)
                    except Exception:  # as below: pass the stream through
                        _log.exception("streamjudge: guard failed on a token; passing it through")
                        text = tok if isinstance(tok, str) else None
                    sink = s.passthrough_sink()
                    if text is not None:
                        yield token_event(text)
                try:
                    async for tok in source:
                        if sink is not None and tok.__class__ is str and tok and tok.isascii():
                            sink.append(tok)
                            plain += 1
                            yield shared(tok) or token_event(tok)
                            continue
                        s.passed(plain)
                        plain = 0
                        try:
                            text = s.accept(tok)
                        except Exception:  # as below: pass the stream through
                            _log.exception("streamjudge: guard failed on a token; passing it through")
                            text = tok if isinstance(tok, str) else None
                        if sink is None:
                            sink = s.passthrough_sink()
                        if text is not None:
                            yield token_event(text)
                finally:
                    s.passed(plain)
                source = _EXHAUSTED  # the source ended: the loop below goes straight to the end
            # bound once for the token loop below (a judged stream's: a stream nothing judges keeps none)
            accept = s.accept
            call_soon = loop.call_soon
            pending = s._pending  # the set itself: its truthiness is the cheapest "verdicts in flight?"
            broken = False
            while True:  # one round per token source: the app's, then each regeneration's
                s.hush_passes(True)  # a verdict nobody sees waits for the next token (see hush_passes)
                while True:
                    if s.has_events:
                        for ev in s.drain():
                            yield ev
                        if s.regen_request is not None:
                            if step is not None:
                                step.abandon()
                                step = None
                            await _aclose(source)
                            source = _to_async(s.open_regeneration(s.begin_regeneration()))
                            pending = s._pending
                            first = _NO_TOKEN  # a token of the retracted answer
                            continue
                    if s.stopped:
                        break
                    if first is not _NO_TOKEN:  # asked for before start(): it is the first one through
                        tok, first = first, _NO_TOKEN
                    elif not pending and step is None and not s.preflight_pending:
                        # the fast path: nothing in flight, just the next token
                        if deferred:
                            call_soon(deferred.pop())
                        try:
                            tok = await source.__anext__()
                        except StopAsyncIteration:
                            break
                    elif (pending or s.preflight_pending) and slow:
                        # verdicts in flight and a slow source: race the next token against them (a fast
                        # one sees them before its next token anyway, and racing costs each token a few
                        # µs of stepping the source by hand)
                        if step is None:
                            step_started = perf_counter()
                            step = SourceStep(source.__anext__())
                            step.advance()
                        if deferred:
                            call_soon(deferred.pop())  # after the source's first step
                        if not step.ready:
                            await wait_step(step, waker, None)
                            if not step.ready:
                                continue  # a verdict: drained above, the source's step kept as it is
                        taken, step = step, None
                        try:
                            tok = taken.take()
                        except StopAsyncIteration:
                            break
                        slow = perf_counter() - step_started > _RACE_GAP_S
                    elif step is not None:
                        if deferred:
                            call_soon(deferred.pop())
                        taken, step = step, None
                        try:
                            tok = await taken
                        except StopAsyncIteration:
                            break
                    else:
                        if deferred:
                            call_soon(deferred.pop())
                        timer -= 1
                        if timer:
                            try:
                                tok = await source.__anext__()
                            except StopAsyncIteration:
                                break
                        else:
                            # the source's pace, sampled: timing every token costs more than the rest of
                            # this branch, and a source does not change its pace from one token to the next
                            timer = _GAP_SAMPLE
                            t0 = perf_counter()
                            try:
                                tok = await source.__anext__()
                            except StopAsyncIteration:
                                break
                            slow = perf_counter() - t0 > _RACE_GAP_S
                    if broken:
                        if isinstance(tok, str) and tok:
                            yield token_event(tok)
                        continue
                    if (fast and s._holding and tok.__class__ is str and tok and tok.isascii() and s._n_tokens
                            and len(tok) <= _MAX_TOKEN):
                        # a burst: the session holds its tokens for the scan its deferred work runs on the
                        # loop's next pass (see GuardSession.accept), so a token of it needs nothing else
                        # until then: the burst's plain tokens are appended here, as a stream nothing judges
                        # passes its tokens, without a call into the session or this loop's checks per
                        # token (its first token went through accept(), which timed it). It ends with the
                        # pass (the source awaited the loop: the session no longer holds), a verdict (which
                        # the round below drains before the token that saw it), a token of another kind, or
                        # the source's end
                        held: list[str] = s._held  # type: ignore[assignment]
                        held.append(tok)
                        burst = 1
                        yield shared(tok) or token_event(tok)
                        if deferred:
                            call_soon(deferred.pop())  # the pass that ends the burst runs the deferred work
                        tok = _NO_TOKEN
                        async for tok in source:
                            if (tok.__class__ is str and tok and tok.isascii() and s._holding
                                    and not s.has_events and len(tok) <= _MAX_TOKEN):
                                held.append(tok)
                                burst += 1
                                yield shared(tok) or token_event(tok)
                                continue
                            break
                        else:
                            tok = _NO_TOKEN
                        s.passed(burst)
                        burst = 0
                        if tok is _NO_TOKEN:
                            break  # the source ended
                        first = tok  # the token that ended the burst goes through on the next round
                        continue
                    try:
                        text = accept(tok)
                    except Exception:  # our bug must not break the user's stream: pass tokens through
                        _log.exception("streamjudge: guard failed on a token; passing the stream through")
                        broken = True
                        text = tok if isinstance(tok, str) else None
                        hold = False
                    if text is not None and not hold:
                        # this runs per token: a str subclass gets an event of its own (see token_event)
                        yield (shared(text) if text.__class__ is str else None) or token_event(text)
                if step is not None:
                    step.abandon()
                    step = None
                if s.stopped:
                    outcome = "stopped"
                    break
                s.close_tail()
                while deferred:  # no next token to wait for: the last checkpoint spans end now
                    deferred.pop()()
                s.hush_passes(False)  # the end wait counts every verdict
                async for ev in settle(s, waker):
                    yield ev
                if s.regen_request is not None and not s.stopped:
                    # the last window failed after the source ended: regenerate from the good prefix
                    await _aclose(source)
                    source = _to_async(s.open_regeneration(s.begin_regeneration()))
                    pending = s._pending
                    continue
                if s.stopped:
                    outcome = "stopped"
                break
            for ev in s.finish(outcome):
                yield ev
        except (GeneratorExit, asyncio.CancelledError):
            s.passed(burst)
            s.abort("disconnected")
            raise
        except BaseException as exc:
            s.passed(burst)
            s.abort("error", exc)
            raise
        finally:
            s.set_notify(None)
            s.set_deferral(None)
            if step is not None:
                step.abandon()
            if s.stopped or outcome != "completed":
                await _aclose(source)

    def _run_sync(self) -> Iterator[StreamEvent]:
        s = self.session
        if not isinstance(self._source, Iterable):
            raise TypeError("an async token source needs `async for`")
        woke = threading.Event()
        s.set_notify(woke.set)
        source: Iterator[Any] = iter(self._source)
        outcome = "completed"
        try:
            yield from s.start()
            if s.preflight_blocks:  # the gate may stop the answer before its first token
                woke.wait(s.settings.preflight_wait_s)
            while True:  # one round per token source: the app's, then each regeneration's
                while not s.stopped:
                    if s.has_events:
                        yield from s.drain()
                        if s.regen_request is not None:
                            source = _regenerated(s, source)
                            continue
                        if s.stopped:
                            break
                    try:
                        tok = next(source)
                    except StopIteration:
                        break
                    text = s.accept(tok)
                    if text is not None and not s.hold_back:
                        yield token_event(text)
                if s.stopped:
                    outcome = "stopped"
                    break
                s.close_tail()
                yield from settle_sync(s, woke)
                if s.regen_request is not None and not s.stopped:
                    # the last window failed after the source ended: regenerate from the good prefix
                    source = _regenerated(s, source)
                    continue
                if s.stopped:
                    outcome = "stopped"
                break
            yield from s.finish(outcome)
        except GeneratorExit:
            s.abort("disconnected")
            raise
        except BaseException as exc:
            s.abort("error", exc)
            raise
        finally:
            s.set_notify(None)
            if outcome != "completed":
                _close_sync(source)


def end_wait(
    session: GuardSession,
    *,
    wait_s: float | None = None,
    ready: Callable[[], bool] | None = None,
    take: Callable[[], list[StreamEvent]] | None = None,
    clock: Callable[[], float] = time.monotonic,
) -> Iterator[list[StreamEvent] | float]:
    """The one end-of-stream wait every driver runs after :meth:`GuardSession.close_tail`.

    Yields lists of events to deliver, and numbers: seconds the driver waits for a verdict (woken early by
    the session's notify callback). It ends when nothing is in flight (the pre-flight verdict included:
    a fast source can end before it came, and it belongs on the span), at the deadline (``wait_s``,
    default the session's ``end_wait_s``), at a stop, or when a regeneration is due (the driver
    regenerates first; the new text gets its own wait). ``ready`` / ``take`` read the events (default:
    the session's own; a binding passes what it keeps for its wrapper too).
    """
    ready = ready or (lambda: session.has_events)
    take = take or session.drain
    deadline = clock() + (session.settings.end_wait_s if wait_s is None else wait_s)
    while not session.stopped:
        if ready():
            events = take()
            if events:
                yield events
            if session.regen_request is not None:
                return
            continue
        if not (session.outstanding or session.preflight_pending):
            break
        remaining = deadline - clock()
        if remaining <= 0:
            break
        yield remaining
    if ready():
        events = take()
        if events:
            yield events


async def settle(
    session: GuardSession, waker: AsyncWaker | None = None, wait_s: float | None = None
) -> AsyncIterator[StreamEvent]:
    """End of the token source: yield the events of verdicts still in flight, for at most ``wait_s``
    (default: the session's ``end_wait_s``), so warnings about the last sentences reach the client before
    ``done``. Call :meth:`GuardSession.close_tail` first and :meth:`GuardSession.finish` after."""
    loop = asyncio.get_running_loop()
    own = waker is None
    if waker is None:
        waker = AsyncWaker(loop)
        session.set_notify(waker.notify)
    try:
        for step in end_wait(session, wait_s=wait_s, clock=loop.time):
            if isinstance(step, list):
                for ev in step:
                    yield ev
            else:
                await waker.wait(None, step)
    finally:
        if own:
            session.set_notify(None)


def settle_sync(
    session: GuardSession, woke: threading.Event, wait_s: float | None = None
) -> Iterator[StreamEvent]:
    """:func:`settle` for a thread: ``woke`` is set by the session's notify callback."""
    for step in end_wait(session, wait_s=wait_s):
        if isinstance(step, list):
            yield from step
        else:
            woke.clear()
            if not session.has_events:  # set after the clear: the verdict came in between
                woke.wait(step)


def _regenerated(s: GuardSession, old: Iterator[Any]) -> Iterator[Any]:
    _close_sync(old)
    new = s.open_regeneration(s.begin_regeneration())
    if not isinstance(new, Iterable):
        raise TypeError("regenerate must return a sync iterable for a sync stream")
    return iter(new)


def _to_async(source: TokenSource) -> AsyncIterator[Any]:
    if isinstance(source, AsyncIterable):
        return aiter(source)
    if isinstance(source, Iterable):
        return _SyncToAsync(iter(source))
    raise TypeError(f"tokens must be an iterable or async iterable, got {type(source).__name__}")


class _SyncToAsync:
    """A sync iterator seen as an async one (a sync source is assumed to be non-blocking)."""

    __slots__ = ("_it",)

    def __init__(self, it: Iterator[Any]) -> None:
        self._it = it

    def __aiter__(self) -> _SyncToAsync:
        return self

    async def __anext__(self) -> Any:
        try:
            return next(self._it)
        except StopIteration:
            raise StopAsyncIteration from None

    async def aclose(self) -> None:
        _close_sync(self._it)


class _Exhausted:
    """A token source that has ended (what a driver reads from once the app's source ended)."""

    __slots__ = ()

    def __aiter__(self) -> _Exhausted:
        return self

    async def __anext__(self) -> Any:
        raise StopAsyncIteration


_EXHAUSTED = _Exhausted()
_NO_TOKEN: Any = object()  # no token waits to go through (a source may yield None: it is a token here)


async def _aclose(source: AsyncIterator[Any]) -> None:
    close = getattr(source, "aclose", None)
    if close is not None:
        try:
            await close()
        except Exception:
            _log.debug("streamjudge: closing the token source failed", exc_info=True)


def _close_sync(source: Iterator[Any]) -> None:
    close = getattr(source, "close", None)
    if close is not None:
        try:
            close()
        except Exception:
            _log.debug("streamjudge: closing the token source failed", exc_info=True)
