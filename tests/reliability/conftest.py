"""Shared pieces of the reliability suite: loopback servers of the other suites, a span ledger.

The suite proves the rows of the reliability issue's "held" list end to end (judge faults, export faults,
load, fork, hostile inputs, secrets, loopback binds, prompt injection). Every test is bounded in time and
talks to 127.0.0.1 only.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, Span, SpanProcessor

_TESTS = Path(__file__).resolve().parents[1]
for sub in (_TESTS, _TESTS / "judges"):
    if str(sub) not in sys.path:
        sys.path.insert(0, str(sub))

from scripted_server import ScriptedLLMServer  # noqa: E402


class SpanLedger(SpanProcessor):
    """Counts every span as it ends, before any processor holds, enriches or drops it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.ended: Counter[int] = Counter()
        self.names: dict[int, str] = {}

    def on_start(self, span: Span, parent_context: Context | None = None) -> None:
        return None

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        assert ctx is not None
        with self._lock:
            self.ended[ctx.span_id] += 1
            self.names[ctx.span_id] = span.name

    def shutdown(self) -> None:
        return None

    def force_flush(self, timeout_millis: int = 30_000) -> bool:
        return True


def wait_unbound(timeout_s: float = 15.0) -> int:
    """The bound streams once the server's request tasks have run their ``finally`` (a client can read the
    whole response before its request task ends). Polls with a deadline."""
    import time

    from streamjudge.instrumentation import _binding

    deadline = time.monotonic() + timeout_s
    while _binding.active_count() and time.monotonic() < deadline:
        time.sleep(0.02)
    return _binding.active_count()


def tokens(text: str) -> list[str]:
    words = text.split(" ")
    return [w if i == 0 else " " + w for i, w in enumerate(words)]


async def atokens(text: str, delay_s: float = 0.0) -> AsyncIterator[str]:
    for tok in tokens(text):
        await asyncio.sleep(delay_s)
        yield tok


@pytest.fixture(autouse=True)
def _instrumentor_left_as_found() -> Iterator[None]:
    """``instrument_app`` marks the instrumentor singleton as instrumented: undo it for later tests."""
    from streamjudge.instrumentation import StreamJudgeInstrumentor

    was = StreamJudgeInstrumentor().is_instrumented_by_opentelemetry
    yield
    inst = StreamJudgeInstrumentor()
    if inst.is_instrumented_by_opentelemetry and not was:
        inst.uninstrument()


@pytest.fixture
def llm_server() -> Iterator[ScriptedLLMServer]:
    srv = ScriptedLLMServer().start()
    try:
        yield srv
    finally:
        srv.stop()


def warned(body: str) -> bool:
    """Whether a response body carries a warning client event (an ``event: warning`` frame, or the data-only
    ``{"type": "warning"}`` frame a data-only SSE app gets)."""
    return "event: warning" in body or 'data: {"type":"warning"' in body
