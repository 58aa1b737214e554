"""Where ``opentelemetry-instrument`` with streamjudge's distro sends OTLP (docs/compatibility.md says the
same): gRPC to localhost:4317 unless the protocol variable says http/protobuf (then localhost:4318); an
endpoint on the other protocol's port is kept as given, with one warning that names the fix."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from streamjudge.instrumentation.distro import otlp_port_mismatches

BIN = Path(sys.executable).parent

# prints every OTLP span exporter reachable from the global provider (streamjudge moves the SDK's exporters
# behind its processor and wraps them: they are found by walking the objects), then leaves without
# exporting anything
PROBE = '''import json, os
from opentelemetry import trace
from opentelemetry.sdk.trace.export import SpanExporter

found, seen, todo = [], set(), [(trace.get_tracer_provider(), 0)]
while todo:
    obj, depth = todo.pop()
    if id(obj) in seen or depth > 30:
        continue
    seen.add(id(obj))
    if isinstance(obj, SpanExporter) and type(obj).__module__.startswith("opentelemetry.exporter."):
        found.append([type(obj).__module__, getattr(obj, "_endpoint", None)])
        continue
    values = obj if isinstance(obj, (list, tuple)) else getattr(obj, "__dict__", {}).values()
    todo.extend((v, depth + 1) for v in values if not isinstance(v, (str, bytes, int, float)))
print(json.dumps(found))
os._exit(0)
'''


def _instrumented(tmp_path: Path, **env: str) -> tuple[list[list[str]], str]:
    probe = tmp_path / "probe.py"
    probe.write_text(PROBE)
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STREAMJUDGE_"))}
    clean.update(env, OTEL_PYTHON_DISTRO="streamjudge", OTEL_PYTHON_CONFIGURATOR="streamjudge")
    run = subprocess.run([str(BIN / "opentelemetry-instrument"), sys.executable, str(probe)], env=clean,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return json.loads(run.stdout.strip().splitlines()[-1]), run.stderr


@pytest.mark.integration
def test_opentelemetry_instrument_sends_otlp_as_the_docs_say(tmp_path: Path) -> None:
    grpc, _ = _instrumented(tmp_path)
    assert grpc == [["opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "localhost:4317"]]
    http, _ = _instrumented(tmp_path, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    assert http == [["opentelemetry.exporter.otlp.proto.http.trace_exporter", "http://localhost:4318/v1/traces"]]
    # the endpoint alone on OTLP/HTTP's port: gRPC there as the SDK does, and one warning saying so
    kept, err = _instrumented(tmp_path, OTEL_EXPORTER_OTLP_ENDPOINT="http://127.0.0.1:4318")
    assert kept == [["opentelemetry.exporter.otlp.proto.grpc.trace_exporter", "127.0.0.1:4318"]]
    warned = [line for line in err.splitlines() if "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in line]
    assert len(warned) == 1 and "traces/metrics/logs" in warned[0], err


def test_an_endpoint_on_the_other_protocols_port_is_named_once_with_its_fix() -> None:
    env = {"OTEL_TRACES_EXPORTER": "otlp", "OTEL_METRICS_EXPORTER": "otlp", "OTEL_LOGS_EXPORTER": "none",
           "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:4318"}
    [message] = otlp_port_mismatches(env)
    assert "traces/metrics " in message and "OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf" in message
    assert otlp_port_mismatches({**env, "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"}) == []
    # a per-signal protocol or endpoint counts for its signal only
    only_metrics = otlp_port_mismatches({**env, "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf"})
    assert len(only_metrics) == 1 and "OTLP metrics go to" in only_metrics[0]
    # HTTP spoken to the gRPC port, without a scheme, or through the exporter's own name
    assert "OTEL_EXPORTER_OTLP_PROTOCOL=grpc" in otlp_port_mismatches(
        {"OTEL_TRACES_EXPORTER": "otlp_proto_http", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "collector:4317"})[0]
    # ports that are neither, no endpoint, or no OTLP exporter: nothing to say
    assert otlp_port_mismatches({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://collector:14318"}) == []
    assert otlp_port_mismatches({"OTEL_TRACES_EXPORTER": "otlp"}) == []
    assert otlp_port_mismatches({"OTEL_TRACES_EXPORTER": "console",
                                 "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}) == []
    assert otlp_port_mismatches({**env, "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:port"}) == []
