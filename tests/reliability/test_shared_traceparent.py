"""Two concurrent requests that carry the same client ``traceparent`` (a front end that reuses one, a
proxy, or a client that copies another user's) through the example LangGraph app: each answer must be
judged on its own and each client must get only its own answer's warnings."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import httpx
import pytest

import streamjudge
from conftest import Harness
from reliability.conftest import warned
from streamjudge import semconv
from streamjudge.instrumentation import uninstrument_app

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "adaptive_rag"
QUESTION = "How tall is the Eiffel Tower?"


def _app():  # type: ignore[no-untyped-def]
    if str(EXAMPLE) not in sys.path:
        sys.path.insert(0, str(EXAMPLE))
    import app as example

    return example.create_app()


async def _pair(app: object, headers: dict[str, str]) -> tuple[str, str]:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://app",  # type: ignore[arg-type]
                                 timeout=30) as client:
        async def get(hallucinate: bool) -> str:
            r = await client.get("/chat", params={"q": QUESTION, "hallucinate": "1" if hallucinate else "0"},
                                 headers=headers)
            assert r.status_code == 200
            return r.text

        invented, grounded = await asyncio.gather(get(True), get(False))
        return invented, grounded


def _check(harness: Harness, app: object, headers: dict[str, str]) -> None:
    harness.exporter.clear()
    invented, grounded = asyncio.run(_pair(app, headers))
    assert warned(invented)
    assert not warned(grounded), "a client got a warning about another request's answer"
    streams = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    answers = sorted(str(s.attributes[semconv.STREAM_ANSWER]) for s in streams)
    assert len(answers) == 2 and all(a.startswith("The Eiffel Tower is") for a in answers), answers


@pytest.mark.timeout(60)
def test_concurrent_requests_with_their_own_traces_are_judged_apart(harness: Harness,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_TOKEN_DELAY_MS", "5")  # both answers stream at the same time
    harness.configure(None, end_wait_s=1.0, client_events=True)
    app = streamjudge.instrument_app(_app())
    try:
        _check(harness, app, {})
    finally:
        uninstrument_app(app)


@pytest.mark.timeout(60)
def test_concurrent_requests_sharing_a_client_traceparent_are_judged_apart(
        harness: Harness, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("EXAMPLE_TOKEN_DELAY_MS", "5")
    harness.configure(None, end_wait_s=1.0, client_events=True)
    app = streamjudge.instrument_app(_app())
    try:
        _check(harness, app, {"traceparent": "00-" + "ab" * 16 + "-" + "cd" * 8 + "-01"})
    finally:
        uninstrument_app(app)


def test_a_stream_opening_in_one_request_does_not_claim_the_other_requests_stream(harness: Harness) -> None:
    """Two requests of one shared trace: the first one's answer opens its session while the second one's
    answer node has not started yet (the second was bound last, so it is the trace's latest binding). The
    first session's start must not mark the second stream as guarded by the application, or the second
    answer is never judged and leaves no stream span (seen when the first request streamed sooner)."""
    import contextvars

    from streamjudge.instrumentation._binding import StreamBinding, bind, unbind

    rt = harness.configure(None, end_wait_s=0.0)
    with rt.tracer.start_as_current_span("shared") as parent:
        trace_id = parent.get_span_context().trace_id
        first, second = contextvars.copy_context(), contextvars.copy_context()
        a = first.run(lambda: StreamBinding(trace_id, owner="http"))
        b = second.run(lambda: StreamBinding(trace_id, owner="http"))
        first.run(bind, a)
        second.run(bind, b)  # the trace's latest binding
        try:
            first.run(a.open, "graph")
            first.run(a.feed, "The Eiffel Tower is in Paris.", "graph")
            assert a.session is not None
            assert b.source is None, "the first request's stream claimed the second one's"
            # the application guarding an answer itself, in the second request, still claims that stream
            second.run(lambda: list(streamjudge.guard(iter(["x"]), question="q", contexts=["c"])))
            assert b.source == "app"
        finally:
            first.run(a.finish)
            first.run(unbind, a)
            second.run(unbind, b)
