"""Beside Langfuse's LangChain ``CallbackHandler``: every LangChain run reaches Langfuse once.

The handler already turns each run into a Langfuse span; openinference (which streamjudge switches on
for its node spans) would export each run a second time. The real Langfuse SDK exports to a recording
HTTP server standing in for Langfuse's OTLP endpoint.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections import Counter
from pathlib import Path

import pytest

from exporters._http import Reply, Seen, otlp_spans, serve

pytest.importorskip("langfuse")
pytestmark = pytest.mark.integration

APP = Path(__file__).with_name("langfuse_callback_app.py")
OTLP = "/api/public/otel/v1/traces"
BIN = Path(sys.executable).parent


def _reply(seen: Seen, _index: int) -> Reply:
    return Reply(200, b"")


def _run(variant: str, url: str) -> None:
    own = ("OTEL_", "STREAMJUDGE_", "LANGFUSE_", "PHOENIX_")
    env = {k: v for k, v in os.environ.items() if not k.startswith(own)} | {
        "LANGFUSE_PUBLIC_KEY": "pk-lf-test", "LANGFUSE_SECRET_KEY": "sk-lf-test", "LANGFUSE_BASE_URL": url,
        "OTEL_TRACES_EXPORTER": "none", "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none",
        "EXAMPLE_TOKEN_DELAY_MS": "0",
    }
    proc = subprocess.run([str(BIN / "opentelemetry-instrument"), str(BIN / "python"), str(APP), variant],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _is_openinference(span: object) -> bool:
    # openinference's LangChain spans; streamjudge's own stream/checkpoint spans carry an OpenInference kind too
    attrs = {kv.key: kv.value.string_value for kv in span.attributes}  # type: ignore[attr-defined]
    own = attrs.get("streamjudge.span.type") in ("stream", "checkpoint", "evaluator")
    return "openinference.span.kind" in attrs and not own


def test_langchain_runs_reach_langfuse_once_beside_its_callback_handler() -> None:
    with serve(_reply) as backend:
        _run("with", backend.url)
        spans = otlp_spans(list(backend.seen), OTLP)
    assert spans
    assert not [s.name for s in spans if _is_openinference(s)]  # no second copy from openinference
    assert Counter(s.name for s in spans)["generate"] == 1  # the handler's own span of the node, once


# the vendor SDK is now joined when it adds its processor, not at the next stream start: spans that ended
# before the first stream no longer reach Langfuse twice
def test_no_span_reaches_langfuse_twice() -> None:
    with serve(_reply) as backend:
        _run("without", backend.url)
        spans = otlp_spans(list(backend.seen), OTLP)
    assert len({s.span_id for s in spans}) == len(spans)


def test_without_the_handler_openinference_still_traces_the_graph() -> None:
    with serve(_reply) as backend:
        _run("without", backend.url)
        spans = otlp_spans(list(backend.seen), OTLP)
    assert [s for s in spans if _is_openinference(s) and s.name == "generate"]
