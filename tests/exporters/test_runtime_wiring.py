"""configure() picks up Langfuse from LANGFUSE_* variables: spans over OTLP and scores through the bridge."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from streamjudge import semconv
from streamjudge.config import Settings

from ._http import Reply, always, serve

CONTEXT = "The company was founded in 1998 in Palo Alto by two graduate students."
ANSWER = "The company was founded in 1998 in Palo Alto. It later expanded to Europe in 2003."


async def tokens() -> AsyncIterator[str]:
    for w in ANSWER.split(" "):
        yield w + " "


def test_langfuse_spans_and_scores_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    with serve(always(Reply(200, b"{}"))) as backend:
        monkeypatch.setenv("LANGFUSE_PUBLIC_KEY", "pk-lf-test")
        monkeypatch.setenv("LANGFUSE_SECRET_KEY", "sk-lf-secret")
        monkeypatch.setenv("LANGFUSE_HOST", backend.url)
        local = InMemorySpanExporter()
        rt = streamjudge.configure(Settings(), downstream=SimpleSpanProcessor(local), set_global=False)
        try:

            async def main() -> None:
                async for _ev in streamjudge.guard(tokens(), question="When was it founded?", contexts=[CONTEXT]):
                    pass

            asyncio.run(main())
            assert rt.force_flush(10_000)
        finally:
            rt.shutdown()
        seen = backend.wait_for(2)
        paths = {s.path for s in seen}
        assert "/api/public/otel/v1/traces" in paths and "/api/public/ingestion" in paths
        stream = next(s for s in local.get_finished_spans() if s.name == semconv.SPAN_STREAM)
        trace_hex = format(stream.context.trace_id, "032x")
        scores = [ev["body"] for s in seen if s.path == "/api/public/ingestion" for ev in s.json()["batch"]]
        assert {sc["traceId"] for sc in scores} == {trace_hex}
        final = [sc for sc in scores if sc["observationId"] == format(stream.context.span_id, "016x")]
        assert any(sc["name"] == "faithfulness" and sc["value"] < 0.7 for sc in final)
        # the Langfuse copy of the stream span is the enriched one: it carries the scores too
        spans = []
        for s in seen:
            if s.path == "/api/public/otel/v1/traces":
                req = ExportTraceServiceRequest.FromString(s.body)
                spans += [sp for rs in req.resource_spans for ss in rs.scope_spans for sp in ss.spans]
        lf_stream = next(sp for sp in spans if sp.name == semconv.SPAN_STREAM)
        keys = {a.key for a in lf_stream.attributes}
        assert semconv.score_attribute("faithfulness") in keys
        assert all(s.headers["authorization"].startswith("Basic ") for s in seen)


def test_configure_without_a_vendor_loads_no_http_client() -> None:
    # the vendor modules bring httpx (and with it rich and pygments when installed): 65-80 ms and ~10k objects
    # at configure() (measured) for an app that sends nothing to Langfuse or Phoenix
    import os
    import subprocess
    import sys

    script = (
        "import sys, streamjudge\n"
        "from streamjudge.config import Settings\n"
        "from streamjudge.runtime import _Discard\n"
        "streamjudge.configure(Settings(), downstream=_Discard(), set_global=False)\n"
        "print(sorted(m for m in ('httpx', 'streamjudge.exporters.langfuse', 'streamjudge.exporters.phoenix')"
        " if m in sys.modules))\n"
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith(("LANGFUSE_", "PHOENIX_", "OTEL_", "STREAMJUDGE_"))}
    out = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=120,
                         check=False)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
