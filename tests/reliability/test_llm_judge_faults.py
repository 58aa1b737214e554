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


class _HugeReplies:
    """An OpenAI-compatible endpoint whose every reply is a valid chat completion of ``size`` bytes, sent
    in 1 MB pieces (never held whole): with a Content-Length, without one (the body ends at the close), or
    gzip-compressed (a few KB on the wire)."""

    def __init__(self, size: int, how: str) -> None:
        import zlib
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

        head = b'{"id":"x","object":"chat.completion","created":0,"model":"m","choices":[{"index":0,' \
               b'"finish_reason":"stop","message":{"role":"assistant","content":"'
        tail = b'"}}],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}'
        piece = b"a" * (1 << 20)
        pieces = size // len(piece)
        total = len(head) + pieces * len(piece) + len(tail)
        gz = b""
        if how == "gzip":
            c = zlib.compressobj(9, zlib.DEFLATED, 31)
            gz = c.compress(head) + b"".join(c.compress(piece) for _ in range(pieces)) + c.compress(tail)
            gz += c.flush()
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:
                return None

            def do_POST(self) -> None:
                outer.requests += 1
                self.rfile.read(int(self.headers.get("Content-Length") or 0))
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                if how == "length":
                    self.send_header("Content-Length", str(total))
                if how == "gzip":
                    self.send_header("Content-Encoding", "gzip")
                    self.send_header("Content-Length", str(len(gz)))
                self.end_headers()
                try:
                    if how == "gzip":
                        self.wfile.write(gz)
                        return
                    self.wfile.write(head)
                    for _ in range(pieces):
                        self.wfile.write(piece)
                    self.wfile.write(tail)
                except OSError:  # the client stopped reading: what the cap is for
                    pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        import threading

        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.mark.timeout(120)
@pytest.mark.parametrize("how", ["stream", "length", "gzip"])
def test_a_reply_over_the_byte_cap_is_an_error_for_that_call_and_costs_no_memory(
        exporter: InMemorySpanExporter, how: str) -> None:
    import tracemalloc

    from streamjudge.judging.judges import _clients

    size = 64 * getattr(_clients, "MAX_REPLY_BYTES", 1 << 20)
    srv = _HugeReplies(size, how)
    settings = load_settings({
        "STREAMJUDGE_JUDGE": "llm", "EVAL_PROVIDER": "openai", "EVAL_MODEL": "judge-model",
        "EVAL_BASE_URL": srv.url, "EVAL_API_KEY": "sk-test-not-a-real-key-0000", "EVAL_TIMEOUT": "30",
        "STREAMJUDGE_JUDGE_TIMEOUT": "60", "STREAMJUDGE_MAX_RETRIES": "0", "STREAMJUDGE_END_WAIT": "0.1",
        "STREAMJUDGE_PREFLIGHT": "false", "STREAMJUDGE_FINAL_METRICS": "faithfulness",
    })
    rt = streamjudge.configure(settings, downstream=SimpleSpanProcessor(exporter), set_global=False,
                               backends_from_env=False, sinks=())
    tracemalloc.start()
    try:
        _stream()
        spans = _judged_spans(rt, exporter)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
        rt.shutdown()
        srv.close()
    print(f"\n{how}: {srv.requests} replies of {size / 1e6:.0f} MB, peak {peak / 1e6:.1f} MB traced")
    assert peak < size / 4, f"peak {peak / 1e6:.1f} MB for replies of {size / 1e6:.0f} MB"
    assert srv.requests >= 2
    assert len(spans) == 2
    for s in spans:
        assert s.attributes[semconv.EVAL_STATUS] == "error", dict(s.attributes)
        assert "reply too large" in str(s.attributes[semconv.EVAL_SKIP_REASON]), dict(s.attributes)
