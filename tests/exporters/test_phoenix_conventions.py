"""phoenix.otel's variables: PHOENIX_CLIENT_HEADERS and PHOENIX_PROJECT_NAME on what streamjudge sends Phoenix."""

from __future__ import annotations

import gzip
import time
from typing import Any

import httpx
import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from streamjudge import semconv
from streamjudge.config import Settings
from streamjudge.exporters.phoenix import (
    PROJECT_NAME_ATTRIBUTE,
    phoenix_annotation_sink_from_env,
    phoenix_exporter_from_env,
    phoenix_headers,
    phoenix_project,
)
from streamjudge.judging.base import Score

from ._http import Reply, always, serve
from .test_phoenix import Phoenix, _poll, phoenix, rec  # noqa: F401  (the real-Phoenix fixture)


def test_client_headers_are_read_like_phoenix_otel_reads_them() -> None:
    env = {"PHOENIX_CLIENT_HEADERS": "X-Team=search%20team, api_key=abc123,Authorization=Basic%20x"}
    assert phoenix_headers(env) == {"x-team": "search team", "api_key": "abc123", "authorization": "Basic x"}
    # the API key's bearer token wins over an authorization header, as in phoenix.otel
    env["PHOENIX_API_KEY"] = "phx-key-1234"
    assert phoenix_headers(env)["authorization"] == "Bearer phx-key-1234"
    assert phoenix_headers({"PHOENIX_CLIENT_HEADERS": "k=not encoded value"}) == {"k": "not encoded value"}
    assert phoenix_headers({}) == {}


def test_project_name_variables() -> None:
    assert phoenix_project({}) is None
    assert phoenix_project({"PHOENIX_PROJECT_NAME": "rag-prod"}) == "rag-prod"
    assert phoenix_project({"PHOENIX_PROJECT_NAME": "alias", "PHOENIX_PROJECT": "canonical"}) == "canonical"


def _resources(seen: list[Any]) -> list[dict[str, Any]]:
    out = []
    for s in seen:
        if s.path != "/v1/traces":
            continue
        body = gzip.decompress(s.body) if s.headers.get("content-encoding") == "gzip" else s.body
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            attrs = {kv.key: kv.value.string_value for kv in rs.resource.attributes}
            out.append({"resource": attrs, "spans": [sp.name for ss in rs.scope_spans for sp in ss.spans]})
    return out


def test_spans_to_phoenix_carry_the_project_and_headers_other_exporters_see_the_resource_unchanged(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    with serve(always(Reply(200, b"", {"Content-Type": "application/x-protobuf"}))) as phx:
        monkeypatch.setenv("PHOENIX_COLLECTOR_ENDPOINT", phx.url)
        monkeypatch.setenv("PHOENIX_PROJECT_NAME", "rag-prod")
        monkeypatch.setenv("PHOENIX_CLIENT_HEADERS", "x-tenant=acme,api_key=k-123")
        own = InMemorySpanExporter()
        provider = TracerProvider(resource=Resource.create({"service.name": "shop"}))
        provider.add_span_processor(SimpleSpanProcessor(own))
        rt = streamjudge.configure(Settings(), tracer_provider=provider, set_global=False)
        try:
            with rt.tracer.start_as_current_span("request"):
                pass
            rt.force_flush(10_000)
            provider.force_flush(10_000)
            seen = phx.wait_for(1)
        finally:
            rt.shutdown()
            provider.shutdown()
    sent = _resources(seen)
    assert sent and all(r["resource"][PROJECT_NAME_ATTRIBUTE] == "rag-prod" for r in sent)
    assert sent[0]["resource"]["service.name"] == "shop"  # merged into, not replaced
    assert "request" in [n for r in sent for n in r["spans"]]
    assert seen[0].headers["x-tenant"] == "acme" and seen[0].headers["api_key"] == "k-123"
    # the app's own exporter: its resource as it was
    (span,) = [s for s in own.get_finished_spans() if s.name == "request"]
    assert PROJECT_NAME_ATTRIBUTE not in span.resource.attributes


def test_without_a_project_the_exporter_is_the_plain_otlp_one() -> None:
    exp = phoenix_exporter_from_env({"PHOENIX_COLLECTOR_ENDPOINT": "http://127.0.0.1:9"})
    assert exp is not None and type(exp.exporter).__name__ == "OTLPSpanExporter"  # type: ignore[attr-defined]
    exp.shutdown()


def test_annotation_bridge_sends_the_client_headers() -> None:
    with serve(always(Reply(200, b'{"data": []}'))) as phx:
        sink = phoenix_annotation_sink_from_env(
            {"PHOENIX_COLLECTOR_ENDPOINT": phx.url, "PHOENIX_CLIENT_HEADERS": "x-tenant=acme",
             "PHOENIX_API_KEY": "phx-key-5678"},
            schedule_delay_s=0.01,
        )
        assert sink is not None
        sink.emit(rec(1, 2, "local", Score(semconv.FAITHFULNESS, 0.9, "pass")))
        assert sink.force_flush(5_000)
        sink.shutdown()
        (req,) = phx.wait_for(1)
    assert req.path.startswith("/v1/span_annotations")
    assert req.headers["x-tenant"] == "acme"
    assert req.headers["authorization"] == "Bearer phx-key-5678"
    assert "phx-key-5678" not in repr(sink._bridge._headers)


@pytest.mark.integration
def test_phoenix_files_the_spans_under_the_project(phoenix: Phoenix) -> None:  # noqa: F811
    project = f"streamjudge-{int(time.time())}"
    env = {"PHOENIX_COLLECTOR_ENDPOINT": phoenix.url, "PHOENIX_PROJECT_NAME": project,
           "PHOENIX_CLIENT_HEADERS": "x-streamjudge-test=1"}
    exporter = phoenix_exporter_from_env(env)
    assert exporter is not None
    provider = TracerProvider(resource=Resource.create({"service.name": "streamjudge-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    with provider.get_tracer("t").start_as_current_span(semconv.SPAN_STREAM) as span:
        sid = format(span.get_span_context().span_id, "016x")
    provider.shutdown()

    def in_project() -> list[dict[str, Any]] | None:
        r = httpx.get(f"{phoenix.url}/v1/projects/{project}/spans", params={"limit": 10})
        return r.json()["data"] if r.status_code == 200 and r.json().get("data") else None

    spans = _poll(in_project)
    assert [s["context"]["span_id"] for s in spans] == [sid]
    r = httpx.get(f"{phoenix.url}/v1/projects/default/spans", params={"limit": 100})
    assert sid not in [s["context"]["span_id"] for s in r.json().get("data", [])]
