"""Memory is bounded by the answer, not by the answer times its checkpoints (issue: 1 MB -> 3.6 GB)."""

from __future__ import annotations

import asyncio
import gc
import tracemalloc
from collections import Counter
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from importlib.metadata import version

import pytest

from _fakes import KeywordJudge
from conftest import Harness, cyclic_garbage, ours
from streamjudge import RegenerateRequest, guard, semconv
from streamjudge.judging._windows import MAX_JOINED_CHARS
from streamjudge.judging.base import EvalInput, JudgeResult, Score

# the SDK's own span metrics: 1.40 and 1.41 record them for every span (its start's attributes and a closure
# for its end, kept while it lives: 4-5 objects more per stream measured); 1.42+ only when asked for
SDK_SPAN_METRICS = 6 if 40 <= int(version("opentelemetry-sdk").split(".")[1]) <= 41 else 0

SENTENCE = "The tower is 330 metres tall and stands in Paris. "


class SlowishJudge:
    """Answers after a short pause, so a fast stream queues and coalesces checkpoints."""

    name = "slowish"

    def __init__(self) -> None:
        self.largest = 0

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        self.largest = max(self.largest, len(item.answer) + len(item.prefix))
        await asyncio.sleep(0.001)
        return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))

    async def aclose(self) -> None:
        return None


async def _tokens(total: int) -> AsyncIterator[str]:
    sent = 0
    while sent < total:
        for word in SENTENCE.split(" "):
            yield word + " "
        sent += len(SENTENCE) + 1
        if sent % 20_000 < len(SENTENCE):
            await asyncio.sleep(0)


def _peak(harness: Harness, total: int) -> tuple[int, SlowishJudge]:
    judge = SlowishJudge()
    harness.configure(judge, preflight=False, end_wait_s=0.5, max_text_attribute_chars=4096)

    async def run() -> None:
        async for _ in guard(_tokens(total), question="q", contexts=["The tower is 330 metres tall."]):
            pass

    tracemalloc.start()
    try:
        asyncio.run(run())
        harness.spans()
        return tracemalloc.get_traced_memory()[1], judge
    finally:
        tracemalloc.stop()


def test_a_long_answer_costs_memory_linear_in_its_length(harness: Harness) -> None:
    small, _ = _peak(harness, 100_000)
    large, judge = _peak(harness, 1_000_000)
    # quadratic growth would be ~100x for 10x the text; the text itself, its tokens and the final pass's copy
    # are linear. Generous bound: a fixed part plus 40 bytes per char of answer.
    assert large < 10 * small + 40_000_000, (small, large)
    assert large < 120_000_000, large
    # no request carried more than a bounded slice of text (checkpoints send new sentences, not the total);
    # only the final pass sees the whole answer
    checkpoint_sizes = judge.largest
    assert checkpoint_sizes >= 1_000_000  # the final pass


def test_checkpoint_requests_never_carry_the_running_text(harness: Harness) -> None:
    sizes: list[int] = []

    class Recording(SlowishJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            if item.kind == "checkpoint":
                sizes.append(len(item.answer) + len(item.prefix))
            return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))

    harness.configure(Recording(), preflight=False)

    async def run() -> None:
        async for _ in guard(_tokens(200_000), question="q", contexts=["The tower is 330 metres tall."]):
            pass

    asyncio.run(run())
    spans = harness.spans()
    assert sizes and max(sizes) <= 8_192 + 1_000  # a coalesced request is capped; the prefix is a tail
    cps = [s for s in spans if s.name == semconv.SPAN_CHECKPOINT]
    # a burst's windows share a checkpoint up to the join cap: its span carries its own sentences, never the
    # running text, and together the checkpoints carry the answer once
    assert max(len(s.attributes[semconv.CHECKPOINT_TEXT]) for s in cps) <= MAX_JOINED_CHARS
    assert sum(len(s.attributes[semconv.CHECKPOINT_TEXT]) for s in cps) <= 200_000 + 1_000


def test_an_event_loop_that_ran_guarded_streams_is_freed_once_it_is_gone(harness: Harness) -> None:
    # each loop gets one wake-up bell (kept in a table weakly keyed by its loop); a bell that held its loop
    # kept every ``asyncio.run`` of a guarded stream alive for the life of the process
    import gc
    import weakref

    harness.configure(SlowishJudge(), preflight=False, end_wait_s=0.5)

    async def run() -> None:
        async for _ in guard(_tokens(2_000), question="q", contexts=["The tower is 330 metres tall."]):
            pass

    loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []
    for _ in range(3):
        loop = asyncio.new_event_loop()
        loops.append(weakref.ref(loop))
        try:
            loop.run_until_complete(run())
        finally:
            loop.close()
        del loop
    harness.spans()
    gc.collect()
    assert [ref() for ref in loops] == [None, None, None]


_GOOD = "The tower is 330 metres tall. It stands in Paris. "
_BAD = "The tower is HALLUCINATED in Lyon. "


async def _paced(text: str, as_bytes: bool, gap_s: float = 0.0) -> AsyncIterator[str | bytes]:
    for word in text.split(" "):
        token = word + " "
        yield token.encode() if as_bytes else token
        await asyncio.sleep(gap_s)  # a loop pass per token at least: each sentence its own checkpoint


@pytest.mark.parametrize(
    ("settings", "as_bytes", "gap_s", "leave_after"),
    [
        ({}, False, 0.0, 0),
        ({}, True, 0.0, 0),  # bytes tokens: the session's decoder
        ({"mode": "hold_back"}, False, 0.0, 0),
        ({"action": "stop"}, False, 0.0, 0),
        ({"action": "regenerate"}, False, 0.0, 0),
        ({"sample_rate": 0.0}, False, 0.0, 0),
        # a slow source whose tokens race the verdicts in flight, and which ends while one is
        ({}, False, 0.004, 0),
        ({}, False, 0.004, 12),  # its client leaving while a token is raced
    ],
    ids=["flag", "bytes", "hold_back", "stop", "regenerate", "sampled_out", "raced_source_end",
         "client_left"],
)
def test_a_finished_stream_is_freed_without_the_cyclic_gc(
    harness: Harness, settings: dict[str, object], as_bytes: bool, gap_s: float, leave_after: int
) -> None:
    # a stream's objects (its session, windows, spans, verdicts: ~50 per judged stream) held in a reference
    # cycle outlive the stream until the cyclic GC finds them: they are promoted through the generations
    # while streams are live, and at hundreds of streams the young collections that copy them and the
    # whole-heap ones they bring stop every stream at once (measured at 500 streams: 28 ms of young
    # collections per run against 16 ms once refcounting freed them)
    # a judge slower than a token gap: the last checkpoint's verdict is still in flight at the source's end
    harness.configure(KeywordJudge(delay_s=0.02 if gap_s else 0.0), end_wait_s=1.0, **settings)

    def regenerate(_req: RegenerateRequest) -> AsyncIterator[str | bytes]:
        return _paced(_GOOD, as_bytes, gap_s)

    async def run() -> None:
        events = aiter(guard(_paced(_GOOD + _BAD + _GOOD, as_bytes, gap_s), question="tower",
                             contexts=["The tower is 330 metres tall and stands in Paris."],
                             regenerate=regenerate))
        seen = 0
        async for _ in events:
            seen += 1
            if leave_after and seen == leave_after:
                break  # the client went away mid-answer
        await events.aclose()  # type: ignore[attr-defined]

    loop = asyncio.new_event_loop()  # one loop throughout: a loop's own cycles are not the stream's
    try:
        loop.run_until_complete(run())  # first use: caches, the loop's wake-up bell
        harness.spans()
        with cyclic_garbage() as found:
            for _ in range(3):
                loop.run_until_complete(run())
            harness.spans()
    finally:
        loop.close()
    left = Counter(ours(found))
    assert not left, left


def test_a_session_keeps_its_state_in_slots(harness: Harness) -> None:
    # a session has more attributes than CPython's shared instance-dict keys hold (30), so each one had a
    # dict of its own: 1,640 bytes per live stream against 472 in slots, and a dict lookup more per read on
    # the token path
    import sys

    harness.configure(KeywordJudge())
    session = guard(_paced(_GOOD, False), question="tower", contexts=["The tower is 330 metres tall."]).session
    assert not hasattr(session, "__dict__")
    assert sys.getsizeof(session) < 600


def _kept_per_stream(
    harness: Harness, ready: Callable[[bool], bool], release: Callable[[], None] = lambda: None, n: int = 40
) -> float:
    """The objects the GC tracks per live stream, guarded over the same streams unguarded: ``n`` streams,
    each held after its first two sentences (and the token after them, on which a boundary is seen) until
    ``ready(guarded)``; ``release`` lets whatever the judge holds go once they are counted."""
    words = (_GOOD * 3).split(" ")
    head = len(_GOOD.split(" "))

    async def run() -> float:
        hold = asyncio.Event()
        waiting = 0

        async def paced() -> AsyncIterator[str]:
            nonlocal waiting
            for i, word in enumerate(words):
                if i == head:
                    waiting += 1
                    await hold.wait()
                await asyncio.sleep(0)
                yield word + " "

        async def bare() -> None:
            async for _ in paced():
                pass

        async def guarded() -> None:
            async for _ in guard(paced(), question="tower", contexts=["The tower is 330 metres tall."]):
                pass

        async def until(done: Callable[[], bool]) -> None:
            for _ in range(1000):
                if done():
                    break
                await asyncio.sleep(0.005)
            assert done(), waiting
            for _ in range(5):
                await asyncio.sleep(0.005)

        def idle() -> bool:
            release()
            return not harness.runtime.pool.depth  # type: ignore[union-attr]

        async def live(one: Callable[[], Awaitable[None]]) -> int:
            nonlocal hold, waiting
            hold, waiting = asyncio.Event(), 0
            harness.exporter.clear()
            gc.collect()
            before = len(gc.get_objects())
            tasks = [asyncio.ensure_future(one()) for _ in range(n)]
            await until(lambda: waiting == n and ready(one is guarded))
            harness.exporter.clear()  # an exporter's copies are the backend's, not the stream's
            gc.collect()
            kept = len(gc.get_objects()) - before
            release()
            hold.set()
            await asyncio.gather(*tasks)
            await until(idle)  # the ends' final passes and exports: the next count starts from an idle pool
            return kept

        await live(guarded)  # first use: caches, the loop's wake-up bell, the pool's thread
        return (await live(guarded) - await live(bare)) / n

    return asyncio.run(run())


# the judged bound leaves a few objects for a verdict that arrives a pass later on a loaded machine
@pytest.mark.parametrize(("sample_rate", "most"), [(0.0, 18), (1.0, 44)])
def test_a_live_stream_keeps_few_objects_for_the_cyclic_gc(
    harness: Harness, sample_rate: float, most: int
) -> None:
    # every object a live stream keeps is one more for each young collection to copy and brings the next
    # whole-heap one sooner: at 500 streams starting together one such collection (~25 ms, collecting
    # nothing) held back every stream's first token. Counted against the same streams unguarded, each held
    # at the same point (two sentences out, their verdicts in, the exporter's copies dropped) so the count
    # depends on what a stream keeps and not on how far a loaded machine got (timed at 60 ms instead, the
    # judged count ran from 18 to 44 by load): before the stream span started without the SDK's start work
    # and the driver kept only what its tokens need, 42 sampled out and 60 judged; since, 20 and 43 (a
    # judged stream holds its last verdict until its next token); since the span's flags, the stream's
    # counters, a result's empty usage and an unused list are shared or gone, 17 and 38; a judged stream's
    # spans and timing have one object of their own since (StreamSpans)
    runtime = harness.configure(KeywordJudge(), preflight=False, sample_rate=sample_rate, end_wait_s=0.5)
    # counted once the pool is done with every checkpoint, its verdicts delivered and their spans exported
    per_stream = _kept_per_stream(harness, lambda _guarded: not runtime.pool.depth)
    harness.spans()
    assert 0 < per_stream <= most + SDK_SPAN_METRICS, per_stream


class _HeldJudge:
    """A coroutine judge (as a model client is) whose calls stay out until :meth:`release`."""

    name = "held"

    def __init__(self) -> None:
        self.out: list[tuple[asyncio.AbstractEventLoop, asyncio.Future[None]]] = []

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self.out.append((loop, fut))
        await fut
        return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))

    def release(self) -> None:
        out, self.out = self.out, []
        for loop, fut in out:
            loop.call_soon_threadsafe(fut.set_result, None)

    async def aclose(self) -> None:
        self.release()


def test_a_call_out_to_a_coroutine_judge_keeps_few_objects_for_the_cyclic_gc(harness: Harness) -> None:
    # a model judge's call is out for its whole latency (hundreds of ms), longer than young collections
    # are apart: what each call keeps is copied by them and promoted. Counted with one checkpoint out per
    # stream against the same streams unguarded, held at the same point: 65 per stream before a call's
    # task ran in a copy of a context made once (no token and mapping of its own), its done callback was
    # a bound method (no closure, no copy of the context) and its job's hooks were one object (no closures
    # over the request), with the stream-level savings above; 54 since
    judge = _HeldJudge()
    harness.configure(judge, preflight=False, final_reconcile=False, concurrency=1000, end_wait_s=0.5)
    # counted with every guarded stream's checkpoint out (none for the unguarded ones)
    n = 40
    per_stream = _kept_per_stream(harness, lambda guarded: len(judge.out) == (n if guarded else 0),
                                  judge.release, n)
    judge.release()
    harness.spans()
    assert 0 < per_stream <= 58 + SDK_SPAN_METRICS, per_stream
