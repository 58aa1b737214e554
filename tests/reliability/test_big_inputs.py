"""Large retrieved contexts (issue 10 #6, #11): the pre-flight gate and context indexing run on the judge
pool's thread, never on the application's event loop; contexts over the judge-input cap are a recorded
skip; and the per-trace context store is bounded by size, so many requests with 1 MB contexts do not keep
them all."""

from __future__ import annotations

import asyncio
import gc
import time
import tracemalloc
from collections.abc import Sequence

import pytest

import streamjudge
from conftest import Harness
from reliability.conftest import atokens
from streamjudge import semconv
from streamjudge._context import ContextStore
from streamjudge.judging.base import EvalInput, JudgeResult, Score

ANSWER = "The tower is 330 metres tall. It was completed in 1889. It is in Paris. It is made of iron."


def _contexts(chars: int, salt: int = 0) -> list[str]:
    unit = f"Passage {salt}: the tower is 330 metres tall and was completed in 1889 in Paris. "
    return [unit * (chars // len(unit) // 4 + 1) for _ in range(4)]


class _Passing:
    """Keeps nothing of what it judges (the fakes in tests/_fakes.py record their inputs)."""

    name = "passing"

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))

    async def aclose(self) -> None:
        return None


async def _ticker(stop: asyncio.Event, lateness: list[float]) -> None:
    """How late the loop wakes a 10 ms timer: what every other request on this loop feels."""
    loop = asyncio.get_running_loop()
    while not stop.is_set():
        t = loop.time()
        await asyncio.sleep(0.01)
        lateness.append(loop.time() - t - 0.01)


@pytest.mark.timeout(120)
@pytest.mark.parametrize("chars", [1_500_000, 5_000_000])
def test_large_contexts_never_stall_the_event_loop(harness: Harness, chars: int) -> None:
    rt = harness.configure(None, end_wait_s=1.0)  # the local judge: pre-flight and indexing are real work
    contexts = _contexts(chars)

    async def main() -> tuple[float, list[float]]:
        stop, lateness = asyncio.Event(), []  # type: ignore[var-annotated]
        ticker = asyncio.create_task(_ticker(stop, lateness))
        await asyncio.sleep(0.05)
        started = time.monotonic()
        first = 0.0
        async for ev in streamjudge.guard(atokens(ANSWER, 0.005), question="How tall is the tower?",
                                          contexts=contexts):
            if ev.type == "token" and not first:
                first = time.monotonic() - started
        stop.set()
        await ticker
        return first, lateness

    first, lateness = asyncio.run(main())
    assert rt.force_flush(60_000)
    print(f"\n{chars / 1e6:g} M chars of contexts: first token {first * 1000:.0f} ms, "
          f"loop late by {max(lateness) * 1000:.0f} ms at most")
    # before: 1 MB of contexts -> 620 ms to first token, 5 MB -> 2.8 s, stalling every stream on the loop
    assert first < 0.5, first
    assert max(lateness) < 0.5, max(lateness)
    stream = next(s for s in harness.spans() if s.name == semconv.SPAN_STREAM)
    if chars > rt.settings.max_judge_input_chars:
        assert stream.attributes[semconv.EVAL_STATUS] == "skipped"
        assert stream.attributes[semconv.EVAL_SKIP_REASON] == "contexts_too_large"
    else:
        assert stream.attributes[semconv.EVAL_STATUS] == "judged"


@pytest.mark.timeout(120)
def test_many_requests_with_1mb_contexts_keep_a_bounded_amount(harness: Harness) -> None:
    rt = harness.configure(_Passing(), preflight=False, end_wait_s=0.2)
    rt.contexts = ContextStore()  # this test's own, empty: earlier tests' entries do not blur the figures
    limit = 32_000_000  # the store's default bound in chars

    async def main() -> None:
        for i in range(60):
            await asyncio.gather(*(_one(5 * i + k) for k in range(5)))

    async def _one(i: int) -> None:
        with rt.tracer.start_as_current_span("request"):
            async for _ in streamjudge.guard(atokens(ANSWER), question="How tall?",
                                             contexts=_contexts(1_000_000, i)):
                pass

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(main())
        assert rt.force_flush(30_000)
        harness.exporter.clear()  # the exported spans are the test's, not the process's
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    assert rt.contexts.chars <= limit
    assert rt.pool.tracked_streams == 0, "per-stream budgets of finished streams are forgotten"
    print(f"\n300 requests with 1 MB contexts: {kept / 1e6:.0f} MB kept, store {rt.contexts.chars / 1e6:.1f} M chars")
    # before: 300 requests with 1 MB contexts kept 309 MB referenced
    assert kept < limit * 1.5, f"{kept / 1e6:.0f} MB kept after 300 requests with 1 MB contexts"


@pytest.mark.timeout(180)
def test_the_local_judges_caches_are_bounded_by_size_not_by_count(harness: Harness) -> None:
    rt = harness.configure(None, preflight=False, end_wait_s=0.2, judge_cpu_share=0.0)
    rt.contexts = ContextStore()  # this test's own, empty: earlier tests' entries do not blur the figures
    # more streams than the old cache's 32 entries, each context larger than the analysis cache takes
    streams, chars = 36, 300_000

    async def main() -> None:
        for i in range(streams):
            async for _ in streamjudge.guard(atokens(ANSWER), question="How tall?",
                                             contexts=_contexts(chars, i)):
                pass

    gc.collect()
    tracemalloc.start()
    try:
        before = tracemalloc.get_traced_memory()[0]
        asyncio.run(main())
        assert rt.force_flush(120_000)
        harness.exporter.clear()
        gc.collect()
        kept = tracemalloc.get_traced_memory()[0] - before
    finally:
        tracemalloc.stop()
    stored = rt.contexts.chars  # what the context store keeps on purpose (bounded by size itself)
    assert stored <= streams * chars * 1.1
    # past what the store keeps, the judge's caches may add a bounded share, not ~17x of every text
    assert kept < 4 * stored, f"{kept / 1e6:.0f} MB kept for {stored / 1e6:.1f} M chars of contexts"
