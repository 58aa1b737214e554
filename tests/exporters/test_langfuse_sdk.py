"""streamjudge beside the real Langfuse SDK (v3+), which exports through its own span processor.

The SDK's default export filter keeps only Langfuse, ``gen_ai.*`` and known-LLM-instrumentation spans, and
it reads the same ``LANGFUSE_*`` variables as streamjudge's own Langfuse exporter. Joining it must give one
copy of every streamjudge span in Langfuse (stream, checkpoints, and evaluator spans with their parents)
and the scores, whichever of the two was set up first.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from streamjudge import semconv

from ._http import Reply, Seen, otlp_spans, run_app, serve

pytest.importorskip("langfuse")

APP = Path(__file__).with_name("langfuse_sdk_app.py")
OTLP = "/api/public/otel/v1/traces"
SCORES = "/api/public/scores"
INGESTION = "/api/public/ingestion"


def _reply(seen: Seen, _index: int) -> Reply:
    return Reply(200, b'{"id": "score"}' if seen.path.startswith(SCORES) else b"")


def _scores(seen: list[Seen]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for s in seen:
        if s.path == SCORES:
            body = json.loads(s.body)
            out += body if isinstance(body, list) else [body]  # the SDK posts a list
        elif s.path == INGESTION:  # streamjudge's bridge: score-create events
            out += [ev["body"] for ev in json.loads(s.body)["batch"] if ev["type"] == "score-create"]
    return out


@pytest.mark.parametrize("variant", ["sdk_first", "streamjudge_first", "sdk_in_code"])
def test_joins_the_langfuse_sdk(variant: str) -> None:
    with serve(_reply) as backend:
        env = {}
        if variant != "sdk_in_code":
            env = {
                "LANGFUSE_PUBLIC_KEY": "pk-lf-env",
                "LANGFUSE_SECRET_KEY": "sk-lf-env",
                "LANGFUSE_BASE_URL": backend.url,
            }
        run_app(APP, variant, backend.url, env=env)
        seen = list(backend.seen)

    otlp = [s for s in seen if s.path == OTLP]
    assert otlp, [s.path for s in seen]
    # one exporter to Langfuse: the SDK's (streamjudge's own would send every span a second time)
    assert all(s.headers.get("x-langfuse-sdk-name") == "python" for s in otlp)
    spans = otlp_spans(seen, OTLP)
    ids = [sp.span_id.hex() for sp in spans]
    assert len(ids) == len(set(ids)), "a span reached Langfuse twice"
    (stream,) = [sp for sp in spans if sp.name == semconv.SPAN_STREAM]
    checkpoints = [sp for sp in spans if sp.name == semconv.SPAN_CHECKPOINT]
    assert len(checkpoints) == 2
    # evaluator spans (beside the app's processors) hang under spans Langfuse has
    for ev in (sp for sp in spans if sp.name == semconv.SPAN_EVALUATOR):
        assert ev.parent_span_id.hex() in ids

    scores = _scores(seen)
    trace_hex = stream.trace_id.hex()
    assert {sc["traceId"] for sc in scores} == {trace_hex}
    by_target = {(sc["observationId"], sc["name"]): sc["value"] for sc in scores}
    checkpoint_ids = {cp.span_id.hex() for cp in checkpoints}
    low = [
        v
        for (obs, name), v in by_target.items()
        if obs in checkpoint_ids and name == "checkpoint.faithfulness"
    ]
    # the pool may coalesce the first checkpoint into the second (superseded): the failing one is judged
    assert low and min(low) < 0.7, by_target
    assert {obs for obs, _name in by_target} <= checkpoint_ids | {stream.span_id.hex()}
    assert by_target[(stream.span_id.hex(), semconv.FAITHFULNESS)] < 0.7
    if variant == "sdk_in_code":
        # no LANGFUSE_* keys for streamjudge: the scores went through the application's SDK client
        assert all(s.headers.get("x-langfuse-public-key") == "pk-lf-code" for s in seen if s.path == SCORES)


def test_own_exporter_defers_to_the_sdk_without_losing_spans_that_ended_before() -> None:
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from streamjudge.exporters.langfuse import LangfuseSpanExporter

    finished = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(finished))
    tracer = provider.get_tracer("app")
    sent = InMemorySpanExporter()
    ours = LangfuseSpanExporter(sent)
    with tracer.start_as_current_span("ended-before"):
        pass
    ours.defer_to_sdk()
    with tracer.start_as_current_span("ended-after"):
        pass
    # a batch processor may still hold a span that ended before the SDK appeared: that one is sent, the
    # later one is the SDK's to send
    ours.export(finished.get_finished_spans())
    assert [s.name for s in sent.get_finished_spans()] == ["ended-before"]


def test_an_application_filter_on_the_sdk_processor_is_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    from langfuse._client.span_processor import LangfuseSpanProcessor
    from langfuse.span_filter import is_default_export_span
    from opentelemetry.sdk.trace import TracerProvider

    from streamjudge.exporters.langfuse import adopt_langfuse_sdk, should_export_span

    def mine(span: Any) -> bool:
        return False

    provider = TracerProvider()
    kw = {"public_key": "pk", "secret_key": "sk", "base_url": "http://127.0.0.1:9"}
    default = LangfuseSpanProcessor(**kw)
    custom = LangfuseSpanProcessor(**kw, should_export_span=mine)
    provider.add_span_processor(default)
    provider.add_span_processor(custom)
    try:
        assert default._should_export_span is is_default_export_span
        with caplog.at_level("WARNING", logger="streamjudge.exporters.langfuse"):
            found = adopt_langfuse_sdk(provider)
        assert {id(p) for p in found} == {id(default), id(custom)}
        assert default._should_export_span is should_export_span
        assert custom._should_export_span is mine  # the application chose what Langfuse receives
        assert "is_streamjudge_span" in caplog.text
    finally:
        provider.shutdown()
