"""Content capture off: no question, document or answer text on the LangChain spans, whoever switched
openinference on first, nor in the server span's URL."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from openinference.instrumentation import TraceConfig
from openinference.instrumentation.langchain import LangChainInstrumentor
from opentelemetry.instrumentation.fastapi import FastAPIInstrumentor
from starlette.middleware import Middleware
from starlette.testclient import TestClient

from conftest import Harness
from instrumentation.test_langgraph import _run
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeInstrumentor, StreamJudgeMiddleware

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "adaptive_rag"))
import rag

QUESTION = "How tall is the Eiffel Tower?"


def _leaks(spans: list[Any], answer: str) -> list[tuple[str, str]]:
    texts = (QUESTION, "330 metres", answer[:40])
    return [(s.name, k) for s in spans for k, v in s.attributes.items()
            if isinstance(v, str) and any(t in v for t in texts)]


@pytest.fixture
def oi() -> Iterator[LangChainInstrumentor]:
    inst = LangChainInstrumentor()
    if inst.is_instrumented_by_opentelemetry:  # an earlier test's
        inst.uninstrument()
    ours = StreamJudgeInstrumentor()
    if ours.is_instrumented_by_opentelemetry:
        ours.uninstrument()
    yield inst
    if ours.is_instrumented_by_opentelemetry:
        ours.uninstrument()
    if inst.is_instrumented_by_opentelemetry:
        inst.uninstrument()


def _graph_spans(harness: Harness) -> tuple[list[Any], str]:
    assert harness.runtime is not None
    with harness.runtime.tracer.start_as_current_span("request"):
        answer = _run(rag.build_graph(), QUESTION, hallucinate=True)
    spans = harness.spans()
    assert any(s.attributes.get("openinference.span.kind") == "RETRIEVER" for s in spans)  # traced
    return spans, answer


def test_openinference_switched_on_first_without_hiding_still_hides(harness: Harness, oi: LangChainInstrumentor) -> None:
    # what opentelemetry-instrument does when openinference's entry point comes before ours, and what an
    # app does that set openinference up itself
    rt = harness.configure(end_wait_s=0.5, capture_content=False)
    oi.instrument(tracer_provider=rt.tracer_provider)
    StreamJudgeInstrumentor().instrument()
    spans, answer = _graph_spans(harness)
    assert any(semconv.NODE_NAME in s.attributes for s in spans)
    assert _leaks(spans, answer) == []


def test_openinference_switched_on_again_later_hides_too(harness: Harness, oi: LangChainInstrumentor) -> None:
    rt = harness.configure(end_wait_s=0.5, capture_content=False)
    StreamJudgeInstrumentor().instrument()
    # the app sets openinference up itself after streamjudge, with a configuration of its own
    oi.uninstrument()
    oi.instrument(tracer_provider=rt.tracer_provider, config=TraceConfig(hide_inputs=False, base64_image_max_length=7))
    assert oi._tracer._tracer._self_config.base64_image_max_length == 7  # the rest of his config is kept
    spans, answer = _graph_spans(harness)
    assert _leaks(spans, answer) == []


def test_uninstrument_gives_back_the_apps_own_configuration(harness: Harness, oi: LangChainInstrumentor) -> None:
    rt = harness.configure(end_wait_s=0.5, capture_content=False)
    own = TraceConfig(base64_image_max_length=9)
    oi.instrument(tracer_provider=rt.tracer_provider, config=own)
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    assert oi._tracer._tracer._self_config.hide_outputs is True
    inst.uninstrument()
    assert oi._tracer._tracer._self_config is own
    assert "_instrument" not in vars(LangChainInstrumentor) or not hasattr(
        vars(LangChainInstrumentor)["_instrument"], "__wrapped__")


def test_capture_on_leaves_openinference_as_it_was(harness: Harness, oi: LangChainInstrumentor) -> None:
    rt = harness.configure(end_wait_s=0.5)
    oi.instrument(tracer_provider=rt.tracer_provider)
    StreamJudgeInstrumentor().instrument()
    spans, answer = _graph_spans(harness)
    assert _leaks(spans, answer) != []  # the check above can see text


def _ask_app(rt: Any) -> FastAPI:
    async def ask(q: str) -> StreamingResponse:
        async def body() -> Any:
            for word in ("Paris ", "is ", "in ", "France."):
                yield f"data: {word}\n\n"
        return StreamingResponse(body(), media_type="text/event-stream")

    app = FastAPI(middleware=[Middleware(StreamJudgeMiddleware)])
    app.add_api_route("/ask", ask)
    FastAPIInstrumentor.instrument_app(app, tracer_provider=rt.tracer_provider, exclude_spans=["send", "receive"])
    return app


@pytest.mark.parametrize("capture", [False, True])
def test_the_question_in_a_get_query_string_follows_the_policy(harness: Harness, capture: bool) -> None:
    rt = harness.configure(end_wait_s=0.5, capture_content=capture)
    app = _ask_app(rt)
    try:
        with TestClient(app) as client:
            r = client.get("/ask", params={"q": "where is the secret bunker", "lang": "en"})
            assert r.status_code == 200 and "France." in r.text
    finally:
        FastAPIInstrumentor.uninstrument_app(app)
    (server,) = [s for s in harness.spans() if s.kind.name == "SERVER"]
    values = [v for v in server.attributes.values() if isinstance(v, str)]
    assert any("/ask" in v for v in values)
    leaked = [v for v in values if "bunker" in v]
    if capture:
        assert leaked
    else:
        assert leaked == []
        url = next(v for v in values if "/ask?" in v)
        assert url.endswith("?q=[REDACTED]&lang=[REDACTED]")


def test_an_openinference_whose_tracer_is_elsewhere_is_set_up_again_hiding(
    harness: Harness, oi: LangChainInstrumentor, caplog: pytest.LogCaptureFixture
) -> None:
    # a future openinference may keep its tracer's configuration somewhere else: streamjudge cannot apply
    # the hiding settings in place, so it switches openinference on again with them (and says so)
    rt = harness.configure(end_wait_s=0.5, capture_content=False)
    oi.instrument(tracer_provider=rt.tracer_provider)
    oi._tracer._tracer = oi._tracer._tracer.__wrapped__  # a plain tracer: no configuration to change
    with caplog.at_level("WARNING", logger="streamjudge.instrumentation"):
        StreamJudgeInstrumentor().instrument()
    assert "setting it up again" in caplog.text
    spans, answer = _graph_spans(harness)
    assert _leaks(spans, answer) == []
