"""(a) A ReAct agent with a retrieval tool behind ``StreamingResponse`` (``data:`` JSON frames, ``[DONE]``).

Its client is strict, like the public template's: it stops reading at the first line that is not a
``data:`` line. The agent's node is ``agent``; it retrieves through its tool before its answer's first
token, so that is when the contexts are known and the pre-flight gate runs.
"""

from __future__ import annotations

import json
import time
from typing import Any

import httpx
import pytest

from apps.conftest import (
    ANSWER,
    CONTINUATION,
    FABRICATED,
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
from streamjudge.config import DEFAULT_FALLBACK, DEFAULT_REGENERATE_INSTRUCTION

pytestmark = pytest.mark.integration
SETTINGS = {"answer_nodes": "agent"}


def strict_client(url: str) -> tuple[bytes, str, list[dict[str, Any]], float]:
    """(raw body, answer text, other typed frames, seconds to the first token frame)."""
    raw = b""
    tokens: list[str] = []
    others: list[dict[str, Any]] = []
    first = 0.0
    t0 = time.perf_counter()
    with httpx.stream("POST", f"{url}/stream", json={"message": QUESTION}, timeout=30) as r:
        assert r.status_code == 200
        for line in r.iter_lines():
            raw += line.encode() + b"\n"
            if not line:
                continue
            if not line.startswith("data: "):
                break  # what the template's client does with a line it does not know
            data = line[6:]
            if data == "[DONE]":
                break
            frame = json.loads(data)
            if frame.get("type") == "token":
                first = first or time.perf_counter() - t0
                tokens.append(frame["content"])
            else:
                others.append(frame)
    return raw, "".join(tokens), others, first


def test_default_changes_no_byte_and_judges_the_agents_answer(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver
) -> None:
    with serve("react_sse.py", llm_server, None, instrumented=False) as app:
        plain, plain_text, _, _ = strict_client(app.url)
    with serve("react_sse.py", llm_server, receiver, **SETTINGS) as app:
        httpx.get(f"{app.url}/healthz")
        httpx.get(f"{app.url}/metrics")
        raw, text, others, client_ttft = strict_client(app.url)
        spans = receiver.wait_for(stream_exported)
    assert raw == plain and text == plain_text == ANSWER and not others
    nodes = {s.attributes.get(semconv.NODE_NAME) for s in spans}
    assert {"agent", "tools"} <= nodes
    stream = stream_span(spans)  # one: /healthz and /metrics carry no answer
    request = next(s for s in spans if s.span_id == stream.parent_span_id)
    assert request.name == "POST /stream"
    assert stream.attributes[semconv.STREAM_ANSWER] == text
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1  # the tool's passage
    assert stream.attributes[semconv.PREFLIGHT_LABEL] == "pass"
    # two model calls before the first token (the tool call, then the answer), each waits 0.3 s: the
    # request waited for both, the answer's own time to first token counts from its turn of the agent
    ttft = stream.attributes[semconv.STREAM_TTFT_MS]
    ttft_request = stream.attributes[semconv.STREAM_TTFT_REQUEST_MS]
    assert ttft >= FIRST_TOKEN_DELAY_S * 1e3 and ttft_request - ttft >= FIRST_TOKEN_DELAY_S * 1e3
    assert ttft_request <= client_ttft * 1e3 + 50
    failed = failing_checkpoints(spans, stream)
    assert [(c.attributes[semconv.CHECKPOINT_CHAR_START], c.attributes[semconv.CHECKPOINT_CHAR_END])
            for c in failed] == [(len(GROUNDED), len(ANSWER))]
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
    assert stream.attributes[semconv.STREAM_OUTCOME] == "completed"


def _fallback_after(text: str) -> str:
    return text + " " + DEFAULT_FALLBACK


@pytest.mark.parametrize(("action", "mode", "expected", "verdict"), [
    ("flag", "stream_first", ANSWER, "flagged"),
    ("flag", "hold_back", ANSWER, "flagged"),
    ("stop", "stream_first", _fallback_after(ANSWER), "stopped"),
    ("stop", "hold_back", _fallback_after(GROUNDED), "stopped"),
    ("regenerate", "stream_first", ANSWER + CONTINUATION, "regenerated"),
    ("regenerate", "hold_back", GROUNDED + CONTINUATION, "regenerated"),
])
def test_each_action_with_client_events_on(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver, action: str, mode: str, expected: str,
    verdict: str,
) -> None:
    llm_server.requests.clear()
    with serve("react_sse.py", llm_server, receiver, action=action, mode=mode, client_events="on",
               **SETTINGS) as app:
        _, text, others, _ = strict_client(app.url)
        spans = receiver.wait_for(stream_exported)
    assert text == expected  # what the app's node received from its model, token by token
    kinds = [f["type"] for f in others]
    assert "warning" in kinds  # in the app's own frame format: a data-only JSON frame
    warning = next(f for f in others if f["type"] == "warning")
    assert warning["metric"] == semconv.FAITHFULNESS
    # the fabricated sentence and only it: not the window, not the grounded sentences before it
    assert ANSWER[warning["char_start"] : warning["char_end"]] == FABRICATED
    assert [ANSWER[s["start"] : s["end"]] for s in warning["sentences"]] == [FABRICATED]
    if action == "stop":
        assert kinds[-1] == "stop"
    if action == "regenerate":
        # stream-first showed the fabricated sentence, so it is retracted; hold-back never showed it
        assert ("retract" in kinds) is (mode == "stream_first")
        reprompt = [r["body"] for r in llm_server.model_requests("/chat/completions")
                    if DEFAULT_REGENERATE_INSTRUCTION in json.dumps(r["body"])]
        assert len(reprompt) == 1
        msgs = reprompt[0]["messages"]
        assert msgs[-2] == {"role": "assistant", "content": GROUNDED}
    if mode == "hold_back" and action != "flag":
        assert FABRICATED not in text
    stream = stream_span(spans)
    assert stream.attributes[semconv.STREAM_VERDICT] == verdict
    assert stream.attributes[semconv.STREAM_MODE] == mode
    if action == "stop":
        assert stream.attributes[semconv.STREAM_OUTCOME] == "stopped"
    if action == "regenerate":
        assert stream.attributes[semconv.STREAM_REGENERATIONS] == 1
        assert stream.attributes[semconv.STREAM_ANSWER] == GROUNDED + CONTINUATION


@pytest.mark.parametrize("case", ["sdk_disabled", "unsampled"])
def test_nothing_waits_when_spans_do_not_record(
    llm_server: ScriptedLLMServer, receiver: OTLPReceiver, case: str
) -> None:
    # hold-back with a 30 s end wait: a guard waiting for verdicts that never come would hit the
    # client's 10 s timeout; stop would cut the answer
    extra = {"OTEL_SDK_DISABLED": "true"} if case == "sdk_disabled" else {}
    headers = {"traceparent": "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-00"} \
        if case == "unsampled" else {}
    with serve("react_sse.py", llm_server, receiver, env=extra, mode="hold_back", action="stop",
               client_events="on", end_wait="30", **SETTINGS) as app, \
            httpx.stream("POST", f"{app.url}/stream", json={"message": QUESTION}, headers=headers,
                         timeout=10) as r:
        lines = [line for line in r.iter_lines() if line.startswith("data: {")]
    frames = [json.loads(line[6:]) for line in lines]
    assert "".join(f["content"] for f in frames if f["type"] == "token") == ANSWER
    assert [f for f in frames if f["type"] != "token"] == []
