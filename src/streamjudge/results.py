"""The values that travel between the stages: what is judged, what a judge says, what became of it.

Every stage may import this module (instrumentation, judging, exporters, offline tools); it imports no stage.
One vocabulary for what is judged: ``checkpoint`` (new sentences of a live stream), ``answer`` (the whole
answer, the final pass) and ``preflight`` (the retrieved contexts, before the first token).
"""

from __future__ import annotations

import math
import operator
from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, Final, Literal

from streamjudge import semconv

EvalKind = Literal["checkpoint", "answer", "preflight"]
#: a sentence's three-way verdict: hard evidence against it, weak signals only, or nothing against it
SentenceVerdict = Literal["supported", "uncertain", "fail"]

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
    #: the three-way verdict of a judge that gives one: ``supported``, ``uncertain`` or ``fail``
    verdict: SentenceVerdict | None = None
    #: whether the judge that gave ``verdict`` wants this sentence to alert (its strictness decides what an
    #: uncertain sentence does); when set, it labels the sentence instead of the threshold
    alert: bool | None = None
    #: the judge (tier) that decided the sentence: ``local``, or the strong judge of a cascade
    tier: str | None = None
    #: the kind of evidence behind ``verdict`` ("number", "name", "role_swap", "negation", "words"...)
    kind: str | None = None

    def __post_init__(self) -> None:
        if not (0.0 <= self.value <= 1.0 and math.isfinite(self.value)):
            raise ValueError(f"sentence score {self.value!r} is outside [0, 1]")
        if self.start < 0 or self.end < self.start:
            raise ValueError(f"sentence range {self.start}..{self.end} is not a range")

    def shifted(self, by: int, threshold: float | None = None) -> SentenceScore:
        """A copy moved ``by`` chars (and labelled against ``threshold`` when given; a sentence whose
        judge decided ``alert`` is labelled by that decision)."""
        label = self.label
        if self.alert is not None:
            label = "fail" if self.alert else "pass"
        elif threshold is not None:
            label = "pass" if self.value >= threshold else "fail"
        return SentenceScore(self.start + by, self.end + by, self.value, self.reason, label, self.verdict,
                             self.alert, self.tier, self.kind)


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
        """Sentences below ``threshold`` (or, when their judge decided, the ones it wants to alert)."""
        return tuple(s for s in self.sentences if (s.value < threshold if s.alert is None else s.alert))

    def with_label(self, threshold: float, *, shift: int = 0) -> Score:
        """Return a copy labelled ``pass``/``fail`` against ``threshold`` (skips stay unlabelled).

        Sentences are labelled too and moved ``shift`` chars (into the stream's coordinates).
        """
        sentences = tuple(s.shifted(shift, threshold) for s in self.sentences)
        if self.value is None:
            return Score(self.name, None, None, self.explanation, self.skipped, sentences)
        sentence_failed = any(s.label == "fail" for s in sentences)
        if sentences and all(s.alert is not None for s in sentences):
            # the judge decided per sentence (three-way verdicts): the average does not overrule it
            failed = sentence_failed
        else:
            failed = self.value < threshold or sentence_failed
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


#: the usage of a judgement that counted none (the local judge's): shared, as a Usage cannot change, so a
#: result does not keep one more object for the cyclic GC to track
NO_USAGE: Final = Usage()


@dataclass(frozen=True, slots=True)
class JudgeResult:
    """Scores for one :class:`EvalInput`."""

    judge: str
    scores: tuple[Score, ...]
    usage: Usage = NO_USAGE

    def get(self, metric: str) -> Score | None:
        """The score of ``metric``, if the judge produced one."""
        for s in self.scores:
            if s.name == metric:
                return s
        return None


JobStatus = Literal[
    "judged",  # scores arrived
    "dropped",  # queue full (by count or bytes)
    "timeout",  # per-call timeout, or waited in the queue past its deadline
    "error",  # the judge raised (after retries for transient errors) or returned something invalid
    "sampled_out",  # not selected by sampling
    "superseded",  # a newer checkpoint of the same stream took over its sentences while queued
    "budget_exhausted",  # per-stream or global judge-call budget used up
    "cancelled",  # its stream went away (client disconnect)
    "shutdown",  # the pool shut down before it ran
    "skipped",  # the stream decided not to judge it (pre-flight policy, empty answer...)
]


@dataclass(frozen=True, slots=True)
class JobOutcome:
    """What became of one judge job: judged (with its result) or the reason it was not."""

    status: JobStatus
    result: JudgeResult | None = None
    error: str | None = None
    attempts: int = 0
    latency_s: float = 0.0  # from submit to outcome


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the judging service tells a stream about one of its requests (posted to the stream's inbox).

    ``scores`` are labelled with the request's own thresholds and their sentences are in the stream's
    coordinates; ``start``/``end`` is the range of the stream's text that was judged (a coalesced request
    covers the sentences of the ones it superseded).
    """

    kind: EvalKind
    index: int
    outcome: JobOutcome
    scores: tuple[Score, ...] = ()
    start: int = 0
    end: int = 0

    @property
    def status(self) -> JobStatus:
        """The job's status (``judged`` when scores arrived)."""
        return self.outcome.status

    @property
    def failed(self) -> tuple[Score, ...]:
        """Scores labelled ``fail``."""
        return tuple(s for s in self.scores if s.label == "fail")


@dataclass(frozen=True, slots=True)
class JudgeRequest:
    """Everything one judgement needs, worked out once by the stream that asks for it.

    ``target_span_id`` / ``target_trace_id`` name the span that carries the results to the exporters (0:
    none, e.g. an unsampled trace); ``stream_id`` groups one stream's requests (budgets, cancellation,
    coalescing); ``reply`` is the stream's inbox, called once with the :class:`Verdict` on the judge pool's
    thread. ``thresholds`` are this stream's, so a per-stream setting labels its own scores.
    """

    item: EvalInput
    metrics: tuple[str, ...]
    thresholds: dict[str, float]
    default_threshold: float = 0.7
    index: int = -1
    stream_id: int = 0
    trace_id: int = 0
    target_span_id: int = 0
    target_trace_id: int = 0
    target_name: str = ""
    coalesce: bool = False
    reply: Callable[[Verdict], None] | None = None
    attributes: dict[str, str | int | float | bool] = field(default_factory=dict)

    @property
    def kind(self) -> EvalKind:
        """What is judged: ``checkpoint``, ``answer`` or ``preflight``."""
        return self.item.kind

    def threshold_for(self, metric: str) -> float:
        """This request's pass threshold for ``metric``."""
        return self.thresholds.get(metric, self.default_threshold)


@dataclass(frozen=True, slots=True)
class EvaluationRecord:
    """Results of one judgement, addressed to the span they judge."""

    trace_id: int
    span_id: int
    span_name: str
    span_type: str  # semconv.SPAN_TYPE_STREAM / SPAN_TYPE_CHECKPOINT
    judge: str
    scores: tuple[Score, ...]
    timestamp_ns: int
    usage: Usage = NO_USAGE
    attributes: dict[str, str | int | float | bool] = field(default_factory=dict)

    @property
    def trace_id_hex(self) -> str:
        """The W3C (32 hex digits) form of the trace id."""
        return format(self.trace_id, "032x")

    @property
    def span_id_hex(self) -> str:
        """The W3C (16 hex digits) form of the span id."""
        return format(self.span_id, "016x")


# --- pickling -----------------------------------------------------------------------------------------
# A judge worker sends a JudgeResult (its Scores, their SentenceScores, a Usage) back on every call, and the
# app's side unpickles it under the app's GIL. The generic state functions dataclasses gives slotted classes
# walk fields() per object: half of unpickling a reply. These reduce to the field values in order and are
# rebuilt by setting the slots directly (the values were validated when the worker built them).
_SLOT_SETTERS: dict[type, tuple[Callable[[Any, Any], None], ...]] = {}


def _restore(cls: type, state: tuple[Any, ...]) -> Any:
    obj: Any = object.__new__(cls)
    for set_slot, value in zip(_SLOT_SETTERS[cls], state, strict=True):
        set_slot(obj, value)
    return obj


def _pickled_by_fields(cls: type) -> None:
    names = [f.name for f in fields(cls)]
    values = operator.attrgetter(*names)  # a tuple of them, in C
    _SLOT_SETTERS[cls] = tuple(cls.__dict__[name].__set__ for name in names)

    def __reduce__(self: Any) -> tuple[Any, ...]:
        return (_restore, (cls, values(self)))

    cls.__reduce__ = __reduce__  # type: ignore[method-assign, assignment]


for _cls in (SentenceScore, Score, Usage, JudgeResult):
    _pickled_by_fields(_cls)


def _no_usage() -> Usage:
    return NO_USAGE


_reduce_by_fields = Usage.__reduce__


def _reduce_usage(self: Usage) -> tuple[Any, ...]:
    # a worker's result that counted nothing comes back as the shared instance, as one made here would be
    if self == NO_USAGE:
        return (_no_usage, ())
    return _reduce_by_fields(self)  # type: ignore[return-value]


Usage.__reduce__ = _reduce_usage  # type: ignore[method-assign, assignment]
