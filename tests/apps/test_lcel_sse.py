"""(e) A langserve-style conversational retrieval chain (LCEL, no LangGraph) streamed with ``astream`` as SSE.

The chain calls its model twice: the condense-question call (its output feeds the retriever) and the
answer (``prompt | model | parser`` at the chain's end). Only the answer is judged; the question is the
chain input's ``input``; the contexts are the retriever's documents.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from apps.conftest import (
    ANSWER,
    CONTINUATION,
    FABRICATED,
    GROUNDED,
    QUESTION,
    app_model,
    failing_checkpoints,
    serve,
    stream_exported,
    stream_span,
)
from instrumentation.otlp_receiver import OTLPReceiver
from judges.scripted_server import ScriptedLLMServer
from streamjudge import semconv
from streamjudge.config import DEFAULT_FALLBACK, DEFAULT_REGENERATE_INSTRUCTION

pytestmark = pytest.mark.integration
HISTORY = [("human", "What is in Paris?"), ("ai", "The Eiffel Tower.")]
FOLLOW_UP = "How tall is it?"
STANDALONE = QUESTION  # what the condense-question call answers: the retriever's query


def chain_model(body: dict[str, Any]) -> dict[str, Any] | None:
    """The condense-question call gets the standalone question; everything else as the other apps."""
    text = "\n".join(str(m.get("content")) for m in body.get("messages", []))
    if "standalone question" in text and DEFAULT_REGENERATE_INSTRUCTION[:30] not in text:
        return {"content": STANDALONE}
    return app_model(body)


@pytest.fixture
def chain_server(llm_server: ScriptedLLMServer) -> Iterator[ScriptedLLMServer]:
    llm_server.app_responder = chain_model
    llm_server.requests.clear()
    try:
        yield llm_server
    finally:
        llm_server.app_responder = app_model


def client(url: str) -> tuple[str, list[tuple[str, Any]]]:
    """(the answer the client read from ``event: data`` frames, the other frames as (event, data))."""
    text: list[str] = []
    others: list[tuple[str, Any]] = []
    event = "message"
    with httpx.stream("POST", f"{url}/chat/stream", json={"input": FOLLOW_UP, "chat_history": HISTORY},
                      timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            if line.startswith("event: "):
                event = line[7:]
            elif line.startswith("data: "):
                data = json.loads(line[6:])
                if event == "data":
                    text.append(data)
                else:
                    others.append((event, data))
            elif not line:
                if event == "end":
                    others.append(("end", None))
                event = "message"
    return "".join(text), others


def test_the_answer_call_is_judged_with_the_chains_question_and_documents(
    chain_server: ScriptedLLMServer, receiver: OTLPReceiver
) -> None:
    with serve("lcel_sse.py", chain_server, None, instrumented=False) as app:
        plain, _ = client(app.url)
    with serve("lcel_sse.py", chain_server, receiver) as app:
        text, others = client(app.url)
        spans = receiver.wait_for(stream_exported)
        found = httpx.post(f"{app.url}/search/stream", json={"input": FOLLOW_UP, "chat_history": HISTORY},
                           timeout=30)
        assert found.status_code == 200 and "330 metres" in found.text
        spans = receiver.wait_for(lambda got: any(s.name == "POST /search/stream" for s in got))
    assert text == plain == ANSWER and others == [("end", None)]
    # each chat ran both model calls (the condense call's text fed the retriever, not the stream), the
    # search its condense call
    asked = [json.dumps(r["body"]) for r in chain_server.model_requests("/chat/completions")]
    assert sum("standalone question" in a for a in asked) == 3 and len(asked) == 5
    stream = stream_span(spans)
    request = next(s for s in spans if s.span_id == stream.parent_span_id)
    assert request.name == "POST /chat/stream"
    assert stream.attributes[semconv.STREAM_ANSWER] == ANSWER
    assert stream.attributes[semconv.STREAM_QUESTION] == FOLLOW_UP  # the chain input's ``input``
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1  # the one document retrieved
    checkpoints = [s for s in spans if s.name == semconv.SPAN_CHECKPOINT
                   and s.parent_span_id == stream.span_id]
    judged = "".join(str(c.attributes.get(semconv.CHECKPOINT_TEXT, "")) for c in checkpoints)
    assert checkpoints and STANDALONE not in judged
    failed = failing_checkpoints(spans, stream)
    assert [(c.attributes[semconv.CHECKPOINT_CHAR_START], c.attributes[semconv.CHECKPOINT_CHAR_END])
            for c in failed] == [(len(GROUNDED), len(ANSWER))]
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
    assert semconv.ANSWER_NOT_FOUND not in request.attributes
    # the search route's model call feeds the retriever: nothing judged, and its request span says why
    search = next(s for s in spans if s.name == "POST /search/stream")
    assert search.attributes[semconv.ANSWER_NOT_FOUND] == "model_output_not_returned"
    assert len([s for s in spans if s.name == semconv.SPAN_STREAM]) == 1


@pytest.mark.parametrize(("action", "mode", "expected", "verdict"), [
    ("stop", "hold_back", GROUNDED + " " + DEFAULT_FALLBACK, "stopped"),
    ("regenerate", "stream_first", ANSWER + CONTINUATION, "regenerated"),
    ("regenerate", "hold_back", GROUNDED + CONTINUATION, "regenerated"),
])
def test_actions_act_on_the_chains_answer(
    chain_server: ScriptedLLMServer, receiver: OTLPReceiver, action: str, mode: str, expected: str,
    verdict: str,
) -> None:
    with serve("lcel_sse.py", chain_server, receiver, action=action, mode=mode, client_events="on") as app:
        text, others = client(app.url)
        spans = receiver.wait_for(stream_exported)
    assert text == expected  # what the chain's parser received from its model
    kinds = [event for event, _ in others]
    assert "warning" in kinds
    # the app's own terminal frame always arrives, last; a stop's event comes before it
    assert kinds[-1] == "end" and ("stop" in kinds) is (action == "stop")
    warning = next(data for event, data in others if event == "warning")
    assert ANSWER[warning["char_start"]: warning["char_end"]] == FABRICATED
    if mode == "hold_back":
        assert FABRICATED not in text
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_VERDICT] == verdict
    assert stream.attributes[semconv.STREAM_MODE] == mode
    if action == "regenerate":
        assert stream.attributes[semconv.STREAM_ANSWER] == GROUNDED + CONTINUATION
