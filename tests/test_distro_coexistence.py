"""streamjudge beside opentelemetry-distro under ``opentelemetry-instrument``: what the discovery order decides.

opentelemetry-instrument loads the *first* ``opentelemetry_distro`` entry point and the *first*
``opentelemetry_configurator`` one (``opentelemetry.instrumentation.auto_instrumentation._load``: unless
``OTEL_PYTHON_DISTRO`` / ``OTEL_PYTHON_CONFIGURATOR`` name one, "first" is the order in which
``importlib.metadata`` finds the distributions — ``sys.path`` order, then directory-listing order inside
site-packages, which is not the install order on every filesystem). Every ``opentelemetry_instrumentor``
runs whatever won.

opentelemetry-distro cannot be installed here, so a stand-in distribution with its entry points
(``distro``, ``configurator``) and its behaviour (the SDK's own configurator; exporter defaults
traces/metrics/logs=otlp, protocol grpc) is put on ``sys.path`` before or after streamjudge's entry points.
Each run is a real ``opentelemetry-instrument`` process streaming one hallucinating answer through
``guard()``, exporting to an OTLP receiver in the test.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import tomllib
from pathlib import Path
from typing import Any

import pytest

from streamjudge import semconv
from streamjudge.offline.otlp_file import OTLPFileReceiver

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

STAND_IN = '''"""Behaves as opentelemetry-distro does: the SDK's configurator, OTLP exporter defaults."""
import os

from opentelemetry.instrumentation.distro import BaseDistro
from opentelemetry.sdk._configuration import _OTelSDKConfigurator


class OpenTelemetryConfigurator(_OTelSDKConfigurator):
    """The SDK's own configurator, unchanged."""


class OpenTelemetryDistro(BaseDistro):
    def _configure(self, **kwargs):
        for var, value in (("OTEL_TRACES_EXPORTER", "otlp"), ("OTEL_METRICS_EXPORTER", "otlp"),
                           ("OTEL_LOGS_EXPORTER", "otlp"), ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc")):
            os.environ.setdefault(var, value)
'''

PROBE = '''import asyncio, json
from opentelemetry import trace
import streamjudge

async def tokens():
    for word in "Paris is the capital of France. It has 90 million dragons and a moon base.".split(" "):
        yield word + " "

async def main():
    with trace.get_tracer("probe").start_as_current_span("request"):
        async for _ in streamjudge.guard(tokens(), question="Where is Paris?",
                                         contexts=["Paris is the capital of France."]):
            pass

asyncio.run(main())
rt = streamjudge.current_runtime()
print(json.dumps({"owns_export": rt is not None and rt.processor.downstream is not None}))
'''


def _dist(where: Path, name: str, version: str, entry_points: dict[str, dict[str, str]]) -> None:
    info = where / f"{name.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")
    text = "".join(f"[{group}]\n" + "".join(f"{k} = {v}\n" for k, v in eps.items()) + "\n"
                   for group, eps in entry_points.items())
    (info / "entry_points.txt").write_text(text)


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("dists")
    otel = base / "otel_distro"
    otel.mkdir()
    (otel / "otel_distro_stand_in.py").write_text(STAND_IN)
    _dist(otel, "opentelemetry-distro", "0.66b0", {
        "opentelemetry_configurator": {"configurator": "otel_distro_stand_in:OpenTelemetryConfigurator"},
        "opentelemetry_distro": {"distro": "otel_distro_stand_in:OpenTelemetryDistro"},
    })
    # streamjudge's entry points as this checkout's pyproject.toml declares them
    ours = base / "streamjudge"
    ours.mkdir()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    _dist(ours, "streamjudge", "0.0.0+checkout", project["entry-points"])
    (base / "probe.py").write_text(PROBE)
    return {"otel": otel, "ours": ours, "probe": base / "probe.py"}


def _run(dists: dict[str, Path], first: str, tmp_path: Path, extra: dict[str, str] | None = None) -> dict[str, Any]:
    order = [dists["otel"], dists["ours"]] if first == "otel" else [dists["ours"], dists["otel"]]
    with OTLPFileReceiver(tmp_path / f"{first}.jsonl") as rx:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STREAMJUDGE_"))}
        env["PYTHONPATH"] = os.pathsep.join([*map(str, order), str(ROOT / "src")])
        env.update({
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.traces_endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_BSP_SCHEDULE_DELAY": "50",
            **(extra or {}),
        })
        proc = subprocess.run([str(BIN / "opentelemetry-instrument"), sys.executable, str(dists["probe"])],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        ok, _ = rx.wait_for(lambda ss: any(s.name == semconv.SPAN_STREAM for s in ss), 10)
        assert ok, "the stream span was not exported"
        time.sleep(0.3)  # an EVALUATOR span may follow its target
        spans = rx.spans()
    stream = next(s for s in spans if s.name == semconv.SPAN_STREAM)
    return {
        "owns_export": json.loads(proc.stdout.strip().splitlines()[-1])["owns_export"],
        "stream_span_has_scores": semconv.score_attribute(semconv.FAITHFULNESS) in stream.attributes,
        "evaluator_spans": sum(1 for s in spans if s.name == semconv.SPAN_EVALUATOR),
        "stream_spans": sum(1 for s in spans if s.name == semconv.SPAN_STREAM),
        "stderr": proc.stderr,
    }


def test_streamjudge_first_owns_the_export_path(dists: dict[str, Path], tmp_path: Path) -> None:
    got = _run(dists, "ours", tmp_path)
    assert "Configuration of configurator not loaded, streamjudge already loaded" in got["stderr"]
    assert got["owns_export"] and got["stream_span_has_scores"] and got["evaluator_spans"] == 0
    assert got["stream_spans"] == 1


def test_opentelemetry_distro_first_streamjudge_joins_its_provider(dists: dict[str, Path], tmp_path: Path) -> None:
    # the SDK's configurator builds the pipeline; streamjudge's instrumentor joins it beside its exporter:
    # every answer is still judged, but the results leave as EVALUATOR spans next to an unenriched span
    got = _run(dists, "otel", tmp_path)
    assert "Configuration of streamjudge not loaded, configurator already loaded" in got["stderr"]
    assert not got["owns_export"] and not got["stream_span_has_scores"] and got["evaluator_spans"] >= 1
    assert got["stream_spans"] == 1


@pytest.mark.parametrize("first", ["ours", "otel"])
def test_naming_streamjudge_makes_the_order_irrelevant(dists: dict[str, Path], tmp_path: Path, first: str) -> None:
    got = _run(dists, first, tmp_path, {"OTEL_PYTHON_CONFIGURATOR": "streamjudge",
                                        "OTEL_PYTHON_DISTRO": "streamjudge"})
    assert got["owns_export"] and got["stream_span_has_scores"] and got["evaluator_spans"] == 0
    assert got["stream_spans"] == 1
