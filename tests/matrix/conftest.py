"""The matrix's processes: one scripted model, one OTLP receiver, three app processes.

Every app runs as a real uvicorn process on 127.0.0.1, under ``opentelemetry-instrument`` (zero-code
shapes) or with ``instrument_app`` in its code (the body shape), and exports its spans over OTLP/HTTP to
the receiver. Action and mode vary per request within one process (``_kit.apply_cell``); client events
are fixed when an app is instrumented, so the four zero-code shapes share one app run once per
client-events setting, and the body app is instrumented twice in one process (``/off`` and ``/on``).
The three start together. ``MATRIX_PROCESS_PER_CELL=1`` starts one process per cell instead, configured
only by ``STREAMJUDGE_ACTION`` / ``STREAMJUDGE_MODE`` / ``STREAMJUDGE_CLIENT_EVENTS`` (slow: it checks
that the per-request switch changes nothing).

The app's model answers in three sentences, the second invented (:data:`FABRICATED`: a name and a year
the passage does not hold), so the local judge fails that sentence and only it; asked again with the
guard's regenerate instruction it continues with a grounded sentence (:data:`CONTINUATION`).
"""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

import httpx
import pytest

from instrumentation.otlp_receiver import OTLPReceiver
from judges.scripted_server import ScriptedLLMServer
from streamjudge.config import DEFAULT_REGENERATE_INSTRUCTION

HERE = Path(__file__).resolve().parent
BIN = Path(sys.executable).parent
QUESTION = "How tall is the Eiffel Tower?"
GROUNDED = "The Eiffel Tower is 330 metres tall."
INVENTED_NAME = "Napoleon Bonaparte"  # not in any passage: the local judge fails its sentence
FABRICATED = f"It was designed by {INVENTED_NAME} in 1750."
AFTER = "It was completed in 1889 for the World's Fair."
ANSWER = f"{GROUNDED} {FABRICATED} {AFTER}"
CONTINUATION = " It is in Paris."
FIRST_TOKEN_DELAY_S = 0.05
TOKEN_DELAY_S = 0.01
PER_CELL = os.environ.get("MATRIX_PROCESS_PER_CELL") == "1"


def app_model(body: dict[str, Any]) -> dict[str, Any] | None:
    """The apps' model: a tool call first (when tools are bound), a standalone question when asked to
    condense one, the continuation when re-prompted by the guard, else the answer."""
    messages = body.get("messages", [])
    text = "\n".join(str(m.get("content")) for m in messages)
    if DEFAULT_REGENERATE_INSTRUCTION[:30] in text:
        return {"content": CONTINUATION}
    if "Standalone question:" in text:
        return {"content": QUESTION}
    if body.get("tools") and not any(m.get("role") == "tool" for m in messages):
        name = body["tools"][0].get("function", {}).get("name", "retrieve")
        return {"tool_call": {"name": name, "arguments": {"query": "Eiffel Tower height"}}}
    return {"content": ANSWER}


@dataclass(frozen=True)
class Process:
    """How one app process is run: its script, whether zero-code, its own settings, and whether it serves
    both client-events settings itself (under ``/off`` and ``/on``) or runs once per setting."""

    script: str
    zero_code: bool = True
    settings: dict[str, str] = field(default_factory=dict)
    events_in_path: bool = False


PROCESSES: dict[str, Process] = {
    # the graph shapes' answer node is ``generate``, the agent's ``agent``; the chain has none
    "zero_code": Process("app_zero_code.py", settings={"answer_nodes": "generate,agent"}),
    "body": Process("app_body.py", zero_code=False, events_in_path=True),
}


@dataclass
class App:
    proc: subprocess.Popen[str]
    port: int
    log: IO[str]  # the process's output: a file, so a chatty app never blocks on a full pipe

    def output(self) -> str:
        self.log.seek(0)
        out = self.log.read()
        self.log.close()
        return out

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _env(llm: ScriptedLLMServer, receiver: OTLPReceiver, port: int, settings: dict[str, str]
         ) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("STREAMJUDGE_", "OTEL_"))}
    env.update({
        "APP_LLM_BASE_URL": llm.openai_base_url,
        "APP_PORT": str(port),
        "OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint,
        "OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "STREAMJUDGE_JUDGE": "local",
        # a verdict later than the end wait releases held text unjudged: on a loaded machine that must not
        # decide a cell (the wait ends as soon as the verdicts are in)
        "STREAMJUDGE_END_WAIT": "10",
        "PYTHONWARNINGS": "ignore",
    })
    env.update({f"STREAMJUDGE_{k.upper()}": v for k, v in settings.items()})
    return env


def _spawn(process: Process, llm: ScriptedLLMServer, receiver: OTLPReceiver, settings: dict[str, str]) -> App:
    port = _free_port()
    cmd = [str(BIN / "python"), str(HERE / process.script)]
    if process.zero_code:
        cmd = [str(BIN / "opentelemetry-instrument"), *cmd]
    log = tempfile.TemporaryFile("w+")  # noqa: SIM115 - closed by App.output, when the process ended
    proc = subprocess.Popen(cmd, env=_env(llm, receiver, port, {**process.settings, **settings}), cwd=HERE,
                            stdout=log, stderr=subprocess.STDOUT, text=True)
    return App(proc, port, log)


def _wait_ready(app: App, script: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        if app.proc.poll() is not None:
            raise AssertionError(f"{script} exited early:\n{app.output()}")
        try:
            httpx.get(f"{app.url}/healthz", timeout=1)
            return
        except httpx.HTTPError:
            if time.monotonic() > deadline:
                raise AssertionError(f"{script} did not start") from None
            time.sleep(0.1)


def _stop(app: App, *, signalled: bool = False) -> str:
    """Stop ``app`` (one SIGINT: a second one makes uvicorn quit without its graceful shutdown)."""
    proc = app.proc
    if proc.poll() is None:
        if not signalled:
            proc.send_signal(signal.SIGINT)
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return app.output()


class Apps:
    """The running app processes; :meth:`get` gives the one serving a cell and the header that selects it."""

    def __init__(self, llm: ScriptedLLMServer, receiver: OTLPReceiver) -> None:
        self._llm = llm
        self._receiver = receiver
        self._running: dict[tuple[str, ...], App] = {}
        self.outputs: dict[tuple[str, ...], str] = {}

    def start_all(self) -> None:
        """Start the shared processes at once: their start-ups overlap."""
        started = {}
        for name, process in PROCESSES.items():
            for events in ("on",) if process.events_in_path else ("off", "on"):
                started[(name, events)] = _spawn(process, self._llm, self._receiver, {"client_events": events})
        try:
            for key, app in started.items():
                _wait_ready(app, PROCESSES[key[0]].script)
        finally:
            self._running.update(started)

    def get(self, process: str, action: str, mode: str, events: str) -> tuple[str, str | None]:
        """The base URL serving this cell and the cell switch to send (None: the process runs only it)."""
        served = PROCESSES[process]
        prefix = f"/{events}" if served.events_in_path else ""
        if not PER_CELL:
            app = self._running[(process, "on" if served.events_in_path else events)]
            return app.url + prefix, f"{action},{mode}"
        key = (process, action, mode, events)
        self.stop_all()
        app = _spawn(served, self._llm, self._receiver,
                     {"client_events": events, "action": action, "mode": mode})
        self._running[key] = app
        _wait_ready(app, served.script)
        return app.url + prefix, None

    def stop_all(self) -> None:
        """SIGINT to every process first, then wait: their drains overlap."""
        for app in self._running.values():
            if app.proc.poll() is None:
                app.proc.send_signal(signal.SIGINT)
        for key, app in list(self._running.items()):
            self.outputs[key] = _stop(app, signalled=True)
        self._running.clear()


@pytest.fixture(scope="session")
def matrix_llm() -> Iterator[ScriptedLLMServer]:
    server = ScriptedLLMServer().start()
    server.app_responder = app_model
    server.first_token_delay_s = FIRST_TOKEN_DELAY_S
    server.token_delay_s = TOKEN_DELAY_S
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def matrix_receiver() -> Iterator[OTLPReceiver]:
    rec = OTLPReceiver().start()
    try:
        yield rec
    finally:
        rec.stop()


@pytest.fixture(scope="session")
def matrix_apps(matrix_llm: ScriptedLLMServer, matrix_receiver: OTLPReceiver) -> Iterator[Apps]:
    apps = Apps(matrix_llm, matrix_receiver)
    try:
        if not PER_CELL:
            apps.start_all()
        yield apps
    finally:
        apps.stop_all()
        broken = {key: out for key, out in apps.outputs.items() if "Traceback" in out}
        if broken:
            report = "\n".join(f"{k}:\n{o}" for k, o in broken.items())
            pytest.fail(f"an app process logged a traceback:\n{report}", pytrace=False)
