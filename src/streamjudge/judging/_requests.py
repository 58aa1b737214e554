"""What a stream asks the judging service: one :class:`~streamjudge.results.JudgeRequest` per checkpoint,
pre-flight gate and final pass, each carrying this stream's own metrics and thresholds."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from opentelemetry import trace

from streamjudge import semconv
from streamjudge.results import EvalInput, EvalKind, JudgeRequest, Verdict

if TYPE_CHECKING:
    from streamjudge.config import Settings


class StreamRequests:
    """Builds the requests of one stream; :meth:`bind` gives it the stream's identity at its start."""

    __slots__ = ("_attributes", "_coalesce", "_recording", "_settings", "_span_id", "_thresholds",
                 "_trace_id")

    def __init__(self, settings: Settings, *, coalesce: bool) -> None:
        self._settings = settings
        # hold-back releases a window only on its own verdict: no coalescing there
        self._coalesce = coalesce
        self._thresholds = {m: settings.threshold_for(m)
                            for m in (*settings.checkpoint_metrics, *settings.final_metrics)}
        self._span_id = self._trace_id = 0
        self._recording = False
        self._attributes: dict[str, str | int | float | bool] = {}

    def bind(self, span: trace.Span, session_id: str | None) -> None:
        """The stream span is open: requests name it, its trace and (for sinks) its session."""
        ctx = span.get_span_context()
        self._span_id, self._trace_id = ctx.span_id, ctx.trace_id
        self._recording = span.is_recording()
        self._attributes = {semconv.STREAM_ID: format(ctx.span_id, "016x")}
        if session_id:
            self._attributes[semconv.SESSION_ID] = session_id

    def threshold(self, metric: str) -> float:
        """This stream's pass threshold for ``metric``."""
        return self._thresholds.get(metric, self._settings.threshold)

    def make(
        self,
        kind: EvalKind,
        text: str,
        *,
        question: str | None,
        contexts: tuple[str, ...] | None,
        reference: str | None,
        prefix: str = "",
        offset: int = 0,
        index: int = -1,
        target: trace.Span | None = None,
        target_name: str = "",
        reply: Callable[[Verdict], None],
    ) -> JudgeRequest:
        """A request about ``text`` (new sentences at ``offset``, the answer, or nothing for pre-flight),
        whose verdict goes to ``reply``.

        ``reply`` comes per request, not at construction: the session that owns this object passes its
        bound method, and holding it here would make a reference cycle (session -> requests -> session)
        that only the cyclic GC frees, taking every finished stream's objects with it."""
        s = self._settings
        metrics = (
            s.checkpoint_metrics if kind == "checkpoint"
            else s.final_metrics if kind == "answer" else (semconv.CONTEXT_PRECISION,)
        )
        thresholds = self._thresholds
        if kind == "preflight":
            thresholds = {semconv.CONTEXT_PRECISION: s.preflight_threshold}
        target_id = target.get_span_context().span_id if target is not None and self._recording else 0
        attributes = self._attributes
        if index >= 0:
            attributes = {**attributes, semconv.CHECKPOINT_INDEX: index}
        return JudgeRequest(
            item=EvalInput(question or "", contexts or (), text, kind, reference, prefix, offset),
            metrics=tuple(metrics),
            thresholds=thresholds,
            default_threshold=s.threshold,
            index=index,
            # the final pass outlives the stream: it must not count against (or re-create) per-stream state
            stream_id=self._span_id if kind != "answer" else 0,
            trace_id=self._trace_id,
            target_span_id=target_id,
            target_trace_id=self._trace_id,
            target_name=target_name,
            coalesce=kind == "checkpoint" and self._coalesce,
            reply=reply,
            attributes=attributes,
        )
