"""Zero-code with content capture off: openinference's ``langchain`` entry point and streamjudge's, in
either discovery order, export no question, document or answer text.

``opentelemetry-instrument`` runs every ``opentelemetry_instrumentor`` entry point in the order
``importlib.metadata`` finds their distributions (``sys.path`` order, then directory-listing order): which
of openinference's and ours comes first depends on the install. Stand-in distributions carrying each
one's entry points are put on ``sys.path`` in one order or the other, ahead of the installed ones; each run
is a real ``opentelemetry-instrument`` process running the example's LangGraph app and exporting to an
OTLP receiver in the test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from streamjudge import semconv
from streamjudge.offline.otlp_file import OTLPFileReceiver
from test_distro_coexistence import _dist

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
QUESTION = "How tall is the Eiffel Tower?"

PROBE = f'''import asyncio, sys
sys.path.insert(0, {str(ROOT / "examples" / "adaptive_rag")!r})
from opentelemetry import trace
import rag

async def main():
    with trace.get_tracer("probe").start_as_current_span("request"):
        answer = []
        async for event, payload in rag.stream_answer(rag.build_graph(), {QUESTION!r}, hallucinate=True):
            if event == "token":
                answer.append(payload["token"])
    print("ANSWER:" + "".join(answer))

asyncio.run(main())
'''


@pytest.fixture(scope="module")
def dists(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import tomllib

    base = tmp_path_factory.mktemp("oi_dists")
    oi = base / "openinference"
    oi.mkdir()
    _dist(oi, "openinference-instrumentation-langchain", "0.1.80", {
        "opentelemetry_instrumentor": {"langchain": "openinference.instrumentation.langchain:LangChainInstrumentor"},
    })
    ours = base / "streamjudge"
    ours.mkdir()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    _dist(ours, "streamjudge", "0.0.0+checkout", project["entry-points"])
    (base / "probe.py").write_text(PROBE)
    return {"openinference": oi, "ours": ours, "probe": base / "probe.py"}


def _run(dists: dict[str, Path], first: str, tmp_path: Path, extra: dict[str, str]) -> tuple[list, str]:  # type: ignore[type-arg]
    order = [dists["openinference"], dists["ours"]] if first == "openinference" else [
        dists["ours"], dists["openinference"]]
    with OTLPFileReceiver(tmp_path / f"{first}.jsonl") as rx:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "STREAMJUDGE_", "OPENINFERENCE_"))}
        env["PYTHONPATH"] = os.pathsep.join([*map(str, order), str(ROOT / "src")])
        env.update({
            "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": rx.traces_endpoint,
            "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "http/protobuf",
            "OTEL_METRICS_EXPORTER": "none", "OTEL_LOGS_EXPORTER": "none", "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_PYTHON_DISABLED_INSTRUMENTATIONS": "fastapi,starlette,asgi,httpx,requests,urllib3",
            **extra,
        })
        proc = subprocess.run([str(BIN / "opentelemetry-instrument"), sys.executable, str(dists["probe"])],
                              env=env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 0, proc.stderr
        ok, _ = rx.wait_for(lambda ss: any(s.name == semconv.SPAN_STREAM for s in ss), 10)
        assert ok, "the stream span was not exported: " + proc.stderr
        time.sleep(0.3)
        spans = rx.spans()
    answer = next(line for line in proc.stdout.splitlines() if line.startswith("ANSWER:"))[len("ANSWER:"):]
    return spans, answer


def _leaks(spans: list, answer: str) -> list[tuple[str, str]]:  # type: ignore[type-arg]
    texts = (QUESTION, "330 metres", answer[:40])
    return [(s.name, k) for s in spans for k, v in s.attributes.items()
            if isinstance(v, str) and any(t in v for t in texts)]


@pytest.mark.parametrize("first", ["openinference", "ours"])
@pytest.mark.parametrize("switch", ["STREAMJUDGE_CAPTURE_CONTENT", "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"])
def test_capture_off_hides_text_whichever_entry_point_runs_first(
    dists: dict[str, Path], tmp_path: Path, first: str, switch: str
) -> None:
    spans, answer = _run(dists, first, tmp_path, {switch: "false"})
    assert answer.startswith("The Eiffel Tower")
    kinds = {s.attributes.get("openinference.span.kind") for s in spans}
    assert {"RETRIEVER", "LLM", "CHAIN"} <= kinds  # openinference traced the graph
    assert _leaks(spans, answer) == []


def test_capture_on_the_same_run_carries_the_text(dists: dict[str, Path], tmp_path: Path) -> None:
    spans, answer = _run(dists, "openinference", tmp_path, {})
    assert _leaks(spans, answer) != []  # the check above would see text
