"""One guarded stream: orchestration of windows, judge requests, verdicts and actions.

The session is driven by a driver (:mod:`streamjudge.judging._drivers`) or a response-body wrapper. It sends
each closed window to the judging service as one request and reads verdicts from its inbox before each
yield; nothing on the token path waits for a judge. What a verdict does to the stream is decided by its
:class:`~streamjudge.judging._stream_state.StreamState`; the session carries it out and reports it (the
reader's events, the spans).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import logging
import os
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import context as otel_context
from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv
from streamjudge.judging._actions import preflight_gate, warning_data, withhold
from streamjudge.judging._backend import StreamBackend, default_backend, stream_started
from streamjudge.judging._requests import StreamRequests
from streamjudge.judging._stream_state import Alert, Regenerate, Release, Stop, StreamState, Unjudged
from streamjudge.judging._telemetry import (
    ANSWER_KEYS,
    CHECKPOINT_KEYS,
    StreamSpans,
    defer_final,
    text_attributes,
)
from streamjudge.judging._telemetry import capped as span_text
from streamjudge.judging._tokens import TokenText
from streamjudge.judging._windows import (
    MAX_TOKEN_CHARS,
    Ended,
    Transcript,
    Window,
    Windows,
)
from streamjudge.results import EvalKind, JudgeRequest, JudgeResult, Verdict

if TYPE_CHECKING:

    from streamjudge.config import Settings
    from streamjudge.judging._lag import LoopProbe

_log = logging.getLogger(__name__)
# the state of every stream no checkpoint is opened for (not started yet, sampled out, skipped): shared,
# as it stays empty - a judged stream makes its own at start, one object fewer per unjudged live stream
_IDLE = StreamState()
_NOT_ENFORCED_LOGGED: set[str] = set()  # reasons logged once a process (see GuardSession.not_enforced)
# guards the lazily made final futures of all sessions (taken once per stream, uncontended)
_FINAL_LOCK = threading.Lock()


def _new_final_lock() -> None:
    # a fork while the pool's thread held it would leave it held forever in the child
    global _FINAL_LOCK
    _FINAL_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_new_final_lock)


class StreamEvent(NamedTuple):
    """One event of a guarded stream.

    ``type`` is ``token`` (``text`` = the token), ``warning`` (a checkpoint or the pre-flight gate failed;
    ``data`` names the metric, score, the failing sentences with their char ranges and reasons, and the
    explanation), ``retract`` (text from ``data["from"]`` to ``data["to"]`` is withdrawn before a
    regeneration), ``stop`` (``text`` = fallback message; nothing follows but ``done``), or ``done``
    (``data`` summarises the stream).
    """

    type: str
    text: str = ""
    data: Mapping[str, Any] | None = None


# the ``token`` events of short tokens, shared by every stream: an event is immutable, and a stream's tokens
# come from its model's vocabulary, so most are tokens some stream already sent (0.84-0.88 of a run's tokens
# in ``benchmarks/run.py``'s answers, each its own text). Looking one up costs a dict probe where making it
# costs a tuple subclass's allocation through ``tuple.__new__`` and its release (~0.15 µs a token, a sixth of
# the 1 µs a token the judged path may add). Bounded: at most _TOKEN_EVENTS_MAX tokens of at most
# _TOKEN_EVENT_CHARS chars (under 1 MB), emptied when full, so a run of rare tokens cannot pin one set
_TOKEN_EVENTS: dict[str, StreamEvent] = {}
_TOKEN_EVENTS_MAX = 4096
_TOKEN_EVENT_CHARS = 16
_new_event = tuple.__new__


def token_event(text: str) -> StreamEvent:
    """The ``token`` event of ``text``: one shared by every stream for a short ``str`` (see _TOKEN_EVENTS).
    Hot loops look ``_TOKEN_EVENTS`` up themselves and call this on a miss."""
    event = _TOKEN_EVENTS.get(text) if text.__class__ is str else None
    if event is None:
        # tuple.__new__ skips NamedTuple's Python-level __new__
        event = _new_event(StreamEvent, ("token", text, None))
        # exactly str: its hash and == are str's
        if text.__class__ is str and len(text) <= _TOKEN_EVENT_CHARS:
            if len(_TOKEN_EVENTS) >= _TOKEN_EVENTS_MAX:
                _TOKEN_EVENTS.clear()
            _TOKEN_EVENTS[text] = event
    return event


@dataclass(frozen=True, slots=True)
class RegenerateRequest:
    """What a regenerate callback gets: continue after ``accepted_prefix`` following ``instruction``."""

    question: str
    contexts: tuple[str, ...]
    accepted_prefix: str
    instruction: str
    attempt: int


TokenSource = AsyncIterable[Any] | Iterable[Any]
RegenerateCallback = Callable[[RegenerateRequest], TokenSource]


@dataclass(slots=True)
class _Delivered:
    """Where what the client received differs from the model's text, and why an action was not enforced.

    ``base``: the client's text of the answers before the last regeneration (up to the retraction, or all
    of it where the retraction could not reach the client); ``start``: where the current answer's own text
    begins in the windows' text; ``extra``: words a driver delivered after the last token (a tap's
    fallback)."""

    base: str | None = None
    start: int = 0
    extra: str = ""
    retracts_shown: bool = True
    not_enforced: str | None = None


class GuardSession:
    """The state of one guarded stream, driven by :func:`~streamjudge.guard` or by a response-body wrapper.

    Call :meth:`start`, then :meth:`accept` per token (pass the token on when it returns text and the
    mode is stream-first), :meth:`drain` whenever :attr:`has_events` is true, and :meth:`finish` (or
    :meth:`abort` when the client went away). Not thread-safe except :meth:`post`, which the judging
    service calls from the judge pool's thread. That thread also makes the checkpoint spans and requests
    the session leaves to it, under a lock of their own that :meth:`finish` and :meth:`abort` take too.
    """

    # slots: past the 30 keys CPython's shared instance dicts hold, each session would have a dict of its own
    # (about three times the bytes per live stream) and every read on the token path a dict lookup instead
    # of a slot load
    __slots__ = (
        "_backend",
        "_defer",
        "_delivered",
        "_final",
        "_final_set",
        "_final_value",
        "_finished",
        "_held",
        "_holding",
        "_hush",
        "_inbox",
        "_join",
        "_judging",
        "_n_tokens",
        "_next_index",
        "_notify",
        "_off_items",
        "_off_lock",
        "_off_ok",
        "_opened",
        "_out",
        "_pending",
        "_preflight_due",
        "_probe",
        "_regenerate",
        "_requests",
        "_scanning",
        "_session_id",
        "_skip_checks",
        "_spans",
        "_state",
        "_text",
        "_to_send",
        "_unjudged_status",
        "_window_start_ns",
        "_windows",
        "contexts",
        "has_events",
        "hold_back",
        "preflight_pending",
        "question",
        "reference",
        "regen_request",
        "settings",
        "stopped",
    )

    def __init__(
        self,
        *,
        question: str | None = None,
        contexts: Sequence[str] | None = None,
        reference: str | None = None,
        settings: Settings | None = None,
        runtime: StreamBackend | None = None,
        regenerate: RegenerateCallback | None = None,
        name: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        context: Context | None = None,
        start_time_ns: int | None = None,
        request_start_ns: int | None = None,
    ) -> None:
        self._backend = runtime or default_backend()
        # the stream's spans and timing; the process's maker of ended spans is a runtime's (a bare backend
        # need not have one). Time to first token counts from ``start_time_ns`` (default: start())
        self._spans = StreamSpans(self._backend.tracer, getattr(self._backend, "ended_spans", None),
                                  name or semconv.SPAN_STREAM, attributes, context, start_time_ns or 0,
                                  request_start_ns or 0)
        self.settings: Settings = settings or self._backend.settings
        self.question = question
        self.contexts: tuple[str, ...] | None = tuple(contexts) if contexts is not None else None
        self.reference = reference
        self._regenerate = regenerate
        s = self.settings
        #: tokens are released only after their window passed (drivers must not emit them themselves)
        self.hold_back = s.mode == "hold_back"
        # made by start() for a judged stream: a sampled-out one never asks the judging service anything,
        # and each of these per-stream objects is one more for the cyclic GC to track while it is live
        self._requests: StreamRequests | None = None
        # the sentence windows are made by start() once it knows the stream is judged: until then the answer
        # is only kept (a sampled-out stream never builds a sentence buffer)
        self._windows: Windows = Transcript()
        self._text: TokenText | None = None  # made by the first token that is not plain ASCII text
        # what verdicts do to the stream (checkpoints, releases, the action a failure takes): made by start()
        # for a judged stream, the shared idle one until then
        self._state = _IDLE
        # the stream's counters (slots of their own: a counters object would be one more per live stream
        # for the cyclic GC to track, and one more hop per token)
        self._n_tokens = 0
        self._judging = True  # decided once at start: sampling, content size
        self._unjudged_status = ""
        self._skip_checks: str | None = None
        self._next_index = 0
        self._window_start_ns = 0
        self._pending = self._state.checkpoints  # its truthiness is the drivers' "verdicts in flight?"
        # set by an event-loop driver: schedules a callback for after the current token went out
        self._defer: Callable[[Callable[[], None]], object] | None = None
        # the Windows' held list while tokens may wait there for the loop's next pass (see accept), or None
        self._held: list[str] | None = None
        # deferred work waits for the loop's next pass and tokens go to _held meanwhile (see accept)
        self._holding = False
        self._scanning = False  # _scan_held closes windows: the send that follows it takes them
        # made by the first window that waits, as the outbox below by the first event: each is a list fewer
        # for the cyclic GC per live stream (most streams never have either for most of their life)
        self._to_send: list[tuple[Window, int, int, bool]] | None = None
        self._preflight_due = False  # asked for, not made and sent yet (see _preflight)
        # windows whose span and request the judge pool's thread makes (see _send_off): where start() found
        # the spans can be made ended; the queue and its lock are made by the first such window
        self._off_ok = False
        self._off_items: deque[tuple[Window, int, int, int, bool]] | None = None
        self._off_lock: threading.Lock | None = None
        # verdicts from the pool's thread
        self._inbox: deque[Verdict] | None = None  # made by start() for a judged stream
        self._notify: Callable[[], None] | None = None
        self._hush = False  # see hush_passes
        self._out: list[StreamEvent] | None = None  # events for the driver (see _outbox)
        self.has_events = False
        self.stopped = False
        self.preflight_pending = False
        self.regen_request: RegenerateRequest | None = None
        # the final result's future is made when someone asks for it (most streams: nobody does; a
        # Future is a condition, a lock and two lists per stream, and the GC tracks each of them)
        self._final: concurrent.futures.Future[JudgeResult | None] | None = None
        self._final_set = False
        self._final_value: JudgeResult | None = None
        self._session_id: str | None = None
        # made by the first thing that makes the client's text differ from the model's (see _Delivered)
        self._delivered: _Delivered | None = None
        self._finished = False
        self._opened = False  # counted by the service's stream_opened (closed in finish)
        self._probe: LoopProbe | None = None  # what stream_opened returned: its loop's lateness probe
        # windows a burst closed go out as one checkpoint (decided at start; see _close_checkpoint)
        self._join = False

    @property
    def final(self) -> concurrent.futures.Future[JudgeResult | None]:
        """Resolves with the final reconciliation result (None when it was skipped or failed)."""
        fut = self._final
        if fut is None:
            with _FINAL_LOCK:
                fut = self._final
                if fut is None:
                    fut = self._final = concurrent.futures.Future()
                    if self._final_set:
                        fut.set_result(self._final_value)
        return fut

    def _set_final(self, value: JudgeResult | None) -> None:
        """The final result, once (later calls are ignored); from any thread."""
        with _FINAL_LOCK:
            if self._final_set:
                return
            self._final_set = True
            self._final_value = value
            fut = self._final
        if fut is not None:  # asked for before: resolve it (else the property makes it resolved)
            # unless its holder cancelled it: that is theirs to do and must not break the stream
            with contextlib.suppress(concurrent.futures.InvalidStateError):
                fut.set_result(value)

    # --- the inbox (judge pool's thread) -----------------------------------------------------------

    def post(self, verdict: Verdict) -> None:
        """Deliver a verdict; called on the judge pool's thread."""
        if verdict.kind == "answer":
            r = verdict.outcome.result
            ok = r is not None and verdict.status == "judged"
            self._set_final(JudgeResult(r.judge, verdict.scores, r.usage) if ok and r else None)
            return
        inbox = self._inbox
        if inbox is None:  # a verdict for a stream that asked for none: keep it anyway (one poster thread)
            inbox = self._inbox = deque()
        inbox.append(verdict)
        self.has_events = True
        notify = self._notify
        if notify is not None and not (self._hush and self._unseen(verdict)):
            notify()

    def _unseen(self, verdict: Verdict) -> bool:
        # draining it makes no event (stream-first mode): a checkpoint that passed or was not judged, a
        # pre-flight verdict whose gate does nothing (read here as _apply_preflight will read it)
        if self.hold_back:
            return False  # a passed window releases its tokens
        if verdict.kind == "checkpoint":
            return not (verdict.status == "judged" and verdict.failed)
        if verdict.kind == "preflight":
            s = self.settings
            return not preflight_gate(verdict, s.preflight_threshold, s.preflight_action).policy
        return False

    def set_notify(self, callback: Callable[[], None] | None) -> None:
        """Called (from any thread) whenever a verdict arrives; drivers use it to wake up."""
        self._notify = callback

    def hush_passes(self, on: bool) -> None:
        """While on, a verdict the reader cannot see does not call the :meth:`set_notify` callback: in
        stream-first mode, a checkpoint that passed or was not judged, and a pre-flight verdict whose gate
        does nothing (only a failure makes an event there). It waits in the inbox, and :attr:`has_events`
        has the driver drain it once its next token went out. A driver turns it on while it waits for
        tokens: woken for it, a loop whose source runs on a timer went back to sleep with a timeout that
        epoll rounds up to whole milliseconds, and its next token came up to 1 ms late
        (``benchmarks/run.py``'s timer-source ITL). It turns it off for the end-of-stream wait, which
        counts every verdict."""
        self._hush = on

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Checkpoints still waiting for a verdict."""
        return len(self._pending)

    @property
    def span(self) -> trace.Span | None:
        """The stream span (None before :meth:`start`)."""
        return self._spans.span

    @property
    def judging(self) -> bool:
        """Whether this stream is judged at all (decided at :meth:`start`)."""
        return self._judging

    def start(self) -> list[StreamEvent]:
        """Open the stream span, resolve the question and contexts, decide sampling, ask for pre-flight."""
        backend = self._backend
        settings = self.settings
        sp = self._spans
        # made ended (see StreamSpans.open): the checkpoints' spans can be made ended too (see _send_later)
        off_ok = sp.open(settings.mode, settings.action)
        self._window_start_ns = sp.start_ns
        trace_id = sp.trace_id
        # end-of-stream attributes, set in one call at the end (each call takes the span's lock)
        late = sp.late
        stream_started(trace_id, self)
        stored = None
        if self.question is not None or self.contexts is not None or self.reference is not None:
            stored = backend.contexts.register(
                trace_id, question=self.question, contexts=self.contexts, reference=self.reference
            )
        else:
            stored = backend.contexts.get(trace_id) or backend.contexts.get(0)
        if stored is not None:
            self.question = self.question if self.question is not None else stored.question
            self.contexts = self.contexts if self.contexts is not None else stored.contexts
            self.reference = self.reference if self.reference is not None else stored.reference
            if stored.session_id:
                late[semconv.SESSION_ID] = stored.session_id
        self._session_id = stored.session_id if stored is not None else None
        if self.question is not None and settings.capture_content:
            late[semconv.STREAM_QUESTION] = late[semconv.INPUT_VALUE] = self.question
        # a trace the tracing sampler dropped counts as sampled out, decided here once, so nothing waits for
        # verdicts and nothing is held
        if not sp.recording or not backend.service.sampled(trace_id):
            self._judging = False
            self._unjudged_status = "sampled_out"
            late[semconv.EVAL_STATUS] = "sampled_out"
        elif self.contexts is not None and _size(self.contexts) > settings.max_judge_input_chars:
            self._judging = False
            self._unjudged_status = "skipped"
            self._record_skip("stream", "contexts_too_large")
            late[semconv.EVAL_STATUS] = "skipped"
            late[semconv.EVAL_SKIP_REASON] = "contexts_too_large"
        if self.contexts is not None:
            late[semconv.STREAM_CONTEXT_COUNT] = len(self.contexts)
        if not self._judging:
            # nothing will be judged: no sentence splitting, no windows, nothing held back
            self.hold_back = False
        else:
            s = settings
            # tokens a driver sent before this start (see early_sink) are the answer's first: the windows
            # scan them with the tokens that follow, on the loop's next pass (below) or now
            early = self._windows.sink if self._n_tokens and isinstance(self._windows, Transcript) else None
            self._windows = Windows(s.window_sentences, s.window_chars, s.checkpoint_every)
            if early:
                self._windows.held.extend(early)
            self._inbox = deque()
            self._state = StreamState(hold_back=self.hold_back, action=s.action,
                                      can_regenerate=self._regenerate is not None,
                                      max_regenerations=s.max_regenerations)
            self._pending = self._state.checkpoints
            self._requests_of()
            self._off_ok = off_ok
        self._hold_tokens()
        if self._judging:
            self._opened = True
            self._probe = backend.service.stream_opened()
            self._join = not self.hold_back and backend.service.scores_sentences("checkpoint")
            if settings.preflight:
                self._preflight()
            if self._held is not None and not self._holding:
                # no pre-flight request waits for the loop's next pass (none asked for, or no contexts to
                # ask about): the first tokens wait for it all the same, as a burst's do (see accept). A
                # source with its tokens at hand then sends them with a list append each, not a sentence
                # scan each until the first window closes (~0.25 µs a token, benchmarks/run.py's answers)
                self._defer(self._send_deferred)  # type: ignore[misc]
                self._holding = True
            elif self._held is None and self._windows.held:
                # early tokens where nothing waits for a next pass: their windows close now
                for end in self._windows.scan():
                    self._close_checkpoint(end)
        return self._take()

    def prepare_late_start(self) -> bool:
        """Whether a driver may ask its source for the first token before :meth:`start`, which it then
        calls as soon as its loop runs (or on that token). Not where the pre-flight gate may stop the
        answer or its checks before the first token is asked for (``stop``, ``skip_checks``). When it may,
        the stream's start time is taken now, and instrumentation is told now that the app guards this
        answer itself: the source's first step may reach the model already, whose tap must not open a
        second session for it."""
        s = self.settings
        sp = self._spans
        if sp.span is not None or (s.preflight and s.preflight_action in ("stop", "skip_checks")):
            return False
        sp.start_ns = sp.start_ns or time.time_ns()
        # the stream's parent is where it began: start() may run on a later step (see early_sink), by
        # when the consumer may have made another span current
        sp.open_parent(otel_context.get_current())
        # a stream under a span (the request's) is in that span's trace; a root stream's trace is new,
        # and nothing can be bound to it yet
        parent = trace.get_current_span(sp.parent).get_span_context()
        if parent.is_valid:
            stream_started(parent.trace_id, self)
        return True

    def set_inputs(self, *, question: str | None = None, contexts: Sequence[str] | None = None) -> None:
        """Inputs learnt after :meth:`start` (contexts retrieved inside the answer node, before its first
        token): used from the next checkpoint on, and the pre-flight gate runs now if it could not before."""
        if question is not None and self.question is None:
            self.question = question
        if contexts is None or self._spans.span is None:
            return
        had = self.contexts is not None
        self.contexts = tuple(contexts)
        self._spans.late[semconv.STREAM_CONTEXT_COUNT] = len(self.contexts)
        if not had and self.settings.preflight and self._judging and not self._n_tokens:
            self._preflight()

    def _requests_of(self) -> StreamRequests:
        requests = self._requests
        if requests is None:
            requests = self._requests = StreamRequests(self.settings, coalesce=not self.hold_back)
            if self._spans.span is not None:
                requests.bind(self._spans.span, self._session_id)
        return requests

    def _request(self, kind: EvalKind, text: str, **where: Any) -> JudgeRequest:
        return self._requests_of().make(kind, text, question=self.question, contexts=self.contexts,
                                        reference=self.reference, reply=self.post, **where)

    def _preflight(self) -> None:
        if self.contexts is None:
            self._record_skip("preflight", "contexts_unknown")
            return
        self.preflight_pending = True
        if self._defer is None or self.preflight_blocks:
            self._backend.service.submit(self._request("preflight", ""))
            return
        # made and sent once the driver waits for the first token (as checkpoint requests are, see
        # _close_checkpoint): submitted here, the pool's thread would wake and judge it (index the contexts)
        # under the GIL while the loop is still busy starting the stream; a source that is slow to its first
        # token (any model) lets it go out at once, before that token. Made then too: a source with its
        # tokens at hand sends them all before, and the request is not theirs to wait for
        if not self._to_send and not self._preflight_due:
            self._defer(self._send_deferred)
        self._preflight_due = True
        self._holding = self._held is not None

    @property
    def preflight_blocks(self) -> bool:
        """The first token waits for the pre-flight verdict: its policy (stop, skip checks) decides what
        happens to the answer before it starts. ``warn`` and ``none`` never delay the first token."""
        return self.preflight_pending and self.settings.preflight_action in ("stop", "skip_checks")

    def _apply_preflight(self, verdict: Verdict) -> None:
        self.preflight_pending = False
        span = self._spans.span
        assert span is not None
        gate = preflight_gate(verdict, self.settings.preflight_threshold, self.settings.preflight_action)
        span.set_attributes(gate.attributes)
        policy, data = gate.policy, gate.data
        if policy == "warn":
            self._emit(StreamEvent("warning", data["explanation"] or "retrieved context looks weak", data))
        elif policy == "skip_checks":
            # checkpoints sent before this verdict came are judged, but say nothing to the reader
            self._skip_checks = "preflight_low_context"
        elif policy == "stop" and self._n_tokens == 0:
            self._stop(data)

    def accept(self, token: Any) -> str | None:
        """Record one token; return its text, or None when it was skipped (None, empty, undecodable)."""
        if token.__class__ is not str or not token.isascii():
            token = self._token_text().text(token, self._record_skip)
            if not token:
                return None
        elif not token:
            return None
        n = self._n_tokens
        if not n:
            self._first_token()
        self._n_tokens = n + 1
        if len(token) > MAX_TOKEN_CHARS and not isinstance(self._windows, Transcript):
            return self._accept_large(token)  # type: ignore[no-any-return]
        if self._holding:
            # the loop has not run since a checkpoint (or the pre-flight request) was deferred to its next
            # pass: a burst, whose tokens come faster than the loop turns. Their sentences wait for that
            # pass too, which scans them as one text (see _send_deferred); nobody could be told of a
            # window of them before it anyway, and a window that closed now would be joined to the one
            # waiting. The token goes out with a list append as its only work
            self._held.append(token)  # type: ignore[union-attr]
            return token  # type: ignore[no-any-return]
        end = self._windows.feed(token)
        if end >= 0:
            self._close_checkpoint(end)
        return token  # type: ignore[no-any-return]

    def _accept_large(self, token: str) -> str:
        # the head is judged; the rest passes through unjudged, in order (see Unjudged), and is counted
        self._scan_held()
        head, rest = token[:MAX_TOKEN_CHARS], token[MAX_TOKEN_CHARS:]
        end = self._windows.feed(head)
        if end >= 0:
            self._close_checkpoint(end)
        self._windows.pass_unjudged(rest)
        self._record_skip("token", "too_large")
        late = self._spans.late
        before = late.get(semconv.STREAM_UNJUDGED_CHARS)
        late[semconv.STREAM_UNJUDGED_CHARS] = (before if isinstance(before, int) else 0) + len(rest)
        return token

    def early_sink(self) -> list[str] | None:
        """Before :meth:`start`, once the first token was accepted: the list a driver may append each plain
        token's text to instead of calling :meth:`accept`, for tokens it sends before it starts the stream
        (a source with its first tokens at hand: the stream's start then runs on the loop's next pass, not
        in front of them). It reports how many it appended with :meth:`passed`; :meth:`start` takes them
        as the answer's first. None where that cannot be: started already, or hold-back (no token goes out
        before its window passed)."""
        windows = self._windows
        if (self._spans.span is not None or self.hold_back or not self._n_tokens
                or not isinstance(windows, Transcript)):
            return None
        return windows.sink

    def passthrough_sink(self) -> list[str] | None:
        """For a stream nothing will judge (sampled out, or skipped at start), once its first token was
        accepted: the list a driver may append each plain token's text to instead of calling
        :meth:`accept` (no verdict can come, so there is nothing else to do per token). The driver
        reports how many it appended with :meth:`passed`. None for any other stream."""
        if self._judging or self.hold_back or not self._n_tokens or self.has_events or self.stopped:
            return None
        windows = self._windows
        return windows.sink if isinstance(windows, Transcript) else None

    def passed(self, tokens: int) -> None:
        """``tokens`` plain tokens were appended to :meth:`passthrough_sink`'s list."""
        self._n_tokens += tokens

    def drain(self) -> list[StreamEvent]:
        """Events ready now: warnings, retractions, stops, tokens released in hold-back mode."""
        self.has_events = False
        inbox = self._inbox
        while inbox:
            verdict = inbox.popleft()
            if verdict.kind == "preflight":
                self._apply_preflight(verdict)
            else:
                self._on_verdict(verdict)
        return self._take()

    def close_tail(self) -> None:
        """End of the token source: flush the tail sentence and close the last checkpoint."""
        self._scan_held()
        tail = self._text.tail() if self._text is not None else ""
        if tail:
            self._n_tokens += 1
            end = self._windows.feed(tail)
            if end >= 0:
                self._close_checkpoint(end)
        end = self._windows.flush()
        if end >= 0:
            self._close_checkpoint(end, final=True)

    def finish(self, outcome: str = "completed") -> list[StreamEvent]:
        """End the stream span (the final reconciliation starts from it) and return the ``done`` event."""
        if self._finished:
            return []
        self._finished = True
        self._send_all()  # checkpoint spans end before their stream span
        sp = self._spans
        span = sp.span
        if span is None:
            return [StreamEvent("done", data={"verdict": "unjudged"})]
        if self.hold_back and not self.stopped:
            # whatever is still held was never judged in time: release it, fail-open, and say so
            self._emit_tokens(self._state.release_all())
            self._emit_tokens(self._windows.take_open_tokens())
        text = self._windows.text()
        summary = self._summary(outcome)
        sp.close(self._end_attributes(outcome, summary["verdict"], text), outcome)
        service = self._backend.service
        service.end_stream(sp.span_id)
        if self._opened:
            service.stream_closed(self._probe)
        skip = self._final_skip(outcome, text)
        if skip is None and self.settings.final_pass == "deferred":
            defer_final(span, text, self.question, self.contexts, self.reference,
                        capture=self.settings.capture_content, limit=self.settings.max_judge_input_chars)
            self._set_final(None)
        elif skip is None:
            service.submit(self._request("answer", text, target=span, target_name=sp.name))
        else:
            if self._judging:
                span.set_attribute(semconv.EVAL_STATUS, "skipped")
                span.set_attribute(semconv.EVAL_SKIP_REASON, skip)
            self._set_final(None)
        span.end()
        self._release_state()
        self._emit(StreamEvent("done", data=summary))
        return self._take()

    def _end_attributes(self, outcome: str, verdict: str, text: str) -> dict[str, AttributeValue]:
        # what the stream span says at the end: counts, outcome, and the answer the client received (the
        # model's text beside it when it differs)
        shown = self.delivered_text()
        settings = self.settings
        limit = settings.max_text_attribute_chars
        attrs: dict[str, AttributeValue] = {
            semconv.STREAM_TOKENS: self._n_tokens,
            semconv.STREAM_CHARS: len(shown),
            semconv.STREAM_CHECKPOINTS: self._next_index,
            semconv.STREAM_ALERTS: self._state.alerts,
            semconv.STREAM_VERDICT: verdict,
            semconv.STREAM_OUTCOME: outcome,
            semconv.STREAM_REGENERATIONS: self._state.regenerations,
        }
        if self._text is not None and self._text.skipped:
            attrs[semconv.STREAM_SKIPPED_TOKENS] = self._text.skipped
        why = self._delivered.not_enforced if self._delivered is not None else None
        if why is not None:
            attrs[semconv.ACTION_ENFORCED] = False
            attrs[semconv.ACTION_ENFORCED_REASON] = why
        capture = settings.capture_content
        if shown != text and capture:
            attrs[semconv.STREAM_MODEL_ANSWER] = span_text(text, limit)
        attrs.update(text_attributes(ANSWER_KEYS, shown, capture=capture, limit=limit))
        if capture:
            attrs[semconv.OUTPUT_VALUE] = span_text(shown, limit)
        return attrs

    def _release_state(self) -> None:
        # the stream is over on every exit path (completed, stopped, client gone, error): a driver that
        # still feeds it must not open windows, send judge requests or keep text for it
        self._judging = False
        self._windows = Ended()
        self._held = None
        self._holding = False
        self._defer = None
        self._state.close()
        self._to_send = None
        self._text = None
        if self._inbox is not None:
            self._inbox.clear()

    def _final_skip(self, outcome: str, text: str) -> str | None:
        if not self._judging:
            return "not_judged"
        if not self.settings.final_reconcile:
            return "final_reconcile_off"
        if outcome not in ("completed", "stopped"):
            return outcome
        if not text:
            return "empty_answer"
        if len(text) > self.settings.max_judge_input_chars:
            return "answer_too_large"
        return None

    @property
    def defers(self) -> bool:
        """Whether checkpoint spans and requests wait for a scheduler (see :meth:`set_deferral`)."""
        return self._defer is not None

    def set_deferral(self, schedule: Callable[[Callable[[], None]], object] | None) -> None:
        """Let checkpoint requests go out via ``schedule`` (e.g. ``loop.call_soon``) instead of inline."""
        if schedule is None:
            self._send_deferred()
        self._defer = schedule
        self._hold_tokens()

    def _hold_tokens(self) -> None:
        # tokens wait for a scan only where a scheduler runs it, and not in hold-back, where tokens go out
        # per window as they came; called whenever the windows, the scheduler or the mode change
        # (a Transcript - before start(), or a stream nothing judges - never holds: its held list is shared)
        windows = self._windows
        lazy = (self._defer is not None and self._judging and not self.hold_back
                and not isinstance(windows, Transcript))
        self._held = windows.held if lazy else None
        self._holding = self._holding and lazy

    def abort(self, outcome: str = "disconnected", error: BaseException | None = None) -> None:
        """The consumer went away or the source failed: cancel queued judge work, end the span."""
        span = self._spans.span
        if self._finished or span is None:
            return
        self._send_all()  # every checkpoint sent has its span, and its request is cancelled below
        cancelled = self._backend.service.cancel_stream(self._spans.span_id)
        self._state.checkpoints.clear()
        if error is not None:
            span.record_exception(error)
        if cancelled:
            self._spans.late[semconv.JUDGE_CANCELLED_JOBS] = cancelled
        self.finish(outcome)

    # --- regeneration -------------------------------------------------------------------------------

    def begin_regeneration(self) -> RegenerateRequest:
        """Reset the running text to the accepted prefix; the driver then switches to the new source."""
        req = self.regen_request
        assert req is not None
        self.regen_request = None
        prefix = req.accepted_prefix
        # hold-back: the retracted windows were never released; the new ones are released from here
        self._state.restart(len(prefix), self._next_index)
        s = self.settings
        self._windows = Windows(s.window_sentences, s.window_chars, s.checkpoint_every, prefix)
        self._hold_tokens()  # the retracted text's held tokens went with the old windows
        return req

    def open_regeneration(self, req: RegenerateRequest) -> TokenSource:
        """Call the user's regenerate callback."""
        assert self._regenerate is not None
        return self._regenerate(req)

    # --- internals ----------------------------------------------------------------------------------

    def _first_token(self) -> None:
        # its span event is added at the end, with this timestamp: made here, on the first token's path, it
        # would be an event, its attributes and a lock more for the GC to track through the whole stream
        self._spans.model_first(not self.hold_back)  # stream-first: it goes out now

    def _close_checkpoint(self, end: int, final: bool = False) -> None:
        window = self._windows.cut(end)
        now = time.time_ns()
        started, self._window_start_ns = self._window_start_ns, now
        to_send = self._to_send
        if to_send and self._join:
            # the window before is still waiting for the loop's next pass (a burst: several sentences
            # arrived without the loop running in between, so nobody could have been told of the first
            # yet): both go out as one checkpoint - one span and one judge call instead of one per window,
            # which the pool would have merged anyway had both reached its queue. Its verdict still names
            # each sentence: only where the checkpoint judge scores sentences (a single score would fail the
            # joined text as a whole). Hold-back keeps its windows: each releases its tokens on its own
            # verdict.
            prev, index, prev_started, _final = to_send[-1]
            if prev.joinable(window):
                to_send[-1] = (prev.joined(window), index, prev_started, final)
                self._state.extend(index, end)
                return
        index = self._next_index
        self._next_index += 1
        judged = self._judging and not self._skip_checks
        if judged or self.hold_back:
            self._state.open(index, window.start, end, window.tokens)
        if self._defer is None:
            if self._off_ok:  # behind the windows already queued for the pool's thread, as they came
                self._send_later(((window, index, started, final),), now)
            else:
                self._send(window, index, started, now, final)
        else:
            # the span and the request (-> judge pool, which wakes the pool's thread) are made right after
            # this token went out, while the stream waits for the next one, not inside its gap
            if not self._scanning:
                if not self._to_send and not self._preflight_due:
                    self._defer(self._send_deferred)
                self._holding = self._held is not None
            if self._to_send is None:
                self._to_send = [(window, index, started, final)]
            else:
                self._to_send.append((window, index, started, final))
        if not judged and self.hold_back:
            self._emit_tokens(self._state.pass_unjudged(index))

    def _scan_held(self) -> None:
        """Feed the held tokens to the windows; the windows they complete join the checkpoints waiting to
        go out, whose send is scheduled already (or is the caller)."""
        self._holding = False
        if self._held:
            self._scanning = True
            try:
                for end in self._windows.scan():
                    self._close_checkpoint(end)
            finally:
                self._scanning = False

    def _send_deferred(self) -> None:
        self._scan_held()
        if self._preflight_due:
            self._preflight_due = False
            self._backend.service.submit(self._request("preflight", ""))
        to_send, self._to_send = self._to_send, None
        if not to_send:
            return
        now = time.time_ns()
        if not self._off_ok:
            for window, index, started, final in to_send:
                self._send(window, index, started, now, final)
        else:
            self._send_later(to_send, now)

    def _send_all(self) -> None:
        """Every closed window's span and request, made now: those waiting for the loop's next pass, and
        those the pool's thread has not made yet (one it is making is waited for)."""
        self._send_deferred()
        self._send_off()

    def _send_later(self, windows: Iterable[tuple[Window, int, int, bool]], end_ns: int) -> None:
        # the spans and requests are made on the judge pool's thread, which runs that path back to back
        # for every stream, next to the judging it leads to. Made on the stream's thread, between two
        # tokens of the app's own work, each checkpoint's path ran with its code and data out of the cache:
        # in benchmarks/run.py's loop-pass streams it cost 58-70 us a checkpoint on the app's loop, against
        # ~15 us in a tight loop. Windows closed without a scheduler (a sync source, a callback) queue here
        # too, so the spans are made in the order their windows closed
        items = self._off_items
        if items is None:
            items = self._off_items = deque()
            self._off_lock = threading.Lock()
        for window, index, started, final in windows:
            items.append((window, index, started, end_ns, final))
        self._backend.service.call_soon(self._send_off)

    def _send_off(self) -> None:
        """Make the spans and requests of the windows :meth:`_send_later` queued, in order: on the judge
        pool's thread, or on the stream's own when it ends (its lock waits for one the pool is making)."""
        items, lock = self._off_items, self._off_lock
        if items is None or lock is None:
            return
        with lock:
            while items:
                self._send(*items.popleft())

    def _send(self, window: Window, index: int, start_ns: int, end_ns: int, final: bool) -> None:
        """Make the checkpoint span and send its request to the judging service."""
        attrs: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT,
            semconv.OPENINFERENCE_SPAN_KIND: semconv.OPENINFERENCE_KIND_GUARDRAIL,
            semconv.CHECKPOINT_INDEX: index,
            semconv.CHECKPOINT_CHAR_START: window.start,
            semconv.CHECKPOINT_CHAR_END: window.end,
            semconv.CHECKPOINT_SENTENCES: window.sentences,
            semconv.STREAM_ID: self._spans.stream_hex,
        }
        if final:
            attrs[semconv.CHECKPOINT_FINAL] = True
        judged = self._judging and not self._skip_checks
        if not self._judging:
            attrs[semconv.EVAL_STATUS] = self._unjudged_status
        elif self._skip_checks:
            attrs[semconv.EVAL_STATUS] = "skipped"
            attrs[semconv.EVAL_SKIP_REASON] = self._skip_checks
        settings = self.settings
        text = text_attributes(CHECKPOINT_KEYS, window.text, capture=settings.capture_content,
                               limit=settings.max_text_attribute_chars)
        cp, live = self._spans.checkpoint(attrs, text, start_ns, end_ns)
        if judged and index in self._pending:
            # before the span's end: the processor holds a span it was told to expect
            self._backend.service.submit(
                self._request("checkpoint", window.text, prefix=window.prefix, offset=window.start,
                              index=index, target=cp, target_name=semconv.SPAN_CHECKPOINT)
            )
        self._spans.end_checkpoint(cp, live, end_ns)

    def _on_verdict(self, v: Verdict) -> None:
        data: dict[str, Any] = {}
        for act in self._state.on_verdict(v, self._windows.text, quiet=self._skip_checks is not None):
            if isinstance(act, Release):
                self._emit_tokens(act.tokens)
            elif isinstance(act, Unjudged):
                self._record_skip("checkpoint", act.status)
            elif isinstance(act, Alert):
                data = self._alert(act)
            elif isinstance(act, Stop):
                self._stop(data)
            elif isinstance(act, Regenerate):
                self._start_regeneration(act)

    def _alert(self, alert: Alert) -> dict[str, Any]:
        # the alert's span event and the reader's warning; returns the warning's data
        v, score, action = alert.verdict, alert.score, self.settings.action
        data = warning_data(v, score, self._requests_of().threshold(score.name), action)
        if self._spans.span is not None:
            first = data["sentences"][0]
            self._spans.event(
                semconv.EVENT_ALERT,
                {
                    semconv.ALERT_METRIC: score.name,
                    semconv.ALERT_SCORE: score.value if score.value is not None else -1.0,
                    semconv.ALERT_CHECKPOINT: v.index,
                    semconv.ALERT_CHAR_START: first["start"],
                    semconv.ALERT_CHAR_END: first["end"],
                    semconv.ALERT_REASON: str(first["reason"])[:300] if self.settings.capture_content
                    else "",
                },
            )
        explanation = score.explanation
        if self.hold_back:
            # the client never sees a failing sentence, not even quoted in the judge's explanation
            explanation = withhold(data, self._windows.text())
        if alert.reason is not None:
            data["action"] = alert.action
            data["reason"] = alert.reason
            if alert.reason == "no_regenerate_callback":
                self.not_enforced("regenerate: no model to re-prompt (no regenerate callback)")
        self._emit(StreamEvent("warning", explanation, data))
        return data

    def _start_regeneration(self, regen: Regenerate) -> None:
        text = self._windows.text()
        keep, shown = regen.keep, regen.shown
        d = self._delivery()
        d.base = (d.base or "") + text[d.start:(keep if d.retracts_shown else shown)]
        d.start = keep
        if shown > keep:
            self._emit(StreamEvent("retract", text[keep:shown], {"from": keep, "to": shown,
                                                                 "checkpoint": regen.checkpoint}))
            self._spans.event(semconv.EVENT_RETRACT, {"from": keep, "to": shown})
        self.regen_request = RegenerateRequest(
            question=self.question or "",
            contexts=self.contexts or (),
            accepted_prefix=text[:keep],
            instruction=self.settings.regenerate_instruction,
            attempt=self._state.regenerations + 1,
        )
        self.has_events = True

    def note_delivered(self, text: str) -> None:
        """``text`` went to the client as the answer's own words after its last token (a tap writes the
        stop's fallback as the model's last words): the answer recorded is what the client received."""
        self._delivery().extra += text

    @property
    def retracts_shown(self) -> bool:
        """Whether a retraction reaches the client (a wrapper with client events off cannot send one)."""
        return self._delivered is None or self._delivered.retracts_shown

    @retracts_shown.setter
    def retracts_shown(self, value: bool) -> None:
        if value != self.retracts_shown:
            self._delivery().retracts_shown = value

    def _delivery(self) -> _Delivered:
        d = self._delivered
        if d is None:
            d = self._delivered = _Delivered()
        return d

    def not_enforced(self, reason: str) -> None:
        """This stream's action or mode cannot be enforced where its tokens come from: the span says so
        (``streamjudge.action.enforced=false`` with ``reason``) and one log line a process says why."""
        d = self._delivery()
        if d.not_enforced is None:
            d.not_enforced = reason
            if reason not in _NOT_ENFORCED_LOGGED:
                _NOT_ENFORCED_LOGGED.add(reason)
                _log.warning("streamjudge: %s/%s cannot be enforced here: %s", self.settings.action,
                             self.settings.mode, reason)

    def delivered_text(self) -> str:
        """The answer as the client received it: released text in hold-back, the text before a retraction
        the client never saw, a tap's fallback words."""
        text = self._windows.delivered()
        released = self._state.released_end
        if self.hold_back and self.stopped and released is not None:
            text = text[:released]
        d = self._delivered
        if d is None:
            return text
        if d.base is not None:
            text = d.base + text[d.start:]
        return text + d.extra

    def _stop(self, data: Mapping[str, Any]) -> None:
        self.stopped = True
        self._state.stop()
        self._windows.take_open_tokens()
        self._spans.event(semconv.EVENT_STOP, {semconv.ALERT_METRIC: str(data.get("metric", ""))})
        self._emit(StreamEvent("stop", self.settings.fallback_message, data))

    def _token_text(self) -> TokenText:
        text = self._text
        if text is None:
            text = self._text = TokenText()
        return text

    def _emit_tokens(self, tokens: list[str]) -> None:
        if tokens:
            if not self._spans.first_ns:
                self._spans.client_first(time.time_ns())
            out = self._outbox()
            out.extend(map(token_event, tokens))
            self.has_events = True

    def _emit(self, event: StreamEvent) -> None:
        self._outbox().append(event)
        self.has_events = True

    def _outbox(self) -> list[StreamEvent]:
        out = self._out
        if out is None:
            out = self._out = []
        return out

    def _take(self) -> list[StreamEvent]:
        out, self._out = self._out, None
        if self.regen_request is not None or self._inbox:  # None or empty: nothing more waits
            self.has_events = True
        return out if out is not None else []

    def _record_skip(self, what: str, reason: str) -> None:
        self._spans.skip(f"{what}:{reason}")

    def _summary(self, outcome: str) -> dict[str, Any]:
        state = self._state
        return {
            "verdict": state.verdict,
            "outcome": outcome,
            "tokens": self._n_tokens,
            "chars": self._windows.length,
            "checkpoints": self._next_index,
            "alerts": state.alerts,
            "regenerations": state.regenerations,
            "first_alert_char": state.first_alert_char,
            "ttft_ms": self._spans.ttft_ms,
            "stream_id": self._spans.stream_hex,
        }


def _size(contexts: Sequence[str]) -> int:
    return sum(len(c) for c in contexts)


__all__ = [
    "GuardSession", "RegenerateCallback", "RegenerateRequest", "StreamEvent", "TokenSource",
]
