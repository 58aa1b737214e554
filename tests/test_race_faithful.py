"""A raced token is asked for in the stream's own task and context, as an unguarded ``async for`` would."""

from __future__ import annotations

import asyncio
import contextvars
from collections.abc import AsyncIterator

from _fakes import KeywordJudge
from conftest import Harness
from streamjudge import guard

CONTEXTS = ["The sky is blue. Grass is green. Water is wet."]
TEXT = "The sky is blue. Grass is green. Water is wet. The sky is blue again. Grass is green again. "

_var: contextvars.ContextVar[str] = contextvars.ContextVar("app_var", default="unset")


def _slow_judge(harness: Harness) -> None:
    # verdicts stay in flight for the whole answer and the source is slow: every token is raced
    harness.configure(KeywordJudge(delay_s=5.0), window_sentences=1, preflight=False, end_wait_s=0.0)


def test_a_source_sees_its_own_context_variables_from_token_to_token(harness: Harness) -> None:
    _slow_judge(harness)
    seen: list[str] = []

    async def source() -> AsyncIterator[str]:
        token = _var.set("set by the source")
        for w in TEXT.split(" "):
            await asyncio.sleep(0.003)
            seen.append(_var.get())
            yield w + " "
        _var.reset(token)  # raises ValueError when a token was made in another context

    async def main() -> str:
        async for _ in guard(source(), question="sky", contexts=CONTEXTS):
            pass
        return _var.get()

    assert asyncio.run(main()) == "unset"
    assert seen and set(seen) == {"set by the source"}


def test_a_timeout_around_the_source_fires_in_the_stream_task(harness: Harness) -> None:
    # asyncio.timeout() binds to the task that entered it: a source whose steps ran in a task per token
    # would have its deadline cancel a finished task, and the stream would run on past it
    _slow_judge(harness)

    async def source() -> AsyncIterator[str]:
        for w in TEXT.split(" "):  # racing is on by the end of these
            await asyncio.sleep(0.005)
            yield w + " "
        async with asyncio.timeout(0.25):
            for _ in range(1000):
                await asyncio.sleep(0.005)
                yield "more words. "

    async def main() -> tuple[int, str]:
        n = 0
        try:
            async for ev in guard(source(), question="sky", contexts=CONTEXTS):
                n += ev.type == "token"
        except TimeoutError:
            return n, "timeout"
        return n, "completed"

    tokens, how = asyncio.run(asyncio.wait_for(main(), 10))
    assert how == "timeout" and 10 < tokens < 200, (tokens, how)


def test_the_stream_task_is_the_one_the_source_runs_in(harness: Harness) -> None:
    _slow_judge(harness)
    tasks: set[asyncio.Task[object] | None] = set()

    async def source() -> AsyncIterator[str]:
        for w in TEXT.split(" "):
            await asyncio.sleep(0.003)
            tasks.add(asyncio.current_task())
            yield w + " "

    async def main() -> asyncio.Task[object] | None:
        async for _ in guard(source(), question="sky", contexts=CONTEXTS):
            pass
        return asyncio.current_task()

    me = asyncio.run(main())
    assert tasks == {me}


def test_a_stop_while_a_token_is_raced_cancels_the_source_at_its_await(harness: Harness) -> None:
    # the stop verdict lands while the next token is asked for: the source sees CancelledError where it
    # waits, as if its task were cancelled, and its cleanup (which awaits) runs to its end
    harness.configure(KeywordJudge(delay_s=0.05), window_sentences=1, preflight=False, action="stop")
    seen: list[str] = []

    async def source() -> AsyncIterator[str]:
        try:
            for w in ["The", "sky", "is", "blue.", "Then", "HALLUCINATED", "facts", "appear.", "More"]:
                await asyncio.sleep(0.01)
                yield w + " "
            # the failing sentence's checkpoint is out: its stop lands while the source waits here (with
            # the next token 10 ms away instead, a loaded machine could deliver it between two tokens,
            # where there is no await to cancel: 1 run in 12 beside two busy processes)
            await asyncio.sleep(5)
            for w in ("words. " * 100).split(" "):
                await asyncio.sleep(0.01)
                yield w + " "
        except asyncio.CancelledError:
            seen.append("cancelled")
            raise
        finally:
            await asyncio.sleep(0.01)  # the model client's own close
            seen.append("closed")

    async def main() -> list[str]:
        types = [ev.type async for ev in guard(source(), question="sky", contexts=CONTEXTS)]
        await asyncio.sleep(0.1)  # the source's cleanup finishes on the loop
        return types

    types = asyncio.run(main())
    assert types[-1] == "done" and "stop" in types
    assert types.count("token") < 60
    assert seen == ["cancelled", "closed"]


def test_a_client_that_leaves_while_a_token_is_raced_cancels_the_source_where_it_waits(
    harness: Harness,
) -> None:
    _slow_judge(harness)
    seen: list[str] = []

    async def source() -> AsyncIterator[str]:
        try:
            for w in (TEXT * 20).split(" "):
                await asyncio.sleep(0.005)
                yield w + " "
        except asyncio.CancelledError:
            seen.append("cancelled at its await")
            raise

    async def main() -> None:
        async def consume() -> None:
            async for _ in guard(source(), question="sky", contexts=CONTEXTS):
                pass

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.3)  # racing by now
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            seen.append("the stream task cancelled")

    asyncio.run(main())
    assert seen == ["cancelled at its await", "the stream task cancelled"]
    stream = [s for s in harness.spans() if s.name == "streamjudge.stream"]
    assert stream and stream[0].attributes["streamjudge.stream.outcome"] == "disconnected"


def test_a_step_awaited_to_its_end_passes_a_cancellation_to_the_source_at_its_await() -> None:
    from streamjudge.judging._drivers import SourceStep

    seen: list[str] = []

    async def source() -> AsyncIterator[str]:
        try:
            await asyncio.sleep(10)
            yield "never"
        except asyncio.CancelledError:
            seen.append("source cancelled at its await")
            raise

    async def main() -> None:
        gen = source()
        step = SourceStep(gen.__anext__())
        assert not step.advance()  # the source waits on its sleep

        async def rest() -> str:
            return str(await step)

        task = asyncio.ensure_future(rest())
        await asyncio.sleep(0.01)
        task.cancel()
        try:
            await task
        except asyncio.CancelledError:
            seen.append("the awaiting task cancelled")
        assert step.ready and step.advance()  # a step that ended stays ended
        await gen.aclose()

    asyncio.run(main())
    assert seen == ["source cancelled at its await", "the awaiting task cancelled"]


def test_a_raced_wait_over_bare_yields_takes_a_verdict_once_and_then_goes_on() -> None:
    # the wait both drivers race a token with (guard()'s and the model tap's): a verdict that arrived while the
    # source yields bare ends one wait, after the pass the source asked for, and is taken with it, so the next
    # wait steps the source on to its token instead of ending at once again (it spun there, the source never
    # resumed, until another verdict came)
    from streamjudge.judging._drivers import AsyncWaker, SourceStep, wait_step

    async def source() -> AsyncIterator[str]:
        for _ in range(3):
            await asyncio.sleep(0)  # bare yields: no future to wait on
        yield "token"

    async def main() -> tuple[bool, bool, str]:
        gen = source()
        step = SourceStep(gen.__anext__())
        assert not step.advance()  # at its first bare yield
        waker = AsyncWaker(asyncio.get_running_loop())
        waker.notify()  # a verdict arrived (from the pool's thread) while nothing waited on a future
        await wait_step(step, waker, None)
        first = step.ready  # the verdict ended the wait, after one pass that stepped the source on
        await asyncio.wait_for(wait_step(step, waker, None), 1.0)
        await gen.aclose()
        return first, waker.take_flag(), step.take()

    first, flag_left, token = asyncio.run(main())
    assert not first and not flag_left and token == "token"


def test_a_step_takes_any_awaitable_a_task_would() -> None:
    from streamjudge.judging._drivers import SourceStep

    class PlainIterator:  # an __await__ that returns an iterator without send()
        def __await__(self):  # type: ignore[no-untyped-def]
            return iter(())

    class BadYield:  # a yield a task refuses: the source gets the task's RuntimeError
        def __await__(self):  # type: ignore[no-untyped-def]
            try:
                yield "not a future"
            except RuntimeError as exc:
                return f"refused: {exc}"
            return "accepted"

    async def main() -> tuple[object, object, object]:
        plain = SourceStep(PlainIterator())
        assert plain.advance()
        bad = SourceStep(BadYield())
        assert bad.advance()
        bare = SourceStep(asyncio.sleep(0, "after one pass"))
        assert not bare.advance()
        return plain.take(), bad.take(), await bare

    plain, bad, bare = asyncio.run(main())
    assert plain is None and str(bad).startswith("refused: ") and bare == "after one pass"


def test_a_warning_reaches_the_reader_while_the_source_only_yields_to_the_loop(harness: Harness) -> None:
    # a source busy between tokens, letting the loop run with bare yields (asyncio.sleep(0)) but waiting on
    # no future: a verdict that lands meanwhile goes out at the next pass, not with the token after the work
    import time

    harness.configure(KeywordJudge(delay_s=0.05), window_sentences=1, preflight=False)

    async def source() -> AsyncIterator[str]:
        for w in ["The", "sky", "is", "blue.", "Then", "HALLUCINATED", "facts", "appear.", "More"]:
            await asyncio.sleep(0.02)  # slow: racing is on
            yield w + " "
        until = time.monotonic() + 0.6
        while time.monotonic() < until:  # the model client's CPU work, yielding to the loop
            time.sleep(0.0005)
            await asyncio.sleep(0)
        yield "Done."

    async def main() -> tuple[float, float]:
        t0 = time.monotonic()
        warned = done = 0.0
        async for ev in guard(source(), question="sky", contexts=CONTEXTS):
            if ev.type == "warning" and not warned:
                warned = time.monotonic() - t0
            elif ev.type == "token" and ev.text == "Done.":
                done = time.monotonic() - t0
        return warned, done

    warned, done = asyncio.run(main())
    assert 0 < warned < done - 0.3, (warned, done)


def test_a_verdict_during_bare_yields_while_another_checkpoint_is_out_does_not_stall_the_stream(
    harness: Harness,
) -> None:
    # the model client's CPU work between tokens, yielding bare to the loop (asyncio.sleep(0)) and slow
    # enough that every token is raced; the first checkpoint's verdict lands during that work while the
    # second is still out. The verdict's flag, read and left set, ended every later pass of the raced
    # wait before the source's step went on: the stream spun at full CPU, its source never resumed, until
    # the second verdict came (here: never, so the stream stalled)
    import threading
    import time

    from streamjudge.judging.base import EvalInput, JudgeResult

    first, rest = threading.Event(), threading.Event()
    calls = 0

    class TwoGates(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: list[str]) -> JudgeResult:  # type: ignore[override]
            nonlocal calls
            calls += 1
            gate = first if calls == 1 else rest
            while not gate.is_set():
                await asyncio.sleep(0.002)
            return self._score(item, metrics)

    harness.configure(TwoGates(), window_sentences=1, preflight=False, final_reconcile=False, end_wait_s=0.1)
    words = ["The", "sky", "is", "blue.", "Grass", "is", "green.", "Water"]

    async def source() -> AsyncIterator[str]:
        for w in words:
            await asyncio.sleep(0.01)  # slow: racing is on
            yield w + " "
        first.set()  # both checkpoints are out: the first one's verdict may come now
        for _ in range(100):
            time.sleep(0.002)  # the client's work (the GIL is free meanwhile: the verdict lands)
            await asyncio.sleep(0)
            yield "more "

    async def main() -> int:
        tokens = 0
        async for ev in guard(source(), question="sky", contexts=CONTEXTS):
            if ev.type == "token":
                tokens += 1
        return tokens

    try:
        tokens = asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        rest.set()
    assert tokens == len(words) + 100
    assert calls == 3  # the two sentences, then the tail at the end
