"""The judge pool with a worker's judge: its calls run without a task each (``ProcessJudge.begin``) and keep
every outcome a coroutine judge's calls have: judged with the in-process scores, timed out at the judge
timeout (a stuck worker replaced), cancelled and shut down exactly once (late replies go to nobody),
transient errors retried; ``auto``'s stopped or killed worker judged in-process instead."""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Sequence
from typing import Any

import pytest
from test_auto_process_judge import auto, eager  # noqa: F401  (a fixture)
from test_process_judge import CONTEXTS, QUESTION, children, items, judge

from streamjudge.config import Settings
from streamjudge.judging.base import METRICS, EvalInput, JudgeResult, TransientJudgeError
from streamjudge.judging.judges import _offload
from streamjudge.judging.judges._process import JudgeSpec, ProcessJudge
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.judging.pool import JobOutcome, JudgeJob, JudgePool


class Outcomes:
    """Every outcome the pool delivers, by job number: each job must get exactly one."""

    def __init__(self) -> None:
        self.by_job: dict[int, list[JobOutcome]] = {}

    def submit(self, pool: JudgePool, judge: Any, its: Sequence[EvalInput], stream_key: int = 0) -> None:
        for it in its:
            n = len(self.by_job)
            self.by_job[n] = []
            assert pool.submit(JudgeJob(judge, it, METRICS, self.by_job[n].append, stream_key=stream_key))

    def once(self) -> list[JobOutcome]:
        assert all(len(v) == 1 for v in self.by_job.values()), self.by_job
        return [v[0] for _, v in sorted(self.by_job.items())]


@pytest.fixture
def task_runs(monkeypatch: pytest.MonkeyPatch) -> list[JudgeJob]:
    """The jobs the pool ran in a task of their own (``_run``), counted."""
    runs: list[JudgeJob] = []
    real = JudgePool._run

    async def counted(self: JudgePool, job: JudgeJob, first_error: TransientJudgeError | None = None) -> None:
        runs.append(job)
        await real(self, job, first_error)

    monkeypatch.setattr(JudgePool, "_run", counted)
    return runs


def stop_after_one_call(pool: JudgePool, j: ProcessJudge, out: Outcomes, it: EvalInput) -> int:
    """One call judged (the worker is up), then the worker stopped: alive, answering nothing."""
    out.submit(pool, j, [it])
    assert pool.force_flush(30_000)
    (pid,) = j.pids
    os.kill(pid, signal.SIGSTOP)
    return pid


def until(cond: Any, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.002)


def test_a_worker_s_calls_run_without_a_task_each_and_give_the_in_process_scores(task_runs: list[Any]) -> None:
    j = judge()
    pool = JudgePool(concurrency=8)
    out = Outcomes()
    its = items()
    try:
        out.submit(pool, j, its)
        assert pool.force_flush(30_000)
        pids = j.pids
    finally:
        pool.shutdown(10_000)  # closes the judges it ran
    got = out.once()
    assert [o.status for o in got] == ["judged"] * len(its)
    assert [o.result for o in got] == [LocalJudge().evaluate_sync(it, METRICS) for it in its]
    assert all(o.attempts == 1 and o.latency_s > 0 for o in got)
    assert task_runs == []  # without begin() every call above was a task
    assert not pool._running and pool.depth == 0
    time.sleep(0.2)
    assert not set(pids) & children()


def test_a_call_to_a_stuck_worker_times_out_at_the_judge_timeout_and_the_worker_is_replaced() -> None:
    # generous: a worker's start (spawn + imports) counts against its first call's deadline, and CI's
    # cores are shared; only the stuck calls ever reach it
    j = judge(judge_timeout_s=5.0)  # the worker counts as stuck after one judge timeout
    pool = JudgePool(timeout_s=5.0, max_retries=0)
    out = Outcomes()
    it = EvalInput(QUESTION, CONTEXTS, "The tower is 330 metres tall.")
    try:
        stuck = stop_after_one_call(pool, j, out, it)
        t0 = time.monotonic()
        out.submit(pool, j, [it, it])
        assert pool.force_flush(30_000)
        took = time.monotonic() - t0
        until(lambda: stuck not in j.pids)  # killed when its call was given up, then restarted
        out.submit(pool, j, [it])
        assert pool.force_flush(30_000)
    finally:
        pool.shutdown(10_000)
    got = out.once()
    assert [o.status for o in got] == ["judged", "timeout", "timeout", "judged"]
    assert got[1].error == "judge call exceeded 5s"
    assert took >= 5.0, took  # given up at the deadline, not before
    until(lambda: stuck not in children())


class FlakyJudge:
    """In the worker: fails each answer once with a retryable error, "always" every time."""

    name = "flaky"

    def __init__(self) -> None:
        self.seen: set[str] = set()

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        if item.answer == "always" or item.answer not in self.seen:
            self.seen.add(item.answer)
            raise TransientJudgeError("429 from judge")
        return JudgeResult(self.name, ())

    async def aclose(self) -> None:
        pass


def test_a_transient_error_from_a_worker_is_retried_as_a_coroutine_judge_s() -> None:
    j = ProcessJudge(JudgeSpec(f"{__name__}:FlakyJudge", Settings()), processes=1)
    pool = JudgePool(max_retries=2, backoff_s=0.01)
    out = Outcomes()
    try:
        out.submit(pool, j, [EvalInput(QUESTION, CONTEXTS, a) for a in ("once", "always")])
        assert pool.force_flush(30_000)
    finally:
        pool.shutdown(10_000)
    judged, failed = out.once()
    assert (judged.status, judged.attempts, judged.result) == ("judged", 2, JudgeResult("flaky", ()))
    assert (failed.status, failed.attempts) == ("error", 3)
    assert "429 from judge" in (failed.error or "")


@pytest.mark.parametrize("how", ["cancel_stream", "shutdown"])
def test_calls_in_flight_are_cancelled_once_and_their_late_replies_go_to_nobody(how: str) -> None:
    j = judge()
    pool = JudgePool(concurrency=8)
    out = Outcomes()
    it = EvalInput(QUESTION, CONTEXTS, "The tower is 330 metres tall.")
    try:
        pid = stop_after_one_call(pool, j, out, it)  # the calls below stay in flight
        out.submit(pool, j, [it, it, it], stream_key=7)
        until(lambda: j.in_flight == 3)
        if how == "cancel_stream":
            assert pool.cancel_stream(7) == 3
            assert pool.force_flush(10_000)
            os.kill(pid, signal.SIGCONT)  # their replies come now, to nobody
            until(lambda: not j.in_flight)
            out.submit(pool, j, [it])
            assert pool.force_flush(10_000)
        else:
            assert not pool.shutdown(300)  # not drained: the rest is given "shutdown"
            with contextlib.suppress(ProcessLookupError):  # its judge closed: the worker may be gone
                os.kill(pid, signal.SIGCONT)
    finally:
        pool.shutdown(10_000)
    got = out.once()
    if how == "cancel_stream":
        assert [o.status for o in got] == ["judged", "cancelled", "cancelled", "cancelled", "judged"]
    else:
        assert [o.status for o in got] == ["judged", "shutdown", "shutdown", "shutdown"]
    assert not pool._running


@pytest.mark.parametrize("signum", [signal.SIGSTOP, signal.SIGKILL])
def test_auto_s_stopped_or_killed_worker_costs_no_verdict_through_the_pool(
    eager: None, task_runs: list[Any], signum: int  # noqa: F811
) -> None:
    its = items()[:8]
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in its]
    before = children()
    j = auto()
    pool = JudgePool(concurrency=8)
    warm = Outcomes()
    out = Outcomes()
    try:
        deadline = time.monotonic() + 20
        while not j.offloaded:  # in-process calls (tasks) until the worker took over
            assert time.monotonic() < deadline, "the worker never took over"
            warm.submit(pool, j, its[:1])
            assert pool.force_flush(10_000)
            time.sleep(0.02)
        in_tasks = len(task_runs)
        (pid,) = j.pids
        os.kill(pid, signum)
        t0 = time.monotonic()
        out.submit(pool, j, its)
        assert pool.force_flush(20_000)
        took = time.monotonic() - t0
    finally:
        pool.shutdown(10_000)
    got = out.once()
    assert [o.status for o in got] == ["judged"] * len(its)
    assert [o.result for o in got] == expected
    assert len(task_runs) == in_tasks  # sent with begin(): judged here by the judge's own fallback
    assert took < _offload._SLOW_S * 4 + 2.0, took  # the slow bound, not the 30 s judge timeout
    warm.once()
    time.sleep(0.3)
    assert children() <= before


# --- a job queued while calls are out: taken with their reply, not with a wake-up of its own ---------------


class _Handle:
    def cancel(self) -> None:
        pass

    def tick(self, now: float) -> None:
        pass


class HeldJudge:
    """A worker-like judge (``begin``): the first call answers on the pool loop's next pass; later ones wait
    until the test answers them (``answer``)."""

    name = "held"

    def __init__(self) -> None:
        self.begun: list[str] = []
        self.waiting: list[Any] = []
        self.loop: Any = None

    def begin(self, item: EvalInput, metrics: Sequence[str], done: Any) -> _Handle:
        import asyncio

        self.loop = asyncio.get_running_loop()
        self.begun.append(item.answer)
        if len(self.begun) == 1:
            self.loop.call_soon(done, self.result(), None)
        else:
            self.waiting.append(done)
        return _Handle()

    @staticmethod
    def result() -> JudgeResult:
        from streamjudge.judging.base import Score

        return JudgeResult("held", (Score("faithfulness", 1.0),))

    def answer(self) -> None:
        done = self.waiting.pop(0)
        self.loop.call_soon_threadsafe(done, self.result(), None)

    def answer_transient(self) -> None:
        done = self.waiting.pop(0)
        self.loop.call_soon_threadsafe(done, None, TransientJudgeError("busy"))

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        return self.result()  # a retry runs in a task, as the pool retries any call

    async def aclose(self) -> None:
        pass


class CountedBell:
    """The pool's wake-up, counted."""

    def __init__(self, real: Any) -> None:
        self.real, self.rings = real, 0

    def ring(self) -> None:
        self.rings += 1
        self.real.ring()


def _held_pool() -> tuple[JudgePool, HeldJudge, CountedBell, Outcomes]:
    pool = JudgePool(concurrency=4, cpu_share=0.0)
    j = HeldJudge()
    out = Outcomes()
    out.submit(pool, j, [EvalInput(QUESTION, CONTEXTS, "first", "checkpoint")])
    until(lambda: len(out.by_job[0]) == 1)  # answered at once: the pool has measured a fast call
    out.submit(pool, j, [EvalInput(QUESTION, CONTEXTS, "held", "checkpoint")])
    until(lambda: len(j.waiting) == 1 and pool._sleeping)  # a call out, the dispatcher asleep
    bell = CountedBell(pool._bell)
    pool._bell = bell  # type: ignore[assignment]
    return pool, j, bell, out


@pytest.mark.parametrize("via", ["submit", "call_soon"])
@pytest.mark.parametrize("ends", ["answer", "answer_transient"])
def test_a_job_queued_while_a_fast_call_is_out_goes_when_that_call_ends_without_a_wake_up(
    ends: str, via: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # the call ends with its reply, or with a transient error (retried in a task: no call out any more, and
    # no reply to come). The sweep's tick is out of reach: only the call's end can take the job in time.
    # The job is submitted, or left to the pool's thread to submit (a stream's checkpoint, see call_soon)
    from streamjudge.judging import pool as pool_module

    monkeypatch.setattr(pool_module, "_SWEEP_S", 30.0)
    pool, j, bell, out = _held_pool()
    try:
        nxt = [EvalInput(QUESTION, CONTEXTS, "next", "checkpoint")]
        if via == "submit":
            out.submit(pool, j, nxt)
        else:
            pool.call_soon(lambda: out.submit(pool, j, nxt))
        time.sleep(0.01)
        assert j.begun == ["first", "held"]  # it waits for the call out: no wake-up came
        getattr(j, ends)()
        until(lambda: j.begun == ["first", "held", "next"], timeout=5)  # the call's end took it
        assert bell.rings == 0
        j.answer()
        assert pool.force_flush(10_000)
        assert [o.status for o in out.once()] == ["judged"] * 3
    finally:
        pool.shutdown(5_000)


def _next_starts_unanswered(pool: JudgePool, j: HeldJudge, out: Outcomes) -> float:
    """Queue a third job with the held call still unanswered; seconds until it started. Then answer both."""
    t0 = time.monotonic()
    out.submit(pool, j, [EvalInput(QUESTION, CONTEXTS, "next", "checkpoint")])
    until(lambda: j.begun == ["first", "held", "next"], timeout=5)
    took = time.monotonic() - t0
    j.answer()
    j.answer()
    assert pool.force_flush(10_000)
    return took


def test_a_job_queued_behind_a_call_that_does_not_answer_waits_no_longer_than_the_sweep() -> None:
    pool, j, bell, out = _held_pool()
    try:
        assert _next_starts_unanswered(pool, j, out) < 1.0  # the sweep's tick (50 ms), not a timeout
        assert bell.rings == 0
    finally:
        pool.shutdown(5_000)


def test_a_job_queued_while_slow_calls_are_out_wakes_the_dispatcher_at_once() -> None:
    pool, j, bell, out = _held_pool()
    try:
        pool._call_s = 1.0  # the calls out take a second: the job does not wait for them
        _next_starts_unanswered(pool, j, out)
        assert bell.rings == 1
    finally:
        pool.shutdown(5_000)

