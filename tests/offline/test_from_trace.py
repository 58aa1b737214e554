"""cases-from-trace: a trace recorded from the example app's graph becomes replay cases that alert again."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import streamjudge
from streamjudge import cli, semconv
from streamjudge.config import Settings
from streamjudge.instrumentation import StreamJudgeInstrumentor
from streamjudge.offline.from_trace import (
    TraceFormatError,
    cases_from_files,
    extract,
    read_spans,
    spans_from_jaeger,
)
from streamjudge.offline.otlp_file import OTLPFileReceiver
from streamjudge.offline.replay import load_cases

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "adaptive_rag"))
import rag

#: (question, hallucinate): grounded, invented facts, weak retrieval (nothing in the corpus)
ASKED = (
    ("How tall is the Eiffel Tower?", False),
    ("When was the Eiffel Tower built?", True),
    ("How high is Mount Kilimanjaro?", True),
    ("How long is the Danube river?", False),
)


def record(path: Path, settings: Settings, asked: tuple[tuple[str, bool], ...] = ASKED) -> dict[str, Any]:
    """Run the example graph in process under streamjudge, spans exported as OTLP/HTTP to a receiver that
    writes OTLP JSON lines; returns the recorded stream span attributes by question."""
    with OTLPFileReceiver(path) as rx:
        rt = streamjudge.configure(
            settings, downstream=BatchSpanProcessor(OTLPSpanExporter(endpoint=rx.traces_endpoint)),
            set_global=False, backends_from_env=False,
        )
        inst = StreamJudgeInstrumentor()
        inst.instrument()
        try:
            graph = rag.build_graph()

            async def ask(q: str, hallucinate: bool) -> None:
                async for _event, _payload in rag.stream_answer(graph, q, hallucinate=hallucinate):
                    pass

            for q, hallucinate in asked:
                with rt.tracer.start_as_current_span("request"):
                    asyncio.run(ask(q, hallucinate))
            rt.force_flush(10_000)
        finally:
            inst.uninstrument()
            rt.shutdown()
        streams = [s for s in rx.spans() if s.attributes.get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM]
    assert len(streams) == len(asked)
    return {s.trace_id: s.attributes for s in streams}


def test_recorded_trace_becomes_cases_that_replay_with_the_same_alerts(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "trace.jsonl"
    recorded = record(trace, Settings(end_wait_s=1.0))
    cases_path = tmp_path / "cases.jsonl"
    assert cli.main(["cases-from-trace", str(trace), "-o", str(cases_path)]) == 0
    err = capsys.readouterr().err
    assert "output.value of 'grade'" in err  # where the contexts came from is said

    cases = load_cases(cases_path)  # the replay loader accepts the file
    assert {c.id for c in cases} == set(recorded)
    for c in cases:
        attrs = recorded[c.id]
        assert c.question == attrs[semconv.STREAM_QUESTION]
        assert c.answer == attrs[semconv.STREAM_ANSWER]
        assert len(c.contexts) == attrs[semconv.STREAM_CONTEXT_COUNT]
        assert c.expect_alert is (attrs[semconv.STREAM_ALERTS] > 0)
        # the graded documents, as the generator saw them
        for ctx in c.contexts:
            assert any(ctx == d.page_content for d in rag.CORPUS)
    assert {c.expect_alert for c in cases} == {True, False}

    # replaying the cases fires exactly where the recording did
    assert cli.main(["replay", str(cases_path), "--json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    results = {r["id"]: r for r in rows if not r.get("summary")}
    for trace_id, attrs in recorded.items():
        assert results[trace_id]["fired"] is (attrs[semconv.STREAM_ALERTS] > 0)
    assert rows[-1]["balanced_accuracy"] == 1.0


def test_deferred_final_pass_contexts_are_read_from_the_answer_span(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    recorded = record(trace, Settings(end_wait_s=1.0, final_pass="deferred"), ASKED[:2])
    found = list(cases_from_files([trace]))
    assert [e.contexts_from for e in found] == [semconv.STREAM_CONTEXTS] * 2
    for e in found:
        assert e.case is not None
        assert list(e.case.contexts) == list(recorded[e.trace_id][semconv.STREAM_CONTEXTS])


def test_without_content_capture_the_answer_is_skipped_with_the_reason(tmp_path: Path, capsys) -> None:  # type: ignore[no-untyped-def]
    trace = tmp_path / "trace.jsonl"
    record(trace, Settings(end_wait_s=1.0, capture_content=False), ASKED[:1])
    found = list(cases_from_files([trace]))
    assert len(found) == 1 and found[0].case is None
    assert "content capture off" in str(found[0].skipped)
    assert cli.main(["cases-from-trace", str(trace)]) == 2
    assert "no answer span" in capsys.readouterr().err


def test_a_capped_answer_is_not_taken_for_the_whole_one(tmp_path: Path) -> None:
    trace = tmp_path / "trace.jsonl"
    record(trace, Settings(end_wait_s=1.0, max_text_attribute_chars=60), ASKED[:1])
    (e,) = cases_from_files([trace])
    assert e.case is None and "shortened" in str(e.skipped)


def _jaeger(spans: list[dict[str, Any]]) -> dict[str, Any]:
    return {"data": [{"traceID": "00ab", "spans": spans, "processes": {}}]}


def test_jaeger_json_tags_types_and_references() -> None:
    doc = _jaeger([
        {"traceID": "00ab", "spanID": "1", "operationName": "retrieve", "references": [],
         "startTime": 1_000, "duration": 10,
         "tags": [{"key": "retrieval.documents.1.document.content", "type": "string", "value": "B"},
                  {"key": "retrieval.documents.0.document.content", "type": "string", "value": "A"}]},
        {"traceID": "00ab", "spanID": "2", "operationName": "streamjudge.stream",
         "references": [{"refType": "CHILD_OF", "traceID": "00ab", "spanID": "1"}],
         "startTime": 1_020, "duration": 100,
         "tags": [{"key": "streamjudge.span.type", "type": "string", "value": "stream"},
                  {"key": "streamjudge.answer", "type": "string", "value": "A and B."},
                  {"key": "streamjudge.question", "type": "string", "value": "What?"},
                  {"key": "streamjudge.contexts.count", "type": "int64", "value": 2},
                  {"key": "streamjudge.stream.alerts", "type": "int64", "value": 0},
                  {"key": "streamjudge.eval.passed", "type": "bool", "value": True}]},
    ])
    spans = spans_from_jaeger(doc)
    assert spans[1].parent_id == "0000000000000001"
    assert spans[1].trace_id == "00ab".rjust(32, "0")
    assert spans[1].start_ns == 1_020_000
    (e,) = extract(spans)
    assert e.case is not None
    assert e.case.contexts == ("A", "B")  # ordered by document index
    assert e.case.expect_alert is False


def test_deferred_contexts_written_as_a_json_string_by_jaeger() -> None:
    doc = _jaeger([{"traceID": "ff", "spanID": "9", "operationName": "s", "startTime": 5, "duration": 1,
                    "tags": [{"key": "streamjudge.span.type", "type": "string", "value": "stream"},
                             {"key": "streamjudge.answer", "type": "string", "value": "x."},
                             {"key": "streamjudge.contexts", "type": "string", "value": '["c1", "c2"]'}]}])
    (e,) = extract(spans_from_jaeger(doc))
    assert e.case is not None and e.case.contexts == ("c1", "c2")
    assert e.case.expect_alert is None  # no verdict recorded: no expectation


def test_files_that_are_not_traces_say_what_is_expected(tmp_path: Path) -> None:
    bad = tmp_path / "x.json"
    bad.write_text('{"hello": 1}\n')
    with pytest.raises(TraceFormatError, match="resourceSpans"):
        read_spans(bad)
    bad.write_text("")
    with pytest.raises(TraceFormatError, match="empty"):
        read_spans(bad)
    bad.write_text('{"resourceSpans": []}\nnot json\n')
    with pytest.raises(TraceFormatError, match=":2: not valid JSON"):
        read_spans(bad)
