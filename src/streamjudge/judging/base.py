"""What a judge is: its input, its output and its errors.

Judges know nothing about spans: a judge turns an :class:`EvalInput` into a :class:`JudgeResult`. The value
types live in :mod:`streamjudge.results` (every stage imports them); they are re-exported here for judges.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from streamjudge.results import (
    METRICS,
    EvalInput,
    EvalKind,
    JudgeResult,
    Score,
    SentenceScore,
    Usage,
)

__all__ = [
    "METRICS",
    "EvalInput",
    "EvalKind",
    "Judge",
    "JudgeError",
    "JudgeResult",
    "Score",
    "SentenceScore",
    "TransientJudgeError",
    "Usage",
]


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
    """Scores text against contexts. Implementations must be safe to call concurrently.

    A judge whose faithfulness score names the failing sentences (``Score.sentences``) may say so with a
    class attribute ``scores_sentences = True``: the live guard then sends the windows a burst closed as one
    checkpoint, whose verdict still names each sentence. Without it (a framework's single score per text)
    every window is judged on its own, so a failure underlines no more than its window, and the judge pool
    does not merge a stream's queued checkpoints into one call under load either.
    """

    name: str

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item`` on ``metrics``. Raise :class:`TransientJudgeError` for retryable failures."""
        ...

    async def aclose(self) -> None:
        """Release clients and connections. Called once when the pool shuts down."""
        ...
