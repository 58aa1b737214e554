"""The judging service: the one seam between live streams and judging.

A stream sends a :class:`~streamjudge.results.JudgeRequest` that carries everything its judgement needs
(what to judge, metrics, *its own* thresholds, where to reply). The service submits it to the judge pool,
labels the scores with the request's thresholds, hands the result to the export side (the span processor,
which holds the target span by id), and posts a :class:`~streamjudge.results.Verdict` to the stream's inbox —
the one cross-thread hand-off. Judging never reaches back into the stream.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from streamjudge._fork import after_fork_in_child
from streamjudge.judging._lag import LoopProbe
from streamjudge.judging._windows import MAX_JOINED_CHARS
from streamjudge.judging.base import Judge
from streamjudge.judging.pool import JudgeJob, JudgePool
from streamjudge.judging.processor import JudgeSpanProcessor
from streamjudge.results import EvalInput, EvalKind, JobOutcome, JudgeRequest, Score, Verdict

_log = logging.getLogger(__name__)

# a coalesced request stops growing where a joined window does (queued on its own instead): joining copies
# the text, and a fast stream behind a slow judge must not make that quadratic
_MAX_MERGED_CHARS = MAX_JOINED_CHARS

#: judged streams live at once from which judges are told load is coming (see
#: :meth:`JudgingService.stream_opened`): at a model's pace (20-50 ms per token) this many streams close
#: checkpoints fast enough to make ``auto``'s meter start its worker within a second or two, and the ones
#: judged in-process until then take the app's GIL while it serves them all
LOAD_STREAMS = 64


class _JobHooks:
    """A job's way back to the service: its outcome's delivery and its merge with an older job.

    One object with two bound methods, where two closures over the request were two functions, their cell
    tuples and three cells: objects the GC tracks for as long as the job is queued or out (a model judge's
    whole latency)."""

    __slots__ = ("_judge", "_request", "_service")

    def __init__(self, service: JudgingService, request: JudgeRequest, judge: Judge) -> None:
        self._service, self._request, self._judge = service, request, judge

    def done(self, outcome: JobOutcome) -> None:
        self._service._done(self._request, outcome)

    def merge(self, older: JudgeJob) -> JudgeJob | None:
        return self._service._merged(self._request, self._judge, older)


class JudgingService:
    """Turns requests into judge jobs and their outcomes into exported results and verdicts."""

    def __init__(
        self,
        *,
        pool: JudgePool,
        processor: JudgeSpanProcessor,
        judges: Callable[[EvalKind], Judge],
    ) -> None:
        self.pool = pool
        self.processor = processor
        self._judges = judges
        self._reset_live()
        # a forked worker (gunicorn, uvicorn --workers) serves none of its parent's streams
        after_fork_in_child(self, JudgingService._reset_live)

    def _reset_live(self) -> None:
        self._live = 0  # judged streams between stream_opened and stream_closed
        self._loaded = False  # _live reached LOAD_STREAMS and has not fallen back to half of it
        self._live_lock = threading.Lock()

    def scores_sentences(self, kind: EvalKind) -> bool:
        """Whether the judge of ``kind`` names the failing sentences (see
        :class:`~streamjudge.judging.base.Judge`)."""
        try:
            return _scores_sentences(self._judges(kind))
        except Exception:  # judges are built at configure time; submit() reports a failure here
            return False

    def sampled(self, trace_id: int) -> bool:
        """Whether a trace is judged at all (decided once, at stream start)."""
        return self.pool.samples(trace_id)

    def submit(self, request: JudgeRequest) -> bool:
        """Queue ``request``; its verdict reaches ``request.reply`` exactly once, on the pool's thread.

        False when it was refused at once (full queue, budget...); the verdict has then been delivered or
        is on its way.
        """
        self.processor.expect(request.target_span_id)
        try:
            judge = self._judges(request.kind)
        except Exception as exc:  # judges are built at configure time; a failure here is a bug
            _log.exception("streamjudge: no judge for %s", request.kind)
            self._done(request, JobOutcome("error", error=f"no judge: {exc!r}"[:200]))
            return False
        return self.pool.submit(self._job(request, judge))

    def call_soon(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` (quick, non-blocking work that leads to requests) on the judge pool's thread; see
        :meth:`~streamjudge.judging.pool.JudgePool.call_soon`."""
        self.pool.call_soon(fn)

    def skip(self, request: JudgeRequest, reason: str) -> None:
        """Record that ``request`` is not judged (the stream decided so): its span says why."""
        self.processor.expect(request.target_span_id)
        self._done(request, JobOutcome("skipped", error=reason))

    def _job(self, request: JudgeRequest, judge: Judge) -> JudgeJob:
        # a queued checkpoint is merged into its stream's next one only where the judge names the failing
        # sentences: one score for the merged text would fail, and underline, sentences of both windows
        # that were fine. Other judges' checkpoints queue on their own (a full queue drops, and says so)
        coalesce = request.coalesce and _scores_sentences(judge)
        hooks = _JobHooks(self, request, judge)
        return JudgeJob(
            judge=judge,
            item=request.item,
            metrics=request.metrics,
            callback=hooks.done,
            stream_key=request.stream_id,
            sample_key=request.trace_id,
            coalesce=coalesce,
            merge=hooks.merge if coalesce else None,
            tag=request,
            size=len(request.item.answer) + len(request.item.prefix),
            live=request.kind != "answer",
        )

    def _merged(self, newer: JudgeRequest, judge: Judge, older: JudgeJob) -> JudgeJob | None:
        """A job for ``newer`` that also covers the sentences of ``older`` (queued, same stream), or None
        when the two cannot be joined (their texts are not adjacent)."""
        old = older.tag
        if not isinstance(old, JudgeRequest):
            return None
        a, b = old.item, newer.item
        if a.offset + len(a.answer) != b.offset or len(a.answer) + len(b.answer) > _MAX_MERGED_CHARS:
            return None
        item = EvalInput(
            question=b.question, contexts=b.contexts, answer=a.answer + b.answer, kind=b.kind,
            reference=b.reference, prefix=a.prefix, offset=a.offset,
        )
        merged = JudgeRequest(
            item=item, metrics=newer.metrics, thresholds=newer.thresholds,
            default_threshold=newer.default_threshold, index=newer.index, stream_id=newer.stream_id,
            trace_id=newer.trace_id, target_span_id=newer.target_span_id,
            target_trace_id=newer.target_trace_id, target_name=newer.target_name, coalesce=True,
            reply=newer.reply, attributes=newer.attributes,
        )
        return self._job(merged, judge)

    def _done(self, request: JudgeRequest, outcome: JobOutcome) -> None:
        scores: tuple[Score, ...] = ()
        item = request.item
        if outcome.result is not None:
            scores = tuple(
                s.with_label(request.threshold_for(s.name), shift=item.offset) for s in outcome.result.scores
            )
        try:
            self.processor.resolve(request, outcome, scores)
        except Exception:  # the stream still gets its verdict
            _log.exception("streamjudge: recording a judgement failed")
        reply = request.reply
        if reply is None:
            return
        verdict = Verdict(request.kind, request.index, outcome, scores, item.offset,
                          item.offset + len(item.answer))
        try:
            reply(verdict)
        except Exception:
            _log.exception("streamjudge: posting a verdict to its stream failed")

    def cancel_stream(self, stream_id: int) -> int:
        """Cancel a stream's queued and running requests (its client went away). Returns how many."""
        return self.pool.cancel_stream(stream_id)

    def stream_opened(self) -> LoopProbe | None:
        """A judged stream started (on its event loop's thread, if it has one). Returns what to pass to
        :meth:`stream_closed`: the pool's probe of that loop's lateness, which its CPU share follows.

        When as many are live as :data:`LOAD_STREAMS`, each judge with a ``prepare_for_load()``
        (``auto``'s: start its worker) gets it called on the pool's thread, before their checkpoints
        arrive: the worker then takes them from the first, instead of after the app's process judged them
        for the second it takes to measure the load and start it."""
        probe = self.pool.watch_loop()
        with self._live_lock:
            self._live += 1
            if self._loaded or self._live < LOAD_STREAMS:
                return probe
            self._loaded = True
        for judge in {id(j): j for j in (self._judges("checkpoint"), self._judges("answer"))}.values():
            self.pool.prepare_for_load(judge)
        return probe

    def stream_closed(self, probe: LoopProbe | None = None) -> None:
        """A stream counted by :meth:`stream_opened` ended; ``probe`` is what that returned."""
        if probe is not None:
            probe.close()
        with self._live_lock:
            self._live -= 1
            if self._live <= LOAD_STREAMS // 2:
                self._loaded = False  # the next rise tells the judges again (a stopped worker restarts)

    def end_stream(self, stream_id: int) -> None:
        """Forget a finished stream's per-stream state (its queued requests still run)."""
        self.pool.end_stream(stream_id)

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        """Wait until every request has its verdict."""
        return self.pool.force_flush(timeout_millis)

    def shutdown(self, timeout_millis: int = 30_000) -> bool:
        """Drain the pool within the deadline; what is left gets a ``shutdown`` verdict."""
        return self.pool.shutdown(timeout_millis)


def _scores_sentences(judge: Judge) -> bool:
    """Whether ``judge`` names the failing sentences (its ``scores_sentences`` class attribute)."""
    return bool(getattr(judge, "scores_sentences", False))
