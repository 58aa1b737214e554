"""The scale-out tier with real processes: apps -> the collector gateway (load_balancing, routing by trace
id, static resolver) -> 3 ``streamjudge worker`` processes -> one OTLP sink per worker.

Each app records every span it exported, so the tests know exactly what entered the pipeline; each worker
exports to its own sink, so the tests know which worker handled each span.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExporter, SpanExportResult

from instrumentation.otlp_receiver import OTLPReceiver, SpanRecord
from integration.infra import (
    COLLECTOR_DIR,
    REPO,
    InfraError,
    Process,
    collector_binary,
    free_port,
    http_get,
)
from streamjudge import semconv
from streamjudge.config import Settings

pytestmark = pytest.mark.integration

GATEWAY_CONFIG = COLLECTOR_DIR / "gateway-config.yaml"
APP = Path(__file__).with_name("worker_app.py")
HERE = Path(__file__).parent
FINAL_METRICS = Settings().final_metrics
SETTLE_S = 60.0  # bound on waiting for spans to arrive (loaded 2-core CI box)


def _env(**extra: str) -> dict[str, str]:
    path = os.pathsep.join([str(REPO / "src"), str(HERE), os.environ.get("PYTHONPATH", "")])
    return {"PYTHONPATH": path, "OTEL_METRICS_EXPORTER": "none", "OTEL_TRACES_EXPORTER": "none",
            "OTEL_LOGS_EXPORTER": "none", **extra}


# --- processes ------------------------------------------------------------------------------------


@dataclass
class WorkerProc:
    name: str
    grpc_port: int
    http_port: int
    sink: OTLPReceiver
    log_dir: Path
    extra_env: dict[str, str] = field(default_factory=dict)
    process: Process | None = None
    incarnation: int = 0

    @property
    def endpoint(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    def start(self, *args: str) -> WorkerProc:
        self.incarnation += 1
        argv = [sys.executable, "-m", "streamjudge.cli", "worker", "--grpc", self.endpoint,
                "--http", f"127.0.0.1:{self.http_port}", *args]
        env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=self.sink.endpoint, **self.extra_env)
        self.process = Process(f"{self.name}-{self.incarnation}", argv, self.log_dir, env)
        url = f"http://127.0.0.1:{self.http_port}/healthz"
        self.process.wait_ready(lambda: http_get(url, timeout=1.0)[0] == 200)
        return self

    def metrics(self) -> str:
        status, body = http_get(f"http://127.0.0.1:{self.http_port}/metrics")
        assert status == 200
        return body.decode()

    def kill(self) -> None:
        assert self.process is not None
        self.process.popen.send_signal(signal.SIGKILL)
        self.process.popen.wait(10)
        self.process.stop()

    def stop(self) -> None:
        if self.process is not None:
            self.process.stop(timeout=15)


@dataclass
class Gateway:
    process: Process
    otlp_http_url: str
    telemetry_port: int

    def telemetry(self) -> str:
        status, body = http_get(f"http://127.0.0.1:{self.telemetry_port}/metrics")
        if status != 200:
            raise InfraError(f"gateway telemetry -> {status}")
        return body.decode()

    def counter(self, name: str, **labels: str) -> float:
        total = 0.0
        for line in self.telemetry().splitlines():
            m = re.match(rf"^{name}(?:_total)?(\{{[^}}]*\}})? (\S+)$", line)
            if m and all(f'{k}="{v}"' in (m.group(1) or "") for k, v in labels.items()):
                total += float(m.group(2))
        return total


@contextlib.contextmanager
def run_gateway(log_dir: Path, worker_endpoints: list[str]) -> Iterator[Gateway]:
    # a port free when picked can be taken before the collector binds it (the workers' own outbound
    # connections draw from the same ephemeral range): pick again rather than fail the module
    for attempt in range(3):
        ports = {k: free_port() for k in ("grpc", "http", "health", "telemetry")}
        env = {
            "STREAMJUDGE_GATEWAY_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
            "STREAMJUDGE_GATEWAY_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
            "STREAMJUDGE_GATEWAY_HEALTH_ENDPOINT": f"127.0.0.1:{ports['health']}",
            "STREAMJUDGE_GATEWAY_TELEMETRY_PORT": str(ports["telemetry"]),
            "STREAMJUDGE_WORKER_ENDPOINTS": "[" + ", ".join(worker_endpoints) + "]",
        }
        proc = Process("gateway", [str(collector_binary()), "--config", str(GATEWAY_CONFIG)], log_dir, env)
        try:
            health = f"http://127.0.0.1:{ports['health']}/"
            proc.wait_ready(lambda url=health: http_get(url, timeout=1.0)[0] == 200)
        except InfraError as exc:
            proc.stop()
            if "address already in use" in str(exc) and attempt < 2:
                continue
            raise
        break
    try:
        yield Gateway(proc, f"http://127.0.0.1:{ports['http']}", ports["telemetry"])
    finally:
        proc.stop()


@dataclass
class ScaleOut:
    gateway: Gateway
    workers: list[WorkerProc]
    log_dir: Path

    def sink_spans(self) -> dict[str, list[SpanRecord]]:
        return {w.name: w.sink.snapshot() for w in self.workers}

    def clear(self) -> None:
        for w in self.workers:
            with w.sink._lock:
                w.sink.spans.clear()

    def logs(self) -> str:
        procs = [self.gateway.process, *(w.process for w in self.workers if w.process is not None)]
        return "\n".join(f"--- {p.name} ---\n{p.log_tail(1500)}" for p in procs)


@pytest.fixture(scope="module")
def scale_out(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ScaleOut]:
    log_dir = tmp_path_factory.mktemp("scale-out")
    with contextlib.ExitStack() as stack:
        workers: list[WorkerProc] = []
        for i in range(3):
            sink = OTLPReceiver().start()
            stack.callback(sink.stop)
            w = WorkerProc(f"worker{i}", free_port(), free_port(), sink, log_dir)
            stack.callback(w.stop)
            workers.append(w.start())
        gateway = stack.enter_context(run_gateway(log_dir, [w.endpoint for w in workers]))
        yield ScaleOut(gateway, workers, log_dir)


# --- apps and what they sent ----------------------------------------------------------------------


def run_apps(gateway: Gateway, out_dir: Path, apps: int, traces: int, delay: float = 0.0,
             token_delay: float = 0.0) -> list[subprocess.Popen[str]]:
    env = {**os.environ, **_env(OTEL_EXPORTER_OTLP_ENDPOINT=gateway.otlp_http_url)}
    return [
        subprocess.Popen(
            [sys.executable, str(APP), "--traces", str(traces), "--seed", str(i), "--delay", str(delay),
             "--token-delay", str(token_delay), "--out", str(out_dir / f"app{i}.jsonl")],
            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        )
        for i in range(apps)
    ]


def wait_apps(procs: list[subprocess.Popen[str]]) -> None:
    for p in procs:
        out, _ = p.communicate(timeout=120)
        assert p.returncode == 0, out[-3000:]


def sent_spans(out_dir: Path, apps: int) -> dict[tuple[str, str], dict[str, Any]]:
    sent: dict[tuple[str, str], dict[str, Any]] = {}
    for i in range(apps):
        for line in (out_dir / f"app{i}.jsonl").read_text().splitlines():
            rec = json.loads(line)
            sent[(rec["trace_id"], rec["span_id"])] = rec
    return sent


def wait_settled(scale: ScaleOut, expected: set[tuple[str, str]], quiet_s: float = 3.0) -> None:
    """Until every expected span arrived, or nothing arrived for ``quiet_s`` (bounded by SETTLE_S)."""
    deadline = time.monotonic() + SETTLE_S
    last, last_change = -1, time.monotonic()
    while time.monotonic() < deadline:
        got = {(s.trace_id, s.span_id) for spans in scale.sink_spans().values() for s in spans}
        if expected <= got:
            return
        if len(got) != last:
            last, last_change = len(got), time.monotonic()
        elif time.monotonic() - last_change > quiet_s:
            return
        time.sleep(0.2)


def owners(sinks: dict[str, list[SpanRecord]]) -> dict[str, set[str]]:
    """trace id -> the workers whose sink has any of its spans."""
    out: dict[str, set[str]] = {}
    for name, spans in sinks.items():
        for s in spans:
            out.setdefault(s.trace_id, set()).add(name)
    return out


def assert_answer_enriched(span: SpanRecord) -> None:
    a = span.attributes
    assert a[semconv.EVAL_STATUS] == "judged", a.get(semconv.EVAL_SKIP_REASON)
    results = [e for e in span.events if e.name == semconv.EVENT_EVALUATION_RESULT]
    assert sorted(e.attributes[semconv.GEN_AI_EVALUATION_NAME] for e in results) == sorted(FINAL_METRICS)
    assert 0.0 <= a[semconv.score_attribute(semconv.FAITHFULNESS)] <= 1.0
    assert isinstance(a[semconv.EVAL_PASSED], bool)


# --- tests ----------------------------------------------------------------------------------------


def test_the_gateway_config_is_valid_for_the_real_collector_and_routes_by_trace_id(tmp_path: Path) -> None:
    env = {**os.environ, "STREAMJUDGE_WORKER_ENDPOINTS": "[127.0.0.1:14317, 127.0.0.1:14318]"}
    proc = subprocess.run([str(collector_binary()), "validate", "--config", str(GATEWAY_CONFIG)],
                          capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr
    text = GATEWAY_CONFIG.read_text()
    assert "routing_key: traceID" in text and "load_balancing:" in text
    # the check can fail: a resolver the exporter does not know is refused
    bad = GATEWAY_CONFIG.read_text().replace("static:", "nowhere:")
    bad_path = tmp_path / "gateway-bad.yaml"
    bad_path.write_text(bad)
    refused = subprocess.run([str(collector_binary()), "validate", "--config", str(bad_path)],
                             capture_output=True, text=True, timeout=120, env=env, check=False)
    assert refused.returncode != 0
    assert "nowhere" in refused.stderr


def test_the_kubernetes_gateway_config_in_deploy_is_valid_for_the_real_collector(tmp_path: Path) -> None:
    import yaml

    docs = [d for d in yaml.safe_load_all((REPO / "deploy" / "gateway.yaml").read_text()) if d]
    [config_map] = [d for d in docs if d["kind"] == "ConfigMap"]
    config = tmp_path / "k8s-gateway.yaml"
    config.write_text(config_map["data"]["config.yaml"])
    env = {**os.environ, "POD_IP": "10.1.2.3", "STREAMJUDGE_WORKER_BEARER_TOKEN": "t0ken"}  # the pod's env
    proc = subprocess.run([str(collector_binary()), "validate", "--config", str(config)],
                          capture_output=True, text=True, timeout=120, check=False, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "k8s" in yaml.safe_load(config.read_text())["exporters"]["load_balancing"]["resolver"]


def test_300_traces_from_3_apps_every_answer_judged_once_each_trace_at_one_worker(
    scale_out: ScaleOut, tmp_path: Path
) -> None:
    scale_out.clear()
    apps, traces = 3, 100
    wait_apps(run_apps(scale_out.gateway, tmp_path, apps, traces))
    sent = sent_spans(tmp_path, apps)
    answers_sent = {k for k, r in sent.items() if r["type"] == semconv.SPAN_TYPE_STREAM}
    assert len(answers_sent) == apps * traces
    assert all(sent[k]["status"] == "deferred" for k in answers_sent)  # the apps left the final pass to us
    wait_settled(scale_out, set(sent))
    sinks = scale_out.sink_spans()
    received = Counter((s.trace_id, s.span_id) for spans in sinks.values() for s in spans)

    duplicated = {k: n for k, n in received.items() if n > 1}
    assert not duplicated, f"{len(duplicated)} spans exported twice"
    missing = set(sent) - set(received)
    assert not missing, f"{len(missing)} of {len(sent)} spans lost\n{scale_out.logs()}"
    assert set(received) == set(sent)  # nothing invented either

    # every span of a trace went through one worker, and all three workers took a share
    by_trace = owners(sinks)
    assert all(len(ws) == 1 for ws in by_trace.values()), [t for t, ws in by_trace.items() if len(ws) > 1]
    share = Counter(next(iter(ws)) for ws in by_trace.values())
    assert set(share) == {w.name for w in scale_out.workers}, share

    # every answer judged exactly once: one enriched copy with the final suite's events
    spans = {(s.trace_id, s.span_id): s for ss in sinks.values() for s in ss}
    failed = 0
    for key in answers_sent:
        span = spans[key]
        assert_answer_enriched(span)
        failed += not span.attributes[semconv.EVAL_PASSED]
    # the apps fabricate every 4th answer; the local judge's final pass catches exactly those
    assert failed == sum(1 for i in range(apps) for j in range(traces) if (i + j) % 4 == 0)
    # the rest left unchanged: checkpoints were judged live in the apps, request spans kept their own
    for key, rec in sent.items():
        if rec["type"] == semconv.SPAN_TYPE_CHECKPOINT:
            assert spans[key].attributes.get(semconv.EVAL_STATUS) == rec["status"]  # the app's, as it was
        elif rec["name"] == "request":
            assert "app.index" in spans[key].attributes
            assert semconv.EVAL_STATUS not in spans[key].attributes
    # each worker says what it did: its answers counter adds up to the answers its sink got
    for w in scale_out.workers:
        text = w.metrics()
        m = re.search(r'^streamjudge_worker_answers_total\{status="judged"\} (\S+)$', text, re.M)
        mine = sum(1 for s in sinks[w.name] if s.attributes.get(semconv.SPAN_TYPE) == "stream")
        assert m is not None and int(float(m.group(1))) >= mine > 0
        assert "streamjudge_judge_queue_depth" in text


def test_a_killed_worker_loses_only_what_it_held_the_gateway_retries_the_rest(
    scale_out: ScaleOut, tmp_path: Path
) -> None:
    scale_out.clear()
    victim = scale_out.workers[1]
    gw = scale_out.gateway
    failures_before = gw.counter("otelcol_exporter_send_failed_spans")
    accepted_before = gw.counter("otelcol_receiver_accepted_spans")
    handed_before = gw.counter("otelcol_exporter_sent_spans", exporter="load_balancing")
    apps, traces = 3, 60
    # streams of ~0.6s overlap (a new one every 50ms): the workers hold checkpoint spans of answers still
    # streaming in the apps, so the kill finds the victim holding traces
    procs = run_apps(scale_out.gateway, tmp_path, apps, traces, delay=0.05, token_delay=0.02)
    time.sleep(1.5)  # mid-run
    victim.kill()
    killed_ns = time.time_ns()
    time.sleep(1.5)  # the gateway meanwhile queues and retries the victim's batches
    victim.start()
    restarted_ns = time.time_ns()
    restarted_after = (restarted_ns - killed_ns) / 1e9
    wait_apps(procs)
    sent = sent_spans(tmp_path, apps)
    wait_settled(scale_out, set(sent))
    sinks = scale_out.sink_spans()
    received = Counter((s.trace_id, s.span_id) for spans in sinks.values() for s in spans)
    by_trace = owners(sinks)

    # at least once: the victim forwards what it does not judge before it acknowledges a request, so a
    # request it had forwarded but not yet acknowledged when killed is retried and exported again; that
    # can only be a request routed to the victim
    twice = {k for k, n in received.items() if n > 1}
    assert all(by_trace.get(t) == {victim.name} for t, _ in twice), "a batch of another worker came twice"
    lost = set(sent) - set(received)
    lost_traces = {t for t, _ in lost}
    # what a SIGKILL loses is what the victim held in memory: acknowledged, not yet exported. It is
    # confined to traces routed to the victim: no other worker has any span of them
    assert all(by_trace.get(t, {victim.name}) == {victim.name} for t in lost_traces), lost_traces
    # every trace is still handled by one worker (the restarted victim has the same place in the ring)
    assert all(len(ws) == 1 for ws in by_trace.values())
    # the gateway gave up on nothing: what the victim could not take during the outage was queued,
    # retried and delivered to its restarted instance — spans that ended while it was down reached its sink
    assert scale_out.gateway.counter("otelcol_exporter_send_failed_spans") == failures_before
    bridged = [s for s in sinks[victim.name] if killed_ns + 200_000_000 < s.end_ns < restarted_ns - 200_000_000]
    assert bridged, "no span that ended during the outage reached the restarted worker"
    restarted = victim.metrics()
    m = re.search(r"^streamjudge_worker_spans_received_total (\S+)$", restarted, re.M)
    assert m is not None and float(m.group(1)) > 0
    spans = {(s.trace_id, s.span_id): s for ss in sinks.values() for s in ss}
    answers = [k for k, r in sent.items() if r["type"] == semconv.SPAN_TYPE_STREAM]
    judged = [k for k in answers if k in spans]
    for key in judged:
        assert_answer_enriched(spans[key])
    lost_answers = len(answers) - len(judged)
    # counted: the gateway's own counters say it accepted every span the apps sent and handed every one on
    # to a worker; the sinks hold all but the lost ones: the difference is what died with the victim
    accepted = gw.counter("otelcol_receiver_accepted_spans") - accepted_before
    handed = gw.counter("otelcol_exporter_sent_spans", exporter="load_balancing") - handed_before
    assert accepted == handed == len(sent)
    assert len(set(received)) == handed - len(lost)
    # the statement of loss, exact (from the apps' own records) and bounded: never more than the traces
    # the victim was holding when it died
    print(
        f"\nSIGKILL of {victim.name} (restarted after {restarted_after:.1f}s): {len(sent)} spans sent, all "
        f"accepted and handed on by the gateway (its counters: {accepted:.0f}, {handed:.0f}); "
        f"{len(lost)} lost in the victim's memory ({len(lost_traces)} traces, {lost_answers} answers never "
        f"judged); {len(bridged)} spans ended during the outage, queued by the gateway and delivered after "
        f"the restart; gateway send failures: 0; duplicates: 0"
    )
    assert lost_answers <= len(lost_traces)
    assert len(lost_traces) <= traces * apps // 3


class _Encoded(SpanExporter):
    """Keeps the OTLP protobuf of what a TracerProvider exports (to post it to a worker directly)."""

    def __init__(self) -> None:
        self.spans: list[ReadableSpan] = []

    def export(self, spans: Any) -> SpanExportResult:
        self.spans.extend(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        return None


def _traces(n_pending: int, n_answers: int) -> tuple[list[ReadableSpan], set[str], set[str]]:
    """Spans of ``n_pending`` traces whose answer has not arrived yet (checkpoints only) and of
    ``n_answers`` traces with a deferred answer span. Returns (spans, pending trace ids, answer span ids)."""
    exported = _Encoded()
    provider = TracerProvider(resource=Resource.create({"service.name": "sigterm-app"}))
    provider.add_span_processor(SimpleSpanProcessor(exported))
    tracer = provider.get_tracer("sigterm")
    pending: set[str] = set()
    answers: set[str] = set()
    for i in range(n_pending + n_answers):
        with tracer.start_as_current_span("request") as root:
            with tracer.start_as_current_span(semconv.SPAN_STREAM) as stream:
                with tracer.start_as_current_span(semconv.SPAN_CHECKPOINT, attributes={
                        semconv.SPAN_TYPE: semconv.SPAN_TYPE_CHECKPOINT, semconv.EVAL_STATUS: "judged"}):
                    pass
                stream.set_attributes({
                    semconv.SPAN_TYPE: semconv.SPAN_TYPE_STREAM, semconv.EVAL_STATUS: "deferred",
                    semconv.STREAM_ANSWER: "Paris is the capital of France.",
                    semconv.STREAM_CONTEXTS: ["Paris is the capital of France."],
                    semconv.STREAM_QUESTION: "What is the capital of France?",
                })
            tid = format(root.get_span_context().trace_id, "032x")
            if i < n_pending:
                pending.add(tid)
            else:
                answers.add(format(stream.get_span_context().span_id, "016x"))
    provider.shutdown()
    # drop the pending traces' answer and root spans: their answers are still streaming in the app
    keep = [s for s in exported.spans
            if format(s.context.trace_id, "032x") not in pending  # type: ignore[union-attr]
            or (s.attributes or {}).get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_CHECKPOINT]
    return keep, pending, answers


def test_sigterm_flushes_pending_traces_and_marks_unfinished_judgements_within_the_deadline(
    tmp_path: Path,
) -> None:
    sink = OTLPReceiver().start()
    worker = WorkerProc("sigterm-worker", free_port(), free_port(), sink, tmp_path,
                        extra_env={"STREAMJUDGE_JUDGE": "worker_judges:HangingJudge"})
    try:
        worker.start("--decision-wait", "600", "--shutdown-timeout", "3", "--hold-traces")
        spans, pending, answers = _traces(n_pending=5, n_answers=3)
        body = encode_spans(spans).SerializeToString()
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{worker.http_port}/v1/traces", data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 200
        held = worker.metrics()
        assert re.search(r"^streamjudge_worker_buffer_traces 8$", held, re.M), held
        assert sink.snapshot() == []  # everything is in the worker's memory
        assert worker.process is not None
        started = time.monotonic()
        worker.process.popen.send_signal(signal.SIGTERM)
        code = worker.process.popen.wait(timeout=20)
        took = time.monotonic() - started
        assert code == 0, worker.process.log_tail()
        # the deadline is 3s; starting the exit and interpreter teardown get a little more
        assert took < 3 + 2.5, f"SIGTERM took {took:.1f}s"
        stopped = json.loads(worker.process.log_tail().strip().splitlines()[-1])
        assert stopped["event"] == "stopped"
        assert stopped["answers_marked_shutdown"] == 3
        got = {(s.trace_id, s.span_id): s for s in sink.snapshot()}
        assert len(got) == len(spans)  # every span out, once
        for s in got.values():
            if s.span_id in answers:  # judgement unfinished at the deadline: marked, not lost
                assert s.attributes[semconv.EVAL_STATUS] == "shutdown"
                assert s.attributes[semconv.EVAL_SKIP_REASON] == "shutdown"
            else:  # held traces flushed unchanged
                assert s.attributes.get(semconv.EVAL_STATUS) in (None, "judged")
        assert {s.trace_id for s in got.values()} >= pending
    finally:
        worker.stop()
        sink.stop()


def test_a_worker_killed_after_acknowledging_an_export_loses_none_of_the_spans_it_does_not_judge(
    tmp_path: Path,
) -> None:
    """SIGKILL (or the OOM killer) gives no chance to flush: what the worker acknowledged and still held
    in memory would be gone. Spans it does not judge are handed on before the acknowledgement."""
    sink = OTLPReceiver().start()
    worker = WorkerProc("kill9-worker", free_port(), free_port(), sink, tmp_path,
                        extra_env={"STREAMJUDGE_JUDGE": "worker_judges:HangingJudge"})
    try:
        worker.start("--decision-wait", "600")
        spans, _pending, answers = _traces(n_pending=5, n_answers=3)
        body = encode_spans(spans).SerializeToString()
        import urllib.request

        req = urllib.request.Request(f"http://127.0.0.1:{worker.http_port}/v1/traces", data=body,
                                     headers={"Content-Type": "application/x-protobuf"})
        with urllib.request.urlopen(req, timeout=30) as resp:
            assert resp.status == 200  # acknowledged: the sender will not send these again
        worker.kill()
        others = {(format(s.context.trace_id, "032x"), format(s.context.span_id, "016x"))  # type: ignore[union-attr]
                  for s in spans if format(s.context.span_id, "016x") not in answers}  # type: ignore[union-attr]
        got = {(s.trace_id, s.span_id) for s in sink.snapshot()}
        assert len(others) == len(spans) - len(answers) == 5 + 3 * 2
        assert got == others, f"{len(others - got)} acknowledged spans lost with the worker"
    finally:
        worker.stop()
        sink.stop()
