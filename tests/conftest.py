from __future__ import annotations

import contextlib
import functools
import gc
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

sys.path.insert(0, str(Path(__file__).parent))

import streamjudge
from streamjudge.config import Settings


@contextlib.contextmanager
def cyclic_garbage() -> Iterator[list[object]]:
    """The objects only the cyclic GC can free that the block leaves behind: what is unreachable at its
    end, or became so in a collection while it ran (everything in a reference cycle). Collects first, so
    garbage from before the block is not counted."""
    gc.collect()
    found: list[object] = []
    gc.set_debug(gc.DEBUG_SAVEALL)  # what a collection finds unreachable is kept in gc.garbage
    try:
        yield found
        gc.collect()
        found.extend(gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()


def ours(objects: list[object]) -> list[str]:
    """The names of those of ``objects`` whose types are streamjudge's or the OpenTelemetry SDK's."""
    return [f"{type(o).__module__}.{type(o).__qualname__}" for o in objects
            if type(o).__module__.startswith(("streamjudge", "opentelemetry"))]


def pytest_collection_finish(session: pytest.Session) -> None:
    """Freeze the heap the collected test modules imported, as a server freezes its start-up heap.

    This process imports every framework the judges and instrumentations support (ragas, deepeval,
    LangChain, LangGraph, OpenAI, Phoenix...): ~490k objects, more than any one app holds. A whole-heap
    collection of them took 0.35-0.6 s on a slow machine, and it fell inside the 0.5 s waits some tests
    bound (a stalled loop measured at 0.56 s, answers whose verdicts missed a 0.5 s end wait). Objects made
    from here on are collected as usual.
    """
    gc.collect()
    gc.freeze()


class Harness:
    """A runtime that owns its export path into an in-memory exporter."""

    def __init__(self) -> None:
        self.exporter = InMemorySpanExporter()
        self.runtime: streamjudge.Runtime | None = None

    def configure(self, judge: object | None = None, **settings: object) -> streamjudge.Runtime:
        if self.runtime is not None:
            self.runtime.shutdown()
        s = Settings(**settings)  # type: ignore[arg-type]
        self.exporter = InMemorySpanExporter()  # a shut-down exporter ignores further spans
        self.runtime = streamjudge.configure(
            s,
            downstream=SimpleSpanProcessor(self.exporter),
            judge=judge,  # type: ignore[arg-type]
            set_global=False,
        )
        return self.runtime

    def spans(self, flush: bool = True) -> list:  # type: ignore[type-arg]
        if flush and self.runtime is not None:
            self.runtime.force_flush(10_000)
        return list(self.exporter.get_finished_spans())


@pytest.fixture
def harness() -> Iterator[Harness]:
    h = Harness()
    try:
        yield h
    finally:
        if h.runtime is not None:
            h.runtime.shutdown()


@pytest.fixture(autouse=True)
def _fresh_judge_load_meter() -> None:
    """Each test's own judging decides whether an auto judge starts a worker (the meter is process-wide
    and, in an app, remembers a burst; a test must not inherit the one before it)."""
    from streamjudge.judging.judges._offload import _METER

    _METER.reset()


@functools.cache
def _old_sse_starlette() -> bool:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return int(version("sse-starlette").split(".")[0]) < 2
    except PackageNotFoundError:
        return False


@pytest.fixture(autouse=True)
def _sse_starlette_exit_event(monkeypatch: pytest.MonkeyPatch) -> None:
    """sse-starlette before 2 keeps one exit event per process, bound to the first event loop that waits on
    it; a test may run several loops (one per TestClient), so each response waits on one of its own loop.
    Only the server's exit signal waits on it, which tests never send."""
    if not _old_sse_starlette():
        return
    from sse_starlette.sse import AppStatus, EventSourceResponse

    original = EventSourceResponse.listen_for_exit_signal

    async def listen_for_exit_signal() -> None:
        AppStatus.should_exit_event = None
        await original()

    monkeypatch.setattr(EventSourceResponse, "listen_for_exit_signal", staticmethod(listen_for_exit_signal))
