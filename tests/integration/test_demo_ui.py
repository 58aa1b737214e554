"""make demo-ui: the example app left running with Jaeger; its page serves, its traces arrive in Jaeger's query
API (and become replay cases), Ctrl-C stops both processes."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import pytest

from integration.infra import REPO, InfraError, jaeger_binary
from streamjudge import cli, semconv
from streamjudge.offline.from_trace import extract, spans_from_jaeger

pytestmark = pytest.mark.integration

SERVICE = "streamjudge-demo-app"


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().split()[2]
    except OSError:
        return False
    return state != "Z"


class _Output:
    """The demo's stdout, read line by line in a thread (a readline would block the test)."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: list[str] = []
        self._thread = threading.Thread(target=self._read, args=(proc,), daemon=True)
        self._thread.start()

    def _read(self, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_for(self, pattern: str, timeout: float, proc: subprocess.Popen[str]) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if any(re.search(pattern, line) for line in list(self.lines)):
                return "\n".join(self.lines)
            if proc.poll() is not None:
                self._thread.join(5)
                break
            time.sleep(0.1)
        raise AssertionError(f"no line matching {pattern!r} (exit {proc.poll()}):\n" + "\n".join(self.lines))

    def rest(self) -> str:
        self._thread.join(10)
        return "\n".join(self.lines)


def _traces(query: str) -> list[dict[str, Any]]:
    r = httpx.get(f"{query}/api/traces", params={"service": SERVICE, "limit": 50}, timeout=5)
    return r.json().get("data") or [] if r.status_code == 200 else []


def _stream_spans(traces: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [s for t in traces for s in t["spans"] if s["operationName"] == semconv.SPAN_STREAM]


def test_demo_ui_serves_the_app_and_its_traces_reach_jaeger(tmp_path: Path) -> None:
    try:
        jaeger = jaeger_binary()
    except InfraError as exc:
        pytest.fail(str(exc))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STREAMJUDGE_", "PHOENIX_"))}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO / "src"), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.Popen(
        [sys.executable, "-m", "streamjudge._demo_ui", "--jaeger", str(jaeger), "--viewer-port", "0",
         "--log-dir", str(tmp_path), "--token-delay-ms", "2"],
        cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    pids: list[int] = []
    out = _Output(proc)
    try:
        text = out.wait_for(r"Ctrl-C stops both", 180, proc)
        pids = [int(p) for p in re.findall(r"\(pid (\d+)\)", text)]
        assert len(pids) == 2 and all(_alive(p) for p in pids), text
        app = re.search(r"app page:\s+(http://127\.0\.0\.1:\d+)/", text)
        viewer = re.search(r"trace viewer:\s+(http://127\.0\.0\.1:\d+)/search\?service=" + SERVICE, text)
        assert app and viewer, text
        app_url, query = app.group(1), viewer.group(1)

        page = httpx.get(f"{app_url}/", timeout=5)
        assert page.status_code == 200 and "hallucinate" in page.text

        # the two warm-up answers are in Jaeger, judged
        deadline = time.monotonic() + 30
        while len(_stream_spans(_traces(query))) < 2 and time.monotonic() < deadline:
            time.sleep(0.3)
        traces = _traces(query)
        streams = _stream_spans(traces)
        assert len(streams) == 2, [s["operationName"] for t in traces for s in t["spans"]]
        alerts = sorted(next(t["value"] for t in s["tags"] if t["key"] == semconv.STREAM_ALERTS) for s in streams)
        assert alerts[0] == 0 and alerts[1] >= 1

        # the app stays up: a new question's trace arrives too
        with httpx.stream("GET", f"{app_url}/chat", params={"q": "How long is the Danube river?"},
                          timeout=30) as r:
            assert r.status_code == 200
            body = "".join(r.iter_text())
        assert "event: token" in body
        deadline = time.monotonic() + 30
        while len(_stream_spans(_traces(query))) < 3 and time.monotonic() < deadline:
            time.sleep(0.3)
        doc = {"data": _traces(query)}
        assert len(_stream_spans(doc["data"])) == 3

        # Jaeger's JSON becomes replay cases that alert where the recording did
        found = extract(spans_from_jaeger(doc))
        cases = [e.case for e in found if e.case is not None]
        assert len(cases) == 3, [e.skipped for e in found]
        assert sorted(c.expect_alert for c in cases) == [False, False, True]
        assert all(c.contexts for c in cases)
        jaeger_json = tmp_path / "jaeger.json"
        jaeger_json.write_text(json.dumps(doc))
        cases_path = tmp_path / "cases.jsonl"
        assert cli.main(["cases-from-trace", str(jaeger_json), "-o", str(cases_path)]) == 0
        assert cli.main(["replay", str(cases_path)]) == 0
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        try:
            code = proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
            for pid in pids:
                if _alive(pid):
                    os.kill(pid, signal.SIGKILL)
            raise
    tail = out.rest()
    assert code == 0, tail
    assert "app (pid" in tail and "jaeger (pid" in tail and "stopped" in tail
    assert not [p for p in pids if _alive(p)]
