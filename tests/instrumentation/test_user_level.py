"""User-level tests: the example app under ``opentelemetry-instrument`` and with ``instrument_app``.

A real uvicorn server in a subprocess, a real HTTP client streaming SSE, and a real OTLP/HTTP receiver
decoding what the process exported. Nothing in the app knows about streamjudge.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from instrumentation.otlp_receiver import OTLPReceiver, SpanRecord
from streamjudge import semconv

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
APP = ROOT / "examples" / "adaptive_rag" / "app.py"
BIN = Path(sys.executable).parent
QUESTION = "How tall is the Eiffel Tower?"
FAITH = semconv.score_attribute(semconv.FAITHFULNESS)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _start(mode: str, receiver: OTLPReceiver, port: int, token_delay_ms: int = 5) -> subprocess.Popen[str]:
    env = {
        **os.environ,
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_HEADERS": "x-test-tenant=streamjudge",
        "OTEL_SERVICE_NAME": f"rag-{mode}",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "OTEL_METRICS_EXPORTER": "none",
        "EXAMPLE_PORT": str(port),
        "EXAMPLE_TOKEN_DELAY_MS": str(token_delay_ms),
        "STREAMJUDGE_JUDGE": "local",
        "STREAMJUDGE_CLIENT_EVENTS": "on",  # these tests read the warnings the client receives
    }
    cmd = [str(BIN / "python"), str(APP)]
    if mode == "zero-code":
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    else:
        cmd.append("--instrument-app")
    proc = subprocess.Popen(cmd, env=env, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"app exited early:\n{proc.stdout.read() if proc.stdout else ''}")
        try:
            httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
            return proc
        except httpx.HTTPError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError("app did not start")


def _stop(proc: subprocess.Popen[str]) -> str:
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.stdout.read() if proc.stdout else ""


def _sse(port: int, path: str, **params: object) -> list[tuple[str, dict[str, object]]]:
    frames: list[tuple[str, dict[str, object]]] = []
    with httpx.stream("GET", f"http://127.0.0.1:{port}{path}", params=params, timeout=30) as r:
        assert r.status_code == 200
        event, data = "message", ""
        for line in r.iter_lines():
            if line.startswith("event:"):
                event = line[6:].strip()
            elif line.startswith("data:"):
                data = line[5:].strip()
            elif not line and data:
                frames.append((event, json.loads(data)))
                event, data = "message", ""
    return frames


@pytest.fixture(params=["zero-code", "instrument_app"])
def served(request: pytest.FixtureRequest) -> Iterator[tuple[str, int, OTLPReceiver]]:
    receiver = OTLPReceiver().start()
    port = _free_port()
    proc = None
    marker = request.node.get_closest_marker("token_delay_ms")
    try:
        proc = _start(request.param, receiver, port, *(marker.args if marker else ()))
        yield request.param, port, receiver
    finally:
        out = _stop(proc) if proc is not None else ""
        receiver.stop()
        assert "Traceback" not in out, out


def _trace_of(spans: list[SpanRecord], answer: str) -> list[SpanRecord]:
    stream = next(s for s in spans if s.name == semconv.SPAN_STREAM
                  and s.attributes.get(semconv.STREAM_ANSWER) == answer)
    return [s for s in spans if s.trace_id == stream.trace_id]


def _judged(spans: list[SpanRecord], n: int) -> bool:
    streams = [s for s in spans if s.name == semconv.SPAN_STREAM and FAITH in s.attributes]
    return len(streams) >= n


def test_grounded_and_hallucinating_answers_are_traced_and_judged(
    served: tuple[str, int, OTLPReceiver],
) -> None:
    mode, port, receiver = served
    grounded = _sse(port, "/chat", q=QUESTION)
    invented = _sse(port, "/chat/raw", q=QUESTION, hallucinate=1)
    spans = receiver.wait_for(lambda s: _judged(s, 2))

    for frames, hallucinating in ((grounded, False), (invented, True)):
        answer = "".join(str(p["token"]) for e, p in frames if e == "token")
        # the grader ("yes") and the reflector ("grounded") never reach the answer
        assert answer and "yes" not in answer.split() and "grounded" not in answer
        trace = _trace_of(spans, answer)
        by_name = {s.name: s for s in trace}
        server = next(s for s in trace if not s.parent_span_id)
        assert server.resource["service.name"] == f"rag-{mode}"

        # node spans with timings, children of the graph span, in the request's trace
        nodes = {s.attributes[semconv.NODE_NAME]: s for s in trace if semconv.NODE_NAME in s.attributes}
        assert {"retrieve", "grade", "generate", "reflect"} <= set(nodes)
        for node in nodes.values():
            assert node.attributes[semconv.NODE_ELAPSED_MS] > 0
            assert abs(node.attributes[semconv.NODE_ELAPSED_MS] - (node.end_ns - node.start_ns) / 1e6) < 5
        assert nodes["generate"].attributes[semconv.NODE_ELAPSED_MS] > 5  # >= 5 ms per token

        # the stream span: child of the request, time to first token, counts, contexts from retrieval
        stream = by_name[semconv.SPAN_STREAM]
        assert stream.parent_span_id == server.span_id
        assert stream.attributes[semconv.STREAM_TTFT_MS] > 0
        assert stream.attributes[semconv.STREAM_TOKENS] == sum(1 for e, _ in frames if e == "token")
        assert stream.attributes[semconv.STREAM_QUESTION] == QUESTION
        assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1
        assert stream.attributes[semconv.PREFLIGHT_LABEL] == "pass"

        # checkpoint spans with evaluation events
        checkpoints = [s for s in trace if s.name == semconv.SPAN_CHECKPOINT]
        assert checkpoints and all(s.parent_span_id == stream.span_id for s in checkpoints)
        assert all(any(e.name == semconv.EVENT_EVALUATION_RESULT for e in s.events) for s in checkpoints)

        # final scores on the answer span; an alert on the hallucinating answer only
        warnings = [p for e, p in frames if e == "warning"]
        final = stream.attributes[FAITH]
        evals = [e for e in stream.events if e.name == semconv.EVENT_EVALUATION_RESULT]
        assert {e.attributes[semconv.GEN_AI_EVALUATION_NAME] for e in evals} >= {
            semconv.FAITHFULNESS, semconv.ANSWER_RELEVANCY, semconv.CONTEXT_PRECISION}
        if hallucinating:
            assert stream.attributes[semconv.STREAM_ALERTS] >= 1
            assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
            assert any(e.name == semconv.EVENT_ALERT for e in stream.events)
            assert final < 0.5
            assert warnings and warnings[0]["metric"] == semconv.FAITHFULNESS
            assert int(warnings[0]["char_end"]) <= len(answer)  # type: ignore[call-overload]
        else:
            assert stream.attributes[semconv.STREAM_ALERTS] == 0
            assert not any(e.name == semconv.EVENT_ALERT for e in stream.events)
            assert final >= 0.9
            assert not warnings
    # no per-chunk "http send" spans in the trace (the server span covers the body)
    assert not [s for s in spans if s.name.endswith("http send")]
    # OTEL_EXPORTER_OTLP_HEADERS reached the receiver
    assert any(h.get("x-test-tenant") == "streamjudge" for h in receiver.headers_seen)


# the answer takes 46 x 25 ms, so the client's departure after its first token comes long before the answer
# could end (at 5 ms per token, one fresh-clone CI run saw the whole answer end before the server noticed)
@pytest.mark.token_delay_ms(25)
def test_client_disconnect_ends_the_stream_span(served: tuple[str, int, OTLPReceiver]) -> None:
    _, port, receiver = served
    with httpx.stream("GET", f"http://127.0.0.1:{port}/chat", params={"q": QUESTION}, timeout=30) as r:
        for line in r.iter_lines():
            if line.startswith("event: token"):
                break  # leave after the first token
    spans = receiver.wait_for(
        lambda s: any(x.name == semconv.SPAN_STREAM for x in s), timeout=30)
    stream = next(s for s in spans if s.name == semconv.SPAN_STREAM)
    assert stream.attributes[semconv.STREAM_OUTCOME] == "disconnected"
    assert stream.status_code == 2  # STATUS_CODE_ERROR
    assert stream.attributes[semconv.STREAM_TOKENS] < 46  # it did not run to the end
    # the next request still works (nothing leaked into the next stream)
    frames = _sse(port, "/chat", q=QUESTION)
    assert any(e == "done" for e, _ in frames)
