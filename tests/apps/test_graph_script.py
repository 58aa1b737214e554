"""(d) A script that runs the graph with no web server: its run gets a root span and is judged."""

from __future__ import annotations

import json

import pytest

from apps.conftest import ANSWER, GROUNDED, failing_checkpoints, run_script, stream_exported, stream_span
from instrumentation.otlp_receiver import OTLPReceiver
from judges.scripted_server import ScriptedLLMServer
from streamjudge import semconv

pytestmark = pytest.mark.integration


def test_a_graph_run_outside_any_span_is_judged(llm_server: ScriptedLLMServer, receiver: OTLPReceiver) -> None:
    plain = run_script("graph_script.py", llm_server, None, instrumented=False)
    out = run_script("graph_script.py", llm_server, receiver)
    assert out == plain
    generation = json.loads(out)["generation"]
    assert generation == ANSWER
    spans = receiver.wait_for(stream_exported, timeout=15)
    stream = stream_span(spans)
    trace = [s for s in spans if s.trace_id == stream.trace_id]
    roots = [s for s in trace if not s.parent_span_id]
    assert len(roots) == 1 and roots[0].name == "LangGraph"
    assert {"retrieve", "generate"} <= {s.attributes.get(semconv.NODE_NAME) for s in trace}
    assert stream.attributes[semconv.STREAM_ANSWER] == generation
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1
    failed = failing_checkpoints(spans, stream)
    assert [c.attributes[semconv.CHECKPOINT_CHAR_START] for c in failed] == [len(GROUNDED)]
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
