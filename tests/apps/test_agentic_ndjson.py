"""(b) An agentic RAG streaming NDJSON ``{node: content}`` lines, a document grader in a conditional edge.

The answer node (``generate_answer``) calls ``ainvoke`` under ``stream_mode="updates"``: its answer is not
streamed, so it is judged whole — unless the guard has to act on it (hold-back, stop, regenerate), in
which case the model is asked to stream and the node receives what the guard released.
"""

from __future__ import annotations

import json
from typing import Any

import httpx
import pytest

from apps.conftest import (
    ANSWER,
    CONTINUATION,
    FIRST_TOKEN_DELAY_S,
    GROUNDED,
    QUESTION,
    failing_checkpoints,
    serve,
    stream_exported,
    stream_span,
)
from instrumentation.otlp_receiver import OTLPReceiver
from judges.scripted_server import ScriptedLLMServer
from streamjudge import semconv
from streamjudge.config import DEFAULT_FALLBACK

pytestmark = pytest.mark.integration
SETTINGS = {"answer_nodes": "generate_answer"}


def ask(url: str) -> tuple[bytes, list[dict[str, Any]]]:
    with httpx.stream("POST", f"{url}/ask", json={"question": QUESTION}, timeout=30) as r:
        assert r.status_code == 200
        raw = r.read()
    return raw, [json.loads(line) for line in raw.splitlines() if line.strip()]


def test_default_changes_no_byte_and_judges_the_answer_node_only(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver
) -> None:
    with serve("agentic_ndjson.py", llm_server, None, instrumented=False) as app:
        plain, _ = ask(app.url)
    with serve("agentic_ndjson.py", llm_server, receiver, **SETTINGS) as app:
        raw, lines = ask(app.url)
        spans = receiver.wait_for(stream_exported)
    assert raw == plain
    assert [next(iter(line)) for line in lines] == ["generate_query_or_respond", "retrieve", "generate_answer"]
    answer = lines[-1]["generate_answer"]
    assert answer == ANSWER
    nodes = {s.attributes.get(semconv.NODE_NAME) for s in spans}
    assert {"generate_query_or_respond", "retrieve", "generate_answer"} <= nodes
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_ANSWER] == answer  # not the grader's {"binary_score": ...}
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1
    # the answer call waits 0.3 s; before it the tool call and the grader waited 0.3 s each
    assert stream.attributes[semconv.STREAM_TTFT_MS] >= FIRST_TOKEN_DELAY_S * 1e3
    assert stream.attributes[semconv.STREAM_TTFT_REQUEST_MS] >= 3 * FIRST_TOKEN_DELAY_S * 1e3
    failed = failing_checkpoints(spans, stream)
    assert [c.attributes[semconv.CHECKPOINT_CHAR_START] for c in failed] == [len(GROUNDED)]
    # a non-streamed answer's verdict agrees with its scores
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
    assert stream.attributes[semconv.score_attribute(semconv.FAITHFULNESS)] < 0.7


@pytest.mark.parametrize(("action", "expected"), [
    ("regenerate", GROUNDED + CONTINUATION),
    ("stop", GROUNDED + " " + DEFAULT_FALLBACK),
])
def test_hold_back_acts_on_a_non_streamed_answer(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver, action: str, expected: str
) -> None:
    with serve("agentic_ndjson.py", llm_server, receiver, action=action, mode="hold_back",
               client_events="on", **SETTINGS) as app:
        _, lines = ask(app.url)
        spans = receiver.wait_for(stream_exported)
    answers = [line["generate_answer"] for line in lines if "generate_answer" in line]
    assert answers == [expected]  # the node's output: the fabricated sentence never reached it
    warnings = [line for line in lines if line.get("type") == "warning"]  # NDJSON client events
    assert warnings and warnings[0]["metric"] == semconv.FAITHFULNESS
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_VERDICT] == ("regenerated" if action == "regenerate" else "stopped")


def test_a_json_endpoint_gets_a_verdict_consistent_with_its_scores(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver
) -> None:
    with serve("agentic_ndjson.py", llm_server, receiver, **SETTINGS) as app:
        answer = httpx.post(f"{app.url}/ask_json", json={"question": QUESTION}, timeout=30).json()["answer"]
        spans = receiver.wait_for(stream_exported)
    assert answer == ANSWER
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_ANSWER] == answer
    assert stream.attributes[semconv.score_attribute(semconv.FAITHFULNESS)] < 0.7
    assert stream.attributes[semconv.STREAM_ALERTS] == 1
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
