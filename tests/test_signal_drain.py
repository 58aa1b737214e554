"""The SIGTERM drain stays in front of handlers installed after it and only drains when the signal is
about to end the process; the process-wide shutdown deadline bounds every wait."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from types import FrameType

import pytest
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from streamjudge import _shutdown
from streamjudge._deadline import (
    Deadline,
    bounded_millis,
    current_deadline,
    pool_budget_millis,
    shutdown_deadline,
    shutdown_timeout_s,
)
from streamjudge.config import Settings
from streamjudge.runtime import Runtime


@pytest.fixture
def runtime() -> Iterator[Runtime]:
    rt = streamjudge.configure(Settings(), exporter=InMemorySpanExporter(), set_global=False)
    yield rt
    rt.shutdown()


@pytest.fixture
def installed(runtime: Runtime) -> Iterator[Runtime]:
    before = signal.getsignal(signal.SIGTERM)
    # the global providers belong to the test session: only this test's runtime is drained
    assert _shutdown.install_signal_drain(runtime, timeout_s=1.0, global_providers=False, at_exit=False)
    try:
        yield runtime
    finally:
        signal.signal(signal.SIGTERM, before)  # what a test installed, undone as its owner would
        _shutdown.uninstall_signal_drain()
        assert signal.getsignal(signal.SIGTERM) == before
        assert signal.signal is _shutdown._original_signal


def test_a_handler_installed_later_runs_behind_the_drain_and_no_drain_when_it_returns(
    installed: Runtime,
) -> None:
    calls: list[int] = []

    def server_handler(signum: int, frame: FrameType | None) -> None:  # like uvicorn's handle_exit
        calls.append(signum)

    previous = signal.signal(signal.SIGTERM, server_handler)
    assert previous == signal.SIG_DFL  # what was there before streamjudge, as for any caller
    assert signal.getsignal(signal.SIGTERM) is server_handler
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)  # the handler runs in the main thread between bytecodes
    assert calls == [signal.SIGTERM]
    drain = _shutdown.installed_drain()
    assert drain is not None and drain.drained is None  # the server shuts down gracefully: no drain yet
    # restoring what it found (as uvicorn does) keeps the drain installed, now in front of SIG_DFL
    assert signal.signal(signal.SIGTERM, previous) is server_handler
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL
    assert _shutdown._original_getsignal(signal.SIGTERM) is drain


def test_a_handler_that_exits_gets_the_drain_first(installed: Runtime) -> None:
    def exiting(signum: int, frame: FrameType | None) -> None:
        raise SystemExit(143)

    signal.signal(signal.SIGTERM, exiting)
    with pytest.raises(SystemExit):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1.0)
    drain = _shutdown.installed_drain()
    assert drain is not None and drain.drained is True
    assert installed._closed


def test_ignored_signals_stay_ignored(installed: Runtime) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    os.kill(os.getpid(), signal.SIGTERM)
    time.sleep(0.05)
    drain = _shutdown.installed_drain()
    assert drain is not None and drain.drained is None and not installed._closed


def test_invalid_handlers_are_refused_as_by_signal_signal(installed: Runtime) -> None:
    with pytest.raises(TypeError):
        signal.signal(signal.SIGTERM, 42)  # type: ignore[arg-type]


def test_a_plain_script_killed_by_sigterm_drains_then_dies_by_the_signal() -> None:
    script = textwrap.dedent(
        """
        import asyncio, os, signal, sys
        from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
        import streamjudge
        from streamjudge import semconv
        from streamjudge._shutdown import install_signal_drain
        from streamjudge.config import Settings

        class Print(SpanExporter):
            def export(self, spans):
                for s in spans:
                    if s.name == semconv.SPAN_STREAM:
                        print("exported", s.attributes.get(semconv.EVAL_STATUS), flush=True)
                return SpanExportResult.SUCCESS

        class Slow:
            name = "slow"
            async def evaluate(self, item, metrics):
                await asyncio.sleep(60)
            async def aclose(self):
                pass

        from streamjudge.judging.judges import create_judge
        local = create_judge("local", Settings(), tier="checkpoint")
        rt = streamjudge.configure(Settings(end_wait_s=0.1), exporter=Print(), judge=Slow(),
                                   checkpoint_judge=local)
        install_signal_drain(timeout_s=1.5)

        async def tokens():
            for w in "The tower is 330 metres tall. It opened in 1889.".split():
                yield w + " "

        async def main():
            async for _ in streamjudge.guard(tokens(), question="How tall?", contexts=["It is 330 m."]):
                pass
        asyncio.run(main())
        print("streamed", flush=True)
        os.kill(os.getpid(), signal.SIGTERM)
        print("not reached", flush=True)
        """
    )
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=30)
    took = time.monotonic() - t0
    assert proc.returncode == -signal.SIGTERM, proc.stderr[-2000:]
    assert proc.stdout.split("\n")[:2] == ["streamed", "exported shutdown"], (proc.stdout, proc.stderr)
    assert "not reached" not in proc.stdout
    assert took < 15, took


def test_a_second_sigterm_during_the_drain_ends_the_process_at_once() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys, time
        from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
        import streamjudge
        from streamjudge._shutdown import install_signal_drain
        from streamjudge.config import Settings
        from streamjudge.judging.judges import create_judge

        class Slow:
            name = "slow"
            async def evaluate(self, item, metrics):
                await asyncio.sleep(60)
            async def aclose(self):
                pass

        streamjudge.configure(Settings(end_wait_s=0.1), exporter=InMemorySpanExporter(), judge=Slow(),
                              checkpoint_judge=create_judge("local", Settings(), tier="checkpoint"))
        install_signal_drain(timeout_s=30)

        async def tokens():
            for w in "The tower is 330 metres tall.".split():
                yield w + " "

        async def main():
            async for _ in streamjudge.guard(tokens(), question="How tall?", contexts=["It is 330 m."]):
                pass
        asyncio.run(main())
        print("ready", flush=True)
        time.sleep(60)
        """
    )
    proc = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        proc.send_signal(signal.SIGTERM)  # starts a drain that may take 30 s (the judge takes 60)
        time.sleep(0.5)
        assert proc.poll() is None  # still draining
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=20)
        took = time.monotonic() - t0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGTERM
    assert took < 5.0, took


def test_the_deadline_bounds_waits_on_every_thread_and_nests_to_the_earliest() -> None:
    assert current_deadline() is None
    assert bounded_millis(None) is None and bounded_millis(2_000) == 2_000
    with shutdown_deadline(10.0):
        with shutdown_deadline(0.5) as inner:
            assert current_deadline() is inner
            assert 0 < (bounded_millis(30_000) or 0) <= 500
            assert 0 < (bounded_millis(None) or 0) <= 500
        assert 9_000 < (bounded_millis(30_000) or 0) <= 10_000
    assert current_deadline() is None
    d = Deadline(2.0)
    part = d.part(0.7, keep_s=1.0)
    assert 0.9 < part.remaining() <= 1.0  # 70% would be 1.4 s, but 1 s is kept for the export
    assert Deadline(None).remaining_millis() == 86_400_000
    assert pool_budget_millis(7_000) == 7_000  # no deadline open: the processor's own wait
    with shutdown_deadline(5.0):
        assert 3_400 < pool_budget_millis(7_000) <= 3_500  # 70% of 5 s
        assert pool_budget_millis(1_000) == 1_000


def test_a_deadline_kept_open_bounds_later_waits() -> None:
    from streamjudge import _deadline

    with shutdown_deadline(0.0) as d:
        _deadline.keep_open(d)
    try:
        assert current_deadline() is d and bounded_millis(30_000) == 0
    finally:
        _deadline._active.remove(d)
    assert current_deadline() is None


def test_shutdown_timeout_from_the_environment() -> None:
    assert shutdown_timeout_s({}) == 5.0
    assert shutdown_timeout_s({"STREAMJUDGE_SHUTDOWN_TIMEOUT": "2.5"}) == 2.5
    assert shutdown_timeout_s({"STREAMJUDGE_SHUTDOWN_TIMEOUT": "soon"}) == 5.0
    assert shutdown_timeout_s({"STREAMJUDGE_SHUTDOWN_TIMEOUT": "-1"}) == 5.0
