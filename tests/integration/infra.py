"""Real observability processes on loopback for integration tests.

Starts the collector built from ``collector/builder-config.yaml``, Jaeger v2, Prometheus and Alertmanager on
free 127.0.0.1 ports, waits until each answers, and always stops them (each ``run_*`` is a context manager).
Binaries come from ``make -s collector`` / ``make -s jaeger`` (the last line they print) unless
``STREAMJUDGE_OTELCOL`` / ``STREAMJUDGE_JAEGER`` name them; Prometheus and Alertmanager come from ``PATH``
(Debian packages, installed by ``make test-infra``) unless ``STREAMJUDGE_PROMETHEUS`` /
``STREAMJUDGE_ALERTMANAGER`` / ``STREAMJUDGE_PROMTOOL`` are set.

Usage::

    with ObservabilityStack.start(tmp_path) as stack:
        # send OTLP to stack.collector.otlp_http_url / stack.collector.otlp_grpc_endpoint
        stack.jaeger.trace(trace_id_hex)
        stack.webhook.wait_for(lambda alert: alert["labels"]["alertname"] == "...")
"""

from __future__ import annotations

import contextlib
import gzip
import json
import os
import shutil
import socket
import subprocess
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = REPO / "collector"
OTEL_CONFIG = REPO / "otel-config.yaml"

# startup of a freshly built Go binary and of Prometheus' TSDB takes a few seconds on a loaded 2-core box
READY_TIMEOUT_S = 60.0


class InfraError(RuntimeError):
    """A process could not be built, started, or did not become ready."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


_built: dict[str, Path | InfraError] = {}
_build_lock = threading.Lock()


def make_binary(target: str, env_var: str) -> Path:
    """Path of a binary built by ``make -s <target>`` (the last line it prints), or ``$env_var``.

    The outcome, failure included, is remembered for the session: a broken build is reported by every test
    that needs it without being retried each time.
    """
    override = os.environ.get(env_var)
    if override:
        path = Path(override)
        if not os.access(path, os.X_OK):
            raise InfraError(f"{env_var}={override} is not an executable file")
        return path
    with _build_lock:
        if target not in _built:
            _built[target] = _run_make(target)
        outcome = _built[target]
    if isinstance(outcome, InfraError):
        raise outcome
    return outcome


def _run_make(target: str) -> Path | InfraError:
    proc = subprocess.run(
        ["make", "-s", "--no-print-directory", target],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=3600,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    if proc.returncode != 0 or not lines:
        return InfraError(f"`make {target}` failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    path = Path(lines[-1].strip())
    if not os.access(path, os.X_OK):
        return InfraError(f"`make {target}` printed {path}, which is not an executable file")
    return path


def system_binary(name: str, env_var: str) -> Path:
    """A binary from ``$env_var`` or ``PATH`` (``make test-infra`` installs the Debian packages)."""
    found = os.environ.get(env_var) or shutil.which(name)
    if not found:
        raise InfraError(f"{name} not found: run `make test-infra` (Debian package) or set {env_var}")
    return Path(found)


def collector_binary() -> Path:
    """The OpenTelemetry Collector built from collector/builder-config.yaml."""
    return make_binary("collector", "STREAMJUDGE_OTELCOL")


def jaeger_binary() -> Path:
    """Jaeger v2 built by ``make jaeger``."""
    return make_binary("jaeger", "STREAMJUDGE_JAEGER")


def promtool_binary() -> Path:
    """promtool (ships with the prometheus package)."""
    return system_binary("promtool", "STREAMJUDGE_PROMTOOL")


def http_get(url: str, timeout: float = 5.0) -> tuple[int, bytes]:
    """GET ``url``; returns (status, body) and never raises for HTTP error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read()


def http_get_json(url: str, timeout: float = 5.0) -> Any:
    """GET ``url`` and decode its JSON body (raises on a non-200 status)."""
    status, body = http_get(url, timeout)
    if status != 200:
        raise InfraError(f"GET {url} -> {status}: {body[:500]!r}")
    return json.loads(body)


class Process:
    """A child process with its output in a log file; stopped (terminate, then kill) by :meth:`stop`."""

    def __init__(
        self, name: str, argv: list[str], log_dir: Path, env: Mapping[str, str] | None = None
    ) -> None:
        self.name = name
        self.log_path = log_dir / f"{name}.log"
        self._log = self.log_path.open("wb")
        full_env = {**os.environ, **(env or {})}
        self.popen = subprocess.Popen(
            argv,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            env=full_env,
            cwd=log_dir,
        )

    def log_tail(self, chars: int = 4000) -> str:
        """The end of the process's output, for failure messages."""
        self._log.flush()
        return self.log_path.read_text(errors="replace")[-chars:]

    def wait_ready(self, probe: Callable[[], bool], timeout: float = READY_TIMEOUT_S) -> None:
        """Poll ``probe`` until True; fail with the log tail if the process exits or time runs out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.popen.poll() is not None:
                raise InfraError(f"{self.name} exited with {self.popen.returncode}:\n{self.log_tail()}")
            with contextlib.suppress(OSError):
                if probe():
                    return
            time.sleep(0.1)
        raise InfraError(f"{self.name} not ready after {timeout:.0f}s:\n{self.log_tail()}")

    def stop(self, timeout: float = 10.0) -> None:
        """Terminate the process (SIGTERM, then SIGKILL after ``timeout``) and close its log."""
        try:
            if self.popen.poll() is None:
                self.popen.terminate()
                try:
                    self.popen.wait(timeout)
                except subprocess.TimeoutExpired:
                    self.popen.kill()
                    self.popen.wait(timeout)
        finally:
            self._log.close()


def _http_ok(url: str) -> Callable[[], bool]:
    return lambda: http_get(url, timeout=1.0)[0] == 200


def _replace_once(text: str, old: str, new: str, source: str) -> str:
    # the shipped configs are the source of truth; if one changes shape the test must fail loudly, not
    # silently run against the defaults
    if text.count(old) != 1:
        raise InfraError(f"expected exactly one {old!r} in {source}")
    return text.replace(old, new)


# --- Jaeger -----------------------------------------------------------------------------------------


@dataclass
class Jaeger:
    """A running Jaeger v2 with in-memory storage."""

    process: Process
    otlp_grpc_endpoint: str
    otlp_http_endpoint: str
    query_url: str

    def trace(self, trace_id: str) -> dict[str, Any] | None:
        """The trace with this 32-hex-digit id from the query API, or None while Jaeger does not have it."""
        status, body = http_get(f"{self.query_url}/api/traces/{trace_id}")
        if status == 404:
            return None
        if status != 200:
            raise InfraError(f"Jaeger /api/traces/{trace_id} -> {status}: {body[:500]!r}")
        data = json.loads(body).get("data") or []
        return data[0] if data else None

    def wait_for_trace(
        self, trace_id: str, ready: Callable[[dict[str, Any]], bool], timeout: float = 30.0
    ) -> dict[str, Any]:
        """Poll until the trace exists and ``ready(trace)`` holds (spans of one trace arrive in batches)."""
        deadline = time.monotonic() + timeout
        last: dict[str, Any] | None = None
        while time.monotonic() < deadline:
            last = self.trace(trace_id)
            if last is not None and ready(last):
                return last
            time.sleep(0.25)
        spans = [s.get("operationName") for s in (last or {}).get("spans", [])]
        raise InfraError(f"trace {trace_id} not complete in Jaeger after {timeout:.0f}s; spans: {spans}")


@contextlib.contextmanager
def run_jaeger(log_dir: Path) -> Iterator[Jaeger]:
    """Jaeger from collector/jaeger.yaml on free loopback ports."""
    ports = {name: free_port() for name in ("grpc", "http", "query", "query_grpc", "metrics")}
    env = {
        "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{ports['query']}",
        "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{ports['query_grpc']}",
        "JAEGER_METRICS_PORT": str(ports["metrics"]),
    }
    proc = Process(
        "jaeger", [str(jaeger_binary()), "--config", str(COLLECTOR_DIR / "jaeger.yaml")], log_dir, env
    )
    try:
        query_url = f"http://127.0.0.1:{ports['query']}"
        proc.wait_ready(_http_ok(f"{query_url}/api/services"))
        yield Jaeger(proc, env["JAEGER_OTLP_GRPC_ENDPOINT"], env["JAEGER_OTLP_HTTP_ENDPOINT"], query_url)
    finally:
        proc.stop()


# --- collector --------------------------------------------------------------------------------------


@dataclass
class Collector:
    """A running collector with otel-config.yaml."""

    process: Process
    otlp_grpc_endpoint: str
    otlp_http_url: str
    prometheus_endpoint: str
    env: dict[str, str]

    @property
    def telemetry_endpoint(self) -> str:
        """host:port of the collector's own metrics."""
        return f"127.0.0.1:{self.env['STREAMJUDGE_COLLECTOR_TELEMETRY_PORT']}"

    def telemetry_text(self) -> str:
        """The collector's own metrics (exporter failures, queue sizes...)."""
        status, body = http_get(f"http://{self.telemetry_endpoint}/metrics")
        if status != 200:
            raise InfraError(f"collector telemetry /metrics -> {status}")
        return body.decode()

    def metrics_text(self) -> str:
        """The Prometheus exporter's current exposition."""
        status, body = http_get(f"http://{self.prometheus_endpoint}/metrics")
        if status != 200:
            raise InfraError(f"collector /metrics -> {status}")
        return body.decode()


def collector_env(jaeger_otlp_grpc: str, extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """Environment for otel-config.yaml: every listening port free, traces to ``jaeger_otlp_grpc``."""
    env = {
        "STREAMJUDGE_COLLECTOR_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_PROMETHEUS_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_HEALTH_ENDPOINT": f"127.0.0.1:{free_port()}",
        "STREAMJUDGE_COLLECTOR_TELEMETRY_PORT": str(free_port()),
        "JAEGER_OTLP_GRPC_ENDPOINT": jaeger_otlp_grpc,
    }
    env.update(extra or {})
    return env


@contextlib.contextmanager
def run_collector(
    log_dir: Path, jaeger_otlp_grpc: str, extra_env: Mapping[str, str] | None = None
) -> Iterator[Collector]:
    """The collector built by ``make collector`` running otel-config.yaml on free loopback ports."""
    env = collector_env(jaeger_otlp_grpc, extra_env)
    proc = Process("otelcol", [str(collector_binary()), "--config", str(OTEL_CONFIG)], log_dir, env)
    try:
        proc.wait_ready(_http_ok(f"http://{env['STREAMJUDGE_COLLECTOR_HEALTH_ENDPOINT']}/"))
        yield Collector(
            proc,
            otlp_grpc_endpoint=env["STREAMJUDGE_COLLECTOR_OTLP_GRPC_ENDPOINT"],
            otlp_http_url=f"http://{env['STREAMJUDGE_COLLECTOR_OTLP_HTTP_ENDPOINT']}",
            prometheus_endpoint=env["STREAMJUDGE_COLLECTOR_PROMETHEUS_ENDPOINT"],
            env=env,
        )
    finally:
        proc.stop()


# --- webhook receiver (Alertmanager's target) -------------------------------------------------------


@dataclass
class WebhookReceiver:
    """A tiny HTTP server that records the JSON bodies Alertmanager posts."""

    server: ThreadingHTTPServer
    url: str
    posts: list[dict[str, Any]] = field(default_factory=list)
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def record(self, payload: dict[str, Any]) -> None:
        with self._cond:
            self.posts.append(payload)
            self._cond.notify_all()

    def alerts(self) -> list[dict[str, Any]]:
        """Every alert received so far (the ``alerts`` of every notification, in order)."""
        with self._cond:
            return [a for p in self.posts for a in p.get("alerts", [])]

    def wait_for(self, match: Callable[[dict[str, Any]], bool], timeout: float) -> dict[str, Any]:
        """The first received alert matching ``match``, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for alert in (a for p in self.posts for a in p.get("alerts", [])):
                    if match(alert):
                        return alert
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise InfraError(f"no matching alert after {timeout:.0f}s; received: {self.posts}")
                self._cond.wait(remaining)


@contextlib.contextmanager
def run_webhook_receiver() -> Iterator[WebhookReceiver]:
    """A webhook receiver on a free loopback port, serving in a daemon thread until the block ends."""
    holder: list[WebhookReceiver] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            holder[0].record(json.loads(body))
            self.send_response(200)
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    receiver = WebhookReceiver(server, f"http://127.0.0.1:{server.server_address[1]}/alerts")
    holder.append(receiver)
    thread = threading.Thread(target=server.serve_forever, name="webhook-receiver", daemon=True)
    thread.start()
    try:
        yield receiver
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- an OTLP/HTTP endpoint that records what it receives (stands in for Langfuse's /api/public/otel) ---


@dataclass
class RecordedRequest:
    """One request an :class:`HttpSink` received (body already un-gzipped)."""

    path: str
    headers: dict[str, str]
    body: bytes


@dataclass
class HttpSink:
    """A loopback HTTP server answering 200 to every POST and keeping the requests."""

    url: str
    requests: list[RecordedRequest] = field(default_factory=list)
    # the status every request gets (set e.g. 401 or 503 to play a rejecting or failing backend)
    status: int = 200
    _cond: threading.Condition = field(default_factory=threading.Condition)

    def record(self, request: RecordedRequest) -> None:
        with self._cond:
            self.requests.append(request)
            self._cond.notify_all()

    def wait_for(self, match: Callable[[RecordedRequest], bool], timeout: float) -> RecordedRequest:
        """The first request matching ``match``, waiting up to ``timeout`` seconds for it."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                for req in self.requests:
                    if match(req):
                        return req
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    seen = [(r.path, len(r.body)) for r in self.requests]
                    raise InfraError(f"no matching request after {timeout:.0f}s; received: {seen}")
                self._cond.wait(remaining)


@contextlib.contextmanager
def run_http_sink() -> Iterator[HttpSink]:
    """An :class:`HttpSink` on a free loopback port until the block ends."""
    holder: list[HttpSink] = []

    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            body = self.rfile.read(int(self.headers.get("Content-Length", "0")))
            if self.headers.get("Content-Encoding") == "gzip":
                body = gzip.decompress(body)
            holder[0].record(
                RecordedRequest(self.path, {k.lower(): v for k, v in self.headers.items()}, body)
            )
            self.send_response(holder[0].status)
            self.send_header("Content-Type", "application/x-protobuf")
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args: Any) -> None:
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sink = HttpSink(f"http://127.0.0.1:{server.server_address[1]}")
    holder.append(sink)
    thread = threading.Thread(target=server.serve_forever, name="http-sink", daemon=True)
    thread.start()
    try:
        yield sink
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


# --- Alertmanager -----------------------------------------------------------------------------------


@dataclass
class Alertmanager:
    """A running Alertmanager whose only receiver is a webhook."""

    process: Process
    url: str
    endpoint: str


@contextlib.contextmanager
def run_alertmanager(log_dir: Path, webhook_url: str) -> Iterator[Alertmanager]:
    """Alertmanager with collector/alertmanager.yml, its webhook pointed at ``webhook_url``, short waits."""
    text = (COLLECTOR_DIR / "alertmanager.yml").read_text()
    text = _replace_once(text, "http://127.0.0.1:5001/alerts", webhook_url, "alertmanager.yml")
    # notify at once instead of batching for 10s/1m: the test waits for the first notification
    text = _replace_once(text, "group_wait: 10s", "group_wait: 1s", "alertmanager.yml")
    text = _replace_once(text, "group_interval: 1m", "group_interval: 2s", "alertmanager.yml")
    config = log_dir / "alertmanager.yml"
    config.write_text(text)
    port = free_port()
    argv = [
        str(system_binary("prometheus-alertmanager", "STREAMJUDGE_ALERTMANAGER")),
        f"--config.file={config}",
        f"--storage.path={log_dir / 'alertmanager-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
        "--cluster.listen-address=",  # no gossip port: a single instance
    ]
    proc = Process("alertmanager", argv, log_dir)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(_http_ok(f"{url}/-/ready"))
        yield Alertmanager(proc, url, f"127.0.0.1:{port}")
    finally:
        proc.stop()


# --- Prometheus -------------------------------------------------------------------------------------


@dataclass
class Prometheus:
    """A running Prometheus scraping the collector and evaluating collector/alerts.yml."""

    process: Process
    url: str

    def query(self, promql: str) -> list[dict[str, Any]]:
        """Instant query; the ``result`` vector."""
        q = urllib.parse.quote(promql)
        data = http_get_json(f"{self.url}/api/v1/query?query={q}")
        return list(data["data"]["result"])

    def alerts(self) -> list[dict[str, Any]]:
        """Alerts Prometheus currently has pending or firing."""
        return list(http_get_json(f"{self.url}/api/v1/alerts")["data"]["alerts"])

    def wait_for_query(
        self,
        promql: str,
        timeout: float = 30.0,
        until: Callable[[list[dict[str, Any]]], bool] = bool,
    ) -> list[dict[str, Any]]:
        """Poll ``promql`` until its vector satisfies ``until`` (default: non-empty).

        A counter fed by several exports can be scraped between them, so callers that expect a
        total pass ``until`` rather than asserting on the first sample.
        """
        deadline = time.monotonic() + timeout
        result: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            result = self.query(promql)
            if until(result):
                return result
            time.sleep(0.25)
        raise InfraError(f"{promql!r} did not reach the expected value in {timeout:.0f}s; last: {result}")


def prometheus_config(
    scrape_target: str, alertmanager: str, telemetry_target: str = "127.0.0.1:8888", interval: str = "1s"
) -> str:
    """collector/prometheus.yml with the given targets, Alertmanager and scrape/evaluation interval."""
    text = (COLLECTOR_DIR / "prometheus.yml").read_text()
    text = _replace_once(text, '"127.0.0.1:8889"', f'"{scrape_target}"', "prometheus.yml")
    text = _replace_once(text, '"127.0.0.1:9093"', f'"{alertmanager}"', "prometheus.yml")
    text = _replace_once(text, '"127.0.0.1:8888"', f'"{telemetry_target}"', "prometheus.yml")
    text = _replace_once(text, "scrape_interval: 15s", f"scrape_interval: {interval}", "prometheus.yml")
    text = _replace_once(
        text, "evaluation_interval: 15s", f"evaluation_interval: {interval}", "prometheus.yml"
    )
    return _replace_once(text, "  - alerts.yml", f"  - {COLLECTOR_DIR / 'alerts.yml'}", "prometheus.yml")


@contextlib.contextmanager
def run_prometheus(
    log_dir: Path, scrape_target: str, alertmanager: str, telemetry_target: str
) -> Iterator[Prometheus]:
    """Prometheus with collector/prometheus.yml (1s scrape and evaluation) on a free loopback port."""
    config = log_dir / "prometheus.yml"
    config.write_text(prometheus_config(scrape_target, alertmanager, telemetry_target))
    port = free_port()
    argv = [
        str(system_binary("prometheus", "STREAMJUDGE_PROMETHEUS")),
        f"--config.file={config}",
        f"--storage.tsdb.path={log_dir / 'prometheus-data'}",
        f"--web.listen-address=127.0.0.1:{port}",
    ]
    proc = Process("prometheus", argv, log_dir)
    try:
        url = f"http://127.0.0.1:{port}"
        proc.wait_ready(_http_ok(f"{url}/-/ready"))
        yield Prometheus(proc, url)
    finally:
        proc.stop()


# --- everything together ----------------------------------------------------------------------------


@dataclass
class ObservabilityStack:
    """Jaeger <- collector -> Prometheus -> Alertmanager -> webhook receiver, all on loopback."""

    jaeger: Jaeger
    collector: Collector
    prometheus: Prometheus
    alertmanager: Alertmanager
    webhook: WebhookReceiver

    @classmethod
    @contextlib.contextmanager
    def start(
        cls, log_dir: Path, collector_extra_env: Mapping[str, str] | None = None
    ) -> Iterator[ObservabilityStack]:
        """Start every process (each one stopped again however the block ends)."""
        with contextlib.ExitStack() as stack:
            jaeger = stack.enter_context(run_jaeger(log_dir))
            collector = stack.enter_context(
                run_collector(log_dir, jaeger.otlp_grpc_endpoint, collector_extra_env)
            )
            webhook = stack.enter_context(run_webhook_receiver())
            alertmanager = stack.enter_context(run_alertmanager(log_dir, webhook.url))
            prometheus = stack.enter_context(
                run_prometheus(
                    log_dir,
                    collector.prometheus_endpoint,
                    alertmanager.endpoint,
                    collector.telemetry_endpoint,
                )
            )
            yield cls(jaeger, collector, prometheus, alertmanager, webhook)

    def logs(self) -> str:
        """The tail of every process's log, for failure messages."""
        procs = (
            self.jaeger.process,
            self.collector.process,
            self.prometheus.process,
            self.alertmanager.process,
        )
        return "\n".join(f"--- {p.name} ---\n{p.log_tail(2000)}" for p in procs)
