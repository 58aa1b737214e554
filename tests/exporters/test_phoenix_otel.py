"""streamjudge beside ``phoenix.otel.register()`` (arize-phoenix-otel), the usual way apps trace to Phoenix.

phoenix.otel's TracerProvider shuts its own exporting processor down when another processor is added unless
told to keep it, and ``register()`` reads the same ``PHOENIX_COLLECTOR_ENDPOINT`` as streamjudge's Phoenix
exporter. Joining it must leave the app's Phoenix tracing working and send every span to Phoenix once.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from streamjudge import semconv

from ._http import Reply, Seen, otlp_spans, run_app, serve

pytest.importorskip("phoenix.otel")

APP = Path(__file__).with_name("phoenix_otel_app.py")


def _reply(seen: Seen, _index: int) -> Reply:
    return Reply(200, b"{}" if "annotations" in seen.path else b"")


@pytest.mark.parametrize("variant", ["register_in_code", "register_from_env"])
def test_joins_phoenix_register_without_silencing_or_doubling_it(variant: str) -> None:
    with serve(_reply) as phoenix:
        env = {"PHOENIX_COLLECTOR_ENDPOINT": phoenix.url} if variant == "register_from_env" else {}
        run_app(APP, variant, phoenix.url, env=env)
        seen = list(phoenix.seen)

    spans = otlp_spans(seen, "/v1/traces")
    names = [sp.name for sp in spans]
    # the app's own span still reaches Phoenix: streamjudge did not displace register()'s exporter
    assert "app.request" in names, names
    ids = [sp.span_id.hex() for sp in spans]
    assert len(ids) == len(set(ids)), f"a span reached Phoenix twice: {sorted(names)}"
    assert names.count(semconv.SPAN_STREAM) == 1 and names.count(semconv.SPAN_CHECKPOINT) == 2
    for ev in (sp for sp in spans if sp.name == semconv.SPAN_EVALUATOR):
        assert ev.parent_span_id.hex() in ids
    if variant == "register_from_env":
        # scores as span annotations over Phoenix's REST API (the endpoint streamjudge knows from the env)
        assert any(s.path.startswith("/v1/span_annotations") for s in seen)
