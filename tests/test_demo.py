"""`streamjudge demo`: the example app under opentelemetry-instrument, read back from its exported spans."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from streamjudge.offline.otlp_file import OTLPFileReceiver

ROOT = Path(__file__).resolve().parents[1]


def demo(*args: str, cwd: Path = ROOT, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "streamjudge", "demo", *args], capture_output=True, text=True,
                          timeout=timeout, check=False, cwd=cwd)


def _gone(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.integration
def test_demo_serves_the_example_app_and_summarises_each_request_from_its_spans(tmp_path: Path) -> None:
    traces = tmp_path / "traces.jsonl"
    p = demo("--traces", str(traces), "--token-delay-ms", "2")
    out = p.stdout
    assert p.returncode == 0, out + p.stderr
    assert "Traceback" not in out + p.stderr and "Failed to export" not in out + p.stderr
    # one app process per action, each stopped by its pid
    pids = [int(x) for x in re.findall(r"app \(pid (\d+)\) stopped, exit status 0", out)]
    assert len(pids) == 3 and all(_gone(pid) for pid in pids)
    sections = {m.group(1): m.group(2) for m in re.finditer(r"--- ([a-z ,]+): GET /chat(.*?)(?=\n--- [a-z]|\n===|\Z)",
                                                           out, re.S)}
    assert set(sections) == {"grounded", "hallucinating", "weak retrieval", "hallucinating, action stop",
                             "hallucinating, action regenerate"}
    for body in sections.values():
        assert re.search(r"nodes:\s+retrieve [\d.]+ ms -> grade [\d.]+ ms", body)
        assert re.search(r"first token: [\d.]+ ms into the answer node", body)
        assert "checkpoint 0: chars 0-" in body and "final:       faithfulness" in body
    grounded = sections["grounded"]
    assert "FAIL" not in grounded and "[warning frame]" not in grounded and "verdict pass" in grounded
    assert "-> generate" in grounded and "-> reflect" in grounded
    bad = sections["hallucinating"]
    assert "[warning frame] faithfulness 0.50 < 0.7" in bad and "verdict flagged" in bad
    assert 'flagged, because: 1 of 2 sentences unsupported, 0 uncertain: "It was originally painted bright green' in bad
    weak = sections["weak retrieval"]
    assert re.search(r"context_precision 0\.\d+ fail", weak) and "pre-flight:  context precision" in weak
    stop = sections["hallucinating, action stop"]
    assert "[stop frame]" in stop and "action stop: alert" in stop and "verdict stopped" in stop
    assert "Leonardo Marconi" in stop and "submarine" not in stop.split("--- from the exported spans")[0]
    assert "action regenerate" in sections["hallucinating, action regenerate"]

    # the file holds OTLP JSON export requests: hex ids, the stream spans with their scores
    lines = [json.loads(line) for line in traces.read_text().splitlines()]
    spans = [s for req in lines for rs in req["resourceSpans"] for ss in rs["scopeSpans"] for s in ss["spans"]]
    streams = [s for s in spans if s["name"] == "streamjudge.stream"]
    assert len(streams) == 5
    assert all(re.fullmatch(r"[0-9a-f]{32}", s["traceId"]) and re.fullmatch(r"[0-9a-f]{16}", s["spanId"])
               for s in spans)
    keys = {a["key"] for s in streams for a in s["attributes"]}
    assert "streamjudge.eval.faithfulness.score" in keys
    assert f"{len(spans)} spans in {len(lines)} OTLP export requests written to {traces}" in out


def test_demo_falls_back_to_the_in_process_demo_when_the_app_cannot_start(tmp_path: Path) -> None:
    broken = tmp_path / "app.py"
    broken.write_text("raise SystemExit('this app cannot start')\n")
    p = demo("--app", str(broken), "--traces", str(tmp_path / "t.jsonl"), "--delay", "0", timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "streamjudge demo: the example app exited with status 1 before serving" in p.stderr
    assert "this app cannot start" in p.stderr
    assert "running the in-process demo instead (streamjudge demo --offline)" in p.stderr
    assert "streamjudge demo (in-process)" in p.stdout and "=== hallucinating" in p.stdout
    assert "[final reconciliation]" in p.stdout


def test_demo_without_the_example_app_says_where_it_looks(tmp_path: Path) -> None:
    p = demo("--app", str(tmp_path / "missing.py"), "--delay", "0", cwd=tmp_path, timeout=120)
    assert p.returncode == 0 and f"the example app {tmp_path / 'missing.py'} does not exist" in p.stderr


def test_offline_demo_runs_with_an_action() -> None:
    p = demo("--offline", "--action", "stop", "--delay", "0", timeout=120)
    assert p.returncode == 0, p.stderr
    assert "action=stop" in p.stdout and "[stop]" in p.stdout


def test_the_receiver_writes_otlp_json_lines(tmp_path: Path) -> None:
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor

    with OTLPFileReceiver(tmp_path / "t.jsonl") as rx:
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter(endpoint=rx.traces_endpoint)))
        with provider.get_tracer("t").start_as_current_span("outer") as outer, \
                provider.get_tracer("t").start_as_current_span("inner", attributes={"n": 3, "b": True}):
            outer.add_event("e", {"k": "v"})
        provider.shutdown()
        spans = {s.name: s for s in rx.spans()}
    assert spans["inner"].parent_span_id == spans["outer"].span_id
    assert spans["inner"].attributes == {"n": 3, "b": True}
    assert spans["outer"].events[0].name == "e" and spans["outer"].events[0].attributes == {"k": "v"}
    lines = [json.loads(x) for x in (tmp_path / "t.jsonl").read_text().splitlines()]
    assert len(lines) == 2  # one export request per ended span (simple processor)
    inner = lines[0]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]
    assert inner["name"] == "inner" and inner["parentSpanId"] == spans["outer"].span_id
    assert inner["kind"] == 1 and inner["traceId"] == spans["inner"].trace_id  # integer enum, hex ids
