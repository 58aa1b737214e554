"""The process judge: a CPU-bound judge (``local``, ``model``) run in worker processes, off the app's GIL.

The judge pool's thread shares the application's GIL, so the pool caps its CPU (``judge_cpu_share``) and a
CPU-bound judge's throughput is that cap. :class:`ProcessJudge` moves the judging itself into N worker
processes; the pool's thread only pickles a request, writes it to a pipe and, when the event loop sees the
reply pipe readable, unpickles the result — tens of microseconds per call, and awaiting the reply costs the
thread no CPU (the pool throttles on ``time.thread_time`` of its own thread only).

- Workers are fresh interpreters (``python -I``, started with ``subprocess`` — a fork-exec like
  multiprocessing's ``spawn``): safe from a threaded app, and unlike ``spawn`` they neither re-run the app's
  ``__main__`` module nor the ``sitecustomize`` of ``opentelemetry-instrument`` (which would configure
  streamjudge, and its process judge, again in every worker). Each worker builds its judges from a picklable
  :class:`JudgeSpec` (judge name + Settings + tier) with :func:`~streamjudge.judging.judges.create_judge`.
- Workers start when the judge is created (configure time); one set of workers serves every tier of one
  Settings (the checkpoint and final judges share them).
- Requests travel over one pipe per worker, replies over another, both read and written on the pool's event
  loop (``add_reader`` / ``add_writer``): no helper thread, no thread hop per call.
- All calls with one contexts tuple go to one worker (by hash), so its context-index cache hits, and the
  contexts cross the pipe once per worker: later calls name them by a small id.
- A worker that dies (killed, segfault) fails its in-flight calls with :class:`JudgeError` (the pool records
  an ``error`` outcome) and is restarted; one that keeps dying at start-up is restarted with backoff, calls
  failing fast meanwhile. A worker that leaves a call unanswered for a whole ``judge_timeout_s`` is stuck
  and is killed (then restarted) when that call is given up. ``aclose`` stops and reaps the workers. In a
  forked child (gunicorn) the parent's workers are not touched: the child starts its own on its first call.
- Workers run at a lower priority (``judge_worker_nice``, 10 by default): on a core the app also wants, the
  kernel runs the app's threads first and preempts the worker when they wake, which the GIL never does for
  the pool's thread. Where a cgroup CPU quota of under two cores bounds the app, the worker's CPU counts
  against that quota (and the kernel throttles the whole group once it is spent), so there a worker also
  keeps to ``judge_cpu_share`` of a core, the pool thread's own cap (see :func:`worker_cpu_cap`).

Only CPU-bound judges are worth a process: the LLM judges (``llm``, ``ragas``, ``deepeval``) wait on the
network and stay in-process.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import dataclasses
import importlib
import importlib.util
import json
import logging
import os
import pickle
import signal
import struct
import subprocess
import sys
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

from streamjudge._fork import after_fork_in_child
from streamjudge._wakefd import read_nonblocking, write_nonblocking
from streamjudge.config import Settings
from streamjudge.judging.base import EvalInput, JudgeError, JudgeResult, TransientJudgeError

__all__ = ["PROCESS_JUDGES", "JudgeSpec", "ProcessJudge", "cgroup_quota", "small_quota", "worker_cpu_cap"]

_log = logging.getLogger(__name__)

#: judges that are CPU-bound in this process and gain from a process of their own
PROCESS_JUDGES: frozenset[str] = frozenset({"local", "model"})

_HEADER = struct.Struct("!I")
_PROTOCOL = pickle.HIGHEST_PROTOCOL
_READ_CHUNK = 1 << 16
# contexts a worker keeps by id (the parent tells it which to drop): by count and by size
_CONTEXT_SLOTS = 256
_CONTEXT_CHARS = 4_000_000  # held in this process too (the same tuples the streams hold while live)
# a worker that dies this soon after starting counts as a crash at start-up; after a few in a row its
# restarts back off (calls fail fast meanwhile) instead of spinning
_YOUNG_S = 2.0
_YOUNG_DEATHS = 3
_MAX_BACKOFF_S = 30.0
_STOP_WAIT_S = 2.0
# a worker answers every request it has at hand before it writes, but holds no reply longer than this
_REPLY_HOLD_S = 0.002

# CPU a capped worker may use at once before it sleeps to keep to its share (as the pool's thread does)
_CPU_BURST_S = 0.05

# message kinds, parent -> worker
_SPEC, _CALL = 0, 1


def cgroup_quota(proc_cgroup: str = "/proc/self/cgroup", root: str = "/sys/fs/cgroup") -> float | None:
    """The cgroup CPU quota this process runs under, in cores: the smallest along its cgroup's path (a
    systemd unit's ``CPUQuota=``, a container's limit, or a parent slice's); None when unlimited or unknown.

    The path comes from ``proc_cgroup`` (cgroup v2's ``0::`` line, v1's ``cpu`` controller), read under
    ``root`` and each of its parents; a path not under ``root`` (a container without a cgroup namespace,
    whose own cgroup is mounted at ``root``) leaves ``root`` itself."""
    try:
        lines = Path(proc_cgroup).read_text().splitlines()
    except OSError:
        lines = []
    base = Path(root)
    quotas: list[float] = []
    for line in lines:
        hierarchy, _, rest = line.partition(":")
        controllers, _, path = rest.partition(":")
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        v2 = hierarchy == "0" and not controllers
        if v2:  # a hybrid host mounts it at unified/
            mounts = [base, base / "unified"]
        elif "cpu" in controllers.split(","):
            mounts = [base / controllers, base / "cpu", base / "cpu,cpuacct"]
        else:
            continue
        for mount in dict.fromkeys(mounts):  # in order, once each
            for depth in range(len(parts), -1, -1):
                quota = _read_quota(mount.joinpath(*parts[:depth]), v2)
                if quota is not None:
                    quotas.append(quota)
    return min(quotas) if quotas else None


def _read_quota(directory: Path, v2: bool) -> float | None:
    try:
        if v2:  # "max 100000" or "150000 100000"
            fields = (directory / "cpu.max").read_text().split()
            if len(fields) == 2 and fields[0] != "max":
                return int(fields[0]) / int(fields[1])
            return None
        quota = int((directory / "cpu.cfs_quota_us").read_text())
        period = int((directory / "cpu.cfs_period_us").read_text())
        return quota / period if quota > 0 and period > 0 else None
    except (OSError, ValueError, ZeroDivisionError):
        return None


def small_quota(quota: float | None) -> bool:
    """Whether a cgroup quota (in cores, None = none) is under two cores: a worker beside the app would
    spend the quota the app needs, and a spent quota stops the whole group until the next period."""
    return quota is not None and quota < 2


def worker_cpu_cap(settings: Settings, quota: float | None = None) -> float:
    """Most of one core's time a judge worker may use; 0 = no cap (the kernel's priorities decide).

    Capped at ``judge_cpu_share`` only under a cgroup quota of less than two cores (``quota``: measured
    when None): a worker's CPU counts against the quota, and the idle CPU niceness lets it use could be
    the quota the app needs later in the same period."""
    quota = cgroup_quota() if quota is None else quota
    if not small_quota(quota) or not 0.0 < settings.judge_cpu_share < 1.0:
        return 0.0
    return settings.judge_cpu_share


@dataclass(frozen=True, slots=True)
class JudgeSpec:
    """What a worker needs to build a judge: ``create_judge(name, settings, tier=tier)``. Picklable."""

    name: str
    settings: Settings
    tier: str = "final"


class ProcessJudge:
    """Runs the judge ``spec`` names in ``processes`` worker processes (see the module docstring).

    Implements the :class:`~streamjudge.judging.base.Judge` protocol; ``evaluate`` must be awaited on one
    event loop at a time (the judge pool's). Results are those of the wrapped judge, unchanged.
    """

    #: its calls made in one pass of the pool's loop go out in one pipe write (the pool batches for it)
    batches_calls = True

    def __init__(self, spec: JudgeSpec, *, processes: int = 1) -> None:
        if processes < 1:
            raise ValueError(f"processes must be >= 1, got {processes!r}")
        self.name = spec.name
        self.spec = spec
        self.scores_sentences = spec.name in PROCESS_JUDGES  # the built-in judges it runs all do
        self._group = _WorkerGroup.shared(spec.settings, processes)
        self._slot = self._group.acquire(spec)
        self._closed = False
        # a judge dropped without aclose still lets its workers go
        self._finalizer = weakref.finalize(self, self._group.release)

    @property
    def pids(self) -> tuple[int, ...]:
        """Process ids of the running workers (restarted ones get new ids)."""
        return self._group.pids

    @property
    def in_flight(self) -> int:
        """Calls sent to the workers and not answered yet (all judges of this worker set)."""
        return self._group.in_flight

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item`` in a worker. Raises :class:`JudgeError` when the worker died or is unavailable."""
        if self._closed:
            raise JudgeError("process judge is closed")
        return await self._group.call(self._slot, item, tuple(metrics))

    def begin(self, item: EvalInput, metrics: Sequence[str], done: Done) -> _Begun:
        """Send ``item`` to a worker; ``done`` gets the result (or the error) on the pool's loop when the
        reply is read, unless the returned call was cancelled first. ``evaluate`` without a task and a
        future per call: the judge pool's own path for a worker's calls (two task steps, a future and two
        timers fewer on its thread, which shares the app's GIL). Raises :class:`JudgeError` when no worker
        can take it; must run on the pool's loop."""
        if self._closed:
            raise JudgeError("process judge is closed")
        return self._group.begin(self._slot, item, metrics if metrics.__class__ is tuple else tuple(metrics),
                                 done)

    async def aclose(self) -> None:
        """Stop using the workers; the last judge of a worker set stops and reaps its processes."""
        self._closed = True
        self._finalizer()

    def __repr__(self) -> str:
        return f"ProcessJudge({self.name!r}, tier={self.spec.tier!r}, processes={self._group.size})"


#: what :meth:`ProcessJudge.begin` calls with the call's result, or with its error
Done = Callable[[JudgeResult | None, BaseException | None], None]


class _Begun:
    """A call made with :meth:`ProcessJudge.begin`, until its callback ran or :meth:`cancel`."""

    __slots__ = ("_call_id", "_group", "_proc", "_sent", "_w")

    def __init__(self, group: _WorkerGroup, w: _Worker, call_id: int, proc: subprocess.Popen[bytes] | None,
                 sent: float) -> None:
        self._group, self._w, self._call_id, self._proc, self._sent = group, w, call_id, proc, sent

    def cancel(self) -> None:
        """Give the call up (on the pool's loop): its callback is not called, a late reply is dropped."""
        if self._w.inflight.pop(self._call_id, None) is not None:
            self._group._given_up(self._w, self._proc, self._sent)

    def tick(self, now: float) -> None:
        """Nothing to check: the pool's deadline is the only one (see ``AutoProcessJudge``'s)."""


class _Worker:
    """One worker process and the parent's end of its two pipes. Used on the bound event loop only."""

    def __init__(self, index: int) -> None:
        self.index = index
        self.proc: subprocess.Popen[bytes] | None = None
        self.owner = 0  # the pid that started it: only that process may stop it
        self.wfd = -1  # requests ->
        self.rfd = -1  # <- replies
        self.started = 0.0
        self.out = bytearray()  # request bytes the pipe did not take yet
        self.inbuf = bytearray()
        # a call's future (``call``) or its callback (``begin``)
        self.inflight: dict[int, asyncio.Future[JudgeResult] | Done] = {}
        self.specs_sent: set[int] = set()
        self.contexts: collections.OrderedDict[int, tuple[int, tuple[str, ...]]] = collections.OrderedDict()
        self.context_chars = 0
        self.next_ctx = 0
        self.young_deaths = 0
        self.down_until = 0.0  # restart backed off until then
        self.last_error = ""
        self.loop: asyncio.AbstractEventLoop | None = None
        self.writing = False
        self.flush_due = False  # a write of ``out`` is scheduled for the loop's next pass


class _WorkerGroup:
    """N workers shared by every :class:`ProcessJudge` built from one Settings value."""

    _registry: ClassVar[weakref.WeakValueDictionary[tuple[int, bytes], _WorkerGroup]] = (
        weakref.WeakValueDictionary()
    )
    _registry_lock: ClassVar[threading.Lock] = threading.Lock()

    @classmethod
    def shared(cls, settings: Settings, processes: int) -> _WorkerGroup:
        key = (processes, pickle.dumps(settings, _PROTOCOL))
        with cls._registry_lock:
            group = cls._registry.get(key)
            if group is None or group._stopped:
                group = cls(processes, hang_s=settings.judge_timeout_s, nice=settings.judge_worker_nice,
                            cpu_cap=worker_cpu_cap(settings))
                cls._registry[key] = group
            return group

    def __init__(self, processes: int, hang_s: float = 30.0, nice: int = 0, cpu_cap: float = 0.0) -> None:
        self.size = processes
        self._hang_s = hang_s
        self._nice = nice
        self._cpu_cap = cpu_cap  # most of a core each worker may use (0 = no cap)
        self._specs: list[JudgeSpec] = []
        self._users = 0
        self._stopped = False
        self._init_state()
        self._start_all()  # configure time: the workers import while the app starts
        _live.add(self)
        after_fork_in_child(self, _WorkerGroup._after_fork)

    def _init_state(self) -> None:
        self._lock = threading.Lock()
        self._workers = [_Worker(i) for i in range(self.size)]
        self._loop: asyncio.AbstractEventLoop | None = None
        self._loop_thread = 0  # the thread running it
        self._next_call = 0

    # --- judges using the group (any thread) --------------------------------------------------

    @property
    def pids(self) -> tuple[int, ...]:
        return tuple(w.proc.pid for w in self._workers if w.proc is not None)

    @property
    def in_flight(self) -> int:
        return sum(len(w.inflight) for w in self._workers)

    def acquire(self, spec: JudgeSpec) -> int:
        with self._lock:
            self._users += 1
            if spec in self._specs:
                return self._specs.index(spec)
            self._specs.append(spec)
            slot = len(self._specs) - 1
        if self._loop is None:
            # no loop reads the pipes yet: send it now so the worker builds the judge before any call
            for w in self._workers:
                self._send_spec_blocking(w, slot)
        return slot

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            last = self._users <= 0
        if last:
            self.stop()

    # --- calls (the bound event loop) ---------------------------------------------------------

    def _route(self, item: EvalInput) -> tuple[asyncio.AbstractEventLoop, EvalInput, _Worker]:
        loop = asyncio.get_running_loop()
        if self._stopped:
            raise JudgeError("process judge is closed")
        if loop is not self._loop:
            self._bind(loop)
        if not isinstance(item.contexts, tuple):  # a list from a caller: hashable for routing
            item = dataclasses.replace(item, contexts=tuple(item.contexts))
        w = self._workers[hash(item.contexts) % self.size if self.size > 1 else 0]
        if w.proc is None:
            self._restart(w)
            if w.proc is None:
                raise JudgeError(f"judge worker unavailable: {w.last_error or 'not started'}")
        return loop, item, w

    async def call(self, slot: int, item: EvalInput, metrics: tuple[str, ...]) -> JudgeResult:
        loop, item, w = self._route(item)
        self._next_call += 1
        call_id = self._next_call
        fut: asyncio.Future[JudgeResult] = loop.create_future()
        w.inflight[call_id] = fut
        proc, sent = w.proc, time.monotonic()
        try:
            self._send(w, self._encode_call(w, call_id, slot, item, metrics))
            return await fut
        finally:
            # cancelled (timeout, client gone): a late reply finds no future and is dropped
            w.inflight.pop(call_id, None)
            # (the task's cancellation cancels the future it awaits: a reply would have set a result)
            if fut.cancelled():
                self._given_up(w, proc, sent)
            # a failed call's future keeps its error, whose traceback keeps this frame: without this, the
            # frame's locals (the future, the request and its contexts) would wait for the cyclic GC
            del fut

    def begin(self, slot: int, item: EvalInput, metrics: tuple[str, ...], done: Done) -> _Begun:
        """``call`` with a callback (see :meth:`ProcessJudge.begin`)."""
        _, item, w = self._route(item)
        self._next_call += 1
        call_id = self._next_call
        frame = self._encode_call(w, call_id, slot, item, metrics)
        w.inflight[call_id] = done
        begun = _Begun(self, w, call_id, w.proc, time.monotonic())
        self._send(w, frame)
        return begun

    def _given_up(self, w: _Worker, proc: subprocess.Popen[bytes] | None, sent: float) -> None:
        if time.monotonic() - sent >= self._hang_s and w.proc is proc:
            # a worker answers in order: one that has not answered this call in a whole judge
            # timeout is stuck (a native loop, a deadlock) and would time out every later call too
            _log.warning("streamjudge: judge worker %s did not answer within %gs; killing it",
                         proc.pid if proc else "?", self._hang_s)
            if proc is not None:
                with contextlib.suppress(ProcessLookupError):
                    proc.kill()  # its pipe closes: _died fails the rest and restarts it

    def _encode_call(self, w: _Worker, call_id: int, slot: int, item: EvalInput,
                     metrics: tuple[str, ...]) -> bytes:
        spec = None
        if slot not in w.specs_sent:
            spec = self._specs[slot]
            w.specs_sent.add(slot)
        contexts = item.contexts
        h = hash(contexts)
        entry = w.contexts.get(h)
        evict: list[int] = []
        send: tuple[str, ...] | None = None
        if entry is not None and (entry[1] is contexts or entry[1] == contexts):
            ctx_id = entry[0]
            w.contexts.move_to_end(h)
        else:
            if entry is not None:  # a hash collision: the other set gives up its slot
                evict.append(entry[0])
                w.context_chars -= _chars(entry[1])
                del w.contexts[h]
            w.next_ctx += 1
            ctx_id = w.next_ctx
            send = contexts
            w.contexts[h] = (ctx_id, contexts)
            w.context_chars += _chars(contexts)
            while len(w.contexts) > 1 and (
                len(w.contexts) > _CONTEXT_SLOTS or w.context_chars > _CONTEXT_CHARS
            ):
                _, (old_id, old) = w.contexts.popitem(last=False)
                evict.append(old_id)
                w.context_chars -= _chars(old)
        msg = (_CALL, call_id, slot, spec, ctx_id, send, evict, item.question, item.answer, item.kind,
               item.reference, item.prefix, item.offset, metrics)
        data = pickle.dumps(msg, _PROTOCOL)
        return _HEADER.pack(len(data)) + data

    # --- pipes -----------------------------------------------------------------------------------

    def _bind(self, loop: asyncio.AbstractEventLoop) -> None:
        """Read and write the pipes on ``loop`` from now on (the pool's loop; a new one after a fork)."""
        old, self._loop = self._loop, loop
        self._loop_thread = threading.get_ident()
        for w in self._workers:
            if old is not None and not old.is_closed():
                with contextlib.suppress(Exception):
                    old.remove_reader(w.rfd)
                    old.remove_writer(w.wfd)
            w.writing = w.flush_due = False  # a flush scheduled on the old loop never runs
            self._fail(w, JudgeError("the judge's event loop changed"))
            if w.proc is not None:
                self._watch(w)

    def _watch(self, w: _Worker) -> None:
        loop = self._loop
        if loop is None:
            return
        w.loop = loop
        loop.add_reader(w.rfd, self._on_readable, w)
        if w.out:
            self._want_write(w)

    def _send(self, w: _Worker, frame: bytes) -> None:
        # calls made in one pass of the loop (the pool starts every queued job's task at once) go out in
        # one write on the next pass: a pipe write that wakes the worker is a syscall and a wake-up (tens
        # of µs of this thread's CPU, under the app's GIL), one per batch instead of one per call
        w.out += frame
        if w.writing or w.flush_due:
            return
        loop = w.loop
        if loop is None:  # not watched by a loop (cannot happen in a call): write now
            self._flush(w)
            return
        w.flush_due = True
        loop.call_soon(self._flush, w)

    def _flush(self, w: _Worker) -> None:
        w.flush_due = False
        if w.writing or not w.out or w.wfd < 0:
            return
        try:
            # with the GIL held (the pipe never blocks): releasing it would hand it to the app's thread
            n = write_nonblocking(w.wfd, w.out)
        except BlockingIOError:
            n = 0
        except OSError as exc:  # EPIPE: the worker is gone
            self._died(w, f"writing to it failed ({exc.strerror})")
            return
        del w.out[:n]
        if w.out:
            self._want_write(w)

    def _want_write(self, w: _Worker) -> None:
        if not w.writing and w.loop is not None:
            w.loop.add_writer(w.wfd, self._on_writable, w)
            w.writing = True

    def _on_writable(self, w: _Worker) -> None:
        try:
            n = write_nonblocking(w.wfd, w.out)
        except BlockingIOError:
            return
        except OSError as exc:
            self._died(w, f"writing to it failed ({exc.strerror})")
            return
        del w.out[:n]
        if not w.out and w.loop is not None:
            w.loop.remove_writer(w.wfd)
            w.writing = False

    def _on_readable(self, w: _Worker) -> None:
        fd = w.rfd
        try:
            while True:
                chunk = read_nonblocking(fd, _READ_CHUNK)  # GIL held, as the writes
                if not chunk:
                    self._died(w, "its pipe closed")
                    return
                w.inbuf += chunk
                if len(chunk) < _READ_CHUNK:
                    break
        except BlockingIOError:
            pass
        except OSError as exc:
            self._died(w, f"reading from it failed ({exc.strerror})")
            return
        buf = w.inbuf
        pos = 0
        while len(buf) - pos >= 4:
            (n,) = _HEADER.unpack_from(buf, pos)
            if len(buf) - pos - 4 < n:
                break
            reply = pickle.loads(buf[pos + 4 : pos + 4 + n])
            pos += 4 + n
            self._on_reply(w, reply)
        if pos:
            del buf[:pos]

    def _on_reply(self, w: _Worker, reply: tuple[Any, ...]) -> None:
        call_id, ok, value = reply
        if call_id == 0:  # the worker is ready (ok) or could not build a judge (value says why)
            if not ok:
                w.last_error = str(value)
                _log.error("streamjudge: %s; its calls fail", value)
            return
        waiter = w.inflight.pop(call_id, None)
        if waiter is None:
            return
        error: BaseException | None = None
        if not ok:
            transient, retry_after, text = value
            error = TransientJudgeError(text, retry_after=retry_after) if transient else JudgeError(text)
        if isinstance(waiter, asyncio.Future):
            if waiter.done():
                return
            if error is None:
                waiter.set_result(value)
            else:
                waiter.set_exception(error)
            return
        _call_back(waiter, None if error else value, error)

    # --- worker lives ----------------------------------------------------------------------------

    def _start_all(self) -> None:
        for w in self._workers:
            self._start(w)

    def _start(self, w: _Worker) -> None:
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        # the package's __init__ is not run when the worker starts: it imports the instrumentation and the
        # OpenTelemetry SDK, which a worker does not use (they would double its start-up time and the
        # modules it loads), and a worker that "auto" starts under load judges nothing until it is up. The
        # package module is made from its spec, unexecuted, so its submodules import as usual; _worker_main
        # runs the __init__ the first time something asks the package for a name it defines (a user's judge)
        boot = (
            "import sys, json, importlib.util as u; sys.path[:0] = json.loads(sys.argv[1]); "
            "s = u.find_spec('streamjudge'); sys.modules['streamjudge'] = u.module_from_spec(s); "
            "from streamjudge.judging.judges._process import _worker_main; "
            "_worker_main(int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))"
        )
        path = [p for p in sys.path if p]
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", boot, json.dumps(path), str(req_r), str(rep_w), str(self._nice),
                 repr(self._cpu_cap)],
                pass_fds=(req_r, rep_w), stdin=subprocess.DEVNULL, close_fds=True,
            )
        except OSError as exc:
            os.close(req_w)
            os.close(rep_r)
            w.last_error = f"cannot start a judge worker: {exc}"
            _log.error("streamjudge: %s", w.last_error)
            return
        finally:
            os.close(req_r)  # the worker's ends
            os.close(rep_w)
        os.set_blocking(req_w, False)
        os.set_blocking(rep_r, False)
        w.proc, w.wfd, w.rfd, w.started = proc, req_w, rep_r, time.monotonic()
        w.owner = os.getpid()
        w.out.clear()
        w.inbuf.clear()
        w.specs_sent.clear()
        w.contexts.clear()
        w.context_chars = 0
        w.writing = False
        if self._loop is not None:
            self._watch(w)
        else:
            for slot in range(len(self._specs)):
                self._send_spec_blocking(w, slot)

    def _send_spec_blocking(self, w: _Worker, slot: int) -> None:
        # before a loop is bound nobody else writes this pipe; a spec is small, so the pipe takes it
        if w.proc is None or slot in w.specs_sent:
            return
        data = pickle.dumps((_SPEC, slot, self._specs[slot]), _PROTOCOL)
        frame = _HEADER.pack(len(data)) + data
        try:
            n = os.write(w.wfd, frame)
        except OSError:
            return  # the worker died already; the first call finds out
        if n < len(frame):
            w.out += frame[n:]
        w.specs_sent.add(slot)

    def _died(self, w: _Worker, why: str) -> None:
        proc = w.proc
        if proc is None:
            return
        if self._stopped:
            # stop() closed its request pipe (at exit, from another thread than the loop watching the
            # reply pipe): the worker exiting is the goodbye, not a death
            _reap(proc, kill=True)
            self._close_pipes(w)
            self._fail(w, JudgeError("process judge is closed"))
            return
        code = _reap(proc, kill=True)
        how = f"exit code {code}"
        if code is not None and code < 0:
            with contextlib.suppress(ValueError):
                how = f"killed by {signal.Signals(-code).name}"
        w.last_error = f"judge worker {proc.pid} died ({how}; {why})"
        _log.warning("streamjudge: %s; restarting it", w.last_error)
        self._close_pipes(w)
        self._fail(w, JudgeError(w.last_error))
        if time.monotonic() - w.started < _YOUNG_S:
            w.young_deaths += 1
        else:
            w.young_deaths = 0
        if w.young_deaths >= _YOUNG_DEATHS:
            backoff = min(_MAX_BACKOFF_S, 0.5 * 2 ** (w.young_deaths - _YOUNG_DEATHS))
            w.down_until = time.monotonic() + backoff
        if not self._stopped:
            self._restart(w)

    def _restart(self, w: _Worker) -> None:
        if self._stopped or w.proc is not None or time.monotonic() < w.down_until:
            return
        self._start(w)

    def _close_pipes(self, w: _Worker) -> None:
        loop = w.loop
        if loop is not None and not loop.is_closed():
            with contextlib.suppress(Exception):
                loop.remove_reader(w.rfd)
                loop.remove_writer(w.wfd)
        for fd in (w.wfd, w.rfd):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        w.wfd = w.rfd = -1
        w.proc = None
        w.loop = None
        w.writing = False

    def _fail(self, w: _Worker, exc: JudgeError) -> None:
        pending, w.inflight = w.inflight, {}
        loop = self._loop
        elsewhere = loop is not None and self._loop_thread != threading.get_ident()
        for waiter in pending.values():
            if isinstance(waiter, asyncio.Future):
                if not waiter.done():
                    waiter.set_exception(exc)
            elif elsewhere and loop is not None:
                # stop() at exit, off the loop's thread: a callback runs on the loop it was made for
                with contextlib.suppress(RuntimeError):  # that loop is closed: nobody waits any more
                    loop.call_soon_threadsafe(_call_back, waiter, None, exc)
            else:
                _call_back(waiter, None, exc)

    def stop(self) -> None:
        """Stop the workers: close their request pipes (they exit on EOF), then reap them."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
        _live.discard(self)
        if any(w.proc is not None and w.owner != os.getpid() for w in self._workers):
            # a forked child that drops its judge before this group's after-fork hook ran: the workers
            # (and the event loop watching their pipes, whose epoll set the child shares) are the parent's
            self._after_fork()
        procs = []
        for w in self._workers:
            proc = w.proc
            if w.wfd >= 0:
                with contextlib.suppress(OSError):
                    os.close(w.wfd)
                w.wfd = -1
            if proc is not None:
                procs.append(proc)
        deadline = time.monotonic() + _STOP_WAIT_S
        for proc in procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
            _reap(proc, kill=True)
        for w in self._workers:
            self._close_pipes(w)
            self._fail(w, JudgeError("process judge is closed"))

    def _after_fork(self) -> None:
        # the parent's workers are the parent's: drop our copies of their pipes (so they still see EOF
        # when the parent goes) and never wait for them; this process starts its own on its first call
        # (lazily: a short-lived forked child that never judges starts no processes)
        for w in self._workers:
            for fd in (w.wfd, w.rfd):
                if fd >= 0:
                    with contextlib.suppress(OSError):
                        os.close(fd)
            if w.proc is not None:
                w.proc.returncode = 0  # not our child
        self._init_state()


def _call_back(done: Done, result: JudgeResult | None, error: BaseException | None) -> None:
    try:
        done(result, error)
    except Exception:  # one broken callback must not lose the replies read after it
        _log.exception("streamjudge: a judge call's callback failed")


def _chars(contexts: tuple[str, ...]) -> int:
    return sum(len(c) for c in contexts)


def _reap(proc: subprocess.Popen[bytes], *, kill: bool) -> int | None:
    """Wait for a worker (killing it first when asked and needed); returns its exit code."""
    code = proc.poll()
    if code is None:
        # a worker whose pipe closed is exiting: give it a moment before the kill
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(0.2)
    if code is None and kill:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        with contextlib.suppress(subprocess.TimeoutExpired):
            code = proc.wait(_STOP_WAIT_S)
    return code


_live: weakref.WeakSet[_WorkerGroup] = weakref.WeakSet()


@atexit.register
def _stop_all() -> None:
    for group in list(_live):
        with contextlib.suppress(Exception):
            group.stop()


# --- the worker process ---------------------------------------------------------------------------


def _package_on_demand() -> None:
    # the worker's boot left the package's __init__ unexecuted (see _WorkerGroup._start): run it on the
    # first lookup of a name that is not a submodule (``from streamjudge import StreamEvent`` in a user's
    # judge), so the package looks whole to whatever asks
    pkg = sys.modules.get("streamjudge")
    spec = getattr(pkg, "__spec__", None)
    if pkg is None or spec is None or spec.loader is None or "__all__" in vars(pkg):
        return  # a normal import ran it
    names, loader = vars(pkg), spec.loader

    def __getattr__(name: str) -> Any:
        if not name.startswith("__") and importlib.util.find_spec(f"streamjudge.{name}") is not None:
            return importlib.import_module(f"streamjudge.{name}")
        names.pop("__getattr__", None)
        loader.exec_module(sys.modules["streamjudge"])
        return getattr(sys.modules["streamjudge"], name)

    names["__getattr__"] = __getattr__


def _worker_main(rfd: int, wfd: int, nice: int = 0, cpu_cap: float = 0.0) -> None:
    """A worker: read requests, judge them in order, write the replies. Exits when the parent goes.

    ``nice`` is added to its niceness; ``cpu_cap`` (0 = none) is the most of a core it uses."""
    _package_on_demand()
    if nice > 0:
        with contextlib.suppress(OSError, AttributeError):  # no os.nice off Unix: the app's priority
            os.nice(nice)
    # the parent went before it read a reply (it exited, or a forked child dropped us): no error to print
    with contextlib.suppress(BrokenPipeError):
        _serve(rfd, wfd, cpu_cap)


def _serve(rfd: int, wfd: int, cpu_cap: float = 0.0) -> None:
    # the parent decides when a worker ends (Ctrl-C in a terminal reaches the whole process group)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # a capped worker's CPU beyond its share so far (seconds), as the pool's thread counts its own
    debt, cpu_seen, cpu_at = 0.0, time.process_time(), time.monotonic()
    judges: dict[int, Any] = {}
    broken: dict[int, str] = {}
    contexts: dict[int, tuple[str, ...]] = {}
    loop: asyncio.AbstractEventLoop | None = None

    out = bytearray()  # replies not written yet
    first_at = 0.0  # when the oldest of them was ready

    def reply(msg: tuple[Any, ...]) -> None:
        nonlocal first_at
        data = pickle.dumps(msg, _PROTOCOL)
        if not out:
            first_at = time.monotonic()
        out.extend(_HEADER.pack(len(data)))
        out.extend(data)

    def flush() -> None:
        data = bytes(out)
        out.clear()
        while data:
            data = data[os.write(wfd, data):]

    def build(slot: int, spec: JudgeSpec) -> None:
        from streamjudge.judging.judges import create_judge

        try:
            # never wrap again: this is the process the judge runs in
            judges[slot] = create_judge(spec.name, spec.settings.replace(judge_processes=0),
                                        tier=spec.tier)  # type: ignore[arg-type]
        except Exception as exc:
            broken[slot] = f"judge {spec.name!r} cannot be built in a worker: {type(exc).__name__}: {exc}"
            reply((0, False, broken[slot]))

    reply((0, True, None))
    flush()
    buf = bytearray()
    pos = 0
    while True:
        if len(buf) - pos < 4 or len(buf) - pos - 4 < _HEADER.unpack_from(buf, pos)[0]:
            # every request at hand is answered: the replies go out in one write (the parent's loop
            # wakes once for them), then wait for more
            if out:
                flush()
            del buf[:pos]
            pos = 0
            chunk = os.read(rfd, _READ_CHUNK)
            if not chunk:
                return  # the parent closed the pipe (aclose) or died
            buf += chunk
            continue
        (n,) = _HEADER.unpack_from(buf, pos)
        msg = pickle.loads(buf[pos + 4 : pos + 4 + n])
        pos += 4 + n
        if out and time.monotonic() - first_at > _REPLY_HOLD_S:
            flush()  # a long batch: the first replies do not wait for the last judgements
        if msg[0] == _SPEC:
            build(msg[1], msg[2])
            continue
        (_, call_id, slot, spec, ctx_id, sent, evict, question, answer, kind, reference, prefix, offset,
         metrics) = msg
        if spec is not None and slot not in judges and slot not in broken:
            build(slot, spec)
        for old in evict:
            contexts.pop(old, None)
        if sent is not None:
            contexts[ctx_id] = sent
        judge = judges.get(slot)
        if judge is None:
            reply((call_id, False, (False, None, broken.get(slot, f"no judge in slot {slot}"))))
            continue
        item = EvalInput(question, contexts[ctx_id], answer, kind, reference, prefix, offset)
        if cpu_cap:
            now, cpu = time.monotonic(), time.process_time()
            debt = max(0.0, debt + cpu - cpu_seen - (now - cpu_at) * cpu_cap)
            cpu_seen, cpu_at = cpu, now
            if debt > _CPU_BURST_S:
                if out:
                    flush()  # the verdicts judged so far do not wait out the pause
                time.sleep((debt - _CPU_BURST_S) / cpu_cap)
        try:
            sync = getattr(judge, "evaluate_sync", None)
            if sync is not None:
                result = sync(item, metrics)
            else:
                if loop is None:
                    loop = asyncio.new_event_loop()
                result = loop.run_until_complete(judge.evaluate(item, metrics))
            reply((call_id, True, result))
        except TransientJudgeError as exc:
            reply((call_id, False, (True, exc.retry_after, _describe(exc))))
        except Exception as exc:
            reply((call_id, False, (False, None, _describe(exc))))
        except BaseException as exc:  # SystemExit from a judge: not its call to make
            reply((call_id, False, (False, None, _describe(exc))))


def _describe(exc: BaseException) -> str:
    text = str(exc).strip().replace("\n", " ")[:300]
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__

