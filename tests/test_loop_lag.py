"""The judge pool's CPU share follows the app's event loops: raised while they keep time, back to its floor
as soon as one runs late, and nothing measured at all unless a ceiling above the floor was asked for."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator

import pytest

import streamjudge
from _fakes import KeywordJudge
from conftest import Harness
from streamjudge.config import ConfigError, load_settings
from streamjudge.judging._lag import TICK_S, LoopLag
from streamjudge.judging.base import EvalInput, JudgeResult
from streamjudge.judging.pool import JudgeJob, JudgePool


class ScriptedLag:
    """Stands in for the pool's LoopLag: each take() returns the next scripted lateness."""

    def __init__(self, values: list[float | None]) -> None:
        self.values = list(values)

    def take(self) -> float | None:
        return self.values.pop(0)


def test_the_share_rises_while_loops_keep_time_and_halves_to_the_floor_when_one_is_late() -> None:
    pool = JudgePool(cpu_share=0.15, cpu_share_max=0.8)
    try:
        late = 0.05  # well past the limit (two GIL switch intervals, at least 10 ms)
        pool._lag = ScriptedLag([0.001] * 10 + [late, late, late, 0.0, None])  # type: ignore[assignment]
        shares = []
        now = 1000.0
        for _ in range(15):
            now += 0.06  # one adaptation window each
            shares.append(round(pool._share_now(now), 3))
        # a step per window up to the ceiling, which holds
        assert shares[:7] == [0.25, 0.35, 0.45, 0.55, 0.65, 0.75, 0.8]
        assert shares[9] == 0.8
        # a late loop halves it, down to the floor and no lower
        assert shares[10:13] == [0.4, 0.2, 0.15]
        assert shares[13] == 0.25  # keeping time again: back up by a step
        # no judged stream on any loop: nothing says the app has CPU to spare
        assert shares[14] == 0.15
    finally:
        pool.shutdown(1000)


def test_the_share_is_read_once_per_window_not_per_job() -> None:
    pool = JudgePool(cpu_share=0.15, cpu_share_max=0.8)
    try:
        pool._lag = ScriptedLag([0.0])  # type: ignore[assignment]
        assert pool._share_now(1000.0) == pytest.approx(0.25)
        # within the same window: the scripted source would raise IndexError if it were read again
        assert pool._share_now(1000.01) == pytest.approx(0.25)
    finally:
        pool.shutdown(1000)


def test_a_fixed_cap_measures_nothing() -> None:
    """The default: no probe on the app's loop, the share stays where it was set."""
    pool = JudgePool.from_settings(load_settings({}))
    try:
        async def main() -> object:
            return pool.watch_loop()

        assert asyncio.run(main()) is None
        assert pool.cpu_share == 0.15
        assert pool._share_now(time.monotonic() + 1) == 0.15
    finally:
        pool.shutdown(1000)


def test_a_probe_records_a_blocked_loop_and_stops_ticking_when_its_streams_end() -> None:
    lag = LoopLag()

    async def main() -> tuple[float, float, float]:
        probe = lag.watch()
        assert probe is not None and probe.live == 1
        await asyncio.sleep(TICK_S * 3)
        on_time = lag.take()
        time.sleep(0.08)  # the app blocks its loop: the tick due meanwhile runs ~70 ms late
        await asyncio.sleep(TICK_S * 2)
        blocked = lag.take()
        probe.close()
        await asyncio.sleep(TICK_S * 3)  # the last tick sees no live stream and does not reschedule
        idle = lag.take()
        return on_time or 0.0, blocked or 0.0, idle if idle is not None else -1.0

    on_time, blocked, idle = asyncio.run(main())
    assert blocked >= 0.05
    assert on_time < blocked
    assert idle == -1.0  # no live stream: None, nothing to say


def test_a_loop_blocked_for_a_whole_window_is_late_before_its_tick_runs() -> None:
    """The pool reads the lateness of a tick that is due and has not run: a loop stuck in one callback
    records nothing itself until it is free again."""
    lag = LoopLag()
    seen: list[float | None] = []

    async def main() -> None:
        probe = lag.watch()
        await asyncio.sleep(TICK_S * 2)
        lag.take()
        reader = threading.Thread(target=lambda: (time.sleep(0.1), seen.append(lag.take())))
        reader.start()
        time.sleep(0.2)  # blocked while the other thread reads
        reader.join()
        assert probe is not None
        probe.close()

    asyncio.run(main())
    assert seen[0] is not None and seen[0] >= 0.05


def test_a_closed_loop_is_forgotten_and_a_synchronous_stream_has_no_probe() -> None:
    lag = LoopLag()

    async def main() -> None:
        lag.watch()  # never closed: the loop ends with its stream still counted

    asyncio.run(main())
    assert lag.take() is None
    assert lag.watch() is None  # no running loop


def test_the_ceiling_is_a_setting() -> None:
    s = load_settings({"STREAMJUDGE_JUDGE_CPU_SHARE_MAX": "0.6"})
    assert s.judge_cpu_share_max == 0.6
    pool = JudgePool.from_settings(s)
    try:
        assert pool._cpu_share_max == 0.6
    finally:
        pool.shutdown(1000)
    with pytest.raises(ConfigError, match="JUDGE_CPU_SHARE_MAX"):
        load_settings({"STREAMJUDGE_JUDGE_CPU_SHARE_MAX": "2"})


def test_a_judged_stream_is_probed_on_its_loop_while_it_streams(harness: Harness) -> None:
    rt = harness.configure(KeywordJudge(), judge_cpu_share_max=0.8, preflight=False)
    lag = rt.pool._lag
    during: list[bool] = []

    async def tokens() -> AsyncIterator[str]:
        # the stream opens (and its loop's probe with it) while the source works on its first token: a model
        # answers after a wait, and the stream's start runs in it
        await asyncio.sleep(0)
        for word in ("The sky is blue. ", "It is day. "):
            during.append(any(p.serving for p in list(lag._probes.values())))
            yield word

    async def main() -> None:
        async for _ev in streamjudge.guard(tokens(), question="sky", contexts=["The sky is blue."]):
            pass

    asyncio.run(main())
    assert during == [True, True]
    assert not any(p.serving for p in list(lag._probes.values()))


@pytest.mark.parametrize("batches", [True, False])
def test_a_throttled_dispatcher_wakes_with_room_for_a_batch_of_worker_calls(
        monkeypatch: pytest.MonkeyPatch, batches: bool) -> None:
    """Past its burst, a dispatcher whose judge batches its calls (a worker's) sleeps until the debt is below
    the burst by a margin: woken right at the line, every queued job got a sleep and a pipe write of its
    own. A judge in the pool's thread keeps waking at the line (a batch would only hold the GIL longer)."""
    from streamjudge.judging import pool as pool_module

    pool = JudgePool(cpu_share=0.15, cpu_burst_s=0.05)
    slept: list[float] = []

    async def fake_sleep(delay: float) -> None:
        slept.append(delay)

    class Judge:
        name = "j"
        batches_calls = batches

        async def evaluate(self, item: object, metrics: object) -> JudgeResult:
            return JudgeResult("j", ())

        async def aclose(self) -> None:
            pass

    try:
        done = threading.Event()
        pool.submit(JudgeJob(Judge(), EvalInput("q", ("c",), "a"), ("faithfulness",), lambda o: done.set()))
        assert done.wait(10)
        assert pool.force_flush(10_000)
        monkeypatch.setattr(pool_module.asyncio, "sleep", fake_sleep)
        pool._cpu_seen, pool._cpu_at = time.thread_time(), time.monotonic()
        pool._cpu_debt = 0.05 + 0.001  # a millisecond past the burst
        asyncio.run(pool._throttle())
        assert len(slept) == 1
        paid = slept[0] * 0.15  # the debt paid off while asleep
        if batches:  # the millisecond over the burst and the margin below it
            assert paid >= 0.001 + pool_module._RESUME_S - 1e-4 and pool_module._RESUME_S >= 0.001
        else:
            assert paid < 0.001 + 1e-3
    finally:
        pool.shutdown(1000)
