"""A console exporter that prints one readable line per span, with its evaluation results."""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import TextIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from streamjudge import semconv

_SHOWN = (
    semconv.NODE_NAME,
    semconv.NODE_ELAPSED_MS,
    semconv.CHECKPOINT_INDEX,
    semconv.CHECKPOINT_CHAR_START,
    semconv.CHECKPOINT_CHAR_END,
    semconv.STREAM_TTFT_MS,
    semconv.STREAM_TOKENS,
    semconv.STREAM_CHARS,
    semconv.STREAM_CHECKPOINTS,
    semconv.STREAM_ALERTS,
    semconv.STREAM_VERDICT,
    semconv.PREFLIGHT_SCORE,
    semconv.PREFLIGHT_LABEL,
    semconv.EVAL_STATUS,
    semconv.EVAL_SKIP_REASON,
)


class ConsoleSummaryExporter(SpanExporter):
    """Prints spans as ``name duration key=value ...`` lines, evaluation results indented below."""

    def __init__(self, out: TextIO | None = None, *, explanations: bool = True) -> None:
        self._out = out or sys.stdout
        self._explanations = explanations

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        for span in spans:
            self._out.write(self.format(span))
        self._out.flush()
        return SpanExportResult.SUCCESS

    def format(self, span: ReadableSpan) -> str:
        """The lines printed for ``span``."""
        attrs = span.attributes or {}
        ms = ((span.end_time or 0) - (span.start_time or 0)) / 1e6
        fields = " ".join(f"{k.removeprefix('streamjudge.')}={attrs[k]!s}" for k in _SHOWN if k in attrs)
        lines = [f"  span {span.name:<24} {ms:8.2f} ms  {fields}\n"]
        for ev in span.events:
            if ev.name != semconv.EVENT_EVALUATION_RESULT:
                continue
            a = ev.attributes or {}
            value = a.get(semconv.GEN_AI_EVALUATION_SCORE_VALUE)
            shown = f"{value:.2f}" if isinstance(value, float) else "-"
            line = (
                f"      {a.get(semconv.GEN_AI_EVALUATION_NAME)}={shown}"
                f" {a.get(semconv.GEN_AI_EVALUATION_SCORE_LABEL, 'skipped')}"
            )
            if self._explanations and a.get(semconv.GEN_AI_EVALUATION_EXPLANATION):
                line += f"  ({a.get(semconv.GEN_AI_EVALUATION_EXPLANATION)})"
            lines.append(line + "\n")
        return "".join(lines)

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True
