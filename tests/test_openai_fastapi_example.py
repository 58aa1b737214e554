"""examples/openai_fastapi: a FastAPI app streaming from the real OpenAI SDK (against the scripted
OpenAI-compatible server on loopback) through guard(), run as its own process."""

from __future__ import annotations

import collections
import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

from judges.scripted_server import ScriptedLLMServer
from streamjudge import semconv
from streamjudge.offline.otlp_file import OTLPFileReceiver

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
APP = ROOT / "examples" / "openai_fastapi" / "app.py"
# (the local judge does not resolve "The tower" of the context to the Eiffel Tower: the answer says it so)
GROUNDED = ("The Eiffel Tower is a wrought-iron lattice tower in Paris, France. It was built between 1887 and "
            "1889. The tower is 330 metres tall including its antennas.")
INVENTED = "It was originally painted bright green by Leonardo Marconi in 1712."
HALLUCINATED = f"The Eiffel Tower is a wrought-iron lattice tower in Paris, France. {INVENTED}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class App:
    def __init__(self, proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
        self.proc, self.url, self.log = proc, url, log

    def chat(self, q: str) -> list[tuple[str, dict[str, Any]]]:
        frames: list[tuple[str, dict[str, Any]]] = []
        with httpx.stream("GET", f"{self.url}/chat", params={"q": q}, timeout=30) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            event = "message"
            for line in r.iter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:"):
                    frames.append((event, json.loads(line[5:])))
        return frames


def _start(tmp_path: Path, llm: ScriptedLLMServer, traces: str, action: str, zero_code: bool = False) -> App:
    port = _free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STREAMJUDGE_", "OPENAI_"))}
    src = str(ROOT / "src")
    env.update({
        "PYTHONPATH": src + os.pathsep + env.get("PYTHONPATH", ""),
        "PORT": str(port),
        "OPENAI_BASE_URL": llm.openai_base_url,
        "OPENAI_API_KEY": "sk-scripted-0000",
        "OPENAI_MODEL": "scripted-app-model",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces,
        "OTEL_SERVICE_NAME": "openai-fastapi-example",
        "STREAMJUDGE_ACTION": action,
        "STREAMJUDGE_END_WAIT": "2",
    })
    cmd = [sys.executable, str(APP)]
    if zero_code:
        cmd = [str(Path(sys.executable).with_name("opentelemetry-instrument")), *cmd]
        env.update({"OTEL_TRACES_EXPORTER": "otlp", "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
                    "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none"})
    log = tmp_path / f"app-{action}.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen(cmd, env=env, stdout=fh, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL)
    app = App(proc, f"http://127.0.0.1:{port}", log)
    deadline = time.monotonic() + 60
    while True:
        if proc.poll() is not None:
            raise AssertionError(f"the app exited with {proc.returncode}:\n{log.read_text()}")
        try:
            if httpx.get(f"{app.url}/openapi.json", timeout=1).status_code == 200:
                return app
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            _stop(app)
            raise AssertionError(f"the app did not serve in 60 s:\n{log.read_text()}")
        time.sleep(0.1)


def _stop(app: App) -> None:
    if app.proc.poll() is None:
        app.proc.send_signal(signal.SIGINT)
        try:
            app.proc.wait(20)
        except subprocess.TimeoutExpired:
            app.proc.kill()
            app.proc.wait()


def _replies(llm: ScriptedLLMServer, *texts: str) -> None:
    """The app's next chat completions answer ``texts``, in order (the scripted server's app model)."""
    queue = collections.deque(texts)
    llm.app_responder = lambda _body: {"content": queue.popleft()} if queue else None


@pytest.fixture
def llm() -> Iterator[ScriptedLLMServer]:
    with ScriptedLLMServer() as server:
        yield server


def test_grounded_and_hallucinating_answers_stream_through_the_guard(tmp_path: Path, llm: ScriptedLLMServer) -> None:
    _replies(llm, GROUNDED, HALLUCINATED)
    with OTLPFileReceiver(tmp_path / "traces.jsonl") as rx:
        app = _start(tmp_path, llm, rx.traces_endpoint, "flag")
        try:
            grounded = app.chat("How tall is the Eiffel Tower?")
            flagged = app.chat("When was the Eiffel Tower built and what colour was it?")
        finally:
            _stop(app)
        spans = rx.spans()
    log = app.log.read_text()
    assert "Traceback" not in log, log

    # the client gets the model's tokens unchanged, as they arrive
    assert grounded[0] == ("sources", {"sources": ["eiffel"]})
    assert "".join(d["token"] for e, d in grounded if e == "token") == GROUNDED
    assert [e for e, _d in grounded if e not in ("token", "sources")] == ["done"]
    assert grounded[-1][1]["alerts"] == 0

    text = "".join(d["token"] for e, d in flagged if e == "token")
    assert text == HALLUCINATED
    warnings = [d for e, d in flagged if e == "warning" and d.get("stage") != "preflight"]
    assert warnings, flagged
    start = HALLUCINATED.index(INVENTED)
    assert warnings[0]["metric"] == semconv.FAITHFULNESS
    assert warnings[0]["char_start"] <= start < warnings[0]["char_end"]
    assert flagged[-1][0] == "done" and flagged[-1][1]["alerts"] >= 1

    # the app called the model through the OpenAI SDK, streaming, with the retrieved passage as its source
    calls = llm.model_requests("/chat/completions")
    assert len(calls) == 2 and all(c["body"]["stream"] is True for c in calls)
    assert calls[0]["body"]["model"] == "scripted-app-model"
    assert "330 metres" in calls[0]["body"]["messages"][0]["content"]
    assert calls[0]["headers"]["user-agent"].startswith("AsyncOpenAI/Python")
    assert calls[0]["headers"]["authorization"] == "Bearer sk-scripted-0000"

    # the answer spans carry the question and contexts given to guard(), and the verdicts
    streams = {s.attributes[semconv.STREAM_QUESTION]: s for s in spans if s.name == semconv.SPAN_STREAM}
    ok = streams["How tall is the Eiffel Tower?"].attributes
    bad = streams["When was the Eiffel Tower built and what colour was it?"].attributes
    assert ok[semconv.STREAM_CONTEXT_COUNT] == 1 and ok[semconv.STREAM_ALERTS] == 0
    assert ok[semconv.score_attribute(semconv.FAITHFULNESS)] == 1.0
    assert bad[semconv.STREAM_ALERTS] >= 1 and bad[semconv.STREAM_VERDICT] != "pass"
    assert {s.resource.get("service.name") for s in spans} == {"openai-fastapi-example"}


def test_regenerate_re_prompts_the_model_with_the_accepted_prefix(tmp_path: Path, llm: ScriptedLLMServer) -> None:
    continuation = " It was built between 1887 and 1889 for the 1889 World's Fair."
    # the failing checkpoint closes mid-answer (when the third sentence starts): its verdict arrives while
    # the rest still streams
    _replies(llm, HALLUCINATED + " Every year about 94 million visitors arrive there by submarine from Lisbon."
              " Tickets are sold at the foot of each of its four pillars.", continuation)
    llm.token_delay_s = 0.01  # the verdict arrives while the answer is still streaming
    with OTLPFileReceiver(tmp_path / "traces.jsonl") as rx:
        app = _start(tmp_path, llm, rx.traces_endpoint, "regenerate")
        try:
            frames = app.chat("When was the Eiffel Tower built and what colour was it?")
        finally:
            _stop(app)
    events = [e for e, _d in frames]
    assert "retract" in events, frames
    calls = llm.model_requests("/chat/completions")
    assert len(calls) == 2, json.dumps([f for f in frames if f[0] != "token"])
    again = calls[1]["body"]["messages"]
    assert again[-2]["role"] == "assistant" and INVENTED not in again[-2]["content"]
    assert again[-2]["content"].startswith("The Eiffel Tower is a wrought-iron lattice tower")
    assert "only facts stated in the provided context" in again[-1]["content"]
    # after the retraction the client is sent the continuation
    after = "".join(d["token"] for e, d in frames[events.index("retract"):] if e == "token")
    assert continuation.strip() in after


def test_under_opentelemetry_instrument_each_answer_is_judged_once(tmp_path: Path, llm: ScriptedLLMServer) -> None:
    _replies(llm, HALLUCINATED)
    question = "When was the Eiffel Tower built and what colour was it?"
    with OTLPFileReceiver(tmp_path / "traces.jsonl") as rx:
        app = _start(tmp_path, llm, rx.traces_endpoint, "flag", zero_code=True)
        try:
            frames = app.chat(question)
            ok, spans = rx.wait_for(lambda ss: any(s.name == semconv.SPAN_STREAM for s in ss)
                                    and any(not s.parent_span_id and s.name.startswith("GET /chat")
                                            for s in ss), 15)
        finally:
            _stop(app)
        spans = rx.spans()
    assert ok, [s.name for s in spans]
    # the app's guard() judged the answer; streamjudge's body middleware stayed off this app
    streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1 and streams[0].attributes[semconv.STREAM_QUESTION] == question
    assert len([d for e, d in frames if e == "warning" and d.get("stage") != "preflight"]) == \
        streams[0].attributes[semconv.STREAM_ALERTS]
    # inside the request's server span (FastAPI instrumentation, loaded by opentelemetry-instrument)
    root = next(s for s in spans if not s.parent_span_id and s.trace_id == streams[0].trace_id)
    assert root.name.startswith("GET /chat")
