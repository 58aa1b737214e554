"""The values that travel between the stages: what is judged, what a judge says, what became of it.

Every stage may import this module (instrumentation, judging, exporters, offline tools); it imports no stage.
One vocabulary for what is judged: ``checkpoint`` (new sentences of a live stream), ``answer`` (the whole
answer, the final pass) and ``preflight`` (the retrieved contexts, before the first token).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

from streamjudge import semconv

EvalKind = Literal["checkpoint", "answer", "preflight"]

#: Metrics a judge may be asked for. Judges skip (``Score.skipped``) what they cannot compute.
METRICS: tuple[str, ...] = (
    semconv.FAITHFULNESS,
    semconv.ANSWER_RELEVANCY,
    semconv.CONTEXT_PRECISION,
    semconv.CONTEXT_RECALL,
)


@dataclass(frozen=True, slots=True)
class EvalInput:
    """One thing to judge.

    ``answer`` is the text to score: a checkpoint's new sentences, or the full answer for the final pass;
    empty for a pre-flight gate. ``prefix`` is the answer text before it (possibly only its tail): reference
    material to resolve "it" or "the tower", not to be scored again. ``offset`` is where ``answer`` starts in
    the stream's text, so sentence ranges can be reported in the stream's coordinates.
    """

    question: str
    contexts: tuple[str, ...]
    answer: str
    kind: EvalKind = "answer"
    reference: str | None = None
    prefix: str = ""
    offset: int = 0


@dataclass(frozen=True, slots=True)
class SentenceScore:
    """The score of one sentence of the judged text.

    ``start``/``end`` are char offsets into :attr:`EvalInput.answer` as the judge saw it (the judging service
    shifts them into the stream's coordinates). ``value`` in [0, 1] (1 = supported); ``reason`` says why a
    low value is low (what is not in the context, a contradicted negation...).
    """

    start: int
    end: int
    value: float
    reason: str = ""
    label: str | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.value <= 1.0 and math.isfinite(self.value)):
            raise ValueError(f"sentence score {self.value!r} is outside [0, 1]")
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"sentence range {self.start}..{self.end} is not a range")

    def shifted(self, by: int, threshold: float | None = None) -> SentenceScore:
        """A copy moved ``by`` chars (and labelled against ``threshold`` when given)."""
        label = self.label
        if threshold is not None:
            label = "pass" if self.value >= threshold else "fail"
        return SentenceScore(self.start + by, self.end + by, self.value, self.reason, label)


@dataclass(frozen=True, slots=True)
class Score:
    """The score of one metric: a value in [0, 1] (1 = good) or a recorded skip.

    ``sentences`` (optional) are per-sentence scores of the judged text; when present, the metric fails
    if any sentence fails, whatever the average: one fabricated sentence among grounded ones is a failure.
    """

    name: str
    value: float | None
    label: str | None = None  # "pass" / "fail" once a threshold has been applied
    explanation: str = ""
    skipped: str | None = None  # reason when no value could be computed (e.g. "no_contexts")
    sentences: tuple[SentenceScore, ...] = ()

    def __post_init__(self) -> None:
        if self.value is not None and not (0.0 <= self.value <= 1.0 and math.isfinite(self.value)):
            raise ValueError(f"score {self.name}={self.value!r} is outside [0, 1]")

    @property
    def worst(self) -> SentenceScore | None:
        """The lowest-scoring sentence, if the judge scored sentences."""
        return min(self.sentences, key=lambda s: s.value) if self.sentences else None

    def failing(self, threshold: float) -> tuple[SentenceScore, ...]:
        """Sentences below ``threshold``."""
        return tuple(s for s in self.sentences if s.value < threshold)

    def with_label(self, threshold: float, *, shift: int = 0) -> Score:
        """Return a copy labelled ``pass``/``fail`` against ``threshold`` (skips stay unlabelled).

        Sentences are labelled too and moved ``shift`` chars (into the stream's coordinates).
        """
        sentences = tuple(s.shifted(shift, threshold) for s in self.sentences)
        if self.value is None:
            return Score(self.name, None, None, self.explanation, self.skipped, sentences)
        failed = self.value < threshold or any(s.label == "fail" for s in sentences)
        return Score(self.name, self.value, "fail" if failed else "pass", self.explanation, self.skipped,
                     sentences)


@dataclass(frozen=True, slots=True)
class Usage:
    """What a judgement cost: model calls, tokens and money (when the provider reports them)."""

    calls: int = 0
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.calls + other.calls,
            self.input_tokens + other.input_tokens,
            self.output_tokens + other.output_tokens,
            self.cost_usd + other.cost_usd,
        )


@dataclass(frozen=True, slots=True)
class JudgeResult:
    """Scores for one :class:`EvalInput`."""

    judge: str
    scores: tuple[Score, ...]
    usage: Usage = field(default_factory=Usage)

    def get(self, metric: str) -> Score | None:
        """The score of ``metric``, if the judge produced one."""
        for s in self.scores:
            if s.name == metric:
                return s
        return None
