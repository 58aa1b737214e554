"""(c) A self-RAG graph whose hallucination grader runs in the conditional edge after ``generate``.

LangGraph tags the grader's run with ``langgraph_node="generate"``; its structured output
(``{"binary_score": "yes"}``) reaches the app's own ``messages`` stream, but never the judged answer.
"""

from __future__ import annotations

import json

import httpx
import pytest

from apps.conftest import (
    ANSWER,
    CONTINUATION,
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

pytestmark = pytest.mark.integration


def chat(url: str) -> tuple[bytes, list[tuple[str, dict[str, object]]]]:
    with httpx.stream("GET", f"{url}/chat", params={"q": QUESTION}, timeout=30) as r:
        assert r.status_code == 200
        raw = r.read()
    frames = []
    for block in raw.decode().replace("\r\n", "\n").split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line)
        if "data" in fields:
            frames.append((fields.get("event", "message"), json.loads(fields["data"])))
    return raw, frames


def test_the_graders_output_is_not_the_answer(llm_server: ScriptedLLMServer, receiver: OTLPReceiver) -> None:
    with serve("self_rag.py", llm_server, None, instrumented=False) as app:
        plain, _ = chat(app.url)
    with serve("self_rag.py", llm_server, receiver) as app:
        raw, frames = chat(app.url)
        spans = receiver.wait_for(stream_exported)
    assert raw == plain
    streamed = "".join(str(p["token"]) for e, p in frames if e == "token")
    assert '"binary_score"' in streamed  # the app shows its grader's chunks: its own business
    generation = frames[-1][1]["generation"]
    assert generation == ANSWER
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_ANSWER] == generation
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1
    assert {"retrieve", "generate"} <= {s.attributes.get(semconv.NODE_NAME) for s in spans}
    failed = failing_checkpoints(spans, stream)
    assert [c.attributes[semconv.CHECKPOINT_CHAR_START] for c in failed] == [len(GROUNDED)]


def test_regenerate_with_hold_back_leaves_the_grader_alone(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver
) -> None:
    with serve("self_rag.py", llm_server, receiver, action="regenerate", mode="hold_back",
               client_events="on") as app:
        _, frames = chat(app.url)
        spans = receiver.wait_for(stream_exported)
    assert frames[-1] == ("done", {"generation": GROUNDED + CONTINUATION})
    assert any(e == "warning" for e, _ in frames)  # the app's SSE format: an ``event: warning`` frame
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_VERDICT] == "regenerated"
    assert stream.attributes[semconv.STREAM_ANSWER] == GROUNDED + CONTINUATION
