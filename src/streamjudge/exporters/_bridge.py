"""Background delivery of evaluation records to an HTTP/JSON API (Langfuse scores, Phoenix annotations).

:class:`HttpBridge` is the one piece both bridges share. ``emit`` appends to a bounded deque and returns;
one worker thread (started on first use, re-created after ``fork``) drains the deque in batches, turns each
batch into JSON requests and sends them with bounded concurrency on its own event loop (several batches in
flight at once), retrying transient failures (connection errors, timeouts, 429, 5xx) with exponential
backoff that honours ``Retry-After``. A backend that answers a batch item by item (Langfuse's 207
multi-status) reports through ``partial``: refused items are dropped, transiently failed ones retried.
``force_flush`` and ``shutdown`` honour the process's shutdown deadline (:mod:`streamjudge._deadline`).
Credentials the backend rejects (401/403) disable the bridge after one log line. Everything that is not
delivered is counted by reason, reported through a log line (at most one per ``log_interval_s``) and the
``streamjudge.export.drops`` counter.

The worker's own HTTP calls run with instrumentation suppressed, like the SDK's batch processors, so they
never show up in (or get judged as part of) the application's traces. Credentials are held in a wrapper
whose ``repr`` is redacted and are never written to logs or exceptions.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import email.utils
import itertools
import logging
import os
import random
import threading
import time
import weakref
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx
from opentelemetry import metrics

from streamjudge import semconv
from streamjudge._deadline import bounded_millis
from streamjudge._redact import redact
from streamjudge._sdk import suppress_instrumentation
from streamjudge.exporters.base import EvaluationRecord
from streamjudge.results import Score

_logger = logging.getLogger(__name__)

# reasons under which undelivered items are counted
DROP_QUEUE_FULL = "queue_full"
DROP_AUTH = "auth_rejected"
DROP_REJECTED = "rejected"  # a 4xx other than 401/403/429: retrying cannot help
DROP_RETRIES = "retries_exhausted"
DROP_SHUTDOWN = "shutdown"
DROP_INVALID = "invalid_record"

_RETRY_STATUS = frozenset({408, 425, 429, 500, 502, 503, 504})
_AUTH_STATUS = frozenset({401, 403})


def is_transient(status: int) -> bool:
    """Whether an HTTP status (of a request, or of one item in a multi-status answer) is worth a retry."""
    return status in _RETRY_STATUS


# a Retry-After longer than this is clamped: a sink must drain, not park for an hour
_MAX_RETRY_AFTER_S = 60.0


class Secret:
    """A credential-bearing mapping of HTTP headers whose ``repr`` never shows the values."""

    __slots__ = ("_headers",)

    def __init__(self, headers: Mapping[str, str]) -> None:
        self._headers = dict(headers)

    def reveal(self) -> dict[str, str]:
        """The headers themselves; only the HTTP client may call this."""
        return dict(self._headers)

    def __repr__(self) -> str:
        return f"Secret(<{len(self._headers)} header(s) redacted>)"

    __str__ = __repr__


@dataclass(frozen=True, slots=True)
class JsonRequest:
    """One POST the bridge sends: ``path`` (relative to the base URL), a JSON body and how many items
    (scores, annotations) it carries, for drop accounting."""

    path: str
    body: Any
    items: int
    params: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class PartialResult:
    """What a 2xx answer said about the items of one request, when the backend answers item by item.

    ``rejected`` items were refused for good (counted as ``rejected`` drops); ``retry`` holds the items
    that failed transiently, to be sent again with backoff; the rest were accepted.
    """

    rejected: int = 0
    retry: JsonRequest | None = None
    detail: str = ""


#: reads a 2xx answer of a request; None = every item accepted
PartialCheck = Callable[[JsonRequest, httpx.Response], PartialResult | None]


@dataclass(frozen=True, slots=True)
class BridgeStats:
    """Counters of one bridge since it was created (or since ``fork`` in a child)."""

    queued_records: int
    sent_items: int
    retries: int
    dropped: Mapping[str, int]
    disabled: bool

    @property
    def dropped_total(self) -> int:
        """Items lost for any reason."""
        return sum(self.dropped.values())


def safe_url(url: str) -> str:
    """``url`` without user info, query or fragment: what may appear in a log line."""
    try:
        u = httpx.URL(url)
    except Exception:
        return "<invalid url>"
    port = f":{u.port}" if u.port else ""
    return f"{u.scheme}://{u.host}{port}{u.path}"


def result_name(record: EvaluationRecord, score: Score) -> str:
    """The name a score is filed under in a backend.

    Final-pass scores (on the stream span) keep the metric name (``faithfulness``); checkpoint scores are
    early warnings on partial text and get their own name (``checkpoint.faithfulness``) so they do not
    skew the record of truth in the backend's aggregates.
    """
    if record.span_type == semconv.SPAN_TYPE_CHECKPOINT:
        return f"{semconv.SPAN_TYPE_CHECKPOINT}.{score.name}"
    return score.name


def _retry_after_seconds(value: str | None) -> float | None:
    """Parse a ``Retry-After`` header: delta seconds or an HTTP date."""
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, when.timestamp() - time.time())


class _Give(Exception):
    """Internal: a request failed for good, with the drop reason and a short, secret-free description."""

    def __init__(self, reason: str, detail: str, delivered: int = 0, refused: int = 0) -> None:
        super().__init__(detail)
        self.reason = reason
        self.detail = detail
        # items of the request accepted / refused (and counted) by an earlier, partial answer
        self.delivered = delivered
        self.refused = refused


class HttpBridge:
    """Queue records, deliver them in the background as JSON POSTs. Never blocks, never raises.

    ``build`` turns a batch of records into the requests to send (it may raise; the batch is then dropped
    as ``invalid_record``). At most ``concurrency`` requests are in flight, from one batch or several.
    ``partial`` (optional) reads a 2xx answer that reports items one by one.

    ``force_flush`` waits until every record emitted before the call was delivered or dropped, up to its
    timeout. ``shutdown`` stops accepting records, flushes for up to ``shutdown_timeout_s`` (retries are cut
    short at that deadline), drops what is left and logs what was lost; it is idempotent. Both wait no
    longer than an open process shutdown deadline allows.
    """

    def __init__(
        self,
        *,
        name: str,
        base_url: str,
        build: Callable[[Sequence[EvaluationRecord]], Iterable[JsonRequest]],
        headers: Secret | None = None,
        max_queue: int = 2048,
        max_batch: int = 64,
        schedule_delay_s: float = 0.5,
        concurrency: int = 4,
        max_retries: int = 5,
        backoff_s: float = 0.5,
        max_backoff_s: float = 30.0,
        request_timeout_s: float = 10.0,
        shutdown_timeout_s: float = 5.0,
        log_interval_s: float = 10.0,
        transport: httpx.AsyncBaseTransport | None = None,
        partial: PartialCheck | None = None,
    ) -> None:
        if max_queue < 1 or max_batch < 1 or concurrency < 1 or max_retries < 0:
            raise ValueError("max_queue, max_batch and concurrency must be >= 1, max_retries >= 0")
        self.name = name
        self._base_url = base_url.rstrip("/")
        self._build = build
        self._headers = headers or Secret({})
        self._max_queue = max_queue
        self._max_batch = max_batch
        self._schedule_delay_s = schedule_delay_s
        self._concurrency = concurrency
        self._max_retries = max_retries
        self._backoff_s = backoff_s
        self._max_backoff_s = max_backoff_s
        self._request_timeout_s = request_timeout_s
        self._shutdown_timeout_s = shutdown_timeout_s
        self._log_interval_s = log_interval_s
        self._transport = transport
        self._partial = partial
        self._drop_counter: metrics.Counter | None = None
        self._init_state()
        if hasattr(os, "register_at_fork"):
            ref = weakref.WeakMethod(self._at_fork_reinit)

            def _after_in_child() -> None:
                method = ref()
                if method is not None:
                    method()

            os.register_at_fork(after_in_child=_after_in_child)

    def _init_state(self) -> None:
        self._queue: collections.deque[EvaluationRecord] = collections.deque()
        self._seq = itertools.count(1)  # next() is atomic under the GIL: cheap ticket for emit
        self._emitted = 0  # highest ticket handed out
        # records leave the queue in ticket order; a batch in flight holds back "done" for its tickets
        self._taken = 0  # tickets the worker took from the queue (or dropped from it)
        self._open: set[int] = set()  # first ticket of each batch in flight
        self._cond = threading.Condition()
        self._start_lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._inflight: set[asyncio.Task[None]] = set()
        self._stopping = False
        self._deadline: float | None = None  # monotonic; set by shutdown
        self._disabled = False
        self._sent = 0
        self._retries = 0
        self._drop_lock = threading.Lock()
        self._dropped: collections.Counter[str] = collections.Counter()
        self._logged: collections.Counter[str] = collections.Counter()
        self._last_log = 0.0

    def _at_fork_reinit(self) -> None:
        # the worker thread and its loop did not survive the fork; the parent still owns (and will send)
        # what was queued before it, so the child starts empty
        self._init_state()

    # --- application side -------------------------------------------------------------------------

    def emit(self, record: EvaluationRecord) -> None:
        """Queue ``record``. Returns at once; never raises."""
        try:
            if self._stopping or self._disabled:
                self._count_drop(DROP_AUTH if self._disabled else DROP_SHUTDOWN, _items(record))
                return
            if len(self._queue) >= self._max_queue:
                self._count_drop(DROP_QUEUE_FULL, _items(record))
                return
            self._queue.append(record)
            self._emitted = next(self._seq)
            if self._thread is None:
                self._start()
            elif len(self._queue) >= self._max_batch:
                self._poke()
        except Exception:  # a sink must never fail the judge pool
            _logger.debug("%s: emit failed", self.name, exc_info=True)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Deliver (or finally drop) everything emitted so far; False if ``timeout_millis`` passed first."""
        target = self._emitted
        if self._thread is None or not self._thread.is_alive():
            with self._cond:
                return self._done_through() >= target or not self._queue
        self._poke()
        wait_ms = bounded_millis(timeout_millis)
        with self._cond:
            return self._cond.wait_for(
                lambda: self._done_through() >= target, timeout=None if wait_ms is None else wait_ms / 1000
            )

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Stop accepting records, flush within the deadline, drop and report the rest. Idempotent."""
        if self._stopping:
            return
        bounded = bounded_millis(timeout_millis, self._shutdown_timeout_s * 1000)
        timeout_s = (bounded or 0) / 1000
        self._deadline = time.monotonic() + timeout_s
        self._stopping = True
        thread = self._thread
        if thread is not None and thread.is_alive():
            loop = self._loop
            if loop is not None:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._arm_deadline, timeout_s)
            self._poke()
            # a little slack past the deadline for the worker to account for the cut-short requests
            thread.join(timeout_s + 0.25)
        left = sum(_items(r) for r in list(self._queue))
        if left:
            self._queue.clear()
            self._count_drop(DROP_SHUTDOWN, left)
        self._report_drops(force=True)

    @property
    def stats(self) -> BridgeStats:
        """Current counters."""
        with self._drop_lock:
            dropped = dict(self._dropped)
        return BridgeStats(len(self._queue), self._sent, self._retries, dropped, self._disabled)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name} -> {safe_url(self._base_url)}>"

    # --- worker -----------------------------------------------------------------------------------

    def _start(self) -> None:
        with self._start_lock:
            if self._thread is not None:
                return
            t = threading.Thread(target=self._run, name=f"streamjudge-{self.name}", daemon=True)
            self._thread = t
            t.start()

    def _poke(self) -> None:
        loop, wake = self._loop, self._wake
        if loop is not None and wake is not None:
            with contextlib.suppress(RuntimeError):  # the loop is already closed
                loop.call_soon_threadsafe(wake.set)

    def _run(self) -> None:
        # the bridge's own HTTP I/O must never be traced into the application's traces
        with suppress_instrumentation():
            try:
                asyncio.run(self._main())
            except Exception:
                _logger.exception("%s: delivery worker stopped unexpectedly", self.name)
            # whatever the worker could not handle counts as done so that flushes do not hang
            with self._cond:
                self._taken = max(self._taken, self._emitted - len(self._queue))
                self._open.clear()
                self._cond.notify_all()

    async def _main(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        limits = httpx.Limits(max_connections=self._concurrency, max_keepalive_connections=self._concurrency)
        sem = asyncio.Semaphore(self._concurrency)
        # batches being delivered (at most ``concurrency``): a batch waiting for its answer must not hold
        # the next one back; the semaphore bounds the requests themselves
        batches: set[asyncio.Task[None]] = set()
        async with httpx.AsyncClient(
            base_url=self._base_url,
            headers=self._headers.reveal(),
            timeout=self._request_timeout_s,
            limits=limits,
            transport=self._transport,
            follow_redirects=False,
        ) as client:
            while True:
                if not self._queue and not self._stopping and not batches:
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wake.wait(), self._schedule_delay_s)
                    self._wake.clear()
                while self._queue:
                    while len(batches) >= self._concurrency:
                        _, batches = await asyncio.wait(batches, return_when=asyncio.FIRST_COMPLETED)
                    batch = [self._queue.popleft() for _ in range(min(self._max_batch, len(self._queue)))]
                    with self._cond:
                        first = self._taken + 1
                        self._taken += len(batch)
                        self._open.add(first)
                    batches.add(asyncio.create_task(self._deliver_and_count(client, sem, batch, first)))
                    await asyncio.sleep(0)  # let it start its requests before the next batch is taken
                if batches:
                    # wait for a batch in flight to finish, for a full batch of new records, or for the
                    # schedule delay (a slow request must not hold back records that arrived meanwhile)
                    waker = asyncio.ensure_future(self._wake.wait())
                    done, _ = await asyncio.wait(
                        [*batches, waker], timeout=self._schedule_delay_s, return_when=asyncio.FIRST_COMPLETED
                    )
                    waker.cancel()
                    batches.difference_update(done)
                    self._wake.clear()
                    continue
                self._report_drops()
                if self._stopping and not self._queue:
                    return

    async def _deliver_and_count(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, batch: list[EvaluationRecord], first: int
    ) -> None:
        try:
            await self._deliver(client, sem, batch)
        finally:
            with self._cond:
                self._open.discard(first)
                self._cond.notify_all()

    def _done_through(self) -> int:
        """The highest ticket up to which every record was delivered or dropped (call under ``_cond``)."""
        return min(self._open) - 1 if self._open else self._taken

    async def _deliver(
        self, client: httpx.AsyncClient, sem: asyncio.Semaphore, batch: list[EvaluationRecord]
    ) -> None:
        items = sum(_items(r) for r in batch)
        if self._disabled:
            self._count_drop(DROP_AUTH, items)
            return
        try:
            requests = list(self._build(batch))
        except Exception as exc:
            self._count_drop(DROP_INVALID, items)
            _logger.warning(
                "%s: could not encode %d record(s): %s", self.name, len(batch), type(exc).__name__
            )
            return

        async def one(req: JsonRequest) -> None:
            try:
                async with sem:
                    delivered = await self._send(client, req)
                self._sent += delivered
            except _Give as give:
                self._sent += give.delivered
                self._count_drop(give.reason, req.items - give.delivered - give.refused, give.detail)
            except asyncio.CancelledError:  # cut short by the shutdown deadline (_cancel_inflight)
                self._count_drop(DROP_SHUTDOWN, req.items, "in flight at the shutdown deadline")

        tasks = [asyncio.create_task(one(r)) for r in requests]
        self._inflight.update(tasks)
        try:
            await asyncio.gather(*tasks)
        finally:
            self._inflight.difference_update(tasks)

    def _arm_deadline(self, timeout_s: float) -> None:
        if self._loop is not None:
            self._loop.call_later(max(0.0, timeout_s), self._cancel_inflight)

    def _cancel_inflight(self) -> None:
        for task in list(self._inflight):
            task.cancel()

    async def _send(self, client: httpx.AsyncClient, req: JsonRequest) -> int:
        """POST ``req`` (retrying transient failures); the number of its items the backend accepted."""
        attempt = 0
        delivered = refused = 0
        while True:
            if self._disabled:
                raise _Give(DROP_AUTH, "credentials were rejected earlier", delivered, refused)
            timeout = self._request_timeout_s
            if self._deadline is not None:
                timeout = min(timeout, self._deadline - time.monotonic())
                if timeout <= 0:
                    raise _Give(DROP_SHUTDOWN, "shutdown deadline passed", delivered, refused)
            retry_after: float | None = None
            try:
                resp = await client.post(req.path, json=req.body, params=dict(req.params), timeout=timeout)
            except httpx.TransportError as exc:  # connect/read/write errors and timeouts
                detail = f"{type(exc).__name__} talking to {safe_url(self._base_url + req.path)}"
            else:
                status = resp.status_code
                if status < 300:
                    part = self._read_partial(req, resp)
                    if part is None:
                        return delivered + req.items
                    retry_items = part.retry.items if part.retry is not None else 0
                    if part.rejected:
                        self._count_drop(DROP_REJECTED, part.rejected, part.detail or f"HTTP {status}")
                    refused += part.rejected
                    delivered += max(0, req.items - part.rejected - retry_items)
                    if part.retry is None or retry_items <= 0:
                        return delivered
                    req = part.retry  # only the items that failed transiently go again
                    detail = f"HTTP {status} with {retry_items} item(s) to retry"
                else:
                    if status in _AUTH_STATUS:
                        self._disable(status)
                        raise _Give(DROP_AUTH, f"HTTP {status}", delivered, refused)
                    if status not in _RETRY_STATUS:
                        raise _Give(DROP_REJECTED, f"HTTP {status}: {_short(resp)}", delivered, refused)
                    detail = f"HTTP {status}"
                    retry_after = _retry_after_seconds(resp.headers.get("retry-after"))
            if attempt >= self._max_retries:
                raise _Give(DROP_RETRIES, f"{detail} after {attempt + 1} attempt(s)", delivered, refused)
            delay = min(self._max_backoff_s, self._backoff_s * (2**attempt)) * random.uniform(0.8, 1.2)
            if retry_after is not None:
                delay = min(retry_after, _MAX_RETRY_AFTER_S)
            if self._deadline is not None and time.monotonic() + delay >= self._deadline:
                raise _Give(
                    DROP_SHUTDOWN, f"{detail}; shutdown deadline before the next retry", delivered, refused
                )
            attempt += 1
            self._retries += 1
            _logger.debug("%s: %s, retry %d in %.2fs", self.name, detail, attempt, delay)
            await asyncio.sleep(delay)

    def _read_partial(self, req: JsonRequest, resp: httpx.Response) -> PartialResult | None:
        if self._partial is None:
            return None
        try:
            part = self._partial(req, resp)
        except Exception:  # an answer we cannot read was still a 2xx: count the items as delivered
            _logger.debug("%s: could not read a %d answer", self.name, resp.status_code, exc_info=True)
            return None
        if part is None:
            return None
        rejected = max(0, min(part.rejected, req.items))
        if part.retry is not None and part.retry.items <= 0:
            return PartialResult(rejected, None, part.detail)
        return PartialResult(rejected, part.retry, part.detail)

    def _disable(self, status: int) -> None:
        if not self._disabled:
            self._disabled = True
            _logger.error(
                "%s: %s answered HTTP %d: the credentials were rejected. The bridge is disabled; every "
                "further evaluation result for it is dropped. Check the keys and restart.",
                self.name,
                safe_url(self._base_url),
                status,
            )
        left = len(self._queue)
        if left:
            dropped = [self._queue.popleft() for _ in range(left)]
            self._count_drop(DROP_AUTH, sum(_items(r) for r in dropped))
            with self._cond:
                self._taken += left
                self._cond.notify_all()

    # --- drop accounting --------------------------------------------------------------------------

    def _count_drop(self, reason: str, items: int, detail: str | None = None) -> None:
        if items <= 0:
            return
        with self._drop_lock:
            self._dropped[reason] += items
        if detail and reason != DROP_AUTH:
            _logger.debug("%s: dropped %d item(s): %s (%s)", self.name, items, reason, detail)

    def _report_drops(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last_log < self._log_interval_s:
            return
        with self._drop_lock:
            new = self._dropped - self._logged
            self._logged = collections.Counter(self._dropped)
        self._last_log = now
        if not new:
            return
        total = sum(new.values())
        parts = ", ".join(f"{k}={v}" for k, v in sorted(new.items()))
        _logger.warning(
            "%s: %d evaluation result(s) were not delivered to %s (%s)",
            self.name,
            total,
            safe_url(self._base_url),
            parts,
        )
        try:
            if self._drop_counter is None:
                meter = metrics.get_meter(semconv.METER_NAME)
                self._drop_counter = meter.create_counter(
                    semconv.METRIC_EXPORT_DROPS,
                    unit="{result}",
                    description="Evaluation results a sink could not deliver",
                )
            for reason, n in new.items():
                self._drop_counter.add(
                    n, {semconv.METRIC_ATTR_SINK: self.name, semconv.METRIC_ATTR_REASON: reason}
                )
        except Exception:
            _logger.debug("%s: could not record the drop metric", self.name, exc_info=True)


def _items(record: EvaluationRecord) -> int:
    return max(1, len(record.scores))


def _short(resp: httpx.Response) -> str:
    try:
        text = resp.text
    except Exception:
        return "<unreadable body>"
    return redact(" ".join(text[:4000].split()))[:200]  # a rejected request's body may echo the key


class BridgeSink:
    """An :class:`~streamjudge.exporters.base.EvaluationSink` that delivers through an :class:`HttpBridge`.

    Subclasses build their bridge in ``__init__`` (``self._bridge``) with the request builder of their API.
    """

    _bridge: HttpBridge

    def emit(self, record: EvaluationRecord) -> None:
        """Queue ``record``; returns at once, never raises."""
        self._bridge.emit(record)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Deliver everything queued; False if the deadline passed first."""
        return self._bridge.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: int | None = None) -> None:
        """Flush within the shutdown deadline, then drop and report what is left."""
        self._bridge.shutdown(timeout_millis)

    @property
    def stats(self) -> BridgeStats:
        """Delivery counters (results sent, retries, dropped by reason)."""
        return self._bridge.stats

    def __repr__(self) -> str:
        return f"<{type(self).__name__} -> {safe_url(self._bridge._base_url)}>"
