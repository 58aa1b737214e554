"""The judge pool: every job gets exactly one outcome, whatever the judge does."""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import Sequence

import pytest

from _fakes import BrokenJudge, FlakyJudge, GatedJudge, KeywordJudge
from streamjudge.judging.base import EvalInput, JudgeResult, Score
from streamjudge.judging.pool import JobOutcome, JudgeJob, JudgePool

ITEM = EvalInput("q", ("ctx",), "answer", kind="checkpoint")


class Collector:
    def __init__(self) -> None:
        self.outcomes: list[JobOutcome] = []
        self.threads: set[str] = set()
        self.lock = threading.Lock()

    def __call__(self, outcome: JobOutcome) -> None:
        with self.lock:
            self.outcomes.append(outcome)
            self.threads.add(threading.current_thread().name)

    def statuses(self) -> list[str]:
        return sorted(o.status for o in self.outcomes)


def job(judge, cb, **kw) -> JudgeJob:  # type: ignore[no-untyped-def]
    return JudgeJob(judge=judge, item=kw.pop("item", ITEM), metrics=("faithfulness",), callback=cb, **kw)


def test_judged_on_its_own_thread_and_flushes() -> None:
    pool = JudgePool()
    cb = Collector()
    for _ in range(5):
        assert pool.submit(job(KeywordJudge(), cb))
    assert pool.force_flush(5_000)
    assert cb.statuses() == ["judged"] * 5
    assert cb.threads == {"streamjudge-judge-pool"}
    pool.shutdown()


def test_concurrency_is_bounded() -> None:
    running = 0
    peak = 0

    class Counting(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            nonlocal running, peak
            running += 1
            peak = max(peak, running)
            await asyncio.sleep(0.02)
            running -= 1
            return JudgeResult("c", (Score("faithfulness", 1.0),))

    pool = JudgePool(concurrency=3)
    cb = Collector()
    for _ in range(12):
        pool.submit(job(Counting(), cb))
    assert pool.force_flush(5_000)
    assert peak == 3
    assert cb.statuses() == ["judged"] * 12
    pool.shutdown()


def test_transient_errors_are_retried_with_backoff_then_succeed() -> None:
    pool = JudgePool(max_retries=2, backoff_s=0.01)
    judge = FlakyJudge(failures=2)
    cb = Collector()
    pool.submit(job(judge, cb))
    assert pool.force_flush(5_000)
    assert cb.outcomes[0].status == "judged"
    assert cb.outcomes[0].attempts == 3
    pool.shutdown()


def test_retries_are_bounded_and_retry_after_is_honoured() -> None:
    pool = JudgePool(max_retries=1, backoff_s=0.001)
    judge = FlakyJudge(failures=5, retry_after=0.2)
    cb = Collector()
    t0 = time.monotonic()
    pool.submit(job(judge, cb))
    assert pool.force_flush(5_000)
    assert time.monotonic() - t0 >= 0.2
    assert cb.outcomes[0].status == "error"
    assert "503" in (cb.outcomes[0].error or "")
    assert judge.attempts == 2
    pool.shutdown()


def test_hanging_judge_times_out_raising_judge_is_an_error_garbage_is_an_error() -> None:
    pool = JudgePool(timeout_s=0.1)
    cb = Collector()
    pool.submit(job(BrokenJudge("hang"), cb))
    pool.submit(job(BrokenJudge("raise"), cb))
    pool.submit(job(BrokenJudge("garbage"), cb))
    assert pool.force_flush(5_000)
    assert cb.statuses() == ["error", "error", "timeout"]
    errors = sorted(o.error or "" for o in cb.outcomes if o.status == "error")
    assert "judge exploded" in errors[0]
    assert "returned str, not a JudgeResult" in errors[1]
    pool.shutdown()


def test_queue_full_drops_and_says_so() -> None:
    gate = threading.Event()

    pool = JudgePool(concurrency=1, queue_size=2)
    cb = Collector()
    accepted = [pool.submit(job(GatedJudge(gate), cb)) for _ in range(6)]
    # one running, two queued; the rest are refused at once
    assert accepted.count(False) >= 3
    gate.set()
    assert pool.force_flush(5_000)
    assert cb.statuses().count("dropped") == accepted.count(False)
    assert len(cb.outcomes) == 6
    pool.shutdown()


def _busy_pool(judge: GatedJudge) -> tuple[JudgePool, Collector]:
    """A one-slot pool whose slot a gated job holds: what is submitted next waits in the queue."""
    pool = JudgePool(concurrency=1)
    cb = Collector()
    pool.submit(job(judge, cb, stream_key=99))
    time.sleep(0.05)
    return pool, cb


def test_live_jobs_run_before_queued_final_passes() -> None:
    # a backlog of whole answers must not delay a checkpoint whose stream is still being read
    gate = threading.Event()
    judge = GatedJudge(gate)
    pool, cb = _busy_pool(judge)
    for i in range(3):
        pool.submit(job(judge, cb, item=EvalInput("q", (), f"final {i}", kind="answer")))
    pool.submit(job(judge, cb, live=True, item=EvalInput("q", (), "live 0")))
    pool.submit(job(judge, cb, item=EvalInput("q", (), "final 3", kind="answer")))
    pool.submit(job(judge, cb, live=True, item=EvalInput("q", (), "live 1")))
    gate.set()
    assert pool.force_flush(5_000)
    order = [c.answer for c in judge.calls][1:]
    assert order == ["live 0", "live 1", "final 0", "final 1", "final 2", "final 3"]
    assert cb.statuses() == ["judged"] * 7
    pool.shutdown()


def test_cancel_and_shutdown_reach_both_lanes() -> None:
    gate = threading.Event()
    pool = JudgePool(concurrency=1)
    cb = Collector()
    pool.submit(job(GatedJudge(gate), cb, stream_key=99))
    time.sleep(0.05)
    pool.submit(job(GatedJudge(gate), cb, stream_key=7, live=True))
    pool.submit(job(GatedJudge(gate), cb, stream_key=7))
    pool.submit(job(GatedJudge(gate), cb, stream_key=8))
    assert pool.cancel_stream(7) == 2
    assert pool.shutdown(timeout_millis=100) is False
    gate.set()
    assert sorted(cb.statuses()) == ["cancelled", "cancelled", "shutdown", "shutdown"]


def test_newer_checkpoint_supersedes_queued_older_one() -> None:
    gate = threading.Event()
    judge = GatedJudge(gate)
    pool, cb = _busy_pool(judge)
    for i in range(4):
        pool.submit(job(judge, cb, stream_key=7, coalesce=True, item=EvalInput("q", (), f"text {i}")))
    gate.set()
    assert pool.force_flush(5_000)
    assert cb.statuses().count("superseded") == 3
    assert [c.answer for c in judge.calls if c.answer.startswith("text")] == ["text 3"]
    pool.shutdown()


def test_a_superseded_outcome_reaches_a_dispatcher_that_fell_asleep(monkeypatch: pytest.MonkeyPatch) -> None:
    # the submitting thread is descheduled right after it merged a queued checkpoint into a newer one; the
    # dispatcher meanwhile judges the merged job and falls asleep. The older job's "superseded" must still be
    # delivered: left for the dispatcher after the merge's lock, nothing woke it again (its stream waited out
    # end_wait_s for the verdict, force_flush its whole deadline)
    gate = threading.Event()
    judge = GatedJudge(gate)
    pool, cb = _busy_pool(judge)
    pool.submit(job(judge, cb, stream_key=7, coalesce=True, item=EvalInput("q", (), "text 0")))
    real_finish_later = pool._finish_later

    def descheduled(done: JudgeJob, outcome: JobOutcome, **kw: object) -> None:
        if outcome.status == "superseded":
            gate.set()
            deadline = time.monotonic() + 2
            while not (pool._sleeping and not pool._queued) and time.monotonic() < deadline:
                time.sleep(0.005)
        real_finish_later(done, outcome, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(pool, "_finish_later", descheduled)
    pool.submit(job(judge, cb, stream_key=7, coalesce=True, item=EvalInput("q", (), "text 1")))
    gate.set()
    assert pool.force_flush(2_000)
    assert cb.statuses() == ["judged", "judged", "superseded"]
    pool.shutdown()


def test_sampling_is_per_trace_and_deterministic() -> None:
    pool = JudgePool(sample_rate=0.5)
    cb = Collector()
    keys = [(i * 0x9E3779B97F4A7C15) & ((1 << 128) - 1) for i in range(1, 201)]
    for k in keys:
        pool.submit(job(KeywordJudge(), cb, sample_key=k))
    assert pool.force_flush(5_000)
    sampled = cb.statuses().count("sampled_out")
    assert 50 < sampled < 150
    pool.shutdown()


def test_per_stream_budget() -> None:
    pool = JudgePool(per_stream_budget=3)
    cb = Collector()
    for _ in range(5):
        pool.submit(job(KeywordJudge(), cb, stream_key=1))
    pool.submit(job(KeywordJudge(), cb, stream_key=2))
    assert pool.force_flush(5_000)
    assert cb.statuses().count("budget_exhausted") == 2
    pool.shutdown()


def test_cancel_stream_cancels_queued_and_running_work() -> None:
    pool = JudgePool(concurrency=1)
    cb = Collector()
    pool.submit(job(BrokenJudge("hang"), cb, stream_key=5))
    pool.submit(job(KeywordJudge(), cb, stream_key=5))
    pool.submit(job(KeywordJudge(), cb, stream_key=6))
    time.sleep(0.05)
    assert pool.cancel_stream(5) == 2
    assert pool.force_flush(5_000)
    assert cb.statuses() == ["cancelled", "cancelled", "judged"]
    pool.shutdown()


def test_shutdown_drains_within_deadline_then_reports_the_rest() -> None:
    pool = JudgePool(concurrency=1, timeout_s=60)
    cb = Collector()
    judge = KeywordJudge()
    pool.submit(job(judge, cb))
    pool.submit(job(BrokenJudge("hang"), cb))
    pool.submit(job(judge, cb))
    t0 = time.monotonic()
    assert pool.shutdown(timeout_millis=300) is False
    assert time.monotonic() - t0 < 5
    assert len(cb.outcomes) == 3  # nothing lost: every job has an outcome
    assert "judged" in cb.statuses()
    assert {"shutdown"} & set(cb.statuses())
    assert judge.closed  # judges are closed with the pool
    # after shutdown, submissions are refused with a reason
    assert pool.submit(job(judge, cb)) is False
    assert cb.outcomes[-1].status == "shutdown"


def test_judge_io_is_not_traced() -> None:
    from opentelemetry.instrumentation.utils import is_instrumentation_enabled

    seen: list[object] = []

    class Peek(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            seen.append(not is_instrumentation_enabled())
            return self._score(item, metrics)

    pool = JudgePool()
    pool.submit(job(Peek(), Collector()))
    assert pool.force_flush(5_000)
    assert seen == [True]
    pool.shutdown()


def test_each_call_runs_in_a_quiet_context_of_its_own() -> None:
    # a call's task runs in a copy of one context made once with instrumentation suppressed: each call
    # still starts from that context, whatever an earlier call set in its own
    import contextvars

    from opentelemetry import trace
    from opentelemetry.instrumentation.utils import is_instrumentation_enabled

    var: contextvars.ContextVar[str | None] = contextvars.ContextVar("set_by_a_judge", default=None)
    seen: list[tuple[bool, str | None, bool]] = []

    class Peek(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            seen.append((is_instrumentation_enabled(), var.get(), trace.get_current_span().is_recording()))
            var.set("set by a call")
            return self._score(item, metrics)

    pool = JudgePool(concurrency=1)
    cb = Collector()
    for _ in range(3):
        pool.submit(job(Peek(), cb))
    assert pool.force_flush(5_000)
    assert seen == [(False, None, False)] * 3
    assert cb.statuses() == ["judged"] * 3
    pool.shutdown()


def test_fork_safe() -> None:
    pool = JudgePool()
    cb = Collector()
    pool.submit(job(KeywordJudge(), cb))
    assert pool.force_flush(5_000)
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: the pool works with a fresh thread
        try:
            got: list[str] = []
            pool.submit(job(KeywordJudge(), lambda o: got.append(o.status)))
            ok = pool.force_flush(5_000)
            os.write(w, f"{ok}:{','.join(got)}".encode())
        finally:
            os._exit(0)
    os.close(w)
    os.waitpid(pid, 0)
    assert os.read(r, 100).decode() == "True:judged"
    pool.shutdown()


def test_a_judge_error_that_echoes_a_key_is_redacted(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EVAL_API_KEY", "sk-test-0123456789abcdef")

    class Echo(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            raise RuntimeError("401 Unauthorized: invalid key sk-test-0123456789abcdef")

    got: list[JobOutcome] = []
    pool = JudgePool()
    try:
        pool.submit(JudgeJob(Echo(), EvalInput("q", ("c",), "a"), ("faithfulness",), got.append))
        assert pool.force_flush(5_000)
    finally:
        pool.shutdown(5_000)
    (outcome,) = got
    assert outcome.status == "error" and outcome.error
    assert "0123456789abcdef" not in outcome.error


def test_a_judge_raising_systemexit_gets_an_outcome_and_the_pool_goes_on() -> None:
    class Exits(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            raise SystemExit(3)

    got: list[JobOutcome] = []
    pool = JudgePool()
    try:
        pool.submit(JudgeJob(Exits(), EvalInput("q", ("c",), "a"), ("faithfulness",), got.append))
        pool.submit(JudgeJob(KeywordJudge(), EvalInput("q", ("c",), "a"), ("faithfulness",), got.append))
        assert pool.force_flush(5_000)
        assert pool.depth == 0
    finally:
        pool.shutdown(5_000)
    assert sorted(o.status for o in got) == ["error", "judged"]


def test_a_result_whose_scores_are_not_scores_is_an_error() -> None:
    class Wrong(KeywordJudge):
        async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            return JudgeResult("wrong", ({"name": "faithfulness", "value": 1.0},))  # type: ignore[arg-type]

    got: list[JobOutcome] = []
    pool = JudgePool()
    try:
        pool.submit(JudgeJob(Wrong(), EvalInput("q", ("c",), "a"), ("faithfulness",), got.append))
        assert pool.force_flush(5_000)
    finally:
        pool.shutdown(5_000)
    (outcome,) = got
    assert outcome.status == "error" and "not a Score" in (outcome.error or "")


def test_a_sleeping_dispatcher_is_woken_once_however_many_jobs_arrive_before_it_runs() -> None:
    # each wake-up is a syscall on the submitting (token-streaming) thread: while the woken dispatcher has
    # not run yet (its thread waits for the GIL, or here for a callback), more jobs must not send more
    pool = JudgePool()
    cb = Collector()
    pool.submit(job(KeywordJudge(), cb))
    assert pool.force_flush(5_000)
    deadline = time.monotonic() + 5
    while not pool._sleeping and time.monotonic() < deadline:
        time.sleep(0.01)
    loop = pool._loop
    assert loop is not None and pool._sleeping
    entered, gate = threading.Event(), threading.Event()

    def hold_up() -> None:  # the pool's thread is busy elsewhere; its dispatcher still sleeps
        entered.set()
        gate.wait(5)

    loop.call_soon_threadsafe(hold_up)
    assert entered.wait(5)
    wakes = 0
    bell = pool._bell
    assert bell is not None

    class Counting:
        def ring(self) -> None:
            nonlocal wakes
            wakes += 1
            bell.ring()

    pool._bell = Counting()  # type: ignore[assignment]
    try:
        for _ in range(5):
            assert pool.submit(job(KeywordJudge(), cb))
    finally:
        gate.set()
    assert pool.force_flush(5_000)
    assert cb.statuses() == ["judged"] * 6
    assert wakes == 1
    pool.shutdown()


def test_force_flush_is_woken_when_the_pool_is_idle_not_per_job() -> None:
    # a thread waiting in force_flush that is woken per finished job takes the GIL from the pool's thread
    # on every call (2 worker processes on 2 cores then used 1.0-1.6 of them instead of 1.7-1.9)
    pool = JudgePool(concurrency=4)
    wakes = 0
    idle = pool._idle
    real = idle.notify_all

    def counting() -> None:
        nonlocal wakes
        wakes += 1
        real()

    idle.notify_all = counting  # type: ignore[method-assign]
    gate = threading.Event()
    cb = Collector()
    for _ in range(40):
        assert pool.submit(job(GatedJudge(gate), cb))
    flushed: list[bool] = []
    waiter = threading.Thread(target=lambda: flushed.append(pool.force_flush(10_000)))
    waiter.start()
    gate.set()
    waiter.join(10)
    assert flushed == [True]
    assert cb.statuses() == ["judged"] * 40
    assert 1 <= wakes <= 2, f"{wakes} wake-ups for 40 jobs"
    pool.shutdown()


def test_cancel_stream_cancels_a_job_taken_from_the_queue_but_not_started_yet() -> None:
    """The pool's thread takes a job off the queue, then starts its task: a stream cancelled in between
    (its client left) still has that job cancelled, instead of judged for as long as the judge takes."""
    pool = JudgePool(concurrency=1)
    cb = Collector()
    counts: list[int] = []
    take = pool._pop

    def take_then_cancel() -> JudgeJob | None:
        got = take()
        if got is not None:
            counts.append(pool.cancel_stream(got.stream_key))  # the app's thread, at the worst moment
        return got

    pool._pop = take_then_cancel  # type: ignore[method-assign]
    t0 = time.monotonic()
    pool.submit(job(KeywordJudge(delay_s=5.0), cb, stream_key=9))
    assert pool.force_flush(10_000)
    assert time.monotonic() - t0 < 3.0
    assert counts == [1]
    assert cb.statuses() == ["cancelled"]
    pool.shutdown()


def test_a_call_left_for_the_pool_runs_on_its_thread_and_force_flush_waits_for_what_it_submits() -> None:
    """A stream leaves its checkpoints' spans and requests to the pool's thread (see ``call_soon``): a
    flush that returned before that call ran would miss the requests it makes."""
    pool = JudgePool()  # no job yet: the call starts the pool's thread
    cb = Collector()
    ran: list[str] = []

    def work() -> None:
        ran.append(threading.current_thread().name)
        time.sleep(0.05)  # the flush below is already waiting
        pool.submit(job(KeywordJudge(), cb))

    pool.call_soon(work)
    assert pool.force_flush(5_000)
    assert ran == ["streamjudge-judge-pool"]
    assert cb.statuses() == ["judged"]
    pool.shutdown()


def test_a_call_left_for_the_pool_that_fails_is_logged_and_the_pool_goes_on(
    caplog: pytest.LogCaptureFixture,
) -> None:
    pool = JudgePool()
    cb = Collector()

    def broken() -> None:
        raise RuntimeError("boom")

    pool.call_soon(broken)
    pool.submit(job(KeywordJudge(), cb))
    assert pool.force_flush(5_000)
    assert cb.statuses() == ["judged"]
    assert "a call left for the judge pool failed" in caplog.text
    pool.shutdown()


def test_a_call_left_for_a_shut_down_pool_runs_at_once_on_the_callers_thread() -> None:
    pool = JudgePool()
    pool.shutdown()
    ran: list[str] = []
    pool.call_soon(lambda: ran.append(threading.current_thread().name))
    assert ran == [threading.current_thread().name]
