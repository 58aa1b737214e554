"""The ``llm`` judge failing in every way an endpoint can, under a real stream: its real client code talks
to the scripted OpenAI-compatible server on 127.0.0.1. The reader never waits longer than ``end_wait_s``;
every span goes out once and says why it was not judged; a one-off transient fault is retried away."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from scripted_server import ScriptedLLMServer

import streamjudge
from reliability.conftest import atokens
from streamjudge import semconv
from streamjudge.config import load_settings
from streamjudge.runtime import Runtime

QUESTION = "What is the capital of France?"
CONTEXTS = ["Paris is the capital of France. Paris has about two million inhabitants."]
ANSWER = "Paris is the capital of France. Paris has about two million inhabitants."
END_WAIT_S = 0.5


def _runtime(srv: ScriptedLLMServer, exporter: InMemorySpanExporter, **env: str) -> Runtime:
    settings = load_settings({
        "STREAMJUDGE_JUDGE": "llm", "EVAL_PROVIDER": "openai", "EVAL_MODEL": "judge-model",
        "EVAL_BASE_URL": srv.openai_base_url, "EVAL_API_KEY": "sk-test-not-a-real-key-0000",
        "EVAL_TIMEOUT": "0.4", "STREAMJUDGE_JUDGE_TIMEOUT": "1.5", "STREAMJUDGE_MAX_RETRIES": "1",
        "STREAMJUDGE_RETRY_BACKOFF": "0.05", "STREAMJUDGE_END_WAIT": str(END_WAIT_S),
        "STREAMJUDGE_PREFLIGHT": "false", "STREAMJUDGE_FINAL_METRICS": "faithfulness",
        **env,
    })
    return streamjudge.configure(settings, downstream=SimpleSpanProcessor(exporter), set_global=False,
                                 backends_from_env=False, sinks=())


def _stream() -> float:
    async def go() -> float:
        started = time.monotonic()
        async for _ in streamjudge.guard(atokens(ANSWER, 0.002), question=QUESTION, contexts=CONTEXTS):
            pass
        return time.monotonic() - started

    return asyncio.run(go())


@pytest.fixture
def exporter() -> Iterator[InMemorySpanExporter]:
    yield InMemorySpanExporter()


def _judged_spans(rt: Runtime, exporter: InMemorySpanExporter) -> list:  # type: ignore[type-arg]
    assert rt.force_flush(20_000)
    assert rt.processor.held == 0
    spans = exporter.get_finished_spans()
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids)), "a span was exported twice"
    return [s for s in spans if s.name in (semconv.SPAN_CHECKPOINT, semconv.SPAN_STREAM)]


@pytest.mark.timeout(120)
@pytest.mark.parametrize(("fault", "status", "why"), [
    ("http:500", "error", "500"),
    ("http:429:0.1", "error", "429"),
    ("http:529", "error", "529"),
    ("http:401", "error", "401"),
    ("hang", "error", "timed out"),
    ("reset", "error", "connection"),
    ("garbage", "error", "JSON"),
])
def test_an_endpoint_that_keeps_failing_never_holds_the_reader_and_every_span_says_why(
        llm_server: ScriptedLLMServer, exporter: InMemorySpanExporter, fault: str, status: str,
        why: str) -> None:
    llm_server.inject(*[fault] * 40)  # every call of this stream fails, retries included
    rt = _runtime(llm_server, exporter)
    try:
        took = _stream()
        assert took < END_WAIT_S + 2.0, took
        spans = _judged_spans(rt, exporter)
        assert len(spans) == 2  # one checkpoint, the stream
        for s in spans:
            assert s.attributes[semconv.EVAL_STATUS] == status, dict(s.attributes)
            assert why.lower() in str(s.attributes[semconv.EVAL_SKIP_REASON]).lower(), dict(s.attributes)
    finally:
        rt.shutdown()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["http:500", "http:503", "http:429:0.1", "http:529", "reset", "hang"])
def test_a_single_transient_fault_is_retried_and_the_stream_is_judged(
        llm_server: ScriptedLLMServer, exporter: InMemorySpanExporter, fault: str) -> None:
    llm_server.inject(fault)
    rt = _runtime(llm_server, exporter)
    try:
        _stream()
        spans = _judged_spans(rt, exporter)
        assert [s.attributes[semconv.EVAL_STATUS] for s in spans] == ["judged", "judged"]
        assert max(int(s.attributes.get(semconv.EVAL_ATTEMPTS, 1)) for s in spans) == 2
    finally:
        rt.shutdown()


@pytest.mark.timeout(60)
def test_a_401_is_final_and_not_retried(llm_server: ScriptedLLMServer, exporter: InMemorySpanExporter) -> None:
    llm_server.inject("http:401")
    rt = _runtime(llm_server, exporter)
    try:
        _stream()
        spans = _judged_spans(rt, exporter)
        statuses = sorted(str(s.attributes[semconv.EVAL_STATUS]) for s in spans)
        assert statuses == ["error", "judged"]  # the first call failed for good, the next one went through
        assert all(int(s.attributes.get(semconv.EVAL_ATTEMPTS, 1)) == 1 for s in spans)
    finally:
        rt.shutdown()
