"""WakeFd: wakes another thread's loop without handing that thread the GIL, once for any number of rings
before the loop runs, and a ring after the loop stopped watching goes to nobody."""

from __future__ import annotations

import asyncio
import gc
import os
import resource
import selectors
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from streamjudge import _wakefd
from streamjudge._wakefd import WakeFd


@pytest.fixture
def long_switch_interval() -> Iterator[None]:
    # the GIL changes hands only where a thread releases it: not on a timer in the middle of a check
    old = sys.getswitchinterval()
    sys.setswitchinterval(5.0)
    try:
        yield
    finally:
        sys.setswitchinterval(old)


@pytest.mark.skipif(_wakefd._write is None, reason="no GIL-holding write here (falls back to os.write)")
def test_a_ring_does_not_hand_the_gil_to_the_thread_it_wakes(long_switch_interval: None) -> None:
    # the woken thread runs Python code (sets `ran`) as soon as it has the GIL: right after the write
    # nothing may have run it. With os.write (a GIL release around the syscall) it often has by then.
    ran_before_caller: list[bool] = []
    for _ in range(30):
        r, w = os.pipe()
        ran = threading.Event()
        entered = threading.Event()

        def woken(r: int = r, ran: threading.Event = ran, entered: threading.Event = entered) -> None:
            entered.set()
            os.read(r, 1)  # waits with the GIL released, as a loop waits in epoll
            ran.set()

        t = threading.Thread(target=woken)
        t.start()
        assert entered.wait(5)
        threading.Event().wait(0.005)  # let it block in read()
        assert _wakefd._write is not None
        _wakefd._write(w, b"\0")
        ran_before_caller.append(ran.is_set())  # no GIL release between the write and here
        t.join(5)
        os.close(r)
        os.close(w)
    assert not any(ran_before_caller)


def test_rings_before_the_loop_runs_are_one_call_on_its_thread() -> None:
    loop = asyncio.new_event_loop()
    calls: list[int] = []
    started, gate, done = threading.Event(), threading.Event(), threading.Event()
    bells: list[WakeFd] = []

    def serve() -> None:
        asyncio.set_event_loop(loop)
        bells.append(WakeFd(loop, lambda: (calls.append(threading.get_ident()), done.set())))
        loop.call_soon(started.set)
        loop.call_soon(gate.wait, 5)  # busy: the rings below wait for the loop's next pass
        loop.run_forever()

    t = threading.Thread(target=serve)
    t.start()
    try:
        assert started.wait(5)
        (bell,) = bells
        for _ in range(5):
            bell.ring()
        gate.set()
        assert done.wait(5)
        loop.call_soon_threadsafe(loop.stop)
        t.join(5)
        assert calls == [t.ident]  # the pipe's bytes were drained in one read
        bell.detach(loop)
        bell.ring()  # nobody watches: no error, no call
        assert calls == [t.ident]
    finally:
        loop.close()
    del bells[:], bell
    gc.collect()  # its pipe closes with it


EXIT_SCRIPT = '''
import asyncio, atexit, threading, weakref
from streamjudge._wakefd import WakeFd

woke = threading.Event()

def drain():  # as streamjudge's exit drain: registered first, it runs after handlers registered later
    bell.ring()
    print("woke" if woke.wait(5) else "lost", flush=True)

atexit.register(drain)
# the first finalizer of the process registers finalize's own atexit hook: the order above only holds if
# WakeFd's is that first one, so the test would pass without the fix otherwise
assert not weakref.finalize._registered_with_atexit
loop = asyncio.new_event_loop()
made = threading.Event()

def serve():
    global bell
    bell = WakeFd(loop, woke.set)
    made.set()
    loop.run_forever()

threading.Thread(target=serve, daemon=True).start()  # daemon: still running when atexit handlers do
made.wait(5)
'''


def test_the_pipe_stays_open_for_the_exit_drain() -> None:
    # weakref.finalize closes at interpreter exit by default, from an atexit hook registered after the
    # drain's (so run before it): the drain's ring went into a closed pipe and the loop never woke
    import subprocess

    out = subprocess.run([sys.executable, "-c", EXIT_SCRIPT], capture_output=True, text=True, timeout=60,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "woke"


# --- the judge pool's loop: polls and pipe reads/writes that cannot block keep the GIL --------------------


def _wakeups_of_a_gil_waiter(call: Callable[[], object], n: int = 50) -> int:
    """How often a thread that waits for the GIL is woken while this one makes ``call`` ``n`` times (with
    0.2 ms of Python between calls, in which the woken thread goes back to waiting); ``n`` when it even
    got the GIL before the calls were over. A call that releases the GIL wakes it each time (and now and
    then hands it the GIL); one that keeps it, never."""
    r, w = os.pipe()
    seen: dict[str, int] = {}
    calls_over: list[bool] = []

    def waiter() -> None:
        seen["before"] = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        os.read(r, 1)  # blocked with the GIL released, then waiting for it
        seen["after"] = resource.getrusage(resource.RUSAGE_THREAD).ru_nvcsw
        seen["early"] = not calls_over

    def spin(seconds: float) -> None:  # Python work that keeps the GIL (perf_counter makes no syscall)
        end = time.perf_counter() + seconds
        while time.perf_counter() < end:
            pass

    t = threading.Thread(target=waiter)
    t.start()
    try:
        while "before" not in seen:
            time.sleep(0.001)
        time.sleep(0.01)  # let it block in read()
        assert _wakefd._write is not None
        _wakefd._write(w, b"\0")  # its read returns; it now waits for the GIL this thread keeps
        spin(0.02)
        for _ in range(n):
            call()
            spin(0.0002)
        calls_over.append(True)
    finally:
        t.join(10)  # releases the GIL: it runs
        os.close(r)
        os.close(w)
    return n if seen["early"] else seen["after"] - seen["before"]


needs_gil_holding_calls = pytest.mark.skipif(
    _wakefd._epoll is None or _wakefd._write is None, reason="no GIL-holding libc calls here (fallbacks)"
)


@needs_gil_holding_calls
def test_a_poll_that_cannot_block_does_not_wake_a_thread_waiting_for_the_gil(
    long_switch_interval: None,
) -> None:
    # each release of the GIL while another thread waits for it costs the releasing thread a futex wake
    # (and often the GIL itself): the pool's loop polls with a zero timeout several times per judge call
    stdlib, ours = selectors.EpollSelector(), _wakefd.GilSelector()
    pr, pw = os.pipe()
    try:
        for sel in (stdlib, ours):
            sel.register(pr, selectors.EVENT_READ)
        if _wakeups_of_a_gil_waiter(lambda: stdlib.select(0)) < 25:
            pytest.skip("this interpreter's GIL release does not wake a waiter: nothing to tell apart")
        assert _wakeups_of_a_gil_waiter(lambda: ours.select(0)) <= 5
    finally:
        stdlib.close()
        ours.close()
        os.close(pr)
        os.close(pw)


@needs_gil_holding_calls
def test_nonblocking_reads_and_writes_do_not_wake_a_thread_waiting_for_the_gil(
    long_switch_interval: None,
) -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)

    def write_and_read() -> None:
        _wakefd.write_nonblocking(w, b"x")
        assert _wakefd.read_nonblocking(r, 10) == b"x"

    try:
        assert _wakeups_of_a_gil_waiter(write_and_read) <= 5
    finally:
        os.close(r)
        os.close(w)


def test_the_gil_holding_selector_reports_what_the_stdlib_reports() -> None:
    ours, theirs = _wakefd.GilSelector(), selectors.DefaultSelector()
    r1, w1 = os.pipe()
    r2, w2 = os.pipe()
    try:
        for sel in (ours, theirs):
            sel.register(r1, selectors.EVENT_READ, "r1")
            sel.register(r2, selectors.EVENT_READ, "r2")
            sel.register(w1, selectors.EVENT_WRITE, "w1")

        def ready(sel: selectors.BaseSelector, timeout: float | None) -> set[tuple[str, int]]:
            return {(key.data, ev) for key, ev in sel.select(timeout)}

        assert ready(ours, 0) == ready(theirs, 0) == {("w1", selectors.EVENT_WRITE)}
        os.write(w1, b"x")
        assert ready(ours, 0) == ready(theirs, 0) == {("w1", selectors.EVENT_WRITE), ("r1", selectors.EVENT_READ)}
        os.close(w2)  # a closed writer: the reader is readable (EOF), as the stdlib says
        assert ready(ours, 0) == ready(theirs, 0)
        assert ("r2", selectors.EVENT_READ) in ready(ours, 0)
        assert ready(ours, 0.01) == ready(theirs, 0.01)  # a poll that may wait: the stdlib's own
        ours.unregister(w1)
        theirs.unregister(w1)
        assert ready(ours, 0) == ready(theirs, 0) == {("r1", selectors.EVENT_READ), ("r2", selectors.EVENT_READ)}
    finally:
        ours.close()
        theirs.close()
        for fd in (r1, w1, r2):
            os.close(fd)


def test_nonblocking_reads_and_writes_behave_as_os_read_and_write() -> None:
    r, w = os.pipe()
    os.set_blocking(r, False)
    os.set_blocking(w, False)
    try:
        with pytest.raises(BlockingIOError):
            _wakefd.read_nonblocking(r, 10)  # nothing there yet
        out = bytearray(b"hello ")
        assert _wakefd.write_nonblocking(w, out) == 6
        out.clear()  # written from the array in place, and the array can change size after
        assert _wakefd.write_nonblocking(w, b"world") == 5
        assert _wakefd.read_nonblocking(r, 3) == b"hel"
        assert _wakefd.read_nonblocking(r, 100) == b"lo world"
        big = b"x" * (1 << 20)  # more than a pipe holds: a partial write, then a full pipe
        n = _wakefd.write_nonblocking(w, big)
        assert 0 < n < len(big)
        with pytest.raises(BlockingIOError):
            _wakefd.write_nonblocking(w, big)
        got = b""
        while len(got) < n:
            got += _wakefd.read_nonblocking(r, 1 << 16)
        assert got == big[:n]
        os.close(r)
        r = -1
        with pytest.raises(BrokenPipeError):  # the reader is gone (SIGPIPE is ignored, as Python sets it)
            _wakefd.write_nonblocking(w, b"x")
    finally:
        for fd in (r, w):
            if fd >= 0:
                os.close(fd)
    with pytest.raises(OSError):
        _wakefd.read_nonblocking(r if r >= 0 else 10_000, 1)  # a bad descriptor


def test_the_judge_pool_runs_on_the_gil_holding_selector() -> None:
    from streamjudge.judging.pool import JudgePool

    pool = JudgePool(concurrency=1)
    try:
        pool._ensure_worker()
        assert pool._loop is not None
        selector = pool._loop._selector  # type: ignore[attr-defined]
        assert isinstance(selector, _wakefd.GilSelector) or _wakefd._epoll is None
    finally:
        pool.shutdown(5_000)


# --- a verdict's wake-up of the stream's loop (the judge pool's thread rings it) --------------------------


@needs_gil_holding_calls
def test_a_verdict_rings_a_waiting_loop_without_releasing_the_gil(long_switch_interval: None) -> None:
    # the pool's thread wakes a stream's loop for its verdicts: through the loop's self-pipe (a socket send)
    # that released the GIL to the app's thread, which the pool's thread then waited to get back
    from streamjudge.judging._drivers import _LoopBell

    loop = asyncio.new_event_loop()
    try:
        bell = _LoopBell(loop)
        assert bell._fd is not None
        waiter = object()

        def ring() -> None:
            bell._ringing = False  # as after the loop ran the last wake-up
            bell._due.clear()
            bell.ring(waiter)  # type: ignore[arg-type]

        if _wakeups_of_a_gil_waiter(lambda: loop.call_soon_threadsafe(lambda: None)) < 25:
            pytest.skip("this interpreter's GIL release does not wake a waiter: nothing to tell apart")
        assert _wakeups_of_a_gil_waiter(ring) <= 5
        # and the loop is woken: it runs the bell's wake-up of what rang it
        woken: list[object] = []
        bell._due = [_Waker(woken)]  # type: ignore[list-item]
        bell._ringing = False
        bell.ring(_Waker(woken))  # type: ignore[arg-type]
        loop.run_until_complete(asyncio.sleep(0.05))
        assert len(woken) == 2
    finally:
        loop.close()


class _Waker:
    def __init__(self, woken: list[object]) -> None:
        self.woken = woken

    def _wake(self) -> None:
        self.woken.append(self)


def test_a_loops_bell_and_its_pipe_go_with_the_loop_without_the_cyclic_gc() -> None:
    # a bell that its pipe's callback held strongly was a reference cycle: its descriptors stayed open until
    # the cyclic GC ran, one pair per loop that ever ran a guarded stream (each asyncio.run)
    import weakref

    from streamjudge.judging._drivers import _LoopBell

    loop = asyncio.new_event_loop()
    bell = _LoopBell(loop)
    assert bell._fd is not None
    bell_gone, pipe_gone = weakref.ref(bell), weakref.ref(bell._fd)
    loop.close()  # the loop forgets the pipe's reader
    gc.disable()
    try:
        del bell
        assert bell_gone() is None
        assert pipe_gone() is None  # and its finalizer closed the pipe
    finally:
        gc.enable()


def test_a_bell_rung_after_its_loop_closed_keeps_nothing() -> None:
    # a verdict racing the end of its loop: nobody reads the bell's pipe any more, so the wakers it was
    # rung for are let go, and the next ring is not taken for one still on its way
    from streamjudge.judging._drivers import _LoopBell

    loop = asyncio.new_event_loop()
    bell = _LoopBell(loop)
    loop.close()
    bell.ring(_Waker([]))  # type: ignore[arg-type]
    assert bell._due == [] and not bell._ringing


def test_a_loop_that_cannot_watch_a_descriptor_is_rung_through_call_soon_threadsafe(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from streamjudge.judging._drivers import _LoopBell

    async def main() -> list[object]:
        loop = asyncio.get_running_loop()

        def no_readers(*_args: object) -> None:
            raise NotImplementedError  # as a proactor loop's

        monkeypatch.setattr(loop, "add_reader", no_readers)
        bell = _LoopBell(loop)
        assert bell._fd is None
        woken: list[object] = []
        await asyncio.to_thread(bell.ring, _Waker(woken))  # type: ignore[arg-type]
        for _ in range(100):
            if woken:
                break
            await asyncio.sleep(0.01)
        return woken

    assert len(asyncio.run(main())) == 1
