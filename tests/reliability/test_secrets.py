"""Secrets in the environment never leave the process in telemetry. An application with the judge LLM's
key, Langfuse's keys and other credentials in its environment streams answers while the judge's gateway
rejects every call with a 401 that quotes the request's headers. Every byte exported — span attributes and
events (in memory), OTLP spans and score batches posted to a Langfuse-like server, log records — is
searched for each secret. (Redaction itself: tests/test_redact.py.)"""

from __future__ import annotations

import asyncio
import gzip
import json
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from threading import Thread

import pytest
from opentelemetry.sdk._logs import LoggerProvider
from opentelemetry.sdk._logs.export import SimpleLogRecordProcessor

try:
    from opentelemetry.sdk._logs.export import InMemoryLogRecordExporter
except ImportError:  # SDK 1.38 knows it by its older name only
    from opentelemetry.sdk._logs.export import InMemoryLogExporter as InMemoryLogRecordExporter
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from exporters._http import Reply, always, serve
from reliability.conftest import atokens
from streamjudge import semconv
from streamjudge._redact import MASK
from streamjudge.config import load_settings

SECRETS = {
    "EVAL_API_KEY": "key-ab12cd34ef56-reliab",  # no recognisable shape: only its variable name tells
    "OPENAI_API_KEY": "sk-proj-reliab0123456789abcdefABCDEF",
    "ANTHROPIC_API_KEY": "sk-ant-api03-reliab0123456789abcdef",
    "LANGFUSE_PUBLIC_KEY": "pk-lf-reliab-0123456789abcdef",
    "LANGFUSE_SECRET_KEY": "sk-lf-reliab-0123456789abcdef",
    "PAYMENTS_SERVICE_TOKEN": "tok-reliab-9f8e7d6c5b4a3210",
    "DB_PASSWORD": "correct-horse-battery-reliab",
}
CONTEXTS = ["Paris is the capital of France. Paris has about two million inhabitants."]
ANSWER = "Paris is the capital of France. Paris has about two million inhabitants. It is old."


class _EchoHeaders(BaseHTTPRequestHandler):
    """A judge gateway that rejects every call, quoting every request header back."""

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers.get("content-length", 0)))
        body = json.dumps({"error": {"type": "authentication_error",
                                     "message": f"rejected {self.headers.get('authorization')} "
                                                f"for {dict(self.headers)}"}}).encode()
        self.send_response(401)
        self.send_header("content-type", "application/json")
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def gateway() -> Iterator[str]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _EchoHeaders)
    thread = Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}/v1"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def _leaks(blob: bytes) -> list[str]:
    return [name for name, value in SECRETS.items() if value.encode() in blob]


@pytest.mark.timeout(90)
def test_no_secret_of_the_environment_is_exported(monkeypatch: pytest.MonkeyPatch, gateway: str) -> None:
    for name, value in SECRETS.items():
        monkeypatch.setenv(name, value)
    with serve(always(Reply(200, b'{"successes": [], "errors": []}'))) as langfuse:
        monkeypatch.setenv("LANGFUSE_HOST", langfuse.url)
        settings = load_settings({
            "STREAMJUDGE_JUDGE": "llm", "STREAMJUDGE_CHECKPOINT_JUDGE": "local", "EVAL_PROVIDER": "openai",
            "EVAL_MODEL": "judge-model", "EVAL_BASE_URL": gateway, "EVAL_API_KEY": SECRETS["EVAL_API_KEY"],
            "STREAMJUDGE_MAX_RETRIES": "0", "STREAMJUDGE_END_WAIT": "0.3",
        })
        spans, logs = InMemorySpanExporter(), InMemoryLogRecordExporter()
        logger_provider = LoggerProvider()
        logger_provider.add_log_record_processor(SimpleLogRecordProcessor(logs))
        rt = streamjudge.configure(settings, downstream=SimpleSpanProcessor(spans), set_global=False,
                                   logger_provider=logger_provider)  # Langfuse exporter + score sink from env
        try:
            async def main() -> None:
                for i in range(3):
                    async for _ in streamjudge.guard(atokens(f"{ANSWER} {i}.", 0.001), question="Capital?",
                                                     contexts=CONTEXTS):
                        pass

            asyncio.run(main())
            assert rt.force_flush(20_000)
        finally:
            rt.shutdown(5_000)
        exported = spans.get_finished_spans()
        streams = [s for s in exported if s.name == semconv.SPAN_STREAM]
        assert len(streams) == 3
        # the final pass went to the rejecting gateway: its error is on the span, without the key
        reasons = [str(s.attributes.get(semconv.EVAL_SKIP_REASON, "")) for s in streams]
        assert all("401" in r for r in reasons), reasons
        assert all(f"rejected Bearer {MASK}" in r for r in reasons), reasons  # the echoed key, redacted
        blob = b"\n".join(s.to_json().encode() for s in exported)
        blob += b"\n".join(r.log_record.to_json().encode() for r in logs.get_finished_logs())
        assert not _leaks(blob), _leaks(blob)
        # what went over the wire to Langfuse: OTLP spans and score batches (the keys belong in the
        # Authorization header only)
        bodies = langfuse.seen
        assert {s.path for s in bodies} >= {"/api/public/otel/v1/traces", "/api/public/ingestion"}
        wire = b"\n".join(gzip.decompress(s.body) if s.headers.get("content-encoding") == "gzip" else s.body
                          for s in bodies)
        wire += b"\n".join(json.dumps({k: v for k, v in s.headers.items() if k != "authorization"}).encode()
                           for s in bodies)
        assert not _leaks(wire), _leaks(wire)
