"""A wake-up for another thread's event loop that does not hand that thread the GIL on the way.

``loop.call_soon_threadsafe`` writes to the loop's self-pipe with ``socket.send``, which releases the GIL
around the syscall. The thread it wakes runs on another core and often takes the GIL in that moment, and
the caller - the app's thread, streaming tokens - then waits until that thread gives it back. Measured at
500 streams with the judge pool woken this way: 87 µs of the app's loop per wake-up on average, ~40 ms per
4 s run. A one-byte write to a non-blocking pipe cannot block, so :class:`WakeFd` makes it with the GIL
held (libc's ``write`` through ``ctypes.PyDLL``, which does not release it); where that is not available
it falls back to ``os.write``.

The same holds for the pool's own thread. Each GIL release it makes while the app's thread waits for the
GIL, or while the app's thread will want it back, is a hand-off: a futex wake-up for the releasing or the
waiting side, a switch, and the caches of whichever thread ran in between. Its event loop polls with a zero
timeout whenever callbacks are ready (several times per judge call) and reads its pipes through ``os.read``,
all of which release the GIL. :class:`GilSelector` makes a poll that cannot block (a zero timeout) with the
GIL held, and :func:`read_nonblocking` / :func:`write_nonblocking` do the same for non-blocking pipes; a
poll that may wait releases it, as it must. Measured (``perf``, the app's thread over 20 runs of
``benchmarks/run.py``'s loop-pass streams, judged in a worker): 3-4% less of its CPU, most of it in the
kernel's wake-up and switch paths.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import platform
import select
import selectors
import threading
import weakref
from collections.abc import Callable
from typing import Any

__all__ = ["GilSelector", "WakeFd", "new_pool_loop", "read_nonblocking", "write_nonblocking"]

_libc: Any = None
with contextlib.suppress(ImportError, OSError):
    import ctypes

    # the process's own symbols, called with the GIL held (PyDLL); errno kept per call for the reads
    _libc = ctypes.PyDLL(None, use_errno=True)


def _raise_errno() -> None:
    code = ctypes.get_errno()
    raise OSError(code, os.strerror(code))  # the errno's own subclass (BlockingIOError for EAGAIN...)


def _gil_holding_read() -> Callable[[int, int], bytes] | None:
    try:
        read = _libc.read
    except AttributeError:
        return None
    read.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    read.restype = ctypes.c_ssize_t
    scratch = threading.local()  # a buffer per thread, kept: a pipe's reads are small and frequent

    def gil_read(fd: int, n: int) -> bytes:
        buf = getattr(scratch, "buf", None)
        if buf is None or len(buf) < n:
            buf = scratch.buf = ctypes.create_string_buffer(n)
        got = read(fd, buf, n)
        if got < 0:
            _raise_errno()
        return ctypes.string_at(buf, got)  # the bytes read, copied once

    return gil_read


_read = _gil_holding_read()


def read_nonblocking(fd: int, n: int) -> bytes:
    """``os.read(fd, n)`` for a descriptor that never blocks (``O_NONBLOCK``), without releasing the GIL
    (see the module's doc). Raises as ``os.read`` does (``BlockingIOError`` when there is nothing)."""
    return _read(fd, n) if _read is not None else os.read(fd, n)


def _gil_holding_write() -> Callable[[int, bytes | bytearray], int] | None:
    try:
        write = _libc.write
    except AttributeError:  # no ctypes, or no such symbol (Windows)
        return None
    write.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_size_t)
    write.restype = ctypes.c_ssize_t

    def gil_write(fd: int, data: bytes | bytearray) -> int:
        n = len(data)
        # a bytearray is passed in place (no copy); the view is gone before the caller may resize it
        got = write(fd, (ctypes.c_char * n).from_buffer(data) if data.__class__ is bytearray else data, n)
        if got < 0:
            _raise_errno()
        return int(got)

    return gil_write


_write = _gil_holding_write()


def write_nonblocking(fd: int, data: bytes | bytearray) -> int:
    """``os.write(fd, data)`` for a descriptor that never blocks (``O_NONBLOCK``), without releasing the
    GIL (see the module's doc). Raises as ``os.write`` does (``BlockingIOError`` when the pipe is full)."""
    return _write(fd, data) if _write is not None else os.write(fd, data)


def _gil_holding_epoll() -> tuple[Callable[..., int], type[Any]] | None:
    try:
        epoll_wait = _libc.epoll_wait
    except AttributeError:  # no ctypes, or not Linux
        return None

    class _Data(ctypes.Union):
        _fields_ = (("fd", ctypes.c_int), ("u64", ctypes.c_uint64))

    packed = platform.machine().lower() in ("x86_64", "amd64")

    class _Event(ctypes.Structure):
        # the kernel's struct epoll_event is packed on x86-64 only (glibc's __EPOLL_PACKED)
        if packed:
            _pack_ = 1
        _fields_ = (("events", ctypes.c_uint32), ("data", _Data))

    if ctypes.sizeof(_Event) != (12 if packed else 16):
        return None
    epoll_wait.argtypes = (ctypes.c_int, ctypes.c_void_p, ctypes.c_int, ctypes.c_int)
    epoll_wait.restype = ctypes.c_int
    return epoll_wait, _Event


# GilSelector reads the stdlib selector's key table (private, but in every version since 3.4): without it,
# the stdlib's own polls
_epoll = (_gil_holding_epoll() if hasattr(getattr(selectors, "EpollSelector", None), "_key_from_fd")
          else None)
_EpollBase: Any = getattr(selectors, "EpollSelector", selectors.DefaultSelector)


class GilSelector(_EpollBase):  # type: ignore[misc]
    """An epoll selector whose polls that cannot block (a zero timeout: the loop has callbacks ready) keep
    the GIL (see the module's doc); a poll that may wait releases it, as any. For the judge pool's own
    event loop, whose thread shares the app's GIL."""

    _events: Any = None  # the poll's event array (one thread polls a selector)

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if _epoll is None or timeout is None or timeout > 0:
            return super().select(timeout)  # type: ignore[no-any-return]
        epoll_wait, event = _epoll
        n = max(len(self._fd_to_key), 1)
        events = self._events
        if events is None or len(events) < n:
            events = self._events = (event * n)()  # kept: the loop polls over and over
        got = epoll_wait(self.fileno(), events, n, 0)  # -1 (EINTR): nothing ready, as the stdlib's
        ready: list[tuple[selectors.SelectorKey, int]] = []
        for i in range(got):
            ev = events[i]
            mask = ev.events
            flags = 0
            if mask & ~select.EPOLLIN:
                flags |= selectors.EVENT_WRITE
            if mask & ~select.EPOLLOUT:
                flags |= selectors.EVENT_READ
            key = self._key_from_fd(ev.data.fd)
            if key:
                ready.append((key, flags & key.events))
        return ready


def new_pool_loop() -> asyncio.AbstractEventLoop:
    """An event loop for a thread beside the app's (the judge pool's): with :class:`GilSelector` where
    libc's epoll is at hand, else the policy's new loop."""
    if _epoll is None:
        return asyncio.new_event_loop()
    return asyncio.SelectorEventLoop(GilSelector())


def _close(r: int, w: int) -> None:
    for fd in (r, w):
        with contextlib.suppress(OSError):
            os.close(fd)


class WakeFd:
    """Calls ``callback`` on ``loop`` (its thread) after :meth:`ring` (any thread; rings before the loop
    ran it are one call). The pipe is closed when this object is collected, never while a ringing thread
    holds it: a closed descriptor's number may be reused by another file, which a late ring would write to.
    It stays open through interpreter exit (the loop may still be draining then; the OS closes it).
    """

    __slots__ = ("__weakref__", "_callback", "_r", "_w")

    def __init__(self, loop: asyncio.AbstractEventLoop, callback: Callable[[], None]) -> None:
        self._r, self._w = os.pipe()
        os.set_blocking(self._r, False)
        os.set_blocking(self._w, False)
        self._callback = callback
        # not at interpreter exit (finalize's default): its atexit hook, registered with the first finalizer
        # made after streamjudge's exit drain, would run before that drain and close the pipe under it - a
        # ring the loop had not read yet was lost with it, and the judge pool slept through the drain while
        # a stream's verdict waited (seen as a probe app's stream span without scores under CPU load)
        weakref.finalize(self, _close, self._r, self._w).atexit = False
        loop.add_reader(self._r, self._readable)

    def ring(self) -> None:
        """Wake the loop (from any thread); never blocks, never raises."""
        # BlockingIOError when the pipe is full: a wake-up is pending anyway
        with contextlib.suppress(OSError):
            write_nonblocking(self._w, b"\0")

    def _readable(self) -> None:
        # one read empties the pipe unless 4,096 rings came first: no second read just to see EAGAIN
        with contextlib.suppress(OSError):
            while len(read_nonblocking(self._r, 4096)) == 4096:
                pass
        self._callback()

    def detach(self, loop: asyncio.AbstractEventLoop) -> None:
        """Stop watching the pipe on ``loop`` (before it closes); a later ring goes to nobody."""
        with contextlib.suppress(Exception):
            loop.remove_reader(self._r)
