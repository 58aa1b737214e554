"""The live guard: wraps a token stream, closes checkpoint spans, and acts on verdicts mid-stream.

Tokens go out as soon as they arrive (stream-first) or once their window passed (hold-back). Verdicts come
back from the judge pool's thread into a per-stream inbox; the stream checks one boolean before each
yield and only then does any work. Nothing on the token path waits for a judge.
"""

from __future__ import annotations

import asyncio
import codecs
import concurrent.futures
import contextlib
import hashlib
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterable, AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, NamedTuple

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace import Status, StatusCode
from opentelemetry.util.types import AttributeValue

from streamjudge import semconv
from streamjudge._context import TraceInputs
from streamjudge.judging.base import EvalInput, EvalKind, JudgeResult, Score
from streamjudge.judging.pool import JobOutcome, JudgeJob
from streamjudge.sentences import CheckpointPolicy, Sentence, SentenceBuffer

if TYPE_CHECKING:
    from streamjudge.config import Settings
    from streamjudge.runtime import Runtime

_log = logging.getLogger(__name__)


_new_event = tuple.__new__


class StreamEvent(NamedTuple):
    """One event of a guarded stream.

    ``type`` is ``token`` (``text`` = the token), ``warning`` (a checkpoint or the pre-flight gate failed;
    ``data`` names the metric, score, char range and explanation), ``retract`` (text from
    ``data["from"]`` to ``data["to"]`` is withdrawn before a regeneration), ``stop`` (``text`` = fallback
    message; nothing follows but ``done``), or ``done`` (``data`` summarises the stream).
    """

    type: str
    text: str = ""
    data: Mapping[str, Any] | None = None


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
class _Checkpoint:
    index: int
    start: int
    end: int


class GuardSession:
    """The state of one guarded stream, driven by :func:`guard` or by a response-body wrapper.

    Call :meth:`start`, then :meth:`accept` per token (pass the token on when it returns text and the
    mode is stream-first), :meth:`drain` whenever :attr:`has_events` is true, and :meth:`finish` (or
    :meth:`abort` when the client went away). Not thread-safe except :meth:`post`, which the judge pool
    calls from its own thread.
    """

    def __init__(
        self,
        *,
        question: str | None = None,
        contexts: Sequence[str] | None = None,
        reference: str | None = None,
        settings: Settings | None = None,
        runtime: Runtime | None = None,
        regenerate: RegenerateCallback | None = None,
        name: str | None = None,
        attributes: Mapping[str, AttributeValue] | None = None,
        context: Context | None = None,
        start_time_ns: int | None = None,
    ) -> None:
        from streamjudge.runtime import get_runtime

        self._runtime = runtime or get_runtime(create=True)
        self.settings: Settings = settings or self._runtime.settings
        self.question = question
        self.contexts: tuple[str, ...] | None = tuple(contexts) if contexts is not None else None
        self.reference = reference
        self._regenerate = regenerate
        self._name = name or semconv.SPAN_STREAM
        self._attributes = dict(attributes or {})
        self._parent = context
        s = self.settings
        #: tokens are released only after their window passed (drivers must not emit them themselves)
        self.hold_back = s.mode == "hold_back"
        self._buf = SentenceBuffer()
        self._policy = CheckpointPolicy(s.window_sentences, s.window_chars, s.checkpoint_every)
        self._decoder: codecs.IncrementalDecoder | None = None
        # counters
        self._tokens = 0
        self._skipped = 0
        self._alerts = 0
        self._regenerations = 0
        self._first_alert_char: int | None = None
        self._ttft_ms: float | None = None
        self._verdict = "unjudged"
        self._judged_any = False
        # checkpoints
        self._next_index = 0
        self._window_start = 0
        self._window_start_ns = 0
        self._window_sentences = 0
        self._checkpoints: dict[int, _Checkpoint] = {}
        self._pending: set[int] = set()
        self._last_good_end = 0
        self._failed_since_good = False
        self._text = ""  # latest running-text snapshot (taken at each checkpoint)
        self._skip_checks: str | None = None
        self._prefix_len = 0  # accepted prefix re-fed after a regeneration
        self._skips: dict[str, int] = {}
        # set by an event-loop driver: schedules a callback for after the current token went out
        self._defer: Callable[[Callable[[], None]], object] | None = None
        self._to_end: list[tuple[dict[str, AttributeValue], int, int]] = []
        # hold-back: tokens not yet released, by checkpoint window
        self._held: list[str] = []
        self._windows: dict[int, list[str]] = {}
        # verdicts from the pool's thread
        self._inbox: deque[tuple[EvalKind, int, JobOutcome, tuple[Score, ...]]] = deque()
        self._notify: Callable[[], None] | None = None
        self._out: list[StreamEvent] = []
        self.has_events = False
        self.stopped = False
        self.preflight_pending = False
        self.regen_request: RegenerateRequest | None = None
        self.final: concurrent.futures.Future[JudgeResult | None] = concurrent.futures.Future()
        self._span: trace.Span | None = None
        self._span_id = 0
        # when generation was requested (time to first token counts from here); default: start()
        self._start_ns = start_time_ns or 0
        self._finished = False

    # --- listener API used by the processor (StreamListener) ----------------------------------------

    def text_until(self, end: int) -> str:
        """The running total text up to ``end`` (-1: all of it)."""
        if end < 0 or end > len(self._text):
            self._text = self._buf.text()
        return self._text if end < 0 else self._text[:end]

    def post(self, kind: EvalKind, index: int, outcome: JobOutcome, scores: tuple[Score, ...]) -> None:
        """Deliver a verdict; called on the judge pool's thread."""
        if kind == "answer":
            self._runtime.streams.remove(self._span_id)
            if not self.final.done():
                r = outcome.result
                judged = r is not None and outcome.status == "judged"
                final = JudgeResult(r.judge, scores, r.usage) if r is not None and judged else None
                self.final.set_result(final)
            return
        self._inbox.append((kind, index, outcome, scores))
        self.has_events = True
        notify = self._notify
        if notify is not None:
            notify()

    def set_notify(self, callback: Callable[[], None] | None) -> None:
        """Called (from any thread) whenever a verdict arrives; drivers use it to wake up."""
        self._notify = callback

    # --- lifecycle ---------------------------------------------------------------------------------

    @property
    def outstanding(self) -> int:
        """Checkpoints of the current text still waiting for a verdict."""
        return len(self._pending)


    @property
    def span(self) -> trace.Span | None:
        """The stream span (None before :meth:`start`)."""
        return self._span

    def start(self) -> list[StreamEvent]:
        """Open the stream span, resolve the question and contexts, run the pre-flight gate."""
        rt = self._runtime
        rt.check_provider()
        self._start_ns = self._start_ns or time.time_ns()
        self._window_start_ns = self._start_ns
        attrs: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM,
            semconv.STREAM_MODE: self.settings.mode,
            semconv.STREAM_ACTION: self.settings.action,
            **self._attributes,
        }
        span = rt.tracer.start_span(self._name, context=self._parent, attributes=attrs,
                                    start_time=self._start_ns)
        self._span = span
        ctx = span.get_span_context()
        self._span_id = ctx.span_id
        span.set_attribute(semconv.STREAM_ID, format(ctx.span_id, "016x"))
        trace_id = ctx.trace_id
        stored: TraceInputs | None
        if self.question is not None or self.contexts is not None or self.reference is not None:
            stored = rt.contexts.register(
                trace_id, question=self.question, contexts=self.contexts, reference=self.reference
            )
        else:
            stored = rt.contexts.get(trace_id) or rt.contexts.get(0)
        if stored is not None:
            self.question = self.question if self.question is not None else stored.question
            self.contexts = self.contexts if self.contexts is not None else stored.contexts
            self.reference = self.reference if self.reference is not None else stored.reference
            if stored.session_id:
                span.set_attribute(semconv.SESSION_ID, stored.session_id)
        if self.question is not None and self.settings.capture_content:
            span.set_attribute(semconv.STREAM_QUESTION, self.question)
        if self.contexts is not None:
            span.set_attribute(semconv.STREAM_CONTEXT_COUNT, len(self.contexts))
        rt.streams.add(self._span_id, self)
        if self.settings.preflight:
            self._preflight()
        return self._take()

    def _preflight(self) -> None:
        if self.contexts is None:
            self._record_skip("preflight", "contexts_unknown")
            return
        judge = self._runtime.judge_for("preflight")
        item = EvalInput(self.question or "", self.contexts, "", kind="preflight")
        metrics = (semconv.CONTEXT_PRECISION,)
        sync = getattr(judge, "evaluate_sync", None)
        if sync is not None:  # the local judge: microseconds, so inline before the first token
            try:
                result: JudgeResult = sync(item, metrics)
            except Exception as exc:
                self._record_skip("preflight", f"error: {exc!r}"[:200])
                return
            self._apply_preflight(JobOutcome("judged", result))
            return
        self.preflight_pending = True

        def done(outcome: JobOutcome) -> None:
            self.post("preflight", -1, outcome, ())

        self._runtime.pool.submit(
            JudgeJob(judge, item, metrics, done, stream_key=self._span_id,
                     sample_key=self._span.get_span_context().trace_id if self._span else 0)
        )

    def _apply_preflight(self, outcome: JobOutcome) -> None:
        self.preflight_pending = False
        span = self._span
        assert span is not None
        score = outcome.result.get(semconv.CONTEXT_PRECISION) if outcome.result else None
        if score is None or score.value is None:
            reason = (score.skipped if score else None) or outcome.error or outcome.status
            span.set_attribute(semconv.PREFLIGHT_LABEL, f"skipped:{reason}")
            return
        threshold = self.settings.preflight_threshold
        label = "pass" if score.value >= threshold else "fail"
        span.set_attribute(semconv.PREFLIGHT_SCORE, score.value)
        span.set_attribute(semconv.PREFLIGHT_LABEL, label)
        if label == "pass" or self.settings.preflight_action == "none":
            return
        policy = self.settings.preflight_action
        span.set_attribute(semconv.PREFLIGHT_POLICY, policy)
        data = {
            "metric": semconv.CONTEXT_PRECISION,
            "score": score.value,
            "threshold": threshold,
            "stage": "preflight",
            "explanation": score.explanation,
            "action": policy,
        }
        if policy == "warn":
            self._emit(StreamEvent("warning", score.explanation or "retrieved context looks weak", data))
        elif policy == "skip_checks":
            self._skip_checks = "preflight_low_context"
        elif policy == "stop" and self._tokens == 0:
            self._stop(data)

    def accept(self, token: Any) -> str | None:
        """Record one token; return its text, or None when it was skipped (None, empty, undecodable)."""
        if token.__class__ is not str or not token.isascii():
            token = self._normalize(token)
            if not token:
                return None
        elif not token:
            return None
        if not self._tokens:
            self._first_token()
        self._tokens += 1
        if self.hold_back:
            self._held.append(token)
        done = self._buf.feed(token)
        if done:
            self._on_sentences(done)
        return token  # type: ignore[no-any-return]

    def drain(self) -> list[StreamEvent]:
        """Events ready now: warnings, retractions, stops, tokens released in hold-back mode."""
        self.has_events = False
        inbox = self._inbox
        while inbox:
            kind, index, outcome, scores = inbox.popleft()
            if kind == "preflight":
                self._apply_preflight(outcome)
            else:
                self._on_verdict(index, outcome, scores)
        return self._take()

    def close_tail(self) -> None:
        """End of the token source: flush the tail sentence and close the last checkpoint."""
        if self._decoder is not None:
            tail = self._decoder.decode(b"", final=True)
            if tail:
                self._tokens += 1
                if self.hold_back:
                    self._held.append(tail)
                done = self._buf.feed(tail)
                if done:
                    self._on_sentences(done)
        rest = self._buf.flush()
        for s in rest:
            self._window_sentences += 1
            self._policy.add(s)
        if self._window_sentences > 0 and self._buf.length > self._window_start:
            self._close_checkpoint(self._buf.length, final=True)

    def finish(self, outcome: str = "completed") -> list[StreamEvent]:
        """End the stream span (the final reconciliation starts from it) and return the ``done`` event."""
        if self._finished:
            return []
        self._finished = True
        self._end_deferred()  # checkpoint spans end before their stream span
        span = self._span
        if span is None:
            return [StreamEvent("done", data={"verdict": "unjudged"})]
        if self.hold_back:
            # whatever is still held was never judged in time: release it, fail-open, and say so
            for idx in sorted(self._windows):
                self._release(idx)
            if self._held and not self.stopped:
                self._emit_tokens(self._held)
                self._held = []
        text = self.text_until(-1)
        summary = self._summary(outcome)
        for key, value in (
            (semconv.STREAM_TOKENS, self._tokens),
            (semconv.STREAM_CHARS, len(text)),
            (semconv.STREAM_CHECKPOINTS, self._next_index),
            (semconv.STREAM_ALERTS, self._alerts),
            (semconv.STREAM_VERDICT, summary["verdict"]),
            (semconv.STREAM_OUTCOME, outcome),
            (semconv.STREAM_REGENERATIONS, self._regenerations),
        ):
            span.set_attribute(key, value)
        if self._skipped:
            span.set_attribute(semconv.STREAM_SKIPPED_TOKENS, self._skipped)
        for reason, count in self._skips.items():
            span.set_attribute(f"{semconv.SKIP_REASON}.{reason}", count)
        if self._ttft_ms is not None:
            span.set_attribute(semconv.STREAM_TTFT_MS, self._ttft_ms)
        if self.settings.capture_content:
            span.set_attribute(semconv.STREAM_ANSWER, _capped(text, self.settings.max_text_attribute_chars))
        if not self.settings.capture_content or len(text) > self.settings.max_text_attribute_chars:
            span.set_attribute(semconv.STREAM_ANSWER_LENGTH, len(text))
            span.set_attribute(semconv.STREAM_ANSWER_SHA256, _sha256(text))
        if outcome not in ("completed", "stopped"):
            span.set_attribute(semconv.EVAL_SKIP_REASON, outcome)
            span.set_status(Status(StatusCode.ERROR, f"stream {outcome}"))
        judged = self.settings.final_reconcile and outcome in ("completed", "stopped") and bool(text)
        if not judged and not text and outcome in ("completed", "stopped"):
            span.set_attribute(semconv.EVAL_SKIP_REASON, "empty_answer")
        self._runtime.pool.end_stream(self._span_id)
        span.end()
        if not judged or not self._runtime.streams.get(self._span_id):
            self._runtime.streams.remove(self._span_id)
            if not self.final.done():
                self.final.set_result(None)
        self._emit(StreamEvent("done", data=summary))
        return self._take()

    def _checkpoint_span(self, attrs: dict[str, AttributeValue], start_ns: int, end_ns: int) -> None:
        parent = trace.set_span_in_context(self._span) if self._span is not None else None
        cp = self._runtime.tracer.start_span(
            semconv.SPAN_CHECKPOINT, context=parent, attributes=attrs, start_time=start_ns
        )
        cp.end(end_time=end_ns)  # -> processor.on_end -> judge pool

    def _end_deferred(self) -> None:
        to_end, self._to_end = self._to_end, []
        for attrs, start_ns, end_ns in to_end:
            self._checkpoint_span(attrs, start_ns, end_ns)

    def set_deferral(self, schedule: Callable[[Callable[[], None]], object] | None) -> None:
        """Let checkpoint spans end via ``schedule`` (e.g. ``loop.call_soon``) instead of inline."""
        if schedule is None:
            self._end_deferred()
        self._defer = schedule

    def abort(self, outcome: str = "disconnected", error: BaseException | None = None) -> None:
        """The consumer went away or the source failed: cancel queued judge work, end the span."""
        if self._finished or self._span is None:
            return
        cancelled = self._runtime.pool.cancel_stream(self._span_id)
        self._pending.clear()
        if error is not None:
            self._span.record_exception(error)
        if cancelled:
            self._span.set_attribute("streamjudge.judge.cancelled_jobs", cancelled)
        self.finish(outcome)

    # --- regeneration -------------------------------------------------------------------------------

    def begin_regeneration(self) -> RegenerateRequest:
        """Reset the running text to the accepted prefix; the driver then switches to the new source."""
        req = self.regen_request
        assert req is not None
        self.regen_request = None
        self._regenerations += 1
        self._pending.clear()  # verdicts of retracted text are ignored from here on
        self._checkpoints.clear()
        self._held = []
        self._windows.clear()
        prefix = req.accepted_prefix
        self._buf = SentenceBuffer()
        if prefix:
            self._buf.feed(prefix)
        self._text = prefix
        self._window_start = len(prefix)
        self._window_sentences = 0
        self._policy = CheckpointPolicy(
            self.settings.window_sentences, self.settings.window_chars, self.settings.checkpoint_every
        )
        self._failed_since_good = False
        self._prefix_len = len(prefix)
        return req

    def open_regeneration(self, req: RegenerateRequest) -> TokenSource:
        """Call the user's regenerate callback."""
        assert self._regenerate is not None
        return self._regenerate(req)

    # --- internals ----------------------------------------------------------------------------------

    def _normalize(self, token: Any) -> str | None:
        if isinstance(token, str):
            try:
                token.encode("utf-8")
                return token
            except UnicodeEncodeError:  # lone surrogates: OTLP needs valid UTF-8
                self._record_skip("token", "invalid_unicode")
                return token.encode("utf-8", "replace").decode("utf-8")
        if isinstance(token, bytes | bytearray | memoryview):
            if self._decoder is None:
                self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
            text = self._decoder.decode(bytes(token))
            if "\ufffd" in text:
                self._record_skip("token", "invalid_utf8")
            return text
        if token is None:
            self._skipped += 1
            return None
        content = getattr(token, "content", None)  # LangChain message chunks
        if isinstance(content, str):
            return self._normalize(content) if content else None
        self._skipped += 1
        self._record_skip("token", f"non_text_token:{type(token).__name__}")
        return None

    def _first_token(self) -> None:
        now = time.time_ns()
        self._ttft_ms = round((now - self._start_ns) / 1e6, 3)
        if self._span is not None:
            self._span.add_event(semconv.EVENT_FIRST_TOKEN, timestamp=now)

    def _on_sentences(self, sentences: tuple[Sentence, ...]) -> None:
        # windows completed by one token (a huge token, a burst) close as one checkpoint at the last end
        add = self._policy.add
        close_at = -1
        for s in sentences:
            if s.end <= self._prefix_len:
                continue  # the accepted prefix re-fed after a regeneration
            self._window_sentences += 1
            if add(s):
                close_at = s.end
        if close_at >= 0:
            self._close_checkpoint(close_at)

    def _close_checkpoint(self, end: int, final: bool = False) -> None:
        index = self._next_index
        self._next_index += 1
        start = self._window_start
        text = self._buf.text()[:end] if end < self._buf.length else self._buf.text()
        self._text = text
        now = time.time_ns()
        attrs: dict[str, AttributeValue] = {
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT,
            semconv.CHECKPOINT_INDEX: index,
            semconv.CHECKPOINT_CHAR_START: start,
            semconv.CHECKPOINT_CHAR_END: end,
            semconv.CHECKPOINT_SENTENCES: self._window_sentences,
            semconv.STREAM_ID: format(self._span_id, "016x"),
        }
        if final:
            attrs[semconv.CHECKPOINT_FINAL] = True
        if self.settings.capture_content:
            attrs[semconv.CHECKPOINT_TEXT] = _capped(text, self.settings.max_text_attribute_chars)
            if len(text) > self.settings.max_text_attribute_chars:
                attrs[semconv.CHECKPOINT_TEXT_LENGTH] = len(text)
        else:
            attrs[semconv.CHECKPOINT_TEXT_LENGTH] = len(text)
            attrs[semconv.CHECKPOINT_TEXT_SHA256] = _sha256(text)
        if self._skip_checks:
            attrs[semconv.EVAL_SKIP_REASON] = self._skip_checks
        else:
            self._pending.add(index)
            self._checkpoints[index] = _Checkpoint(index, start, end)
        if self.hold_back:
            # the held tokens up to here form this window; anything past `end` (the token that
            # completed the sentence may carry the next one's start) stays for the next window
            self._windows[index] = self._split_held(end)
        started = self._window_start_ns
        self._window_start = end
        self._window_start_ns = now
        self._window_sentences = 0
        if self._defer is None:
            self._checkpoint_span(attrs, started, now)
        else:
            # the span (start, end -> processor -> judge pool, which wakes the pool's thread) is made right
            # after this token went out, while the stream waits for the next one, not inside its gap
            if not self._to_end:
                self._defer(self._end_deferred)
            self._to_end.append((attrs, started, now))
        if self._skip_checks and self.hold_back:
            self._release(index)

    def _split_held(self, end: int) -> list[str]:
        held = self._held
        over = self._buf.length - end
        if over <= 0:
            self._held = []
            return held
        # cut the last token(s) at `end`: the part after it belongs to the next window
        keep: list[str] = []
        while over > 0 and held:
            last = held.pop()
            if len(last) <= over:
                keep.append(last)
                over -= len(last)
            else:
                held.append(last[: len(last) - over])
                keep.append(last[len(last) - over :])
                over = 0
        keep.reverse()
        self._held = keep
        return held

    def _on_verdict(self, index: int, outcome: JobOutcome, scores: tuple[Score, ...]) -> None:
        if index not in self._pending:
            return  # a checkpoint of text that was retracted since
        self._pending.discard(index)
        cp = self._checkpoints.pop(index)
        if outcome.status == "superseded":
            # a newer checkpoint covers this text; its verdict releases this window too
            return
        if outcome.status != "judged":
            self._record_skip("checkpoint", outcome.status)
            if self.hold_back:
                self._release(index)
            return
        self._judged_any = True
        failed = [s for s in scores if s.label == "fail"]
        if not failed:
            if not self._failed_since_good:
                self._last_good_end = max(self._last_good_end, cp.end)
            if self._verdict == "unjudged":
                self._verdict = "pass"
            if self.hold_back:
                self._release(index)
            return
        self._alert(cp, failed[0])

    def _alert(self, cp: _Checkpoint, score: Score) -> None:
        self._alerts += 1
        self._failed_since_good = True
        if self._first_alert_char is None:
            self._first_alert_char = cp.end
        action = self.settings.action
        data: dict[str, Any] = {
            "metric": score.name,
            "score": score.value,
            "threshold": self.settings.threshold_for(score.name),
            "checkpoint": cp.index,
            "char_start": cp.start,
            "char_end": cp.end,
            "explanation": score.explanation,
            "action": action,
        }
        if self._span is not None:
            self._span.add_event(
                semconv.EVENT_ALERT,
                {
                    semconv.ALERT_METRIC: score.name,
                    semconv.ALERT_SCORE: score.value if score.value is not None else -1.0,
                    semconv.ALERT_CHECKPOINT: cp.index,
                    semconv.ALERT_CHAR_END: cp.end,
                },
            )
        if action == "regenerate":
            if self._regenerate is None:
                data["action"] = "flag"
                data["reason"] = "no_regenerate_callback"
            elif self._regenerations >= self.settings.max_regenerations:
                data["action"] = "stop"
                data["reason"] = "max_regenerations"
                action = "stop"
        self._emit(StreamEvent("warning", score.explanation, data))
        if action == "stop":
            self._stop(data)
        elif action == "regenerate" and self._regenerate is not None:
            self._start_regeneration(cp)
        else:
            self._verdict = "flagged"
            if self.hold_back:
                self._release(cp.index)

    def _start_regeneration(self, cp: _Checkpoint) -> None:
        self._verdict = "regenerated"
        keep = self._last_good_end
        text = self.text_until(-1)
        shown = len(text) if not self.hold_back else keep
        if shown > keep:
            self._emit(StreamEvent("retract", text[keep:shown], {"from": keep, "to": shown,
                                                                 "checkpoint": cp.index}))
            if self._span is not None:
                self._span.add_event(semconv.EVENT_RETRACT, {"from": keep, "to": shown})
        self.regen_request = RegenerateRequest(
            question=self.question or "",
            contexts=self.contexts or (),
            accepted_prefix=text[:keep],
            instruction=self.settings.regenerate_instruction,
            attempt=self._regenerations + 1,
        )
        self.has_events = True

    def _stop(self, data: Mapping[str, Any]) -> None:
        self.stopped = True
        self._verdict = "stopped"
        self._held = []
        self._windows.clear()
        if self._span is not None:
            self._span.add_event(semconv.EVENT_STOP, {semconv.ALERT_METRIC: str(data.get("metric", ""))})
        self._emit(StreamEvent("stop", self.settings.fallback_message, data))

    def _release(self, index: int) -> None:
        for idx in sorted(i for i in self._windows if i <= index):
            self._emit_tokens(self._windows.pop(idx))

    def _emit_tokens(self, tokens: list[str]) -> None:
        for t in tokens:
            self._out.append(StreamEvent("token", t))
        self.has_events = True

    def _emit(self, event: StreamEvent) -> None:
        self._out.append(event)
        self.has_events = True

    def _take(self) -> list[StreamEvent]:
        out, self._out = self._out, []
        if self.regen_request is not None or self._inbox:
            self.has_events = True
        return out

    def _record_skip(self, what: str, reason: str) -> None:
        # one event per distinct reason (a flood of drops must not push other events out of the span's
        # bounded event list); the counts go on the span at the end
        key = f"{what}:{reason}"
        n = self._skips.get(key, 0)
        self._skips[key] = n + 1
        if not n and self._span is not None:
            self._span.add_event(semconv.EVENT_SKIP, {semconv.SKIP_REASON: key})

    def _summary(self, outcome: str) -> dict[str, Any]:
        verdict = self._verdict
        if verdict == "unjudged" and self._judged_any:
            verdict = "pass"
        return {
            "verdict": verdict,
            "outcome": outcome,
            "tokens": self._tokens,
            "chars": self._buf.length,
            "checkpoints": self._next_index,
            "alerts": self._alerts,
            "regenerations": self._regenerations,
            "first_alert_char": self._first_alert_char,
            "ttft_ms": self._ttft_ms,
            "stream_id": format(self._span_id, "016x"),
        }


def _capped(text: str, limit: int) -> str:
    """At most ``limit`` chars: the head and the tail of a longer text around an elision mark."""
    if len(text) <= limit:
        return text
    half = max(1, (limit - 3) // 2)
    return f"{text[:half]} … {text[-half:]}"


def _sha256(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "replace")).hexdigest()


# --- drivers ---------------------------------------------------------------------------------------


class _AsyncWaker:
    """Wakes the stream's event loop from the pool's thread when a verdict arrives.

    Only a driver that is actually waiting is woken (a cross-thread wake-up costs a pipe write and a loop
    iteration); a busy driver sees ``has_events`` before its next yield anyway. The driver publishes its
    future before it re-checks the flag, and the pool sets the flag before it reads the future, so one
    of the two always sees the other.
    """

    __slots__ = ("_flag", "_fut", "_loop")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = loop
        self._fut: asyncio.Future[None] | None = None
        self._flag = False

    def notify(self) -> None:
        self._flag = True
        fut = self._fut
        if fut is None or fut.done():
            return
        with contextlib.suppress(RuntimeError):  # loop already closed: nobody is waiting any more
            self._loop.call_soon_threadsafe(self._wake)

    def _wake(self) -> None:
        self._release()

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


# a source slower than this between tokens is raced against verdicts, so a warning is not held back
# until the next token; a faster one is awaited directly (a verdict then waits at most one token gap,
# and racing would cost every such token a task while a verdict is in flight)
_RACE_GAP_S = 0.0015


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
        waker = _AsyncWaker(loop)
        s.set_notify(waker.notify)
        # checkpoint-span work waits here until the next token has been asked for: scheduled before that, it
        # would run ahead of a racing source task's first step and push back the source's own timer
        deferred: list[Callable[[], None]] = []
        s.set_deferral(deferred.append)
        call_soon = loop.call_soon
        source: AsyncIterator[Any] = _to_async(self._source)
        nxt: asyncio.Future[Any] | None = None
        outcome = "completed"
        hold = s.hold_back
        slow = False  # measured while verdicts are in flight
        nxt_started = 0.0
        try:
            for ev in s.start():
                yield ev
            if s.preflight_pending and not s.stopped:
                nxt = asyncio.ensure_future(anext(source))
                deadline = loop.time() + s.settings.preflight_wait_s
                while s.preflight_pending and not nxt.done() and loop.time() < deadline:
                    await waker.wait(nxt, deadline - loop.time())
                    for ev in s.drain():
                        yield ev
            pending = s._pending  # the set itself: its truthiness is the cheapest "verdicts in flight?"
            accept = s.accept
            new_event = _new_event
            broken = False
            while True:
                if s.has_events:
                    for ev in s.drain():
                        yield ev
                    if s.regen_request is not None:
                        if nxt is not None:
                            nxt.cancel()
                            nxt = None
                        await _aclose(source)
                        source = _to_async(s.open_regeneration(s.begin_regeneration()))
                        pending = s._pending
                        continue
                if s.stopped:
                    break
                if not pending and nxt is None and not s.preflight_pending:
                    # the fast path: nothing in flight, just the next token
                    if deferred:
                        call_soon(deferred.pop())
                    try:
                        tok = await source.__anext__()
                    except StopAsyncIteration:
                        break
                elif (pending and slow) or s.preflight_pending:
                    # verdicts in flight and a slow source: race the next token against them
                    if nxt is None:
                        nxt_started = perf_counter()
                        nxt = asyncio.ensure_future(source.__anext__())
                    if deferred:
                        call_soon(deferred.pop())  # after the source task's first step
                    if not nxt.done():
                        await waker.wait(nxt, None)
                        if not nxt.done():
                            continue
                    fut, nxt = nxt, None
                    try:
                        tok = fut.result()
                    except StopAsyncIteration:
                        break
                    slow = perf_counter() - nxt_started > _RACE_GAP_S
                elif nxt is not None:
                    if deferred:
                        call_soon(deferred.pop())
                    fut, nxt = nxt, None
                    try:
                        tok = await fut
                    except StopAsyncIteration:
                        break
                else:
                    if deferred:
                        call_soon(deferred.pop())
                    t0 = perf_counter()
                    try:
                        tok = await source.__anext__()
                    except StopAsyncIteration:
                        break
                    slow = perf_counter() - t0 > _RACE_GAP_S
                if broken:
                    if isinstance(tok, str) and tok:
                        yield new_event(StreamEvent, ("token", tok, None))
                    continue
                try:
                    text = accept(tok)
                except Exception:  # our bug must not break the user's stream: pass tokens through
                    _log.exception("streamjudge: guard failed on a token; passing the stream through")
                    broken = True
                    text = tok if isinstance(tok, str) else None
                    hold = False
                if text is not None and not hold:
                    # tuple.__new__ skips NamedTuple's Python-level __new__: this runs per token
                    yield new_event(StreamEvent, ("token", text, None))
            if nxt is not None:
                nxt.cancel()
                nxt = None
            if s.stopped:
                outcome = "stopped"
            else:
                s.close_tail()
                while deferred:  # no next token to wait for: the last checkpoint spans end now
                    deferred.pop()()
                deadline = loop.time() + s.settings.end_wait_s
                while not s.stopped:
                    if s.has_events:
                        for ev in s.drain():
                            yield ev
                    if not s.outstanding or loop.time() >= deadline:
                        break
                    await waker.wait(None, deadline - loop.time())
                if s.stopped:
                    outcome = "stopped"
            for ev in s.finish(outcome):
                yield ev
        except (GeneratorExit, asyncio.CancelledError):
            s.abort("disconnected")
            raise
        except BaseException as exc:
            s.abort("error", exc)
            raise
        finally:
            s.set_notify(None)
            s.set_deferral(None)
            if nxt is not None:
                nxt.cancel()
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
            if s.preflight_pending:
                woke.wait(s.settings.preflight_wait_s)
            while not s.stopped:
                if s.has_events:
                    yield from s.drain()
                    if s.regen_request is not None:
                        _close_sync(source)
                        new = s.open_regeneration(s.begin_regeneration())
                        if not isinstance(new, Iterable):
                            raise TypeError("regenerate must return a sync iterable for a sync stream")
                        source = iter(new)
                        continue
                    if s.stopped:
                        break
                try:
                    tok = next(source)
                except StopIteration:
                    break
                text = s.accept(tok)
                if text is not None and not s.hold_back:
                    yield StreamEvent("token", text)
            if s.stopped:
                outcome = "stopped"
            else:
                s.close_tail()
                deadline = time.monotonic() + s.settings.end_wait_s
                while not s.stopped:
                    if s.has_events:
                        yield from s.drain()
                    remaining = deadline - time.monotonic()
                    if not s.outstanding or remaining <= 0:
                        break
                    woke.clear()
                    if not s.has_events:
                        woke.wait(remaining)
                if s.stopped:
                    outcome = "stopped"
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


def guard(
    tokens: TokenSource,
    *,
    question: str | None = None,
    contexts: Sequence[str] | None = None,
    reference: str | None = None,
    settings: Settings | None = None,
    runtime: Runtime | None = None,
    regenerate: RegenerateCallback | None = None,
    name: str | None = None,
    attributes: Mapping[str, AttributeValue] | None = None,
    context: Context | None = None,
) -> GuardedStream:
    """Watch a token stream while it is written.

    ``tokens`` is any async or sync iterable of text tokens (``str``; ``bytes`` are decoded as UTF-8,
    split characters included; ``None`` and empty tokens are skipped and counted). Iterate the result
    with ``async for`` (or ``for`` for a sync source) to receive :class:`StreamEvent`s: every token at
    once (stream-first) plus ``warning`` / ``retract`` / ``stop`` / ``done`` events.

    ``question`` / ``contexts`` default to what instrumentation registered for the current trace.
    ``regenerate`` is called with a :class:`RegenerateRequest` when the action is ``regenerate`` and
    must return the new token source. ``settings`` override the runtime's for this stream.
    """
    session = GuardSession(
        question=question,
        contexts=contexts,
        reference=reference,
        settings=settings,
        runtime=runtime,
        regenerate=regenerate,
        name=name,
        attributes=attributes,
        context=context,
    )
    return GuardedStream(tokens, session)
