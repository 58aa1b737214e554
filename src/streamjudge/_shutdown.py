"""Drain judged spans when the process is terminated by a signal, within a deadline.

The OpenTelemetry SDK flushes its exporters from an ``atexit`` handler, which runs when Python exits
normally (``sys.exit``, ``KeyboardInterrupt``), not when a signal's default action kills the process.
A single-process uvicorn catches SIGTERM, shuts its server down gracefully, restores the handlers it
found and raises SIGTERM again: the process dies by the signal and every span still waiting for its final
judgement, or in an exporter's queue, is lost.

:func:`install_signal_drain` puts a handler for SIGTERM in front of whatever handles it, and keeps it
there: ``signal.signal`` is wrapped so that a handler installed later (uvicorn's, asyncio's) becomes the
*previous* handler of ours instead of replacing it, and ``signal.getsignal`` reports that handler. When
the signal arrives, ours calls the previous handler first. Only when the signal is about to end the
process (the previous handler is the default action, or it raised ``SystemExit``/``KeyboardInterrupt``)
it drains, within ``STREAMJUDGE_SHUTDOWN_TIMEOUT`` (default 5 s): the judge pool gets most of the time,
held spans go out judged or marked ``shutdown``, sinks and exporters flush under the same deadline, and
the tracer, meter and logger providers shut down. Then the default action runs as before (the exit
status still says "terminated by SIGTERM"). A second SIGTERM during the drain ends the process at once.

The drain runs on a helper thread the handler waits for, so a lock held by the interrupted main thread
can delay it only up to the deadline, never hang the exit.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import signal
import threading
import time
from collections.abc import Callable, Iterable
from types import FrameType
from typing import TYPE_CHECKING, Any

from streamjudge._deadline import (
    Deadline,
    keep_open,
    pool_budget_millis,
    shutdown_deadline,
    shutdown_timeout_s,
)

if TYPE_CHECKING:
    from streamjudge.runtime import Runtime

_log = logging.getLogger(__name__)

Handler = Callable[[int, FrameType | None], Any] | int | signal.Handlers | None

#: how long past the deadline the handler waits for the drain thread (its last export call returning)
_JOIN_SLACK_S = 0.5

_lock = threading.RLock()
_drains: dict[int, _SignalDrain] = {}
_original_signal = signal.signal
_original_getsignal = signal.getsignal


class _SignalDrain:
    """The handler installed for one signal: the previous handler first, the drain when it would end the
    process."""

    def __init__(self, signum: int, previous: Handler, runtime: Callable[[], Runtime | None],
                 timeout_s: float | None, global_providers: bool = True) -> None:
        self.signum = signum
        self.previous = previous
        self._runtime = runtime
        self._timeout_s = timeout_s
        self._global_providers = global_providers
        self._draining = False
        self.drained: bool | None = None  # the outcome of the last drain (for tests and logs)

    def __call__(self, signum: int, frame: FrameType | None) -> None:
        previous = self.previous
        if self._draining:  # a second signal while draining: end now, as the user asked twice
            self._terminate(previous if callable(previous) else None, signum, frame)
            return
        if previous is signal.SIG_IGN:
            return
        if callable(previous):
            try:
                previous(signum, frame)
            except (SystemExit, KeyboardInterrupt):
                self._drain()
                raise
            return
        # SIG_DFL (or a handler not installed from Python): the signal ends the process
        self._drain()
        self._terminate(None, signum, frame)

    def _drain(self) -> None:
        self._draining = True
        try:
            timeout = self._timeout_s if self._timeout_s is not None else shutdown_timeout_s()
            self.drained = drain(self._runtime(), timeout, global_providers=self._global_providers)
        except Exception:  # a failed drain must not keep the process from ending
            _log.exception("streamjudge: draining on signal %d failed", self.signum)

    def _terminate(self, handler: Callable[..., Any] | None, signum: int, frame: FrameType | None) -> None:
        if handler is not None:
            handler(signum, frame)
            return
        _original_signal(signum, signal.SIG_DFL)
        signal.raise_signal(signum)
        # the default action of SIGTERM ends the process above; for a signal whose default is to be
        # ignored, stay installed
        _original_signal(signum, self)

    def __repr__(self) -> str:
        return f"<streamjudge signal drain for {signal.Signals(self.signum).name}, then {self.previous!r}>"


def drain(runtime: Runtime | None, timeout_s: float | None = None, *, global_providers: bool = True) -> bool:
    """Shut ``runtime`` (and, with ``global_providers``, the global tracer, meter and logger providers)
    down within ``timeout_s`` (default ``STREAMJUDGE_SHUTDOWN_TIMEOUT``); True when all finished in time.

    Safe to call from a signal handler: the work runs on a helper thread, waited for no longer than the
    deadline (plus a little slack for an export call to return).
    """
    timeout = shutdown_timeout_s() if timeout_s is None else timeout_s
    t0 = time.monotonic()
    with shutdown_deadline(timeout) as deadline:
        done = threading.Event()

        def run() -> None:
            try:
                if runtime is not None:
                    shutdown_runtime(runtime, deadline)
                if global_providers:
                    _shutdown_global_providers(deadline)
            except Exception:
                _log.exception("streamjudge: shutdown within the deadline failed")
            finally:
                done.set()

        try:
            worker = threading.Thread(target=run, name="streamjudge-drain", daemon=True)
            worker.start()
        except RuntimeError:  # no new threads this late in interpreter shutdown: drain here
            run()
        finished = done.wait(deadline.remaining() + _JOIN_SLACK_S)
        if not finished:
            keep_open(deadline)
    took = time.monotonic() - t0
    if finished:
        _log.info("streamjudge: drained in %.2fs", took)
    else:
        _log.warning("streamjudge: shutdown deadline (%.1fs) passed; what was not exported is lost", timeout)
    return finished


def shutdown_runtime(runtime: Runtime, deadline: Deadline) -> None:
    """``runtime.shutdown`` within ``deadline``.

    A runtime whose ``shutdown`` takes ``timeout_millis`` is given what is left of the deadline; an older
    one gets its judge pool drained first within :func:`~streamjudge._deadline.pool_budget_millis` (70%
    of the deadline, keeping 1 s for the export), so that the processor's own, longer wait for the pool
    returns at once and the spans it held go out marked ``shutdown``.
    """
    try:
        takes_deadline = "timeout_millis" in inspect.signature(runtime.shutdown).parameters
    except (TypeError, ValueError):
        takes_deadline = False
    if takes_deadline:
        runtime.shutdown(timeout_millis=deadline.remaining_millis())  # type: ignore[call-arg]
        return
    pool = getattr(runtime, "pool", None)
    if pool is not None:
        pool.shutdown(pool_budget_millis(deadline.remaining_millis()))
    runtime.shutdown()


def _shutdown_global_providers(deadline: Deadline) -> None:
    """What the SDK's atexit handlers would have done: shut the global providers down (idempotent)."""
    from opentelemetry import metrics, trace
    from opentelemetry._logs import get_logger_provider

    for provider in (trace.get_tracer_provider(), get_logger_provider(), metrics.get_meter_provider()):
        shutdown = getattr(provider, "shutdown", None)
        if shutdown is None or deadline.expired:
            continue
        with contextlib.suppress(Exception):
            if _takes_timeout(shutdown):
                shutdown(timeout_millis=deadline.remaining_millis())
            else:
                shutdown()


def _takes_timeout(fn: Callable[..., Any]) -> bool:
    try:
        return "timeout_millis" in inspect.signature(fn).parameters
    except (TypeError, ValueError):
        return False


# --- keeping the handler installed ------------------------------------------------------------------


def _signal(signalnum: int, handler: Handler) -> Handler:
    """``signal.signal`` that keeps streamjudge's drain in front of the handler being installed."""
    d = _drains.get(signalnum)
    if d is None:
        return _original_signal(signalnum, handler)  # type: ignore[arg-type]
    if threading.current_thread() is not threading.main_thread():
        raise ValueError("signal only works in main thread of the main interpreter")
    if not (handler in (signal.SIG_DFL, signal.SIG_IGN) or callable(handler)):
        raise TypeError("signal handler must be signal.SIG_IGN, signal.SIG_DFL, or a callable object")
    with _lock:
        previous = d.previous
        if handler is not d:
            d.previous = handler
        _original_signal(signalnum, d)
    return previous


def _getsignal(signalnum: int) -> Handler:
    """``signal.getsignal`` that reports the handler streamjudge's drain runs in front of."""
    d = _drains.get(signalnum)
    current: Handler = _original_getsignal(signalnum)
    if d is not None and _same(current, d):
        return d.previous
    return current


def install_signal_drain(
    runtime: Runtime | Callable[[], Runtime | None] | None = None,
    *,
    signals: Iterable[int] = (signal.SIGTERM,),
    timeout_s: float | None = None,
    global_providers: bool = True,
    at_exit: bool = True,
) -> bool:
    """Drain ``runtime`` (default: the process's current runtime at signal time) when one of ``signals``
    is about to end the process. Idempotent; False (and nothing installed) off the main thread.

    ``timeout_s`` defaults to ``STREAMJUDGE_SHUTDOWN_TIMEOUT`` read when the signal arrives.
    ``global_providers``: also shut the global tracer/meter/logger providers down, as the SDK's atexit
    handlers would have. ``at_exit``: bound the drain at interpreter exit by the same deadline
    (:func:`install_exit_drain`).
    """
    if at_exit:
        install_exit_drain(runtime, timeout_s=timeout_s)
    if threading.current_thread() is not threading.main_thread():
        _log.debug("streamjudge: signal drain not installed (not on the main thread)")
        return False
    get_runtime = _runtime_getter(runtime)
    with _lock:
        for signum in signals:
            d = _drains.get(signum)
            if d is not None:
                d._runtime, d._timeout_s, d._global_providers = get_runtime, timeout_s, global_providers
                if not _same(_original_getsignal(signum), d):  # someone bypassed the wrapper
                    d.previous = _original_getsignal(signum)
                    _original_signal(signum, d)
                continue
            previous = _original_getsignal(signum)
            d = _SignalDrain(signum, previous, get_runtime, timeout_s, global_providers)
            _original_signal(signum, d)
            _drains[signum] = d
        signal.signal = _signal  # type: ignore[assignment]
        signal.getsignal = _getsignal  # type: ignore[assignment]
    return True


def uninstall_signal_drain() -> None:
    """Put the handlers (and ``signal.signal`` / ``signal.getsignal``) back as they would be without us."""
    if threading.current_thread() is not threading.main_thread():
        return
    with _lock:
        for signum, d in list(_drains.items()):
            if _same(_original_getsignal(signum), d):
                previous = d.previous if d.previous is not None else signal.SIG_DFL
                _original_signal(signum, previous)  # type: ignore[arg-type]
            del _drains[signum]
        signal.signal = _original_signal
        signal.getsignal = _original_getsignal


def _same(handler: object, drain_: _SignalDrain) -> bool:
    return handler is drain_


def installed_drain(signum: int = signal.SIGTERM) -> _SignalDrain | None:
    """The drain installed for ``signum``, if any."""
    return _drains.get(signum)


_exit_drain_installed = False


def install_exit_drain(runtime: Runtime | Callable[[], Runtime | None] | None = None,
                       *, timeout_s: float | None = None) -> None:
    """Drain within the deadline at interpreter exit too (``sys.exit``, end of the script, Ctrl+C),
    before the SDK's own atexit shutdown, which has no overall deadline (it can take tens of seconds after
    a large run). Only the runtime is drained: the providers' own atexit handlers run
    after it, with the runtime's spans already exported. Idempotent.
    """
    global _exit_drain_installed
    import atexit

    with _lock:
        if _exit_drain_installed:
            return
        _exit_drain_installed = True
    get_runtime = _runtime_getter(runtime)

    def at_exit() -> None:
        rt = get_runtime()
        if rt is not None and not getattr(rt, "_closed", False):
            drain(rt, timeout_s, global_providers=False)

    # atexit runs handlers last-in first-out: registered after the SDK's providers, this one runs first
    atexit.register(at_exit)


def _runtime_getter(runtime: Runtime | Callable[[], Runtime | None] | None) -> Callable[[], Runtime | None]:
    if runtime is None:

        def current() -> Runtime | None:
            from streamjudge.runtime import current_runtime

            return current_runtime()

        return current
    if callable(runtime) and not hasattr(runtime, "shutdown"):
        return runtime
    return lambda: runtime  # type: ignore[return-value]

