"""A judge that blocks its thread (``time.sleep`` inside ``evaluate``): the pool's event loop stops, no
``asyncio.timeout`` can fire. The reader must not notice, and the held span must still go out."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import pytest

import streamjudge
from conftest import Harness
from reliability.conftest import atokens
from streamjudge import semconv
from streamjudge.judging.base import EvalInput, JudgeResult, Score

CONTEXTS = ["The sky is blue. Grass is green."]
ANSWER = "The sky is blue. Grass is green. The sky is blue again. Grass is green again."
BLOCK_S = 4.0
END_WAIT_S = 0.3
HOLD_TIMEOUT_S = 0.5


class BlockingJudge:
    """Sleeps on the pool's thread; released early by the test so teardown stays short."""

    name = "blocking"

    def __init__(self) -> None:
        self.release = threading.Event()
        self.entered = threading.Event()

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        self.entered.set()
        self.release.wait(BLOCK_S)  # blocks the thread, like time.sleep or a sync HTTP call
        return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))

    async def aclose(self) -> None:
        return None


async def _consume(n: int) -> list[float]:
    async def one() -> float:
        started = time.monotonic()
        async for _ in streamjudge.guard(atokens(ANSWER, 0.001), question="sky", contexts=CONTEXTS):
            pass
        return time.monotonic() - started

    return list(await asyncio.gather(*(one() for _ in range(n))))


@pytest.fixture
def blocked(harness: Harness) -> BlockingJudge:
    judge = BlockingJudge()
    harness.configure(judge, preflight=False, end_wait_s=END_WAIT_S, hold_timeout_s=HOLD_TIMEOUT_S,
                      judge_timeout_s=0.2, concurrency=2)
    return judge


@pytest.mark.timeout(60)
def test_streams_finish_within_end_wait_while_the_judge_blocks_its_thread(
        harness: Harness, blocked: BlockingJudge) -> None:
    try:
        durations = asyncio.run(_consume(5))
        assert blocked.entered.is_set(), "the judge was called and is blocking the pool's thread"
        # each stream waited at most end_wait_s for verdicts, not the judge's 4 s
        assert max(durations) < END_WAIT_S + 1.5, durations
        print(f"\nblocked judge: 5 streams, longest {max(durations):.2f} s (end_wait {END_WAIT_S} s)")
    finally:
        blocked.release.set()


@pytest.mark.timeout(60)
def test_a_span_held_for_a_blocked_judge_goes_out_as_timeout_after_hold_timeout(
        harness: Harness, blocked: BlockingJudge) -> None:
    try:
        asyncio.run(_consume(1))
        assert blocked.entered.wait(5)
        # no further traffic, no flush: only the hold timeout can release the held spans
        deadline = time.monotonic() + HOLD_TIMEOUT_S + 1.5
        spans = harness.exporter.get_finished_spans()
        while time.monotonic() < deadline:
            spans = harness.exporter.get_finished_spans()
            if any(s.name == semconv.SPAN_CHECKPOINT for s in spans):
                break
            time.sleep(0.05)
        assert blocked.release.is_set() is False, "the judge is still blocking"
        checkpoints = [s for s in spans if s.name == semconv.SPAN_CHECKPOINT]
        assert checkpoints, "no held span was released while the judge blocked past hold_timeout_s"
        assert all(s.attributes[semconv.EVAL_STATUS] == "timeout" for s in checkpoints)
    finally:
        blocked.release.set()


@pytest.mark.timeout(60)
def test_a_later_stream_sweeps_spans_held_past_hold_timeout_while_the_judge_blocks(
        harness: Harness, blocked: BlockingJudge) -> None:
    try:
        asyncio.run(_consume(1))
        assert blocked.entered.wait(5)
        time.sleep(HOLD_TIMEOUT_S + 0.1)
        asyncio.run(_consume(1))  # its first request sweeps what is overdue
        first = [s for s in harness.exporter.get_finished_spans() if s.name == semconv.SPAN_CHECKPOINT]
        assert first and all(s.attributes[semconv.EVAL_STATUS] == "timeout" for s in first)
        assert not blocked.release.is_set(), "released by the sweep, not by the judge"
    finally:
        blocked.release.set()
    # the blocked judge's late results find no slot: nothing is exported twice
    spans = harness.spans()
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids))
