"""Test judges with scripted behaviour (the real judges have their own tests)."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

from streamjudge.judging.base import EvalInput, JudgeResult, Score, TransientJudgeError


class KeywordJudge:
    """Faithfulness 0.0 when the text contains a marker word, else 1.0; optional simulated latency."""

    name = "keyword"

    def __init__(self, marker: str = "HALLUCINATED", delay_s: float = 0.0, sync_delay: bool = False) -> None:
        self.marker = marker
        self.delay_s = delay_s
        self.calls: list[EvalInput] = []
        self._lock = threading.Lock()
        self.closed = False

    def _score(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        with self._lock:
            self.calls.append(item)
        scores = []
        for m in metrics:
            if m == "faithfulness":
                bad = self.marker in item.answer
                scores.append(Score(m, 0.0 if bad else 1.0, explanation=f"contains {self.marker}" if bad else ""))
            elif m == "context_precision":
                ok = any(w in " ".join(item.contexts) for w in item.question.split()) if item.contexts else False
                scores.append(Score(m, 1.0 if ok else 0.0) if item.contexts else Score(m, None, skipped="no_contexts"))
            else:
                scores.append(Score(m, 0.9))
        return JudgeResult(self.name, tuple(scores))

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return self._score(item, metrics)

    async def aclose(self) -> None:
        self.closed = True


class SyncKeywordJudge(KeywordJudge):
    """Has ``evaluate_sync`` like the local judge (used inline by the pre-flight gate)."""

    def evaluate_sync(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        return self._score(item, metrics)


class FlakyJudge(KeywordJudge):
    """Raises TransientJudgeError ``failures`` times, then answers."""

    def __init__(self, failures: int, retry_after: float | None = None) -> None:
        super().__init__()
        self.failures = failures
        self.retry_after = retry_after
        self.attempts = 0

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        self.attempts += 1
        if self.attempts <= self.failures:
            raise TransientJudgeError("503 from judge", retry_after=self.retry_after)
        return self._score(item, metrics)


class BrokenJudge(KeywordJudge):
    """Raises, hangs, or returns garbage."""

    def __init__(self, how: str) -> None:
        super().__init__()
        self.how = how

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        if self.how == "raise":
            raise RuntimeError("judge exploded")
        if self.how == "hang":
            await asyncio.sleep(3600)
        if self.how == "garbage":
            return "not a result"  # type: ignore[return-value]
        if self.how == "block":
            time.sleep(0.2)
        return self._score(item, metrics)


class GatedJudge(KeywordJudge):
    """Answers only once ``gate`` is set: keeps the pool's slots busy."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        while not self.gate.is_set():
            await asyncio.sleep(0.005)
        return self._score(item, metrics)
