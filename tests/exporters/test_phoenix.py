"""Phoenix: annotation shape (unit) and a real ``phoenix serve`` on loopback (integration)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from streamjudge import semconv
from streamjudge.exporters.base import EvaluationRecord
from streamjudge.exporters.phoenix import (
    PhoenixAnnotationSink,
    annotation,
    annotator_kind,
    phoenix_annotation_sink_from_env,
    phoenix_exporter_from_env,
)
from streamjudge.judging.base import Score

# `make phoenix` (a prerequisite of `make test`) installs Phoenix into its own venv
PHOENIX_PYTHON = Path(
    os.environ.get("STREAMJUDGE_PHOENIX_PYTHON")
    or Path.home() / ".cache" / "streamjudge" / "phoenix-venv" / "bin" / "python"
)
LAUNCHER = Path(__file__).with_name("phoenix_loopback.py")


def rec(
    span_id: int, trace_id: int, judge: str, *scores: Score, span_type: str = "stream"
) -> EvaluationRecord:
    name = semconv.SPAN_STREAM if span_type == semconv.SPAN_TYPE_STREAM else semconv.SPAN_CHECKPOINT
    return EvaluationRecord(trace_id, span_id, name, span_type, judge, tuple(scores), time.time_ns())


# --- unit ------------------------------------------------------------------------------------------


def test_annotation_shape_and_annotator_kind() -> None:
    r = rec(0xB7AD6B7169203331, 0x0AF7651916CD43DD8448EB211C80319C, "llm",
            Score(semconv.FAITHFULNESS, 0.2, "fail", "unsupported date"))
    a = annotation(r, r.scores[0])
    assert a == {
        "span_id": "b7ad6b7169203331",
        "name": "faithfulness",
        "annotator_kind": "LLM",
        "result": {"score": 0.2, "label": "fail", "explanation": "unsupported date"},
        "metadata": {"judge": "llm", "trace_id": "0af7651916cd43dd8448eb211c80319c",
                     "span_name": semconv.SPAN_STREAM, "span_type": "stream"},
        "identifier": "streamjudge.llm",
    }
    assert annotator_kind("local") == "CODE"
    assert annotator_kind("ragas") == "LLM" and annotator_kind("deepeval") == "LLM"
    skipped = annotation(r, Score(semconv.CONTEXT_RECALL, None, skipped="no_reference"))
    assert skipped["result"] == {"label": "skipped", "explanation": "no_reference"}


def test_factories_are_opt_in() -> None:
    assert phoenix_exporter_from_env({}) is None
    assert phoenix_annotation_sink_from_env({}) is None
    exp = phoenix_exporter_from_env({}, require_env=False)
    assert exp is not None and exp.exporter._endpoint == "http://127.0.0.1:6006/v1/traces"  # type: ignore[attr-defined]
    exp.shutdown()
    exp = phoenix_exporter_from_env({"PHOENIX_COLLECTOR_ENDPOINT": "http://phx:6006/v1/traces"})
    assert exp is not None and exp.exporter._endpoint == "http://phx:6006/v1/traces"  # type: ignore[attr-defined]
    exp.shutdown()
    sink = phoenix_annotation_sink_from_env({"PHOENIX_COLLECTOR_ENDPOINT": "http://phx:6006",
                                             "PHOENIX_API_KEY": "phx-secret"})
    assert sink is not None and "phx-secret" not in repr(sink) + repr(sink._bridge._headers)
    sink.shutdown()


# --- integration: a real Phoenix -------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _listening(port: int) -> list[str]:
    """Hex local addresses of listening TCP sockets on ``port`` (from /proc/net/tcp{,6})."""
    out = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            addr, hexport = fields[1].split(":")
            if fields[3] == "0A" and int(hexport, 16) == port:
                out.append(addr)
    return out


class Phoenix:
    def __init__(self, url: str, http_port: int, grpc_port: int, startup_s: float) -> None:
        self.url = url
        self.http_port = http_port
        self.grpc_port = grpc_port
        self.startup_s = startup_s


@pytest.fixture(scope="module")
def phoenix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Phoenix]:
    if not PHOENIX_PYTHON.exists():
        pytest.skip(f"Arize Phoenix is not installed at {PHOENIX_PYTHON} (`make phoenix` installs it)")
    workdir = tmp_path_factory.mktemp("phoenix")
    http_port, grpc_port = _free_port(), _free_port()
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(http_port),
        "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(workdir),
        "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    }
    log = (workdir / "phoenix.log").open("wb")
    t0 = time.monotonic()
    proc = subprocess.Popen(
        [str(PHOENIX_PYTHON), str(LAUNCHER)], env=env, stdout=log, stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{http_port}"
    try:
        deadline = t0 + 180
        while True:
            if proc.poll() is not None:
                output = (workdir / "phoenix.log").read_text()
                raise RuntimeError(f"phoenix exited with {proc.returncode}: {output[-4000:]}")
            try:
                if httpx.get(f"{url}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            if time.monotonic() > deadline:
                raise RuntimeError("phoenix did not become healthy within 180 s")
            time.sleep(0.2)
        startup = time.monotonic() - t0
        print(f"\nphoenix startup: {startup:.1f} s", file=sys.stderr)
        yield Phoenix(url, http_port, grpc_port, startup)
    finally:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
        log.close()


def _poll(fn: Any, timeout: float = 60.0) -> Any:
    end = time.monotonic() + timeout
    while True:
        value = fn()
        if value:
            return value
        if time.monotonic() > end:
            raise AssertionError("timed out waiting for Phoenix")
        time.sleep(0.3)


@pytest.mark.integration
def test_phoenix_listens_on_loopback_only(phoenix: Phoenix) -> None:
    for port in (phoenix.http_port, phoenix.grpc_port):
        addrs = _listening(port)
        assert addrs, f"nothing listens on {port}"
        # a wildcard bind is all zeros (0.0.0.0 / ::); loopback is 0100007F / ::1 / ::ffff:127.0.0.1
        assert all(int(a, 16) != 0 for a in addrs), (port, addrs)


@pytest.mark.integration
def test_spans_and_annotations_reach_phoenix(phoenix: Phoenix) -> None:
    env = {"PHOENIX_COLLECTOR_ENDPOINT": phoenix.url}
    exporter = phoenix_exporter_from_env(env)
    sink = phoenix_annotation_sink_from_env(env, schedule_delay_s=0.05)
    assert exporter is not None and isinstance(sink, PhoenixAnnotationSink)
    provider = TracerProvider(resource=Resource.create({"service.name": "streamjudge-test"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracer = provider.get_tracer("test")

    with tracer.start_as_current_span(
        semconv.SPAN_STREAM, attributes={semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM}
    ) as stream:
        sctx = stream.get_span_context()
        with tracer.start_as_current_span(
            semconv.SPAN_CHECKPOINT, attributes={semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT}
        ) as ckpt:
            cctx = ckpt.get_span_context()
        # the checkpoint is exported; its score follows
        sink.emit(rec(cctx.span_id, cctx.trace_id, "local",
                      Score(semconv.FAITHFULNESS, 0.2, "fail", "date not in context"),
                      span_type=semconv.SPAN_TYPE_CHECKPOINT))
        # the stream span is still open: its annotation arrives at Phoenix before the span does
        sink.emit(rec(sctx.span_id, sctx.trace_id, "llm",
                      Score(semconv.FAITHFULNESS, 0.9, "pass", "all claims supported"),
                      Score(semconv.CONTEXT_RECALL, None, skipped="no_reference")))
        assert sink.force_flush(10_000)
    provider.shutdown()
    sink.shutdown()
    assert sink.stats.sent_items == 3 and sink.stats.dropped_total == 0

    sid, cid = format(sctx.span_id, "016x"), format(cctx.span_id, "016x")
    spans = _poll(lambda: (lambda d: d if {s["context"]["span_id"] for s in d} >= {sid, cid} else None)(
        httpx.get(f"{phoenix.url}/v1/projects/default/spans", params={"limit": 100}).json()["data"]
    ))
    stream_span = next(s for s in spans if s["context"]["span_id"] == sid)
    assert stream_span["name"] == semconv.SPAN_STREAM
    assert stream_span["attributes"][semconv.SPAN_TYPE] == semconv.SPAN_TYPE_STREAM

    def annotations() -> list[dict[str, Any]] | None:
        r = httpx.get(f"{phoenix.url}/v1/projects/default/span_annotations", params={"span_ids": [sid, cid]})
        if r.status_code != 200:
            return None
        data: list[dict[str, Any]] = r.json()["data"]
        return data if len(data) >= 3 else None

    got = {(a["span_id"], a["name"]): a for a in _poll(annotations)}
    ck = got[(cid, "checkpoint.faithfulness")]
    assert ck["annotator_kind"] == "CODE"
    assert ck["result"] == {"label": "fail", "score": 0.2, "explanation": "date not in context"}
    st = got[(sid, "faithfulness")]
    assert st["annotator_kind"] == "LLM" and st["result"]["score"] == 0.9 and st["result"]["label"] == "pass"
    assert st["identifier"] == "streamjudge.llm"
    assert got[(sid, "context_recall")]["result"]["label"] == "skipped"
