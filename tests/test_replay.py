"""The replay harness in process: cases stream concurrently, results come as they finish."""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

from _fakes import KeywordJudge
from streamjudge.config import Settings
from streamjudge.judging.base import EvalInput, JudgeResult
from streamjudge.offline.replay import CaseResult, ReplayCase, replay


class CountingJudge(KeywordJudge):
    """Records how many calls overlap (calls take ``delay_s``)."""

    def __init__(self) -> None:
        super().__init__(delay_s=0.03)
        self.inflight = 0
        self.most = 0
        self._count = threading.Lock()

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        with self._count:
            self.inflight += 1
            self.most = max(self.most, self.inflight)
        try:
            return await super().evaluate(item, metrics)
        finally:
            with self._count:
                self.inflight -= 1


def _case(i: str, sentences: int) -> ReplayCase:
    answer = " ".join(f"The sky is blue number {n}." for n in range(sentences))
    return ReplayCase(i, "What colour is the sky?", ("The sky is blue.",), answer, expect_alert=False)


def test_cases_stream_concurrently_and_report_as_they_finish() -> None:
    judge = CountingJudge()
    finished: list[str] = []
    # the long case closes six checkpoints (each waits for its verdict), the short one a single one
    cases = [_case("long", 12), _case("short", 1)]
    results = replay(cases, Settings(concurrency=4), concurrency=2, judge=judge, checkpoint_judge=judge,
                     on_result=lambda r: finished.append(r.case.id))
    assert [r.case.id for r in results] == ["long", "short"]  # in the order of the cases
    assert finished == ["short", "long"]  # reported as they finished
    assert judge.most >= 2 and results[0].checkpoints >= 6


def test_one_at_a_time_keeps_the_order() -> None:
    judge = CountingJudge()
    finished: list[CaseResult] = []
    t0 = time.monotonic()
    results = replay([_case("long", 12), _case("short", 1)], Settings(), concurrency=1, judge=judge,
                     checkpoint_judge=judge, on_result=finished.append)
    assert [r.case.id for r in finished] == ["long", "short"] and finished == results
    assert time.monotonic() - t0 < 20
