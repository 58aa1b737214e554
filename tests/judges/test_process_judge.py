"""The process judge: the local judge in real worker processes gives the in-process judge's results, survives
a killed worker, leaves no process behind, and gives a forked child workers of its own."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from conftest import Harness, cyclic_garbage
from streamjudge import StreamEvent, guard, semconv
from streamjudge.config import ConfigError, Settings, load_settings
from streamjudge.judging.base import METRICS, EvalInput, JudgeError, JudgeResult, TransientJudgeError
from streamjudge.judging.judges import _process, create_judge
from streamjudge.judging.judges._process import JudgeSpec, ProcessJudge, _stop_all, worker_cpu_cap
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.judging.pool import JobOutcome, JudgeJob, JudgePool

QUESTION = "When was the Eiffel Tower completed, and how tall is it?"
CONTEXTS = (
    "The Eiffel Tower in Paris was completed in 1889 for the World's Fair. It is 330 metres tall.",
    "Gustave Eiffel's company designed and built the tower.",
)
ANSWERS = (
    "The Eiffel Tower was completed in 1889. It is 330 metres tall.",
    "The Eiffel Tower was completed in 1899 by Gustave Eiffel's company.",
    "It is not 330 metres tall. The tower was painted green in 2001.",
    "Here is what I found.",
    "",
)


def items() -> list[EvalInput]:
    out: list[EvalInput] = []
    for i, answer in enumerate(ANSWERS):
        for contexts in (CONTEXTS, CONTEXTS[:1], (f"Report {i}: the plant produced {1000 + i} units in 1990.",)):
            out.append(EvalInput(QUESTION, contexts, answer, kind="checkpoint",
                                 prefix="The tower stands in Paris. ", offset=27))
            out.append(EvalInput(QUESTION, contexts, answer, kind="answer", reference=ANSWERS[0]))
    return out


def judge(processes: int = 1, **settings: object) -> ProcessJudge:
    return ProcessJudge(JudgeSpec("local", Settings(**settings), "checkpoint"), processes=processes)  # type: ignore[arg-type]


def children() -> set[int]:
    """This process's child processes (zombies included: a child not yet reaped is still listed)."""
    out: set[int] = set()
    for tid in os.listdir("/proc/self/task"):
        try:
            with open(f"/proc/self/task/{tid}/children") as f:
                out.update(int(p) for p in f.read().split())
        except FileNotFoundError:  # the thread ended since the listing (the hold-timeout sweeper does)
            continue
    return out


async def gather(j: ProcessJudge, its: Sequence[EvalInput], metrics: Sequence[str]) -> list[JudgeResult]:
    return list(await asyncio.gather(*(j.evaluate(it, metrics) for it in its)))


def test_results_equal_the_in_process_local_judge() -> None:
    its = items()
    # contexts past a pipe's buffer: the request goes out in pieces, as the pipe takes them
    big = (CONTEXTS[0] + " The tower has three levels for visitors." * 8000,)
    its.append(EvalInput(QUESTION, big, ANSWERS[1], kind="checkpoint"))
    expected = [LocalJudge().evaluate_sync(it, METRICS) for it in its]

    async def go() -> tuple[list[JudgeResult], list[JudgeResult]]:
        j = judge(processes=2)
        try:
            first = await gather(j, its, METRICS)
            again = await gather(j, its, METRICS)  # contexts now known to the workers by id
            return first, again
        finally:
            await j.aclose()

    first, again = asyncio.run(go())
    assert first == expected
    assert again == expected
    assert any(s.value is not None and s.value < 1 for r in expected for s in r.scores)  # not all alike


def test_a_cancelled_call_s_late_reply_goes_to_nobody() -> None:
    good, bad = (EvalInput(QUESTION, CONTEXTS, a) for a in ANSWERS[:2])

    async def go() -> JudgeResult:
        j = judge()
        try:
            await j.evaluate(good, METRICS)
            task = asyncio.ensure_future(j.evaluate(good, METRICS))
            await asyncio.sleep(0)  # sent, not answered yet
            task.cancel()
            return await j.evaluate(bad, METRICS)
        finally:
            await j.aclose()

    assert asyncio.run(go()) == LocalJudge().evaluate_sync(bad, METRICS)


def test_a_worker_whose_parent_went_before_its_first_reply_exits_quietly() -> None:
    # a forked child that starts a worker and exits at once leaves the worker writing its hello to a pipe
    # nobody reads: that is no error of the worker's (it printed a BrokenPipeError traceback before)
    req_r, req_w = os.pipe()
    rep_r, rep_w = os.pipe()
    os.close(rep_r)  # the parent is gone: its reply pipe has no reader
    boot = ("import sys; from streamjudge.judging.judges._process import _worker_main; "
            "_worker_main(int(sys.argv[1]), int(sys.argv[2]))")
    try:
        proc = subprocess.run([sys.executable, "-c", boot, str(req_r), str(rep_w)], pass_fds=(req_r, rep_w),
                              capture_output=True, text=True, timeout=60, check=False)
    finally:
        for fd in (req_r, req_w, rep_w):
            os.close(fd)
    assert proc.returncode == 0 and "Traceback" not in proc.stderr, proc.stderr


def test_a_killed_worker_fails_its_call_then_a_new_worker_judges() -> None:
    it = EvalInput(QUESTION, CONTEXTS, ANSWERS[1])
    expected = LocalJudge().evaluate_sync(it, METRICS)

    async def go() -> None:
        j = judge()
        try:
            assert await j.evaluate(it, METRICS) == expected
            (pid,) = j.pids
            os.kill(pid, signal.SIGKILL)
            with pytest.raises(JudgeError, match=rf"judge worker {pid} died"):
                await j.evaluate(it, METRICS)
            assert await j.evaluate(it, METRICS) == expected
            assert j.pids and j.pids != (pid,)
            assert pid not in children()  # reaped, not a zombie
        finally:
            await j.aclose()

    asyncio.run(go())


def test_the_pool_records_an_error_for_a_killed_worker_and_judges_the_next_job() -> None:
    j = judge()
    pool = JudgePool(concurrency=4, max_retries=0)
    outcomes: list[JobOutcome] = []
    it = EvalInput(QUESTION, CONTEXTS, ANSWERS[0])

    def run_one(before_outcome: Callable[[], None] = lambda: None) -> JobOutcome:
        pool.submit(JudgeJob(j, it, ("faithfulness",), outcomes.append))
        before_outcome()
        assert pool.force_flush(30_000)
        return outcomes[-1]

    def kill_while_in_flight() -> None:
        # a stopped worker cannot answer: the call is surely in flight when the worker dies
        deadline = time.monotonic() + 30
        while not j.in_flight and time.monotonic() < deadline:
            time.sleep(0.001)
        assert j.in_flight == 1
        os.kill(pid, signal.SIGKILL)

    try:
        assert run_one().status == "judged"
        (pid,) = j.pids
        os.kill(pid, signal.SIGSTOP)
        failed = run_one(kill_while_in_flight)
        assert failed.status == "error" and "died" in (failed.error or "")
        recovered = run_one()
        assert recovered.status == "judged"
        assert recovered.result == LocalJudge().evaluate_sync(it, ("faithfulness",))
        pids = j.pids
        assert pids
    finally:
        pool.shutdown(10_000)  # closes the judges it ran
    assert not set(pids) & children()


def test_aclose_stops_and_reaps_every_worker() -> None:
    async def go() -> tuple[int, ...]:
        j = judge(processes=2)
        await gather(j, items()[:4], ("faithfulness",))
        pids = j.pids
        assert len(pids) == 2 and set(pids) <= children()
        await j.aclose()
        with pytest.raises(JudgeError, match="closed"):
            await j.evaluate(items()[0], ("faithfulness",))
        return pids

    pids = asyncio.run(go())
    assert not set(pids) & children()


def test_both_tiers_of_one_settings_share_the_workers() -> None:
    s = Settings(judge_processes=1)
    checkpoint = create_judge("local", s, tier="checkpoint")
    final = create_judge("local", s, tier="final")
    assert isinstance(checkpoint, ProcessJudge) and isinstance(final, ProcessJudge)
    it = items()[1]

    async def go() -> None:
        assert checkpoint.pids == final.pids
        assert await final.evaluate(it, METRICS) == LocalJudge().evaluate_sync(it, METRICS)
        await checkpoint.aclose()
        assert await final.evaluate(it, METRICS) == LocalJudge().evaluate_sync(it, METRICS)
        pids = final.pids
        await final.aclose()
        assert not set(pids) & children()

    asyncio.run(go())


def test_a_forked_child_judges_with_workers_of_its_own() -> None:
    it = EvalInput(QUESTION, CONTEXTS, ANSWERS[1])
    expected = LocalJudge().evaluate_sync(it, METRICS)
    j = judge()

    async def use() -> tuple[JudgeResult, tuple[int, ...]]:
        return await j.evaluate(it, METRICS), j.pids

    try:
        result, parent_pids = asyncio.run(use())
        assert result == expected
        pid = os.fork()
        if pid == 0:  # the child: like a gunicorn worker forked after configure
            code = 1
            try:
                got, child_pids = asyncio.run(use())
                mine = children()
                asyncio.run(j.aclose())
                ok = (got == expected and child_pids and not set(child_pids) & set(parent_pids)
                      and set(child_pids) <= mine and not set(child_pids) & children())
                code = 0 if ok else 2
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        # the parent's workers were not disturbed by the child
        result, pids_after = asyncio.run(use())
        assert result == expected and pids_after == parent_pids
    finally:
        asyncio.run(j.aclose())


class RaisingJudge:
    """Fails the way a flaky judge does: the error crosses the process boundary with its kind."""

    name = "raising"

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        if "transient" in item.answer:
            raise TransientJudgeError("503 from judge", retry_after=1.5)
        raise RuntimeError("judge exploded")

    async def aclose(self) -> None:
        pass


def test_judge_errors_keep_their_kind_and_a_judge_that_cannot_be_built_says_why() -> None:
    async def go() -> None:
        raising = ProcessJudge(JudgeSpec(f"{__name__}:RaisingJudge", Settings()), processes=1)
        missing = ProcessJudge(JudgeSpec("no_such_module_xyz:Judge", Settings()), processes=1)
        try:
            with pytest.raises(TransientJudgeError, match="503") as info:
                await raising.evaluate(EvalInput(QUESTION, CONTEXTS, "transient"), METRICS)
            assert info.value.retry_after == 1.5
            with pytest.raises(JudgeError, match="RuntimeError: judge exploded") as plain:
                await raising.evaluate(EvalInput(QUESTION, CONTEXTS, "other"), METRICS)
            assert not isinstance(plain.value, TransientJudgeError)
            with pytest.raises(JudgeError, match=r"cannot be built in a worker.*no_such_module_xyz"):
                await missing.evaluate(EvalInput(QUESTION, CONTEXTS, "x"), METRICS)
        finally:
            await raising.aclose()
            await missing.aclose()

    asyncio.run(go())


def test_a_failed_call_leaves_its_request_to_refcounting_not_to_the_cyclic_gc() -> None:
    # the call's future held the error, whose traceback held the call's frame, whose locals held the
    # future and the request: every failed call kept its contexts (any size) until a cyclic collection
    pool = JudgePool()
    judge = ProcessJudge(JudgeSpec(f"{__name__}:RaisingJudge", Settings()), processes=1)
    statuses: list[str] = []
    try:
        def submit(n: int) -> None:
            for i in range(n):
                item = EvalInput(QUESTION, (f"[{i}] " + CONTEXTS[0],), "other")
                assert pool.submit(JudgeJob(judge=judge, item=item, metrics=("faithfulness",),
                                            callback=lambda o: statuses.append(o.status)))
            assert pool.force_flush(10_000)

        submit(1)  # the worker is up, the pool's thread and loop too
        with cyclic_garbage() as found:
            submit(3)
        left = [type(o).__qualname__ for o in found if isinstance(o, EvalInput | BaseException)]
    finally:
        pool.shutdown()
        asyncio.run(judge.aclose())
    assert statuses == ["error"] * 4
    assert left == []


class ExitingJudge:
    """Takes its worker down while it is built (a native library crashing at load)."""

    name = "exiting"

    def __init__(self) -> None:
        os._exit(3)


def test_a_worker_that_dies_at_start_up_fails_every_call_with_its_exit_code() -> None:
    before = children()

    async def go() -> None:
        j = ProcessJudge(JudgeSpec(f"{__name__}:ExitingJudge", Settings()), processes=1)
        try:
            for _ in range(6):  # restarted, then backed off: calls fail, none hangs
                with pytest.raises(JudgeError, match="exit code 3"):
                    await j.evaluate(EvalInput(QUESTION, CONTEXTS, "x"), METRICS)
        finally:
            await j.aclose()
        assert children() <= before  # every crashed worker reaped

    asyncio.run(go())


class HangingJudge:
    """Never returns from one input (a native loop that holds its thread)."""

    name = "hanging"

    def evaluate_sync(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        while item.answer == "hang":
            time.sleep(3600)
        return JudgeResult(self.name, ())

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        return self.evaluate_sync(item, metrics)

    async def aclose(self) -> None:
        pass


def test_a_worker_stuck_past_the_judge_timeout_is_replaced() -> None:
    async def go() -> None:
        j = ProcessJudge(JudgeSpec(f"{__name__}:HangingJudge", Settings(judge_timeout_s=0.05)), processes=1)
        try:
            assert await j.evaluate(EvalInput(QUESTION, CONTEXTS, "fine"), METRICS) == JudgeResult("hanging", ())
            (stuck,) = j.pids
            queued = asyncio.ensure_future(j.evaluate(EvalInput(QUESTION, CONTEXTS, "behind it"), METRICS))
            with pytest.raises(TimeoutError):  # the pool's per-call timeout, as the pool applies it
                async with asyncio.timeout(0.5):
                    await j.evaluate(EvalInput(QUESTION, CONTEXTS, "hang"), METRICS)
            with pytest.raises(JudgeError, match=f"judge worker {stuck} died"):
                await queued  # queued behind the stuck call: fails, does not hang
            assert await j.evaluate(EvalInput(QUESTION, CONTEXTS, "fine"), METRICS) == JudgeResult("hanging", ())
            assert stuck not in j.pids and stuck not in children()
        finally:
            await j.aclose()

    async def bounded() -> None:
        async with asyncio.timeout(60):  # a regression fails here instead of hanging the run
            await go()

    asyncio.run(bounded())


def test_create_judge_wraps_only_cpu_bound_judges_when_asked() -> None:
    assert isinstance(create_judge("local", Settings(judge_processes=0)), LocalJudge)
    other = create_judge(f"{__name__}:RaisingJudge", Settings(judge_processes=1))
    assert isinstance(other, RaisingJudge)  # an I/O-bound judge stays in-process
    wrapped = create_judge("local", Settings(judge_processes=1))
    try:
        assert isinstance(wrapped, ProcessJudge) and wrapped.name == "local"
    finally:
        asyncio.run(wrapped.aclose())


def test_settings_name_the_variable_and_raise_the_concurrency_for_processes() -> None:
    var = "STREAMJUDGE_JUDGE_PROCESSES"
    for bad in ("two", "-1", "1.5", "autoo"):
        with pytest.raises(ConfigError, match=var):
            load_settings({var: bad})
    assert load_settings({}).judge_processes == "auto"
    assert load_settings({var: " Auto "}).judge_processes == "auto"
    assert load_settings({var: "0"}).judge_processes == 0
    assert load_settings({}).concurrency == 4
    assert load_settings({var: "1"}).concurrency == 16
    s = load_settings({var: "3"})
    assert (s.judge_processes, s.concurrency) == (3, 48)
    assert load_settings({var: "3", "STREAMJUDGE_CONCURRENCY": "2"}).concurrency == 2
    assert load_settings(judge_processes=4).concurrency == 64
    for wrong in (-1, "two", True, 1.5):
        with pytest.raises(ConfigError, match="judge_processes"):
            Settings(judge_processes=wrong)  # type: ignore[arg-type]


def test_workers_run_at_the_configured_lower_priority() -> None:
    # the kernel then runs the app's threads first on a core both want (the GIL never hands the pool's
    # thread's core back that way)
    own = os.getpriority(os.PRIO_PROCESS, 0)

    async def niceness(**settings: object) -> int:
        j = judge(**settings)
        try:
            await j.evaluate(items()[0], ("faithfulness",))
            (pid,) = j.pids
            return os.getpriority(os.PRIO_PROCESS, pid)
        finally:
            await j.aclose()

    assert asyncio.run(niceness()) == min(19, own + 10)
    assert asyncio.run(niceness(judge_worker_nice=3)) == min(19, own + 3)
    assert asyncio.run(niceness(judge_worker_nice=0)) == own
    var = "STREAMJUDGE_JUDGE_WORKER_NICE"
    assert load_settings({var: "19"}).judge_worker_nice == 19
    for bad in ("20", "-1", "low"):
        with pytest.raises(ConfigError, match=var):
            load_settings({var: bad})


def test_a_worker_is_capped_only_under_a_cgroup_quota_of_less_than_two_cores() -> None:
    s = Settings()
    assert worker_cpu_cap(s, quota=0.5) == worker_cpu_cap(s, quota=1.5) == s.judge_cpu_share == 0.15
    assert worker_cpu_cap(Settings(judge_cpu_share=0.3), quota=1.0) == 0.3
    assert worker_cpu_cap(s, quota=2.0) == worker_cpu_cap(s, quota=8.0) == 0.0
    assert worker_cpu_cap(Settings(judge_cpu_share=0.0), quota=1.0) == 0.0  # no cap asked for
    # no quota: the niceness alone decides (this machine's own quota, whatever it is, gives a valid cap)
    assert 0.0 <= worker_cpu_cap(s) <= s.judge_cpu_share


def test_the_quota_is_the_smallest_along_the_process_cgroup_path(tmp_path: Any) -> None:
    def write(rel: str, text: str) -> None:
        f = tmp_path / "fs" / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(text)

    proc = tmp_path / "cgroup"
    # v2: a systemd unit under a slice; the root has no cpu.max at all (as on a systemd host)
    write("system.slice/cpu.max", "150000 100000\n")
    write("system.slice/app.service/cpu.max", "max 100000\n")
    proc.write_text("0::/system.slice/app.service\n")
    assert _process.cgroup_quota(str(proc), str(tmp_path / "fs")) == 1.5
    write("system.slice/app.service/cpu.max", "50000 100000\n")
    assert _process.cgroup_quota(str(proc), str(tmp_path / "fs")) == 0.5
    # v1, a container without a cgroup namespace: its host path is not under the mount, its own cgroup is
    write("cpu,cpuacct/cpu.cfs_quota_us", "200000\n")
    write("cpu,cpuacct/cpu.cfs_period_us", "100000\n")
    proc.write_text("4:memory:/docker/abc\n3:cpu,cpuacct:/docker/abc\n")
    assert _process.cgroup_quota(str(proc), str(tmp_path / "fs")) == 2.0
    write("cpu,cpuacct/cpu.cfs_quota_us", "-1\n")  # unlimited
    assert _process.cgroup_quota(str(proc), str(tmp_path / "fs")) is None
    assert _process.cgroup_quota(str(tmp_path / "absent"), str(tmp_path / "fs")) is None
    proc.write_text("0::/../../x\nnot a cgroup line\n")  # odd lines: nothing read outside the mount
    assert _process.cgroup_quota(str(proc), str(tmp_path / "fs")) is None


def test_a_process_in_a_real_cgroup_with_a_quota_sees_it_and_caps_its_worker() -> None:
    # cgroup v1's cpu controller, writable here as root; elsewhere there is no cgroup of our own to make
    parent = "/sys/fs/cgroup/cpu"
    if not (os.path.isfile(f"{parent}/cgroup.procs") and os.access(parent, os.W_OK)):
        pytest.skip("no writable cgroup v1 cpu hierarchy")
    group = f"{parent}/streamjudge-test-{os.getpid()}"
    os.mkdir(group)
    try:
        with open(f"{group}/cpu.cfs_quota_us", "w") as f:
            f.write("50000")  # half a core per 100 ms period
        code = ("from streamjudge.config import Settings; from streamjudge.judging.judges import _process; "
                "print(_process.cgroup_quota(), _process.worker_cpu_cap(Settings()))")

        def enter() -> None:
            with open(f"{group}/cgroup.procs", "w") as f:
                f.write(str(os.getpid()))

        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                             preexec_fn=enter, check=True)
        assert out.stdout.split() == ["0.5", "0.15"]
    finally:
        os.rmdir(group)  # its one process has exited


def _cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def test_a_capped_worker_keeps_to_its_share_of_a_core(monkeypatch: pytest.MonkeyPatch) -> None:
    # distinct, long contexts: every call builds an index, ~tens of ms of CPU each
    work = [EvalInput(QUESTION, (" ".join(f"Plant {i} made {n} units in {1900 + n % 99}." for n in range(400)),),
                      f"Plant {i} made 7 units in 1907.", "checkpoint") for i in range(40)]

    async def share(cap: float) -> tuple[float, int]:
        monkeypatch.setattr(_process, "worker_cpu_cap", lambda settings: cap)
        j = judge(judge_timeout_s=60.0 + cap)  # a Settings of its own: workers of their own
        try:
            await j.evaluate(items()[0], ("faithfulness",))  # started, judge built
            (pid,) = j.pids
            cpu0, t0 = _cpu_s(pid), time.monotonic()
            results = await gather(j, work, ("faithfulness",))
            return (_cpu_s(pid) - cpu0) / (time.monotonic() - t0), len(results)
        finally:
            await j.aclose()

    free, n = asyncio.run(share(0.0))
    capped, m = asyncio.run(share(0.2))
    assert n == m == len(work)
    # the cap, plus its 50 ms burst and the clock's 10 ms ticks over a run of seconds; the free worker is
    # not compared with a fixed share: on shared cores it may get less than the cap itself
    assert capped < 0.3, (capped, free)


def test_a_stream_guarded_with_judge_processes_gets_the_in_process_verdicts(harness: Harness) -> None:
    answer = ("The Eiffel Tower was completed in 1889 for the World's Fair. It is 330 metres tall. "
              "It was designed by Leonardo da Vinci in 1920. Gustave Eiffel's company built it.")

    async def words() -> AsyncIterator[str]:
        for w in answer.split(" "):
            yield w + " "
            await asyncio.sleep(0.002)

    def stream() -> tuple[list[tuple[Any, ...]], dict[str, Any], list[Any]]:
        async def collect() -> list[StreamEvent]:
            return [ev async for ev in guard(words(), question=QUESTION, contexts=list(CONTEXTS))]

        events = asyncio.run(collect())
        warnings = sorted((e.data["metric"], e.data["char_start"], e.data["char_end"], e.data["score"])
                          for e in events if e.type == "warning" and e.data)
        checkpoints = [s for s in harness.spans() if s.name == semconv.SPAN_CHECKPOINT]
        statuses = [s.attributes[semconv.EVAL_STATUS] for s in checkpoints]
        done = {k: v for k, v in (events[-1].data or {}).items() if k not in ("ttft_ms", "stream_id")}
        return warnings, done, statuses

    harness.configure()
    in_process = stream()
    rt = harness.configure(judge_processes=1)
    assert isinstance(rt.judge_for("checkpoint"), ProcessJudge)
    assert isinstance(rt.judge_for("answer"), ProcessJudge)
    in_workers = stream()
    assert in_workers == in_process
    warnings, done, statuses = in_workers
    assert warnings and done["verdict"] == "flagged" and set(statuses) == {"judged"}
    pids = rt.judge_for("checkpoint").pids  # type: ignore[attr-defined]
    assert pids
    rt.shutdown()  # the pool closes its judges: the workers go
    assert not set(pids) & children()


def test_workers_stopped_at_exit_are_not_reported_dead_or_restarted(caplog: pytest.LogCaptureFixture) -> None:
    # at interpreter exit the atexit hook stops the workers from the main thread while the judge pool's
    # loop still watches their pipes on its own thread: the EOF it then reads is the goodbye, not a death
    loop = asyncio.new_event_loop()
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    j = judge()
    try:
        asyncio.run_coroutine_threadsafe(j.evaluate(items()[0], ("faithfulness",)), loop).result(30)
        (pid,) = j.pids
        with caplog.at_level("WARNING", logger="streamjudge"):
            _stop_all()  # what atexit runs
            time.sleep(0.5)  # the loop thread reads the worker's EOF meanwhile
        assert not [r for r in caplog.records if "died" in r.getMessage()]
        assert pid not in children() and not j.pids  # reaped, and no new worker started
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)
        loop.close()


def test_results_cross_the_pipe_unchanged_and_stay_frozen() -> None:
    # results are pickled by their field values (see streamjudge.results): every field survives, with
    # every protocol, and what comes out is as frozen as what went in
    import copy
    import dataclasses
    import pickle

    from streamjudge.results import Score, SentenceScore, Usage

    result = JudgeResult("local", (
        Score("faithfulness", 0.5, "fail", "1/2 claims supported", None,
              (SentenceScore(0, 38, 1.0, "", "pass"), SentenceScore(39, 80, 0.0, "not in context: 1712", "fail"))),
        Score("context_recall", None, None, "", "no_reference"),
    ), Usage(1, 120, 8, 0.25))
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        back = pickle.loads(pickle.dumps(result, protocol))
        assert back == result and type(back.scores[0].sentences[1]) is SentenceScore
        assert back.get("faithfulness").failing(0.7) == (result.scores[0].sentences[1],)  # type: ignore[union-attr]
        with pytest.raises(dataclasses.FrozenInstanceError):
            back.scores[0].value = 1.0  # type: ignore[misc]
    assert copy.deepcopy(result) == result and dataclasses.replace(result, judge="x").scores == result.scores


def test_a_result_without_usage_shares_one_empty_usage_across_the_pipe() -> None:
    # the local judge counts no usage: its results share one empty Usage (one object fewer per result for
    # the cyclic GC), and one that crossed a worker's pipe comes back as that same instance
    import pickle

    from streamjudge.results import NO_USAGE, Usage

    made = JudgeResult("local", ())
    assert made.usage is NO_USAGE and Usage() == NO_USAGE
    for protocol in range(2, pickle.HIGHEST_PROTOCOL + 1):
        assert pickle.loads(pickle.dumps(made, protocol)).usage is NO_USAGE
        assert pickle.loads(pickle.dumps(Usage(), protocol)) is NO_USAGE
        counted = pickle.loads(pickle.dumps(Usage(2, 10, 3, 0.5), protocol))
        assert counted == Usage(2, 10, 3, 0.5) and counted is not NO_USAGE


def test_a_worker_starts_without_the_sdk_and_still_gives_a_judge_the_whole_package() -> None:
    """The worker's boot skips the package's __init__ (the instrumentation, the OpenTelemetry SDK: imports a
    worker does not use, and a slower start under load); a judge asking the package for one of its names
    gets it."""
    async def go() -> None:
        judge = ProcessJudge(JudgeSpec("judges.lean_worker_judge:ModulesJudge", Settings()), processes=1)
        try:
            result = await judge.evaluate(EvalInput(QUESTION, CONTEXTS, "x"), ("sdk_at_build", "whole_package"))
        finally:
            await judge.aclose()
        scores = {s.name: s.value for s in result.scores}
        assert scores == {"sdk_at_build": 0.0, "whole_package": 1.0}

    asyncio.run(go())
