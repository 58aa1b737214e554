"""streamjudge -> collector -> Jaeger / Langfuse endpoint / Prometheus -> Alertmanager -> webhook, for real.

Two services stream through the real collector: one answers from its context, one hallucinates. The
hallucinating trace is read back from Jaeger's query API with its evaluation attributes and events, the same
spans reach the Langfuse endpoint with Basic auth, and the low-faithfulness alert reaches the webhook for the
hallucinating service only.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcSpanExporter
from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

import streamjudge
from integration.conftest import LANGFUSE_AUTH
from integration.infra import HttpSink, ObservabilityStack, RecordedRequest
from streamjudge import semconv
from streamjudge.config import Settings

pytestmark = pytest.mark.integration

QUESTION = "When was the Eiffel Tower completed and how tall is it?"
CONTEXTS = [
    "The Eiffel Tower is in Paris, France. It was completed in 1889 and is 330 metres tall. "
    "Gustave Eiffel's company designed and built it for the 1889 World's Fair."
]
GROUNDED = (
    "The Eiffel Tower was completed in 1889. It stands in Paris and is 330 metres tall. "
    "Gustave Eiffel's company built it for the World's Fair."
)
HALLUCINATED = (
    "The Eiffel Tower was completed in 1925 in Berlin. It is 950 metres tall. "
    "Thomas Edison designed it for the Olympic Games in Rome."
)
GROUNDED_SERVICE = "rag-grounded"
HALLUCINATING_SERVICE = "rag-hallucinating"
LOW_FAITHFULNESS = "StreamjudgeLowFaithfulnessRate"


async def _tokens(text: str) -> AsyncIterator[str]:
    for word in text.split(" "):
        yield word + " "
        await asyncio.sleep(0.002)


def _stream(stack: ObservabilityStack, service: str, answer: str) -> tuple[str, list[str]]:
    """Stream ``answer`` through streamjudge.guard in a process-like runtime exporting to the collector.

    Spans go over OTLP/gRPC, streamjudge's own metrics over OTLP/HTTP. Returns the trace id and the
    guard's event types.
    """
    reader = PeriodicExportingMetricReader(
        OTLPMetricExporter(endpoint=f"{stack.collector.otlp_http_url}/v1/metrics"), export_interval_millis=500
    )
    resource = Resource.create({"service.name": service})
    runtime = streamjudge.configure(
        Settings(),
        # a provider of its own, so a global provider another test installed cannot take these spans
        tracer_provider=TracerProvider(resource=resource),
        exporter=GrpcSpanExporter(endpoint=stack.collector.otlp_grpc_endpoint, insecure=True),
        metric_readers=[reader],
        resource=resource,
        set_global=False,
    )

    async def serve() -> tuple[str, list[str]]:
        with runtime.tracer.start_as_current_span("rag.request") as request:
            trace_id = format(request.get_span_context().trace_id, "032x")
            events = [
                ev.type
                async for ev in streamjudge.guard(
                    _tokens(answer), question=QUESTION, contexts=CONTEXTS, runtime=runtime
                )
            ]
        return trace_id, events

    try:
        result = asyncio.run(serve())
        assert runtime.force_flush(30_000)
    finally:
        runtime.shutdown()
    return result


def _tags(span: dict[str, Any]) -> dict[str, Any]:
    return {t["key"]: t["value"] for t in span.get("tags", [])}


def _events(span: dict[str, Any], name: str) -> list[dict[str, Any]]:
    """The span's events called ``name`` (Jaeger shows events as logs with an ``event`` field)."""
    found = []
    for log in span.get("logs", []):
        fields = {f["key"]: f["value"] for f in log.get("fields", [])}
        if fields.get("event") == name:
            found.append(fields)
    return found


def _faithfulness_events(span: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        e
        for e in _events(span, semconv.EVENT_EVALUATION_RESULT)
        if e.get(semconv.GEN_AI_EVALUATION_NAME) == semconv.FAITHFULNESS
    ]


def _complete(trace: dict[str, Any]) -> bool:
    # spans of one trace reach Jaeger in more than one batch: complete once every checkpoint the stream
    # span counted is there
    spans = trace.get("spans", [])
    streams = [s for s in spans if s["operationName"] == semconv.SPAN_STREAM]
    if not streams or not any(s["operationName"] == "rag.request" for s in spans):
        return False
    expected = int(_tags(streams[0]).get(semconv.STREAM_CHECKPOINTS, 1))
    return sum(s["operationName"] == semconv.SPAN_CHECKPOINT for s in spans) >= expected


def _is_low_faithfulness_alert(service: str) -> Any:
    def match(alert: dict[str, Any]) -> bool:
        labels = alert.get("labels", {})
        return bool(
            labels.get("alertname") == LOW_FAITHFULNESS
            and labels.get("job") == service
            and alert.get("status") == "firing"
        )

    return match


def test_hallucinating_stream_is_traced_scored_and_alerted_while_grounded_one_fires_nothing(
    stack: ObservabilityStack, langfuse_endpoint: HttpSink
) -> None:
    grounded_trace, grounded_events = _stream(stack, GROUNDED_SERVICE, GROUNDED)
    bad_trace, bad_events = _stream(stack, HALLUCINATING_SERVICE, HALLUCINATED)
    assert "warning" not in grounded_events
    assert "warning" in bad_events and bad_events[-1] == "done"

    # --- Jaeger: the stream and checkpoint spans with their evaluation attributes and events -------------
    trace = stack.jaeger.wait_for_trace(bad_trace, _complete)
    spans = trace["spans"]
    assert len({s["spanID"] for s in spans}) == len(spans), "a span was exported twice"
    assert {p["serviceName"] for p in trace["processes"].values()} == {HALLUCINATING_SERVICE}
    (stream,) = [s for s in spans if s["operationName"] == semconv.SPAN_STREAM]
    checkpoints = [s for s in spans if s["operationName"] == semconv.SPAN_CHECKPOINT]
    assert checkpoints
    stream_tags = _tags(stream)
    assert stream_tags[semconv.SPAN_TYPE] == semconv.SPAN_TYPE_STREAM
    assert stream_tags[semconv.EVAL_STATUS] == "judged"
    assert stream_tags[semconv.score_attribute(semconv.FAITHFULNESS)] < 0.5
    assert stream_tags[semconv.STREAM_VERDICT] != "pass"
    (final,) = _faithfulness_events(stream)
    assert float(final[semconv.GEN_AI_EVALUATION_SCORE_VALUE]) < 0.5
    assert final[semconv.GEN_AI_EVALUATION_SCORE_LABEL] == "fail"
    assert final[semconv.GEN_AI_EVALUATION_EXPLANATION]
    for cp in checkpoints:
        assert any(ref["spanID"] == stream["spanID"] for ref in cp.get("references", [])), "not a child"
        assert _tags(cp)[semconv.EVAL_STATUS] == "judged"
        assert _tags(cp)[semconv.score_attribute(semconv.FAITHFULNESS)] < 0.5
        assert len(_faithfulness_events(cp)) == 1
    assert _events(stream, semconv.EVENT_ALERT)

    good = stack.jaeger.wait_for_trace(grounded_trace, _complete)
    (good_stream,) = [s for s in good["spans"] if s["operationName"] == semconv.SPAN_STREAM]
    assert _tags(good_stream)[semconv.score_attribute(semconv.FAITHFULNESS)] >= 0.5
    assert not _events(good_stream, semconv.EVENT_ALERT)

    # --- Prometheus -> Alertmanager -> webhook: the hallucinating service alerts ---------------------------
    alert = stack.webhook.wait_for(_is_low_faithfulness_alert(HALLUCINATING_SERVICE), timeout=90)
    assert alert["labels"]["gen_ai_evaluation_name"] == semconv.FAITHFULNESS
    assert alert["labels"]["severity"] == "critical"

    # ...and the grounded one, evaluated by the same rule rounds, has results but no low score and no alert
    prom = stack.prometheus
    results = prom.wait_for_query(
        f'streamjudge_eval_results_total{{job="{GROUNDED_SERVICE}",gen_ai_evaluation_name="faithfulness"}}'
    )
    assert float(results[0]["value"][1]) >= 1
    assert prom.query(f'streamjudge_eval_low_scores_total{{job="{GROUNDED_SERVICE}"}}') == []
    assert prom.query(f'ALERTS{{job="{GROUNDED_SERVICE}"}}') == []
    assert not [a for a in stack.webhook.alerts() if a["labels"].get("job") == GROUNDED_SERVICE]

    # streamjudge's own metrics arrived over OTLP and sit next to the span-derived ones
    prom.wait_for_query(
        f'streamjudge_eval_score_count{{job="{HALLUCINATING_SERVICE}",evaluation="faithfulness"}}'
    )
    alerts_total = prom.wait_for_query(f'streamjudge_alerts_total{{job="{HALLUCINATING_SERVICE}"}}')
    assert sum(float(r["value"][1]) for r in alerts_total) >= 1
    assert prom.query(f'streamjudge_alerts_total{{job="{GROUNDED_SERVICE}"}}') == []

    # the collector's own telemetry is scraped too: what each trace backend received
    prom.wait_for_query(
        '{__name__=~"otelcol_exporter_sent_spans(_total)?",exporter="otlp_grpc/jaeger"}',
        until=lambda sent: sum(float(r["value"][1]) for r in sent) >= len(spans),
    )

    # --- the Langfuse path: OTLP/HTTP at {host}/api/public/otel with Basic auth ----------------------------
    def carries_bad_trace(req: RecordedRequest) -> bool:
        if req.path != "/api/public/otel/v1/traces":
            return False
        export = ExportTraceServiceRequest.FromString(req.body)
        return any(
            span.trace_id.hex() == bad_trace and span.name == semconv.SPAN_STREAM
            for rs in export.resource_spans
            for ss in rs.scope_spans
            for span in ss.spans
        )

    req = langfuse_endpoint.wait_for(carries_bad_trace, timeout=30)
    assert req.headers["authorization"] == f"Basic {LANGFUSE_AUTH}"
    assert req.headers["content-type"] == "application/x-protobuf"
    assert LANGFUSE_AUTH not in stack.collector.process.log_tail(10**6), "the credential leaked into a log"


def test_collector_counts_judge_errors_skips_and_low_scores_at_the_threshold(
    stack: ObservabilityStack,
) -> None:
    """Spans with the names, attributes and events streamjudge emits, sent with the plain SDK (OTLP/HTTP)."""
    service = "rag-contract"
    provider = TracerProvider(resource=Resource.create({"service.name": service}))
    provider.add_span_processor(
        SimpleSpanProcessor(HttpSpanExporter(endpoint=f"{stack.collector.otlp_http_url}/v1/traces"))
    )
    tracer = provider.get_tracer(semconv.TRACER_NAME)
    result = semconv.EVENT_EVALUATION_RESULT
    with tracer.start_as_current_span(
        semconv.SPAN_STREAM, attributes={semconv.SPAN_TYPE: "stream"}
    ) as stream:
        for index, score in enumerate((0.49, 0.5, 0.9)):
            with tracer.start_as_current_span(
                semconv.SPAN_CHECKPOINT,
                attributes={
                    semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT,
                    semconv.CHECKPOINT_INDEX: index,
                    semconv.EVAL_STATUS: "judged",
                    semconv.score_attribute(semconv.FAITHFULNESS): score,
                },
            ) as cp:
                cp.add_event(
                    result,
                    {
                        semconv.GEN_AI_EVALUATION_NAME: semconv.FAITHFULNESS,
                        semconv.GEN_AI_EVALUATION_SCORE_VALUE: score,
                    },
                )
        with tracer.start_as_current_span(
            semconv.SPAN_CHECKPOINT,
            attributes={
                semconv.SPAN_TYPE: "checkpoint",
                semconv.EVAL_STATUS: "error",
                semconv.EVAL_JUDGE: "llm",
            },
        ):
            pass
        with tracer.start_as_current_span(
            semconv.SPAN_CHECKPOINT,
            attributes={semconv.SPAN_TYPE: "checkpoint", semconv.EVAL_STATUS: "timeout"},
        ):
            pass
        stream.add_event(semconv.EVENT_SKIP, {semconv.SKIP_REASON: "budget_exhausted"})
        # a skipped metric: an evaluation event without a score is neither a result nor a low score
        stream.add_event(result, {semconv.GEN_AI_EVALUATION_NAME: semconv.CONTEXT_RECALL})
    provider.shutdown()

    prom = stack.prometheus
    job = f'job="{service}"'

    def settles_at(promql: str, expected: float) -> None:
        # SimpleSpanProcessor sends each span in its own request, so a scrape can land between them:
        # wait for the expected value rather than asserting on the first sample seen.
        prom.wait_for_query(
            promql,
            until=lambda found: len(found) == 1 and float(found[0]["value"][1]) == pytest.approx(expected),
        )

    settles_at(f'streamjudge_eval_results_total{{{job},gen_ai_evaluation_name="faithfulness"}}', 3)
    # below the threshold (0.5) is low; exactly at it is not
    settles_at(f'streamjudge_eval_low_scores_total{{{job},gen_ai_evaluation_name="faithfulness"}}', 1)
    settles_at(f'streamjudge_eval_errors_total{{{job},streamjudge_eval_judge="llm"}}', 1)
    settles_at(f'streamjudge_eval_unjudged_total{{{job},streamjudge_eval_status="timeout"}}', 1)
    settles_at(f'streamjudge_eval_unjudged_total{{{job},streamjudge_eval_status="error"}}', 1)
    settles_at(f'streamjudge_eval_skips_total{{{job},streamjudge_skip_reason="budget_exhausted"}}', 1)
    settles_at(f'streamjudge_eval_faithfulness_score_count{{{job},streamjudge_span_type="checkpoint"}}', 3)
    settles_at(f'streamjudge_eval_faithfulness_score_bucket{{{job},le="0.5"}}', 2)
    assert (
        prom.query(f'streamjudge_eval_results_total{{{job},gen_ai_evaluation_name="context_recall"}}') == []
    )
    # one low result of three is 33%: above the 20% rate, so this service alerts as well
    settles_at(f'streamjudge:eval_low_score_ratio:5m{{{job},gen_ai_evaluation_name="faithfulness"}}', 1 / 3)
