"""``make demo-ui``: the example app under ``opentelemetry-instrument`` with a trace viewer, left running.

Starts a trace viewer on 127.0.0.1 — Jaeger v2 (``make jaeger`` builds it; in-memory storage, the
project's ``collector/jaeger.yaml``) or Arize Phoenix (``make phoenix`` installs it in its own venv) — and
the example app (``examples/adaptive_rag/app.py``) under zero-code instrumentation with the local judge,
exporting its spans to the viewer; streams a grounded and a hallucinating question so there is something to
look at; prints the app's page and the viewer's address; and waits. Ctrl-C (or SIGTERM) stops the app
(its spans are flushed on the way out) and then the viewer, each by its pid (they run in sessions of their
own, so the terminal's Ctrl-C reaches only this process and the order holds).

With Phoenix, streamjudge's own Phoenix exporter sends the spans (``PHOENIX_COLLECTOR_ENDPOINT``, project
``streamjudge-demo``) and the scores also arrive as span annotations.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

from streamjudge import _demo_app
from streamjudge._demo_app import App, DemoUnavailable, Question

SERVICE = "streamjudge-demo-app"
PHOENIX_PROJECT = "streamjudge-demo"
JAEGER_VERSION_DIR = Path.home() / ".cache" / "streamjudge" / "jaeger" / "v1.76.0"
PHOENIX_VENV = Path.home() / ".cache" / "streamjudge" / "phoenix-venv"
#: streamed once the app is up, so the viewer has traces to show
WARM_UP: tuple[Question, ...] = (
    Question("grounded", "How tall is the Eiffel Tower?"),
    Question("hallucinating", "When was the Eiffel Tower built?", hallucinate=True),
)


@dataclass
class Viewer:
    """A running trace viewer."""

    name: str
    proc: subprocess.Popen[bytes]
    ui: str  # what a person opens
    otlp_http: str  # base URL of its OTLP/HTTP receiver
    log_path: Path

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGTERM (both viewers shut down cleanly on it), SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def _root() -> Path:
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / "collector" / "jaeger.yaml").is_file():
            return root
    raise DemoUnavailable("collector/jaeger.yaml is not here: run make demo-ui from a checkout or sdist of "
                          "streamjudge")


def jaeger_binary(explicit: str | None = None) -> Path:
    """``explicit``, ``$STREAMJUDGE_JAEGER`` or the binary ``make jaeger`` builds."""
    for candidate in (explicit, os.environ.get("STREAMJUDGE_JAEGER"), str(JAEGER_VERSION_DIR / "jaeger")):
        if candidate and os.access(candidate, os.X_OK):
            return Path(candidate)
    raise DemoUnavailable("Jaeger is not built: run `make jaeger` (or pass --jaeger PATH)")


def _wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout: float, what: str) -> None:
    import httpx

    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            tail = "\n".join(log.read_text(errors="replace").splitlines()[-15:])
            raise DemoUnavailable(f"{what} exited with status {proc.returncode} (log: {log}):\n{tail}")
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(url, timeout=1.0).status_code == 200:
                return
        if time.monotonic() > deadline:
            raise DemoUnavailable(f"{what} did not answer {url} within {timeout:g} s (log: {log})")
        time.sleep(0.2)


def _port(wanted: int) -> int:
    """``wanted`` when it is free on 127.0.0.1 (0: any free port)."""
    import socket

    if wanted:
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", wanted))
                return wanted
            except OSError:
                pass
    return _demo_app._free_port()


def start_jaeger(binary: Path, ui_port: int, log_dir: Path, timeout: float = 60.0) -> Viewer:
    """Jaeger v2 on loopback: UI/query on ``ui_port`` (another free one if busy), OTLP on free ports."""
    ports = {n: _demo_app._free_port() for n in ("grpc", "http", "qgrpc", "metrics")}
    ports["ui"] = _port(ui_port)
    env = {
        **os.environ,
        "JAEGER_OTLP_GRPC_ENDPOINT": f"127.0.0.1:{ports['grpc']}",
        "JAEGER_OTLP_HTTP_ENDPOINT": f"127.0.0.1:{ports['http']}",
        "JAEGER_QUERY_HTTP_ENDPOINT": f"127.0.0.1:{ports['ui']}",
        "JAEGER_QUERY_GRPC_ENDPOINT": f"127.0.0.1:{ports['qgrpc']}",
        "JAEGER_METRICS_PORT": str(ports["metrics"]),
    }
    log = log_dir / "streamjudge-demo-ui-jaeger.log"
    with log.open("wb") as fh:
        config = _root() / "collector" / "jaeger.yaml"
        # jaeger_query traces itself to localhost:4317 by default: the retries there delay its shutdown
        proc = subprocess.Popen([str(binary), "--config", str(config),
                                 "--set", "extensions::jaeger_query::enable_tracing=false"], env=env,
                                stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    viewer = Viewer("jaeger", proc, f"http://127.0.0.1:{ports['ui']}", f"http://127.0.0.1:{ports['http']}",
                    log)
    try:
        _wait_http(f"{viewer.ui}/api/services", proc, log, timeout, "Jaeger")
    except BaseException:
        viewer.stop(5)
        raise
    return viewer


def start_phoenix(python: Path, ui_port: int, log_dir: Path, timeout: float = 180.0) -> Viewer:
    """``phoenix serve`` from its venv on loopback (its gRPC port too), UI on ``ui_port``."""
    port, grpc_port = _port(ui_port), _demo_app._free_port()
    workdir = log_dir / "streamjudge-demo-ui-phoenix"
    workdir.mkdir(parents=True, exist_ok=True)
    env = {
        **os.environ,
        "PHOENIX_HOST": "127.0.0.1", "PHOENIX_PORT": str(port), "PHOENIX_GRPC_PORT": str(grpc_port),
        "PHOENIX_WORKING_DIR": str(workdir), "PHOENIX_TELEMETRY_ENABLED": "false",
        "PHOENIX_ALLOW_EXTERNAL_RESOURCES": "false",
    }
    # Phoenix binds gRPC on every interface with no setting to change it: bind it to loopback before it does
    launcher = (
        "import sys, grpc.aio\n"
        "_server = grpc.aio.server\n"
        "def _loopback(*a, **k):\n"
        "    s = _server(*a, **k)\n"
        "    add = s.add_insecure_port\n"
        "    s.add_insecure_port = lambda addr: add(addr.replace('[::]:', '127.0.0.1:', 1))\n"
        "    return s\n"
        "grpc.aio.server = _loopback\n"
        "from phoenix.server.main import main\n"
        "sys.argv = ['phoenix', 'serve']\n"
        "main()\n"
    )
    log = log_dir / "streamjudge-demo-ui-phoenix.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([str(python), "-c", launcher], env=env, stdin=subprocess.DEVNULL, stdout=fh,
                                stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    viewer = Viewer("phoenix", proc, url, url, log)
    try:
        _wait_http(f"{url}/healthz", proc, log, timeout, "Phoenix")
    except BaseException:
        viewer.stop(5)
        raise
    return viewer


def start_app(
    viewer: Viewer, app: Path, action: str, log_dir: Path, timeout: float, token_delay_ms: float
) -> App:
    """The example app under ``opentelemetry-instrument``, its spans to ``viewer``."""
    port = _demo_app._free_port()
    env = _demo_app.app_env(action, port, f"{viewer.otlp_http}/v1/traces", token_delay_ms)
    env["OTEL_SERVICE_NAME"] = SERVICE
    if viewer.name == "phoenix":
        # streamjudge's Phoenix exporter (project, annotations) instead of the plain OTLP one
        env.update({"OTEL_TRACES_EXPORTER": "none", "PHOENIX_COLLECTOR_ENDPOINT": viewer.otlp_http,
                    "PHOENIX_PROJECT_NAME": PHOENIX_PROJECT})
        env.pop("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", None)
    log = log_dir / "streamjudge-demo-ui-app.log"
    with log.open("wb") as fh:
        proc = subprocess.Popen([_demo_app._instrument_command(), sys.executable, str(app)], env=env,
                                cwd=app.parent, stdin=subprocess.DEVNULL, stdout=fh, stderr=subprocess.STDOUT,
                                start_new_session=True)
    served = App(proc, port, log, action)
    try:
        _wait_http(f"{served.base}/openapi.json", proc, log, timeout, "the example app")
    except BaseException:
        served.stop(5)
        raise
    return served


def viewer_link(viewer: Viewer) -> str:
    """Where to look at the app's traces."""
    if viewer.name == "jaeger":
        return f"{viewer.ui}/search?service={SERVICE}"
    return f"{viewer.ui}/projects"


@contextlib.contextmanager
def _signals_as_interrupt() -> Iterator[None]:
    """SIGTERM stops the demo like Ctrl-C does."""
    def handler(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    try:
        old = signal.signal(signal.SIGTERM, handler)
    except ValueError:  # not the main thread
        yield
        return
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, old)


def run(argv: Sequence[str] | None = None, out: TextIO | None = None) -> int:
    """``python -m streamjudge._demo_ui``; returns the exit status."""
    out = out or sys.stdout
    p = argparse.ArgumentParser(prog="streamjudge demo-ui", description=__doc__.splitlines()[0])
    p.add_argument("--viewer", choices=("jaeger", "phoenix"), default="jaeger")
    p.add_argument("--jaeger", default=None, help="the Jaeger v2 binary (default: what `make jaeger` built)")
    p.add_argument("--phoenix-python", default=str(PHOENIX_VENV / "bin" / "python"),
                   help="the interpreter of Phoenix's venv (default: what `make phoenix` installed)")
    p.add_argument("--viewer-port", type=int, default=None,
                   help="the viewer's UI port (default 16686 for Jaeger, 6006 for Phoenix; 0: any free one)")
    p.add_argument("--action", choices=("flag", "stop", "regenerate"), default="flag")
    p.add_argument("--app", default=None, help="the example app (default examples/adaptive_rag/app.py)")
    p.add_argument("--no-warm-up", action="store_true", help="do not stream the two first questions")
    p.add_argument("--token-delay-ms", type=float, default=15.0)
    p.add_argument("--log-dir", default=None, help="where the processes' logs go (default: the temp dir)")
    p.add_argument("--startup-timeout", type=float, default=120.0)
    args = p.parse_args(argv)
    log_dir = Path(args.log_dir) if args.log_dir else _demo_app.default_traces().parent
    log_dir.mkdir(parents=True, exist_ok=True)
    viewer: Viewer | None = None
    app: App | None = None
    with _signals_as_interrupt():
        try:
            app_path = _demo_app.find_app(args.app)
            _demo_app._check_app_modules()
            if args.viewer == "jaeger":
                port = 16686 if args.viewer_port is None else args.viewer_port
                viewer = start_jaeger(jaeger_binary(args.jaeger), port, log_dir, args.startup_timeout)
            else:
                python = Path(args.phoenix_python)
                if not python.exists():
                    raise DemoUnavailable(f"Phoenix is not installed at {python}: run `make phoenix`")
                port = 6006 if args.viewer_port is None else args.viewer_port
                viewer = start_phoenix(python, port, log_dir, args.startup_timeout)
            out.write(f"streamjudge demo-ui: {viewer.name} (pid {viewer.proc.pid}) at {viewer.ui}\n")
            out.flush()
            app = start_app(viewer, app_path, args.action, log_dir, args.startup_timeout, args.token_delay_ms)
            out.write(f"streamjudge demo-ui: the example app (pid {app.proc.pid}) at {app.base}/ under "
                      f"opentelemetry-instrument, judge=local, action={args.action}\n")
            out.flush()
            if not args.no_warm_up:
                for q in WARM_UP:
                    _demo_app.stream_question(app, q, io.StringIO())
                out.write(f"streamjudge demo-ui: streamed {len(WARM_UP)} questions "
                          f"({', '.join(q.title for q in WARM_UP)})\n")
            out.write(
                f"\n  app page:     {app.base}/\n"
                f"  trace viewer: {viewer_link(viewer)}\n"
                f"  logs:         {app.log_path}, {viewer.log_path}\n\n"
                "Ask questions on the page (tick 'hallucinate' to see a sentence flagged), then look at the "
                "trace. Ctrl-C stops both.\n"
            )
            out.flush()
            while app.proc.poll() is None and viewer.proc.poll() is None:
                time.sleep(0.5)
            which = "the app" if app.proc.poll() is not None else viewer.name
            out.write(f"streamjudge demo-ui: {which} exited; stopping\n")
            return 1
        except DemoUnavailable as exc:
            print(f"streamjudge demo-ui: {exc}", file=sys.stderr)
            return 2
        except KeyboardInterrupt:
            out.write("\nstreamjudge demo-ui: stopping\n")
            return 0
        finally:
            # the app first: it flushes its last spans to the viewer on the way out
            if app is not None:
                code = app.stop()
                out.write(f"streamjudge demo-ui: app (pid {app.proc.pid}) stopped, status {code}\n")
            if viewer is not None:
                code = viewer.stop()
                out.write(f"streamjudge demo-ui: {viewer.name} (pid {viewer.proc.pid}) stopped, "
                          f"status {code}\n")
            out.flush()


if __name__ == "__main__":
    sys.exit(run())
