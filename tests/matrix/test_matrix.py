"""Every action in every app shape: shapes x {flag, stop, regenerate} x {stream_first, hold_back} x
client events {off, on}, each cell one request to a real uvicorn app whose model is the scripted server.

The model's answer is ``GROUNDED FABRICATED AFTER``: the default window (two sentences) holds the grounded
first sentence and the invented second, and the verdict names the second only. What each cell requires:

- The app's terminal frame arrives, once, last.
- Client events off: the client's bytes are exactly a sequence of the app's own frames (re-rendered
  byte for byte), nothing injected. The token text is, per action:
  flag: the answer, every frame of it, whatever the mode.
  stop: hold_back: the grounded sentence only (never the invented one) — then, where the tokens come from
  the app's model (graph, agent and chain shapes), the fallback as the model's last words
  (``GROUNDED + " " + fallback``); stream_first: a prefix of the answer that holds at least the invented
  sentence (it was shown before its verdict), then the same fallback. The body shape cannot write a token
  in the app's format, so its answer just ends there (the fallback goes out only as a client event).
  regenerate: hold_back: ``GROUNDED + CONTINUATION``, the invented sentence never sent; stream_first: the
  answer as far as it went, then the continuation (with events off no retraction can reach the client).
- Client events on: a warning names the invented sentence by its char range and only it; stop sends a
  ``stop`` event carrying the fallback; regenerate in stream_first sends a ``retract`` back to the end of
  the grounded sentence, so the text the client shows is ``GROUNDED + CONTINUATION`` in either mode.
- The stream span: ``streamjudge.answer`` is the text the client shows (its token frames less what a
  retract withdrew); action and mode are the cell's; one alert; verdict, outcome and regenerations say
  what happened. A span saying ``streamjudge.action.enforced=false`` fails the cell with its reason: an
  action a shape cannot enforce is a known failure listed in :data:`FAILING_TODAY`, never a pass.

:data:`FAILING_TODAY` is the one table of cells that fail on today's code (strict xfail: a cell that
starts passing fails until its entry is removed).
"""

from __future__ import annotations

import json

import pytest

from instrumentation.otlp_receiver import OTLPReceiver, SpanRecord
from judges.scripted_server import ScriptedLLMServer
from matrix._client import Received, Wire, wires
from matrix.conftest import (
    ANSWER,
    CONTINUATION,
    FABRICATED,
    GROUNDED,
    QUESTION,
    Apps,
)
from streamjudge import semconv
from streamjudge.config import DEFAULT_FALLBACK, DEFAULT_REGENERATE_INSTRUCTION

pytestmark = pytest.mark.integration

SHAPES = ("async_graph", "sync_graph", "react", "lcel", "body_sse", "body_ndjson", "body_ws")
ACTIONS = ("flag", "stop", "regenerate")
MODES = ("stream_first", "hold_back")
EVENTS = ("off", "on")
WIRES = wires(QUESTION)
# the attribute a shape sets when it cannot enforce the action (with its reason beside it)
ENFORCED = getattr(semconv, "ACTION_ENFORCED", "streamjudge.action.enforced")
ENFORCED_REASON = getattr(semconv, "ACTION_ENFORCED_REASON", "streamjudge.action.enforced.reason")

#: (shape, action, mode, client events) -> why the cell fails on today's code; "*" matches any value
FAILING_TODAY: dict[tuple[str, str, str, str], str] = {
}


def _failing(shape: str, action: str, mode: str, events: str) -> str | None:
    for (s, a, m, e), reason in FAILING_TODAY.items():
        if all(p in ("*", v) for p, v in ((s, shape), (a, action), (m, mode), (e, events))):
            return reason
    return None


def _cells() -> list[object]:
    out = []
    for shape in SHAPES:
        for action in ACTIONS:
            for mode in MODES:
                for events in EVENTS:
                    reason = _failing(shape, action, mode, events)
                    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                    out.append(pytest.param(shape, action, mode, events, marks=marks,
                                            id=f"{shape}-{action}-{mode}-events_{events}"))
    return out


def _stream_span(receiver: OTLPReceiver, trace_id: str) -> SpanRecord:
    def done(spans: list[SpanRecord]) -> bool:
        return any(s.trace_id == trace_id and s.name == semconv.SPAN_STREAM for s in spans)

    try:
        spans = receiver.wait_for(done, timeout=15)
    except AssertionError:
        raise AssertionError("no stream span: the answer was not judged") from None
    streams = [s for s in spans if s.trace_id == trace_id and s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1, [s.attributes for s in streams]
    return streams[0]


def _expected_text(wire: Wire, action: str, mode: str, events: str, got: str) -> str:
    """The text the client must show; stream-first's prefix (as far as the answer went before the guard
    acted) is read from ``got`` after checking it holds the invented sentence and is the answer's."""
    fallback = " " + DEFAULT_FALLBACK if wire.fallback_in_answer else ""
    if action == "flag":
        return ANSWER
    tail = fallback if action == "stop" else CONTINUATION
    if mode == "hold_back" or (action == "regenerate" and events == "on"):
        return GROUNDED + tail
    assert got.endswith(tail), got
    shown = got[: len(got) - len(tail)]
    assert ANSWER.startswith(shown) and shown.startswith(f"{GROUNDED} {FABRICATED}"), got
    return shown + tail


def _check_client(wire: Wire, got: Received, action: str, mode: str, events: str) -> None:
    kinds = [f.kind for f in got.frames]
    assert kinds.count("terminal") == 1 and kinds[-1] == "terminal", kinds
    shown = got.shown()
    assert shown == _expected_text(wire, action, mode, events, shown)
    if mode == "hold_back" and action != "flag":
        assert FABRICATED.encode() not in got.raw and "Napoleon" not in shown
    if events == "off":
        assert got.guard == [], got.guard
        assert wire.render(got.frames) == got.raw  # the app's frames, byte for byte, nothing else
        if action == "flag":
            assert got.tokens == [w if i == 0 else " " + w for i, w in enumerate(ANSWER.split(" "))]
        return
    types = [g["type"] for g in got.guard]
    warnings = [g for g in got.guard if g["type"] == "warning"]
    assert warnings, types
    w = warnings[0]
    assert w["metric"] == semconv.FAITHFULNESS
    assert ANSWER[w["char_start"]: w["char_end"]] == FABRICATED
    assert [ANSWER[s["start"]: s["end"]] for s in w["sentences"]] == [FABRICATED]
    assert ("stop" in types) is (action == "stop"), types
    if action == "stop":
        assert next(g for g in got.guard if g["type"] == "stop")["text"] == DEFAULT_FALLBACK
    # only a sentence the client saw is retracted: stream-first regenerate
    assert ("retract" in types) is (action == "regenerate" and mode == "stream_first"), types


def _check_span(span: SpanRecord, got: Received, action: str, mode: str) -> None:
    a = span.attributes
    if a.get(ENFORCED) is False:
        raise AssertionError(f"{action} not enforced: {a.get(ENFORCED_REASON)!r}")
    assert (a[semconv.STREAM_ACTION], a[semconv.STREAM_MODE]) == (action, mode), "the cell switch did not take"
    assert a[semconv.STREAM_ANSWER] == got.shown()
    assert a[semconv.STREAM_ALERTS] == 1
    verdict = {"flag": "flagged", "stop": "stopped", "regenerate": "regenerated"}[action]
    assert a[semconv.STREAM_VERDICT] == verdict
    assert a[semconv.STREAM_OUTCOME] == ("stopped" if action == "stop" else "completed")
    assert a[semconv.STREAM_REGENERATIONS] == (1 if action == "regenerate" else 0)


def _check_reprompt(llm: ScriptedLLMServer, before: int) -> None:
    """The guard asked the app's model once more, with the accepted prefix as the assistant's turn."""
    asked = [r["body"] for r in llm.model_requests("/chat/completions")[before:]
             if DEFAULT_REGENERATE_INSTRUCTION in json.dumps(r["body"])]
    assert len(asked) == 1
    assert asked[0]["messages"][-2] == {"role": "assistant", "content": GROUNDED}


@pytest.mark.parametrize(("shape", "action", "mode", "events"), _cells())
def test_cell(matrix_apps: Apps, matrix_llm: ScriptedLLMServer, matrix_receiver: OTLPReceiver,
              shape: str, action: str, mode: str, events: str) -> None:
    wire = WIRES[shape]
    app, cell = matrix_apps.get(wire.process, action, mode, events)
    before = len(matrix_llm.model_requests())
    got = wire.request(app.url, cell)
    span = _stream_span(matrix_receiver, got.trace_id)
    _check_span(span, got, action, mode)
    _check_client(wire, got, action, mode, events)
    if action == "regenerate":
        _check_reprompt(matrix_llm, before)
