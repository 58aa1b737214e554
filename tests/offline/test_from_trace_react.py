"""cases-from-trace on a ReAct agent's trace: the answer span opens with the agent's first model call, the
retriever runs inside the tool after it, and the answer is written by the agent's last model call."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from streamjudge import cli, semconv
from streamjudge.offline.from_trace import cases_from_files
from streamjudge.offline.replay import load_cases

TRACE_ID = "5b8efff798038103d269b633813fc60c"
QUESTION = "Who founded the company?"
DOCS = ["Harrison founded the company in 2022.", "It later grew to fifty people."]
ANSWER = "Harrison founded the company in 2022."


def _value(v: Any) -> dict[str, Any]:
    if isinstance(v, bool):
        return {"boolValue": v}
    if isinstance(v, int):
        return {"intValue": str(v)}
    return {"stringValue": v}


def _span(span_id: str, parent: str, name: str, start: int, end: int, **attrs: Any) -> dict[str, Any]:
    return {"traceId": TRACE_ID, "spanId": span_id, "parentSpanId": parent, "name": name,
            "startTimeUnixNano": str(start), "endTimeUnixNano": str(end),
            "attributes": [{"key": k, "value": _value(v)} for k, v in attrs.items()]}


def react_trace(model_kind: dict[str, Any]) -> dict[str, Any]:
    """request -> LangGraph -> agent (model call: a tool call) -> tools -> retrieve (tool) -> retriever ->
    agent (model call: the answer); the stream span from the first agent step to the answer's end.
    ``model_kind``: the attributes that mark a model call (OpenInference's or the GenAI conventions')."""
    kind = semconv.OPENINFERENCE_SPAN_KIND
    retrieved = {f"retrieval.documents.{i}.document.content": d for i, d in enumerate(DOCS)}
    spans = [
        _span("a000000000000001", "", "POST /stream", 0, 1000),
        _span("a000000000000002", "a000000000000001", "LangGraph", 10, 990, **{
            kind: "CHAIN", "input.value": json.dumps({"messages": [["user", QUESTION]]})}),
        _span("a000000000000003", "a000000000000002", "agent", 20, 300, **{kind: "CHAIN"}),
        _span("a000000000000004", "a000000000000003", "ChatOpenAI", 30, 290, **model_kind,
              **{"output.value": json.dumps({"generations": [[{"text": ""}]]})}),
        _span("a000000000000005", "a000000000000002", "tools", 310, 500, **{kind: "CHAIN"}),
        _span("a000000000000006", "a000000000000005", "retrieve", 320, 490, **{
            kind: "TOOL", "output.value": "\n\n".join(DOCS)}),
        _span("a000000000000007", "a000000000000006", "VectorStoreRetriever", 330, 480, **{
            kind: "RETRIEVER"}, **retrieved),
        _span("a000000000000008", "a000000000000002", "agent", 510, 980, **{kind: "CHAIN"}),
        _span("a000000000000009", "a000000000000008", "ChatOpenAI", 520, 970, **model_kind),
        _span("a00000000000000a", "a000000000000003", semconv.SPAN_STREAM, 20, 985, **{
            semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM, semconv.STREAM_ANSWER: ANSWER,
            semconv.STREAM_CONTEXT_COUNT: len(DOCS), semconv.STREAM_ALERTS: 0,
            semconv.STREAM_VERDICT: "pass", semconv.EVAL_STATUS: "judged"}),
    ]
    return {"resourceSpans": [{"resource": {}, "scopeSpans": [{"scope": {"name": "t"}, "spans": spans}]}]}


def test_contexts_of_a_react_trace_come_from_the_retriever_before_the_last_model_call(tmp_path: Path) -> None:
    for i, marks in enumerate(({semconv.OPENINFERENCE_SPAN_KIND: "LLM"},
                               {semconv.GEN_AI_OPERATION_NAME: "chat"})):
        path = tmp_path / f"react{i}.json"
        path.write_text(json.dumps(react_trace(marks)))
        [found] = list(cases_from_files([path]))
        assert found.case is not None, found.skipped
        assert list(found.case.contexts) == DOCS
        assert found.contexts_from == "retriever span 'VectorStoreRetriever' (retrieval.documents)"
        assert found.case.question == QUESTION
        assert not any("context" in n for n in found.notes)  # the count on the span is met


def test_react_case_replays_with_faithfulness_judged(tmp_path: Path) -> None:
    trace = tmp_path / "react.json"
    trace.write_text(json.dumps(react_trace({semconv.OPENINFERENCE_SPAN_KIND: "LLM"})))
    cases_path = tmp_path / "cases.jsonl"
    assert cli.main(["cases-from-trace", str(trace), "-o", str(cases_path)]) == 0
    [case] = load_cases(cases_path)
    assert case.contexts == tuple(DOCS) and case.expect_alert is False


def test_without_a_model_call_in_the_answer_the_answer_start_still_bounds_the_contexts(tmp_path: Path) -> None:
    doc = react_trace({})  # no span marks a model call: retrieval after the answer's start is not taken
    path = tmp_path / "plain.json"
    path.write_text(json.dumps(doc))
    [found] = list(cases_from_files([path]))
    assert found.case is not None and found.case.contexts == ()
