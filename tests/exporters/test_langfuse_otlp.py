"""The Langfuse OTLP exporter against a local OTLP/HTTP receiver that decodes the protobuf request."""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from datetime import datetime
from typing import Any

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from exporters._http import Recorder, Reply, always, serve
from streamjudge import semconv
from streamjudge.exporters.langfuse import (
    LangfuseSpanExporter,
    langfuse_exporter_from_env,
)

PK = "pk-lf-otlp"
SK = "sk-lf-otlp-secret"


def decode(body: bytes) -> dict[str, dict[str, Any]]:
    """span name -> {attribute: value, '_start': ns, '_parent': bytes}"""
    req = ExportTraceServiceRequest()
    req.ParseFromString(body)
    out: dict[str, dict[str, Any]] = {}
    for rs in req.resource_spans:
        for ss in rs.scope_spans:
            for span in ss.spans:
                attrs: dict[str, Any] = {"_start": span.start_time_unix_nano}
                for kv in span.attributes:
                    which = kv.value.WhichOneof("value")
                    attrs[kv.key] = getattr(kv.value, which)
                out[span.name] = attrs
    return out


@pytest.fixture
def receiver() -> Iterator[Recorder]:
    with serve(always(Reply(200, b"", {"Content-Type": "application/x-protobuf"}))) as rec:
        yield rec


def test_opt_in_and_host_resolution() -> None:
    assert langfuse_exporter_from_env({}) is None
    assert langfuse_exporter_from_env({"LANGFUSE_SECRET_KEY": SK}) is None
    exp = langfuse_exporter_from_env({"LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK})
    assert isinstance(exp, LangfuseSpanExporter)
    assert exp._exporter.exporter._endpoint == "https://cloud.langfuse.com/api/public/otel/v1/traces"  # type: ignore[attr-defined]
    assert SK not in repr(exp)
    exp.shutdown()
    exp = langfuse_exporter_from_env(
        {"LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK, "LANGFUSE_BASE_URL": "https://lf.example/"}
    )
    assert exp._exporter.exporter._endpoint == "https://lf.example/api/public/otel/v1/traces"  # type: ignore[union-attr]
    exp.shutdown()  # type: ignore[union-attr]


def test_spans_reach_langfuse_path_with_basic_auth_and_mapped_attributes(receiver: Recorder) -> None:
    exporter = langfuse_exporter_from_env(
        {"LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK, "LANGFUSE_HOST": receiver.url},
        trace_name="rag-chat",
    )
    assert exporter is not None
    plain = InMemorySpanExporter()  # another backend on the same provider
    provider = TracerProvider()
    # as deployed: behind a batch processor, so a request's spans usually travel in one batch
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=60_000))
    provider.add_span_processor(SimpleSpanProcessor(plain))
    tracer = provider.get_tracer("test")

    with tracer.start_as_current_span("POST /chat", attributes={semconv.SESSION_ID: "thread-42"}):
        with tracer.start_as_current_span(
            semconv.SPAN_STREAM,
            attributes={
                semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM,
                semconv.STREAM_QUESTION: "Where is the Eiffel tower?",
                semconv.STREAM_ANSWER: "In Paris.",
                semconv.STREAM_TTFT_MS: 120.5,
                semconv.STREAM_TOKENS: 7,
                semconv.STREAM_ALERTS: 1,
                semconv.STREAM_VERDICT: "fail",
            },
        ) as stream:
            stream_start = stream.start_time
            with tracer.start_as_current_span(
                semconv.SPAN_CHECKPOINT,
                attributes={
                    semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT,
                    semconv.CHECKPOINT_TEXT: "In Paris.",
                },
            ):
                pass
        with tracer.start_as_current_span(
            semconv.SPAN_EVALUATOR, attributes={semconv.SPAN_TYPE: semconv.SPAN_TYPE_EVALUATOR}
        ):
            pass
    provider.shutdown()

    seen = receiver.wait_for(1)
    for req in seen:
        assert req.path == "/api/public/otel/v1/traces"
        assert req.headers["authorization"] == "Basic " + base64.b64encode(f"{PK}:{SK}".encode()).decode()
        assert req.headers["x-langfuse-ingestion-version"] == "4"
        assert req.headers["content-type"] == "application/x-protobuf"
    spans: dict[str, dict[str, Any]] = {}
    for req in seen:
        spans.update(decode(req.body))

    gen = spans[semconv.SPAN_STREAM]
    assert gen["langfuse.observation.type"] == "generation"
    assert gen["langfuse.observation.input"] == "Where is the Eiffel tower?"
    assert gen["langfuse.observation.output"] == "In Paris."
    cst = datetime.fromisoformat(gen["langfuse.observation.completion_start_time"])
    assert stream_start is not None
    assert abs(cst.timestamp() * 1e9 - (stream_start + 120.5e6)) < 2_000  # start + TTFT, µs precision
    assert json.loads(gen["langfuse.observation.usage_details"]) == {"output": 7}
    assert gen["langfuse.observation.level"] == "WARNING"
    ckpt = spans[semconv.SPAN_CHECKPOINT]
    assert ckpt["langfuse.observation.type"] == "span"
    assert ckpt["langfuse.observation.output"] == "In Paris."
    assert spans[semconv.SPAN_EVALUATOR]["langfuse.observation.type"] == "evaluator"
    root = spans["POST /chat"]
    assert root["langfuse.trace.name"] == "rag-chat"
    assert root["langfuse.session.id"] == "thread-42"
    # children end (and sit in the batch) before the root that carries the session: they get it too
    for name in (semconv.SPAN_STREAM, semconv.SPAN_CHECKPOINT, semconv.SPAN_EVALUATOR):
        assert spans[name]["langfuse.session.id"] == "thread-42"
    assert "langfuse.trace.name" not in gen  # only on the root
    # our own attributes are still there
    assert gen[semconv.STREAM_TTFT_MS] == 120.5

    # the other backend saw our spans unchanged
    for span in plain.get_finished_spans():
        assert not any(k.startswith("langfuse.") for k in (span.attributes or {}))


def test_session_from_langgraph_thread_metadata_propagates_within_the_trace(receiver: Recorder) -> None:
    exporter = langfuse_exporter_from_env(
        {"LANGFUSE_PUBLIC_KEY": PK, "LANGFUSE_SECRET_KEY": SK, "LANGFUSE_HOST": receiver.url}
    )
    assert exporter is not None
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")
    with tracer.start_as_current_span("LangGraph"):
        meta = {"metadata": json.dumps({"thread_id": "t-7", "langgraph_node": "retrieve"})}
        with tracer.start_as_current_span("retrieve", attributes=meta):
            pass
        with tracer.start_as_current_span("generate"):
            pass
    provider.shutdown()
    spans: dict[str, dict[str, Any]] = {}
    for req in receiver.wait_for(3):
        spans.update(decode(req.body))
    assert spans["retrieve"]["langfuse.session.id"] == "t-7"
    assert spans["generate"]["langfuse.session.id"] == "t-7"  # exported later, same trace
    assert "langfuse.trace.name" not in spans["LangGraph"]  # no trace_name configured
