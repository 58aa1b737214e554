"""``judge_processes="auto"`` (the default): the local judge stays in the app's process while it is light,
moves to a real worker process once its CPU is measured to weigh on the app, gives the same scores wherever
it ran, loses no verdict when the worker dies or cannot start, and leaves no process behind."""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections.abc import AsyncIterator

import pytest
from test_process_judge import CONTEXTS, QUESTION, RaisingJudge, children, items

import streamjudge
from conftest import Harness
from streamjudge import guard
from streamjudge.config import Settings
from streamjudge.judging import service
from streamjudge.judging.base import METRICS, EvalInput, Judge, JudgeResult
from streamjudge.judging.guard import GuardSession
from streamjudge.judging.judges import _offload, create_judge
from streamjudge.judging.judges._offload import AutoProcessJudge
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.runtime import _Discard


@pytest.fixture
def eager(monkeypatch: pytest.MonkeyPatch) -> None:
    """Any in-process judging counts as load enough for a worker."""
    monkeypatch.setattr(_offload, "OFFLOAD_SHARE", 1e-9)


def auto(tier: str = "checkpoint") -> AutoProcessJudge:
    j = create_judge("local", Settings(), tier=tier)  # type: ignore[arg-type]
    assert isinstance(j, AutoProcessJudge)
    return j


async def until_offloaded(j: AutoProcessJudge, probe: EvalInput, timeout: float = 20.0) -> list[JudgeResult]:
    """Judge ``probe`` until ``j`` judges in its worker; the results on the way."""
    out: list[JudgeResult] = []
    deadline = time.monotonic() + timeout
    while not j.offloaded:
        assert time.monotonic() < deadline, "the worker never took over"
        out.append(await j.evaluate(probe, METRICS))
        await asyncio.sleep(0.02)
    return out


def test_auto_is_the_default_and_wraps_only_the_local_judge_unless_a_small_cgroup_quota_binds(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    assert Settings().judge_processes == "auto"
    monkeypatch.setattr(_offload, "cgroup_quota", lambda: None)  # one core by affinity or many: a worker
    wrapped = create_judge("local", Settings())
    assert isinstance(wrapped, AutoProcessJudge) and isinstance(wrapped, Judge) and wrapped.name == "local"
    assert isinstance(create_judge(f"{RaisingJudge.__module__}:RaisingJudge", Settings()), RaisingJudge)
    assert isinstance(create_judge("local", Settings(judge_processes=0)), LocalJudge)
    monkeypatch.setattr(_offload, "cgroup_quota", lambda: 2.0)
    assert isinstance(create_judge("local", Settings()), AutoProcessJudge)
    # a worker would spend the same quota beside the app, and a spent quota stops the whole group
    monkeypatch.setattr(_offload, "cgroup_quota", lambda: 1.5)
    assert isinstance(create_judge("local", Settings()), LocalJudge)


def test_the_meter_wants_a_worker_only_for_a_share_of_a_core_within_one_window(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    meter = _offload._Meter()
    budget = _offload.OFFLOAD_SHARE * _offload.WINDOW_S
    assert not meter.add(budget * 0.6)
    clock = [time.monotonic() + _offload.WINDOW_S + 0.1]  # a new window: the first 60% is forgotten
    monkeypatch.setattr(_offload.time, "monotonic", lambda: clock[0])
    assert not meter.add(budget * 0.6)
    assert meter.add(budget * 0.5)  # 110% within this window
    assert meter.wanted


def test_light_judging_stays_in_process_and_starts_no_process() -> None:
    before = children()
    its = items()

    async def go() -> list[JudgeResult]:
        j = auto()
        try:
            out = [await j.evaluate(it, METRICS) for it in its[:4]]
            assert not j.offloaded and j.pids == ()
            return out
        finally:
            await j.aclose()

    assert asyncio.run(go()) == [LocalJudge().evaluate_sync(it, METRICS) for it in its[:4]]
    assert children() <= before


def test_heavy_judging_moves_to_one_worker_for_both_tiers_with_the_same_scores(eager: None) -> None:
    its = items()
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in its]
    before = children()

    async def go() -> tuple[list[JudgeResult], list[JudgeResult], list[JudgeResult]]:
        checkpoint, final = auto("checkpoint"), auto("final")
        try:
            warming = await until_offloaded(checkpoint, its[0])
            await until_offloaded(final, its[1])
            assert checkpoint.pids and checkpoint.pids == final.pids  # one worker serves both tiers
            assert set(checkpoint.pids) <= children() - before
            remote = [await checkpoint.evaluate(it, METRICS) for it in its]
            remote_final = list(await asyncio.gather(*(final.evaluate(it, METRICS) for it in its)))
            return warming, remote, remote_final
        finally:
            await checkpoint.aclose()
            await final.aclose()

    warming, remote, remote_final = asyncio.run(go())
    assert warming and all(r == expected[0] for r in warming)  # judged in-process while the worker started
    assert remote == expected
    assert remote_final == expected
    assert children() <= before  # stopped and reaped


def test_an_idle_worker_stops_and_the_next_burst_starts_another(
    eager: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_offload, "IDLE_S", 0.3)
    it = items()[0]
    expected = LocalJudge().evaluate_sync(it, METRICS)
    before = children()

    async def go() -> tuple[int, int, list[JudgeResult]]:
        j = auto()
        try:
            await until_offloaded(j, it)
            (first,) = j.pids
            busy = []
            for _ in range(4):  # calls keep it alive past one idle period
                busy.append(await j.evaluate(it, METRICS))
                await asyncio.sleep(0.1)
            assert j.offloaded and j.pids == (first,)
            deadline = time.monotonic() + 5
            while j.pids:  # nothing to judge: it stops
                assert time.monotonic() < deadline, "the idle worker never stopped"
                await asyncio.sleep(0.05)
            assert not j.offloaded
            busy.append(await j.evaluate(it, METRICS))  # in-process again, and counted on the meter
            await until_offloaded(j, it)
            (second,) = j.pids
            return first, second, busy
        finally:
            await j.aclose()

    first, second, results = asyncio.run(go())
    assert first != second and all(r == expected for r in results)
    time.sleep(0.3)
    assert children() <= before


def test_a_killed_worker_costs_no_verdict(eager: None) -> None:
    its = items()
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in its]

    async def go() -> list[JudgeResult]:
        j = auto()
        try:
            await until_offloaded(j, its[0])
            (pid,) = j.pids
            os.kill(pid, signal.SIGKILL)
            # calls in flight when it died and calls sent to its dead pipe are judged here instead
            return list(await asyncio.gather(*(j.evaluate(it, METRICS) for it in its)))
        finally:
            await j.aclose()

    assert asyncio.run(go()) == expected


def test_a_stopped_worker_holds_no_verdict_back_and_is_given_up(eager: None) -> None:
    its = items()[:8]
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in its]
    before = children()

    async def go() -> tuple[list[JudgeResult], float]:
        j = auto()
        try:
            await until_offloaded(j, its[0])
            (pid,) = j.pids
            os.kill(pid, signal.SIGSTOP)  # alive, never answering (a stuck or CPU-starved worker)
            t0 = time.monotonic()
            async with asyncio.timeout(20):  # without the bound: the calls wait for the worker forever
                out = list(await asyncio.gather(*(j.evaluate(it, METRICS) for it in its)))
            took = time.monotonic() - t0
            assert not j.offloaded and j.pids == ()  # given up after the calls it left unanswered
            out += [await j.evaluate(it, METRICS) for it in its]  # in-process, at once
            return out, took
        finally:
            await j.aclose()

    out, took = asyncio.run(go())
    assert out == expected * 2
    # each call falls back after ~0.5 s instead of the 30 s judge timeout
    assert took < _offload._SLOW_S * 4 + 2.0, took
    print(f"\n{len(its)} calls to a stopped worker judged in-process in {took:.2f} s")
    time.sleep(0.3)
    assert children() <= before  # the stopped worker was killed and reaped


def test_a_worker_that_cannot_start_is_given_up_and_judging_stays_in_process(
    eager: None, monkeypatch: pytest.MonkeyPatch
) -> None:
    its = items()
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in its]
    monkeypatch.setattr(sys, "executable", "/bin/false")  # every worker exits at once
    before = children()

    async def go() -> list[JudgeResult]:
        j = auto()
        try:
            out = [await j.evaluate(its[0], METRICS)]  # starts a worker, judged here meanwhile
            deadline = time.monotonic() + 10
            while j.pids or j._warming is not None:
                assert time.monotonic() < deadline, "the broken worker was never given up"
                out.append(await j.evaluate(its[0], METRICS))
                await asyncio.sleep(0.05)
            assert not j.offloaded
            out += [await j.evaluate(it, METRICS) for it in its]
            assert j.pids == () and j._remote is None  # no new worker before the retry delay
            return out
        finally:
            await j.aclose()

    out = asyncio.run(go())
    assert out[-len(its):] == expected and all(r == expected[0] for r in out[: -len(its)])
    time.sleep(0.3)
    assert children() <= before


def test_a_forked_child_judges_in_process_on_its_own(eager: None) -> None:
    it = EvalInput(QUESTION, CONTEXTS, "The Eiffel Tower was completed in 1889.")
    expected = LocalJudge().evaluate_sync(it, METRICS)

    async def offload(j: AutoProcessJudge) -> None:
        await until_offloaded(j, it)

    j = auto()
    loop = asyncio.new_event_loop()
    try:
        loop.run_until_complete(offload(j))
        pid = os.fork()
        if pid == 0:  # the child: the parent's worker is not its own
            code = 1
            try:
                signal.alarm(20)
                ok = not j.offloaded and j.pids == () and not _offload._METER.wanted
                result = asyncio.run(j.evaluate(it, METRICS))
                code = 0 if ok and result == expected else 3
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        assert j.offloaded  # the parent's worker still serves the parent
        assert loop.run_until_complete(j.evaluate(it, METRICS)) == expected
    finally:
        loop.run_until_complete(j.aclose())
        loop.close()


def test_a_guarded_stream_gets_the_same_warnings_once_judging_moved_to_a_worker(
    harness: Harness, eager: None
) -> None:
    answer = ("The Eiffel Tower was completed in 1889 for the World's Fair. It is 330 metres tall. "
              "It was designed by Leonardo da Vinci in 1920. Gustave Eiffel's company built it.")

    async def words() -> AsyncIterator[str]:
        for w in answer.split(" "):
            yield w + " "

    async def warnings() -> list[tuple[int, int]]:
        out = []
        async for ev in guard(words(), question=QUESTION, contexts=CONTEXTS):
            if ev.type == "warning":
                out.append((ev.data["char_start"], ev.data["char_end"]))
        return out

    harness.configure(judge_processes=0, preflight=False)
    expected = asyncio.run(warnings())
    assert expected  # the da Vinci sentence
    rt = harness.configure(preflight=False)
    seen = []
    deadline = time.monotonic() + 30
    while not any(getattr(j, "offloaded", False) for j in rt._judges.values()):
        assert time.monotonic() < deadline, "judging never moved to a worker"
        seen.append(asyncio.run(warnings()))
    seen += [asyncio.run(warnings()) for _ in range(3)]  # judged in the worker
    assert all(w == expected for w in seen)


def test_many_live_streams_start_the_worker_before_their_first_checkpoint(
    monkeypatch: pytest.MonkeyPatch
) -> None:
    # a crowd of judged streams: their checkpoints are on their way, so the worker starts before the first
    # of them instead of after the app's process judged a second's worth; fewer streams start nothing
    monkeypatch.setattr(service, "LOAD_STREAMS", 6)
    before = children()
    rt = streamjudge.configure(Settings(preflight=False, final_reconcile=False), downstream=_Discard(),
                               set_global=False)
    try:
        judge = rt.judge_for("checkpoint")
        assert isinstance(judge, AutoProcessJudge)
        sessions = [GuardSession(question=QUESTION, contexts=CONTEXTS, runtime=rt) for _ in range(6)]
        for s in sessions[:5]:
            s.start()
        time.sleep(0.3)
        assert judge.pids == () and children() <= before
        sessions[5].start()
        deadline = time.monotonic() + 20.0
        while not judge.offloaded:
            assert time.monotonic() < deadline, "the worker never took over"
            time.sleep(0.02)
        assert len(judge.pids) == 1
        # the streams' checkpoints go to it; their verdicts are the in-process judge's
        for s in sessions:
            s.accept("The sky is blue because of Rayleigh scattering. ")
            s.close_tail()
            s.finish()
        assert rt.force_flush(20_000)
    finally:
        rt.shutdown()
    assert children() <= before


def test_the_live_stream_count_tells_the_judges_once_per_crowd() -> None:
    class Pool:
        def __init__(self) -> None:
            self.prepared: list[object] = []

        def prepare_for_load(self, judge: object) -> bool:
            self.prepared.append(judge)
            return True

        def watch_loop(self) -> None:
            return None

    checkpoint, final = object(), object()
    pool = Pool()
    svc = service.JudgingService(pool=pool, processor=None,  # type: ignore[arg-type]
                                 judges=lambda kind: final if kind == "answer" else checkpoint)
    n = service.LOAD_STREAMS
    for _ in range(n - 1):
        svc.stream_opened()
    assert pool.prepared == []
    svc.stream_opened()
    assert pool.prepared == [checkpoint, final]  # each tier's judge, once
    for _ in range(10):
        svc.stream_opened()
        svc.stream_closed()
    assert len(pool.prepared) == 2  # the same crowd says nothing new
    for _ in range(n - n // 2):
        svc.stream_closed()
    for _ in range(n - n // 2):
        svc.stream_opened()
    assert len(pool.prepared) == 4  # it fell to half and came back: a stopped worker starts again


def test_the_wrappers_say_whether_the_judge_they_run_scores_sentences() -> None:
    # the guard joins a burst's windows into one checkpoint only for such a judge
    assert auto().scores_sentences is True and LocalJudge.scores_sentences is True
    assert AutoProcessJudge(RaisingJudge(), auto().spec).scores_sentences is False
    assert not getattr(RaisingJudge(), "scores_sentences", False)
