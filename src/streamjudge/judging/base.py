"""What a judge is: its input, its output and its errors.

Judges know nothing about spans. The processor turns a finished span into an :class:`EvalInput`, a judge
turns that into a :class:`JudgeResult`, and the processor writes the result back onto telemetry.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal, Protocol, runtime_checkable

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

    ``answer`` is the running total text of the stream at the checkpoint (never only the delta), or the
    full answer for the final pass; for a pre-flight gate it is empty.
    """

    question: str
    contexts: tuple[str, ...]
    answer: str
    kind: EvalKind = "answer"
    reference: str | None = None


@dataclass(frozen=True, slots=True)
class Score:
    """The score of one metric: a value in [0, 1] (1 = good) or a recorded skip."""

    name: str
    value: float | None
    label: str | None = None  # "pass" / "fail" once a threshold has been applied
    explanation: str = ""
    skipped: str | None = None  # reason when no value could be computed (e.g. "no_contexts")

    def __post_init__(self) -> None:
        if self.value is not None and not (0.0 <= self.value <= 1.0 and math.isfinite(self.value)):
            raise ValueError(f"score {self.name}={self.value!r} is outside [0, 1]")

    def with_label(self, threshold: float) -> Score:
        """Return a copy labelled ``pass``/``fail`` against ``threshold`` (skips stay unlabelled)."""
        if self.value is None:
            return self
        label = "pass" if self.value >= threshold else "fail"
        return Score(self.name, self.value, label, self.explanation, self.skipped)


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


class JudgeError(Exception):
    """A judge could not produce a result. Not retried."""


class TransientJudgeError(JudgeError):
    """A judge failed in a way that may succeed on retry (5xx, 429, timeout, connection reset).

    ``retry_after`` (seconds) is honoured by the pool's backoff when the provider sent one.
    """

    def __init__(self, message: str, *, retry_after: float | None = None) -> None:
        super().__init__(message)
        self.retry_after = retry_after


@runtime_checkable
class Judge(Protocol):
    """Scores text against contexts. Implementations must be safe to call concurrently."""

    name: str

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item`` on ``metrics``. Raise :class:`TransientJudgeError` for retryable failures."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections. Called once when the pool shuts down."""
        ...
