"""The demo of the real product: the example app under ``opentelemetry-instrument``, questions over HTTP.

For each action (flag, stop, regenerate; the action is a process-wide setting, so the app is started once
per action with ``STREAMJUDGE_ACTION`` set) the example app (``examples/adaptive_rag/app.py``: a LangGraph
retrieve -> grade -> generate -> reflect graph behind FastAPI SSE, with a deterministic model that
hallucinates on request) is started as a subprocess on 127.0.0.1 (a free port) under zero-code
instrumentation with the local judge. Its spans go over OTLP/HTTP to a receiver in this process that
writes them to an OTLP JSON lines file. Every answer is printed as it streams (with the warning and stop
frames the app's client gets), then summarised from the exported spans: node timings, time to first
token, pre-flight and checkpoint scores, the flagged sentences and why, the actions, the final scores.
The app is stopped by its pid. :class:`DemoUnavailable` is raised when the app cannot be served (the
caller then falls back to the in-process demo).
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from streamjudge import semconv
from streamjudge.offline.otlp_file import OTLPFileReceiver, ReceivedSpan

ACTIONS: tuple[str, ...] = ("flag", "stop", "regenerate")
METRICS: tuple[str, ...] = (
    semconv.FAITHFULNESS, semconv.ANSWER_RELEVANCY, semconv.CONTEXT_PRECISION, semconv.CONTEXT_RECALL,
)
ANSWER_NODE = "generate"  # the example graph's answer node
APP_MODULES = ("fastapi", "uvicorn", "sse_starlette", "langgraph", "langchain_core")


class DemoUnavailable(RuntimeError):
    """The example app cannot be served here; the message says why and what to do."""


@dataclass(frozen=True, slots=True)
class Question:
    """One request of the demo."""

    title: str
    q: str
    hallucinate: bool = False


#: what is asked under each action (questions are distinct within a run: spans are matched by question)
QUESTIONS: dict[str, tuple[Question, ...]] = {
    "flag": (
        Question("grounded", "How tall is the Eiffel Tower?"),
        Question("hallucinating", "When was the Eiffel Tower built?", hallucinate=True),
        Question("weak retrieval", "How long is the Great Wall of China?"),
    ),
    "stop": (Question("hallucinating, action stop", "How high is Mount Kilimanjaro?", hallucinate=True),),
    "regenerate": (
        Question("hallucinating, action regenerate", "How long is the Danube river?", hallucinate=True),
    ),
}


def default_traces() -> Path:
    """Where the exported spans are written unless told otherwise."""
    return Path(tempfile.gettempdir()) / "streamjudge-demo-traces.jsonl"


def find_app(app: str | os.PathLike[str] | None = None) -> Path:
    """The example app: ``app`` if given, else ``examples/adaptive_rag/app.py`` under the working
    directory or the source checkout this package runs from."""
    if app is not None:
        path = Path(app)
        if not path.is_file():
            raise DemoUnavailable(f"the example app {path} does not exist")
        return path.resolve()
    rel = Path("examples") / "adaptive_rag" / "app.py"
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / rel).is_file():
            return (root / rel).resolve()
    raise DemoUnavailable(
        f"the example app ({rel}) is not here: run the demo from a checkout or sdist of streamjudge, "
        "or pass --app PATH"
    )


def _instrument_command() -> str:
    beside = Path(sys.executable).parent / "opentelemetry-instrument"
    if beside.is_file():
        return str(beside)
    found = shutil.which("opentelemetry-instrument")
    if found is None:
        raise DemoUnavailable("opentelemetry-instrument is not installed (pip install streamjudge)")
    return found


def _check_app_modules() -> None:
    missing = [m for m in APP_MODULES if importlib.util.find_spec(m) is None]
    if missing:
        raise DemoUnavailable(
            f"the example app needs {', '.join(missing)}: pip install 'streamjudge[examples]'"
        )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class App:
    """The example app's process."""

    proc: subprocess.Popen[bytes]
    port: int
    log_path: Path
    action: str

    @property
    def base(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def log_tail(self, lines: int = 15) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join("    | " + line for line in text.splitlines()[-lines:])

    def stop(self, timeout: float = 15.0) -> int | None:
        """SIGINT (uvicorn's graceful shutdown; the SDK flushes at exit), then SIGKILL after ``timeout``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


def app_env(action: str, port: int, traces_endpoint: str, token_delay_ms: float) -> dict[str, str]:
    """The app's environment: zero-code setup exporting traces only, to the demo's receiver."""
    import streamjudge

    env = dict(os.environ)
    # the app imports the same streamjudge as this process (a checkout run with PYTHONPATH=src included)
    package_root = str(Path(streamjudge.__file__).resolve().parents[1])
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_root, env.get("PYTHONPATH", "")) if p)
    env.update({
        "OTEL_SERVICE_NAME": "streamjudge-demo-app",
        # the demo shows the product's frames; an app's own clients get them only when asked for
        "STREAMJUDGE_CLIENT_EVENTS": "on",
        "OTEL_TRACES_EXPORTER": "otlp",
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
        "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": traces_endpoint,
        # only traces were asked for: no export attempts (and errors) for metrics and logs
        "OTEL_METRICS_EXPORTER": "none",
        "OTEL_LOGS_EXPORTER": "none",
        "OTEL_BSP_SCHEDULE_DELAY": "100",
        "EXAMPLE_HOST": "127.0.0.1",
        "EXAMPLE_PORT": str(port),
        "EXAMPLE_TOKEN_DELAY_MS": f"{token_delay_ms:g}",
        "STREAMJUDGE_JUDGE": "local",
        "STREAMJUDGE_CHECKPOINT_JUDGE": "local",
        "STREAMJUDGE_ACTION": action,
    })
    env.pop("EXAMPLE_LLM_MODEL", None)  # the deterministic offline model, whatever the shell says
    return env


def start_app(
    app: Path, action: str, traces_endpoint: str, *, token_delay_ms: float, startup_timeout: float,
    log_dir: Path,
) -> App:
    """Start the app under ``opentelemetry-instrument`` and wait until it serves."""
    log_path = log_dir / f"streamjudge-demo-app-{action}.log"
    cmd = [_instrument_command(), sys.executable, str(app)]
    deadline = time.monotonic() + startup_timeout
    for attempt in range(2):  # a second try when another process took the free port first
        port = _free_port()
        with log_path.open("wb") as log:
            proc = subprocess.Popen(
                cmd, env=app_env(action, port, traces_endpoint, token_delay_ms), cwd=app.parent,
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
            )
        served = App(proc, port, log_path, action)
        if _serving(served, deadline) or attempt or "address already in use" not in served.log_tail(50):
            break
    if proc.poll() is None:
        return served
    raise DemoUnavailable(
        f"the example app exited with status {proc.returncode} before serving "
        f"(log: {log_path}):\n{served.log_tail()}"
    )


def _serving(served: App, deadline: float) -> bool:
    """Wait until the app answers HTTP (True) or exits (False); stops it and raises at ``deadline``."""
    import httpx

    while True:
        if served.proc.poll() is not None:
            return False
        try:
            if httpx.get(f"{served.base}/openapi.json", timeout=1.0).status_code == 200:
                return True
        except httpx.HTTPError:
            pass
        if time.monotonic() > deadline:
            served.stop(timeout=5)
            raise DemoUnavailable(
                f"the example app did not serve in time (log: {served.log_path}):\n{served.log_tail()}"
            )
        time.sleep(0.1)


# --- one request ------------------------------------------------------------------------------------

@dataclass
class Streamed:
    """What the client saw of one answer."""

    question: Question
    answer: str = ""
    frames: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    ttft_ms: float | None = None
    total_ms: float = 0.0


def _sse(response: Any) -> Iterator[tuple[str, str]]:
    event, data = "message", []
    for line in response.iter_lines():
        if line.startswith("event:"):
            event = line[6:].strip()
        elif line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line:
            if data:
                yield event, "\n".join(data)
            event, data = "message", []
    if data:
        yield event, "\n".join(data)


def _payload(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError:
        return {"text": text}
    return value if isinstance(value, dict) else {"value": value}


def stream_question(app: App, question: Question, out: TextIO) -> Streamed:
    """Stream one answer over SSE, printing tokens and streamjudge's frames as they arrive."""
    import httpx

    got = Streamed(question)
    params: dict[str, str | int] = {"q": question.q}
    if question.hallucinate:
        params["hallucinate"] = 1
    out.write("    answer: ")
    out.flush()
    t0 = time.perf_counter()
    with httpx.stream("GET", f"{app.base}/chat", params=params, timeout=60.0) as response:
        if response.status_code != 200:
            raise RuntimeError(f"GET /chat answered {response.status_code}")
        for event, raw in _sse(response):
            data = _payload(raw)
            got.frames.append((event, data))
            if event == "token":
                if got.ttft_ms is None:
                    got.ttft_ms = (time.perf_counter() - t0) * 1000
                token = str(data.get("token", ""))
                got.answer += token
                out.write(token)
            elif event == "warning":
                reason = f", {data['reason']}" if data.get("reason") else ""
                out.write(
                    f"\n      [warning frame] {data.get('metric')} {_num(data.get('score'))} < "
                    f"{data.get('threshold')} on chars {data.get('char_start')}-{data.get('char_end')}, "
                    f"action {data.get('action')}{reason}\n    answer: …"
                )
            elif event == "stop":
                out.write(f"\n      [stop frame] the client is sent the fallback: {data.get('text')!r}")
            elif event == "retract":
                out.write(f"\n      [retract frame] {json.dumps(data)[:160]}\n    answer: …")
            elif event not in ("thread", "status", "sources", "done"):
                out.write(f"\n      [{event} frame] {json.dumps(data)[:160]}")
            out.flush()
    got.total_ms = (time.perf_counter() - t0) * 1000
    out.write("\n")
    return got


# --- reading the spans back -------------------------------------------------------------------------

def _num(v: Any) -> str:
    return f"{v:.2f}" if isinstance(v, float | int) and not isinstance(v, bool) else str(v)


def _cut(text: str, width: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= width else text[: width - 1] + "…"


def find_stream(spans: Sequence[ReceivedSpan], question: str) -> ReceivedSpan | None:
    """The judged stream span of the answer to ``question`` (None until it was exported)."""
    for s in spans:
        if (s.name == semconv.SPAN_STREAM and s.attributes.get(semconv.STREAM_QUESTION) == question
                and semconv.EVAL_STATUS in s.attributes):
            return s
    return None


def _trace_complete(spans: Sequence[ReceivedSpan], question: str) -> bool:
    stream = find_stream(spans, question)
    if stream is None:
        return False
    trace = [s for s in spans if s.trace_id == stream.trace_id]
    # the request's server span ends last; every checkpoint of the stream carries its verdict
    has_root = any(not s.parent_span_id for s in trace)
    checkpoints = [s for s in trace if s.name == semconv.SPAN_CHECKPOINT]
    want = int(stream.attributes.get(semconv.STREAM_CHECKPOINTS, 0) or 0)
    return has_root and len(checkpoints) >= want


def summarise(spans: Sequence[ReceivedSpan], got: Streamed) -> list[str]:
    """The summary lines of one request, read from its exported trace."""
    stream = find_stream(spans, got.question.q)
    if stream is None:
        return ["    (its stream span was not exported in time)"]
    a = stream.attributes
    trace = sorted((s for s in spans if s.trace_id == stream.trace_id), key=lambda s: s.start_ns)
    lines = [f"    --- from the exported spans (trace {stream.trace_id})"]

    nodes = [s for s in trace if semconv.NODE_NAME in s.attributes]
    if nodes:
        timings = [f"{s.attributes[semconv.NODE_NAME]} {_num(s.attributes.get(semconv.NODE_ELAPSED_MS))} ms"
                   for s in nodes]
        if not any(s.attributes[semconv.NODE_NAME] == ANSWER_NODE for s in nodes):
            timings.append(f"{ANSWER_NODE} (its span had not ended when the response was complete)")
        lines.append("    nodes:       " + " -> ".join(timings))
    ttft = a.get(semconv.STREAM_TTFT_MS)
    first = next((ev.time_ns for ev in stream.events if ev.name == semconv.EVENT_FIRST_TOKEN), None)
    root = next((s for s in trace if not s.parent_span_id), None)
    parts = [f"{_num(ttft)} ms into the answer node"]
    if first is not None and root is not None:
        parts.append(f"{(first - root.start_ns) / 1e6:.1f} ms after the request reached the server")
    if got.ttft_ms is not None:
        parts.append(f"the client had it {got.ttft_ms:.1f} ms after sending the request")
    lines.append("    first token: " + ", ".join(parts))
    if semconv.PREFLIGHT_SCORE in a or semconv.PREFLIGHT_LABEL in a:
        policy = f", policy {a[semconv.PREFLIGHT_POLICY]}" if semconv.PREFLIGHT_POLICY in a else ""
        lines.append(f"    pre-flight:  context precision {_num(a.get(semconv.PREFLIGHT_SCORE))} "
                     f"({a.get(semconv.PREFLIGHT_LABEL)}{policy}) over {a.get(semconv.STREAM_CONTEXT_COUNT)} "
                     "retrieved context(s), before the first token")

    checkpoints = sorted((s for s in trace if s.name == semconv.SPAN_CHECKPOINT),
                         key=lambda s: int(s.attributes.get(semconv.CHECKPOINT_INDEX, 0)))
    faith = semconv.score_attribute(semconv.FAITHFULNESS)
    for cp in checkpoints:
        c = cp.attributes
        start, end = int(c.get(semconv.CHECKPOINT_CHAR_START, 0)), int(c.get(semconv.CHECKPOINT_CHAR_END, 0))
        label = c.get(semconv.label_attribute(semconv.FAITHFULNESS))
        score = (f"faithfulness {_num(c[faith])} {str(label).upper()}" if faith in c
                 else f"not judged ({c.get(semconv.EVAL_STATUS)})")
        lines.append(f"    checkpoint {c.get(semconv.CHECKPOINT_INDEX)}: chars {start}-{end}, "
                     f"{c.get(semconv.CHECKPOINT_SENTENCES)} sentence(s), {score}")
        if label == "fail":
            text = str(c.get(semconv.CHECKPOINT_TEXT, ""))  # the checkpoint's own new sentences
            if text:
                lines.append(f"      new text: {_cut(text.strip(), 220)!r}")
            ranges = c.get(semconv.sentences_attribute(semconv.FAITHFULNESS, "ranges"))
            if ranges and text:
                # the failing sentences, in the answer's coordinates; the checkpoint's text starts at `start`
                bounds = list(ranges)
                for lo, hi in zip(bounds[::2], bounds[1::2], strict=False):
                    lines.append(f"      failing sentence: {_cut(text[lo - start : hi - start], 220)!r}")
            for ev in cp.events:
                if (ev.name == semconv.EVENT_EVALUATION_RESULT
                        and ev.attributes.get(semconv.GEN_AI_EVALUATION_SCORE_LABEL) == "fail"):
                    why = ev.attributes.get(semconv.GEN_AI_EVALUATION_EXPLANATION, "")
                    lines.append(f"      flagged, because: {_cut(why, 300)}")

    acted = []
    for ev in stream.events:
        if ev.name == semconv.EVENT_ALERT:
            acted.append(f"alert ({ev.attributes.get(semconv.ALERT_METRIC)} "
                         f"{_num(ev.attributes.get(semconv.ALERT_SCORE))} at checkpoint "
                         f"{ev.attributes.get(semconv.ALERT_CHECKPOINT)})")
        elif ev.name in (semconv.EVENT_RETRACT, semconv.EVENT_STOP, semconv.EVENT_SKIP):
            acted.append(ev.name.rsplit(".", 1)[-1])
    lines.append(
        f"    actions:     action {a.get(semconv.STREAM_ACTION)}: {', '.join(acted) or 'none needed'}; "
        f"verdict {a.get(semconv.STREAM_VERDICT)}, outcome {a.get(semconv.STREAM_OUTCOME)}, "
        f"regenerations {a.get(semconv.STREAM_REGENERATIONS, 0)}; {a.get(semconv.STREAM_TOKENS)} tokens"
    )
    finals = []
    for m in METRICS:
        if semconv.score_attribute(m) in a:
            finals.append(f"{m} {_num(a[semconv.score_attribute(m)])} {a.get(semconv.label_attribute(m), '')}"
                          .rstrip())
        else:
            skipped = next((ev.attributes.get(semconv.EVAL_SKIP_REASON) for ev in stream.events
                            if ev.name == semconv.EVENT_EVALUATION_RESULT
                            and ev.attributes.get(semconv.GEN_AI_EVALUATION_NAME) == m), None)
            if skipped:
                finals.append(f"{m} skipped ({skipped})")
    lines.append("    final:       " + (", ".join(finals) or f"not judged ({a.get(semconv.EVAL_STATUS)})"))
    return lines


# --- the whole demo -----------------------------------------------------------------------------------

def run(
    *,
    actions: Sequence[str] = ACTIONS,
    traces: str | os.PathLike[str] | None = None,
    app: str | os.PathLike[str] | None = None,
    token_delay_ms: float = 15.0,
    startup_timeout: float = 60.0,
    span_timeout: float = 15.0,
    out: TextIO | None = None,
) -> int:
    """Run the demo; 0 when every request was streamed and summarised.

    Raises :class:`DemoUnavailable` when the app cannot be served before any answer was streamed.
    """
    out = out or sys.stdout
    t_start = time.monotonic()
    app_path = find_app(app)
    _check_app_modules()
    _instrument_command()
    traces_path = Path(traces) if traces is not None else default_traces()
    log_dir = traces_path.parent
    streamed_any = False
    problems: list[str] = []
    with OTLPFileReceiver(traces_path) as receiver:
        shown = app_path.relative_to(Path.cwd()) if app_path.is_relative_to(Path.cwd()) else app_path
        out.write(f"streamjudge demo: {shown} under opentelemetry-instrument, judge=local; "
                  f"spans -> {traces_path}\n")
        for action in actions:
            out.write(f"\n=== STREAMJUDGE_ACTION={action}: starting the app ...")
            out.flush()
            t0 = time.monotonic()
            try:
                served = start_app(app_path, action, receiver.traces_endpoint, token_delay_ms=token_delay_ms,
                                   startup_timeout=startup_timeout, log_dir=log_dir)
            except DemoUnavailable:
                out.write("\n")
                if not streamed_any:
                    raise
                problems.append(f"the app did not start for action {action}")
                continue
            out.write(f" serving on {served.base} (pid {served.proc.pid}, {time.monotonic() - t0:.1f} s)\n")
            try:
                for question in QUESTIONS[action]:
                    out.write(f"\n--- {question.title}: GET /chat?q={question.q}"
                              f"{'&hallucinate=1' if question.hallucinate else ''}\n")
                    try:
                        got = stream_question(served, question, out)
                    except Exception as exc:  # the app broke mid-demo: say so, go on with the next
                        out.write(f"\n    request failed: {type(exc).__name__}: {exc}\n")
                        problems.append(f"{question.title}: {exc}")
                        continue
                    streamed_any = True
                    complete = functools.partial(_trace_complete, question=question.q)
                    ok, spans = receiver.wait_for(complete, span_timeout)
                    if not ok:
                        problems.append(f"{question.title}: spans incomplete after {span_timeout:g} s")
                    out.write("\n".join(summarise(spans, got)) + "\n")
            finally:
                code = served.stop()
                out.write(f"\n    app (pid {served.proc.pid}) stopped, exit status {code}; its output: "
                          f"{served.log_path}\n")
                log = served.log_path.read_text(errors="replace") if served.log_path.exists() else ""
                if "Traceback" in log or "Failed to export" in log:
                    out.write(f"    the app logged errors:\n{served.log_tail(25)}\n")
                    problems.append(f"the app logged errors (action {action})")
            if not streamed_any:
                raise DemoUnavailable(f"no answer could be streamed from the app (log: {served.log_path})")
        spans_total = len(receiver.spans())
        requests = receiver.requests
    out.write(
        f"\n{spans_total} spans in {requests} OTLP export requests written to {traces_path} "
        f"(OTLP JSON, one export request per line); demo took {time.monotonic() - t_start:.1f} s\n"
    )
    if problems:
        out.write("problems: " + "; ".join(problems) + "\n")
        return 1
    return 0
