"""App shapes that mirror public LangGraph apps, each run under ``opentelemetry-instrument`` in a subprocess.

The apps use the real ``langchain-openai`` client against the scripted OpenAI-compatible server of
``tests/judges`` (streamed chat completions, tool calls, ``json_schema`` structured output) and export
their spans over OTLP/HTTP to the test's receiver. Nothing in an app knows about streamjudge.

The app's model answers the question with three sentences: two stated in the retrieved passage and a
fabricated last one (:data:`FABRICATED`), so a checkpoint window of one sentence flags that one only.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from instrumentation.otlp_receiver import OTLPReceiver, SpanRecord
from judges.scripted_server import ScriptedLLMServer
from streamjudge import semconv
from streamjudge.config import DEFAULT_REGENERATE_INSTRUCTION

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
QUESTION = "How tall is the Eiffel Tower?"
GROUNDED = "The Eiffel Tower is 330 metres tall. It was completed in 1889 for the World's Fair."
FABRICATED = "It was built by Napoleon Bonaparte in 1750 from Norwegian granite."
ANSWER = f"{GROUNDED} {FABRICATED}"
CONTINUATION = " It is in Paris."
FIRST_TOKEN_DELAY_S = 0.3  # the scripted model's wait before its first token, per call
TOKEN_DELAY_S = 0.01


def app_model(body: dict[str, Any]) -> dict[str, Any] | None:
    """The apps' model: tool call first (when tools are bound), grader verdicts, the answer, a continuation."""
    messages = body.get("messages", [])
    text = "\n".join(str(m.get("content")) for m in messages)
    if body.get("response_format"):
        return {"json": {"binary_score": "yes"}}
    if DEFAULT_REGENERATE_INSTRUCTION[:30] in text:
        return {"content": CONTINUATION}
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        name = body["tools"][0].get("function", {}).get("name", "retrieve")
        return {"tool_call": {"name": name, "arguments": {"query": "Eiffel Tower height"}}}
    return {"content": ANSWER}


@pytest.fixture(scope="session")
def llm_server() -> Iterator[ScriptedLLMServer]:
    server = ScriptedLLMServer().start()
    server.app_responder = app_model
    server.first_token_delay_s = FIRST_TOKEN_DELAY_S
    server.token_delay_s = TOKEN_DELAY_S
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def receiver() -> Iterator[OTLPReceiver]:
    rec = OTLPReceiver().start()
    try:
        yield rec
    finally:
        rec.stop()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class App:
    proc: subprocess.Popen[str]
    port: int

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def app_env(llm_server: ScriptedLLMServer, receiver: OTLPReceiver | None, port: int,
            env: dict[str, str] | None = None, **settings: str) -> dict[str, str]:
    extra = env or {}
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMJUDGE_", "OTEL_"))}
    env.update({
        "APP_LLM_BASE_URL": llm_server.openai_base_url,
        "APP_PORT": str(port),
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "STREAMJUDGE_JUDGE": "local",
        "STREAMJUDGE_CHECKPOINT_SENTENCES": "1",  # one verdict per sentence
        "PYTHONWARNINGS": "ignore",
    })
    if receiver is not None:
        env.update({"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
                    "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    env.update({f"STREAMJUDGE_{k.upper()}": v for k, v in settings.items()})
    env.update(extra)
    return env


@contextlib.contextmanager
def serve(script: str, llm_server: ScriptedLLMServer, receiver: OTLPReceiver | None, *,
          instrumented: bool = True, env: dict[str, str] | None = None, **settings: str) -> Iterator[App]:
    """Run ``tests/apps/<script>`` (under ``opentelemetry-instrument`` unless told otherwise) until done."""
    port = free_port()
    cmd = [str(BIN / "python"), str(HERE / script)]
    if instrumented:
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    proc = subprocess.Popen(cmd, env=app_env(llm_server, receiver, port, env, **settings), cwd=HERE,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    app = App(proc, port)
    try:
        deadline = time.monotonic() + 60
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"{script} exited early:\n{proc.stdout.read() if proc.stdout else ''}")
            try:
                httpx.get(f"{app.url}/healthz", timeout=1)
                break
            except httpx.HTTPError:
                if time.monotonic() > deadline:
                    raise AssertionError(f"{script} did not start") from None
                time.sleep(0.1)
        yield app
    finally:
        out = stop(proc)
        assert "Traceback" not in out, out
        # zero-code start-up is quiet: an instrumentor loaded twice says so on every start
        assert "already instrumented" not in out, out


def stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


def run_script(script: str, llm_server: ScriptedLLMServer, receiver: OTLPReceiver | None, *,
               instrumented: bool = True, **settings: str) -> str:
    """Run a script app to its end; returns its output."""
    cmd = [str(BIN / "python"), str(HERE / script)]
    if instrumented:
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    done = subprocess.run(cmd, env=app_env(llm_server, receiver, 0, **settings), cwd=HERE,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and "Traceback" not in done.stderr, done.stderr
    assert "already instrumented" not in done.stderr, done.stderr
    return done.stdout


# --- what the tests read from the spans ----------------------------------------------------------------

def stream_span(spans: list[SpanRecord]) -> SpanRecord:
    streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1, [s.attributes for s in streams]
    return streams[0]


def stream_exported(spans: list[SpanRecord]) -> bool:
    return any(s.name == semconv.SPAN_STREAM and semconv.score_attribute(semconv.FAITHFULNESS) in s.attributes
               for s in spans)


def failing_checkpoints(spans: list[SpanRecord], stream: SpanRecord) -> list[SpanRecord]:
    label = semconv.label_attribute(semconv.FAITHFULNESS)
    return [s for s in spans if s.name == semconv.SPAN_CHECKPOINT and s.parent_span_id == stream.span_id
            and s.attributes.get(label) == "fail"]
