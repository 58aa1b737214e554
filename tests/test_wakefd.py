"""WakeFd: wakes another thread's loop without handing that thread the GIL, once for any number of rings
before the loop runs, and a ring after the loop stopped watching goes to nobody."""

from __future__ import annotations

import asyncio
import gc
import os
import sys
import threading
from collections.abc import Iterator

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
