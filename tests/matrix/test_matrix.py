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
- hold_back, stop and regenerate: no token frame ever carries the invented sentence (a warning frame may
  quote it: it says what was withheld and why).
- Client events on: a warning names the invented sentence by its char range and only it; stop sends a
  ``stop`` event carrying the fallback; regenerate in stream_first sends a ``retract`` back to the end of
  the grounded sentence, so the text the client shows is ``GROUNDED + CONTINUATION`` in either mode.
- The stream span: ``streamjudge.answer`` is the text the client shows (its token frames less what a
  retract withdrew); action and mode are the cell's; one alert; verdict, outcome and regenerations say
  what happened. A span saying ``streamjudge.action.enforced=false`` fails the cell with its reason,
  unless :data:`NOT_ENFORCEABLE` lists the cell (what the stream core declares a shape cannot do, and what
  it runs instead): there the span must say ``enforced=false`` with a reason, and the client and the span
  must show what the stand-in promises (a body-fed stream runs hold-back as stream-first, and flags where
  it was asked to regenerate).

:data:`FAILING_TODAY` is the one table of cells that fail on today's code (strict xfail: a cell that
starts passing fails until its entry is removed).
"""

from __future__ import annotations

import fnmatch
import json
import os
from dataclasses import dataclass

import pytest

from instrumentation.otlp_receiver import OTLPReceiver, SpanRecord
from judges.scripted_server import ScriptedLLMServer
from matrix._client import Received, Wire, wires
from matrix.conftest import (
    ANSWER,
    CONTINUATION,
    FABRICATED,
    GROUNDED,
    INVENTED_NAME,
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
STREAM_SPAN_GRACE_S = 3.0
# MATRIX_IGNORE_TABLE=1: every cell runs as a plain test, to see why the listed ones fail
SHOW_ALL = os.environ.get("MATRIX_IGNORE_TABLE") == "1"
# the attribute a shape sets when it cannot enforce the action (with its reason beside it)
ENFORCED = getattr(semconv, "ACTION_ENFORCED", "streamjudge.action.enforced")
ENFORCED_REASON = getattr(semconv, "ACTION_ENFORCED_REASON", "streamjudge.action.enforced.reason")

#: (shape, action, mode, client events) -> why the cell fails on today's code (glob patterns: "*" is any)
FAILING_TODAY: dict[tuple[str, str, str, str], str] = {
    # (d) LangChain without LangGraph: the retraction reaches the wrapper after the continuation's first
    # frame (the wrapper sends the guard's events after the frame it forwards), so the client's text loses
    # that frame's word
    ("lcel", "regenerate", "stream_first", "on"): "the retract follows the continuation's first frame",
}


#: what a shape cannot enforce, as the stream core declares it (docs/stream-core.md): (shape, action, mode)
#: -> what the stream runs instead. Such a cell passes only when the span says
#: ``streamjudge.action.enforced=false`` with a reason and the client gets what the stand-in promises.
NOT_ENFORCEABLE: dict[tuple[str, str, str], dict[str, str]] = {
    # a body-fed stream's frames leave before their verdicts: it cannot hold back, it runs stream-first
    ("body_*", "*", "hold_back"): {"mode": "stream_first"},
    # and it sees no model to re-prompt: it flags instead
    ("body_*", "regenerate", "*"): {"action": "flag"},
}


def _match(patterns: tuple[str, ...], values: tuple[str, ...]) -> bool:
    return all(fnmatch.fnmatchcase(v, p) for p, v in zip(patterns, values, strict=True))


def _failing(shape: str, action: str, mode: str, events: str) -> str | None:
    for key, reason in FAILING_TODAY.items():
        if _match(key, (shape, action, mode, events)):
            return reason
    return None


@dataclass(frozen=True)
class Cell:
    """One cell: what was asked (``action``, ``mode``) and what the shape can do of it (``does``,
    ``runs``: the same unless :data:`NOT_ENFORCEABLE` says otherwise)."""

    shape: str
    action: str
    mode: str
    events: str
    does: str
    runs: str

    @classmethod
    def of(cls, shape: str, action: str, mode: str, events: str) -> Cell:
        does, runs = action, mode
        for key, instead in NOT_ENFORCEABLE.items():
            if _match(key, (shape, action, mode)):
                does, runs = instead.get("action", does), instead.get("mode", runs)
        return cls(shape, action, mode, events, does, runs)

    @property
    def enforced(self) -> bool:
        return (self.does, self.runs) == (self.action, self.mode)


def _cells() -> list[object]:
    out = []
    for shape in SHAPES:
        for action in ACTIONS:
            for mode in MODES:
                for events in EVENTS:
                    reason = None if SHOW_ALL else _failing(shape, action, mode, events)
                    marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
                    out.append(pytest.param(shape, action, mode, events, marks=marks,
                                            id=f"{shape}-{action}-{mode}-events_{events}"))
    return out


def _stream_span(receiver: OTLPReceiver, got: Received) -> SpanRecord | None:
    """The request's stream span. It is exported after the request span (held for its final score): once
    the request span is in, a stream span that is still missing after a short wait never came."""
    def spans_of(spans: list[SpanRecord]) -> list[SpanRecord]:
        return [s for s in spans if s.trace_id == got.trace_id]

    mine = spans_of(receiver.wait_for(lambda spans: any(s.parent_span_id == got.parent_id
                                                        for s in spans_of(spans)), timeout=30))
    if not any(s.name == semconv.SPAN_STREAM for s in mine):
        try:
            mine = spans_of(receiver.wait_for(lambda spans: any(s.name == semconv.SPAN_STREAM
                                                                for s in spans_of(spans)),
                                              timeout=STREAM_SPAN_GRACE_S))
        except AssertionError:
            return None
    streams = [s for s in mine if s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1, [s.attributes for s in streams]
    return streams[0]


class Problems:
    """Every way a cell falls short, reported together (a cell that fails shows all its reasons)."""

    def __init__(self) -> None:
        self.found: list[str] = []

    def check(self, ok: bool, what: str, detail: object = "") -> bool:
        if not ok:
            self.found.append(f"{what}: {detail!r}" if detail != "" else what)
        return ok

    def raise_any(self) -> None:
        if self.found:
            raise AssertionError("\n  - ".join(["the cell falls short:", *self.found]))


def _expected_text(wire: Wire, cell: Cell, got: str) -> str | None:
    """The text the client must show, or None when ``got`` is not of the allowed form. Stream-first's prefix
    (as far as the answer went before the guard acted) is read from ``got``: it must hold the invented
    sentence (shown before its verdict) and be the answer's."""
    fallback = " " + DEFAULT_FALLBACK if wire.fallback_in_answer else ""
    if cell.does == "flag":
        return ANSWER
    tail = fallback if cell.does == "stop" else CONTINUATION
    if cell.runs == "hold_back" or (cell.does == "regenerate" and cell.events == "on"):
        return GROUNDED + tail
    shown = got[: len(got) - len(tail)] if got.endswith(tail) else got
    if not (ANSWER.startswith(shown) and shown.startswith(f"{GROUNDED} {FABRICATED}")):
        return None
    return shown + tail


def _check_client(p: Problems, wire: Wire, got: Received, cell: Cell) -> None:
    kinds = [f.kind for f in got.frames]
    p.check(kinds.count("terminal") == 1 and kinds[-1:] == ["terminal"], "the app's terminal frame did not "
            "arrive once, last", kinds[-3:])
    shown = got.shown()
    expected = _expected_text(wire, cell, shown)
    p.check(shown == expected, "client text", f"{shown} (expected {expected or 'another form'})")
    if cell.runs == "hold_back" and cell.does != "flag":
        p.check(INVENTED_NAME not in "".join(got.tokens), "the invented sentence reached the client's text "
                "in hold_back")
        p.check(FABRICATED.encode() not in got.raw, "a frame quoted the invented sentence in hold_back",
                [g for g in got.guard if FABRICATED in json.dumps(g)])
    if cell.events == "off":
        p.check(got.guard == [], "guard frames sent with client events off", got.guard)
        if got.guard == []:
            p.check(wire.render(got.frames) == got.raw, "the bytes are not exactly the app's frames")
        if cell.does == "flag":
            p.check(got.tokens == [w if i == 0 else " " + w for i, w in enumerate(ANSWER.split(" "))],
                    "flag changed the app's token frames", got.tokens)
        return
    types = [g["type"] for g in got.guard]
    warnings = [g for g in got.guard if g["type"] == "warning"]
    if p.check(bool(warnings), "no warning frame", types):
        w = warnings[0]
        p.check(w.get("metric") == semconv.FAITHFULNESS, "warning metric", w.get("metric"))
        p.check(ANSWER[w.get("char_start", 0): w.get("char_end", 0)] == FABRICATED
                and [ANSWER[s["start"]: s["end"]] for s in w.get("sentences", [])] == [FABRICATED],
                "the warning does not name the invented sentence (only)", w)
    p.check(("stop" in types) is (cell.does == "stop"), "stop frame", types)
    if cell.does == "stop" and "stop" in types:
        p.check(next(g for g in got.guard if g["type"] == "stop").get("text") == DEFAULT_FALLBACK,
                "the stop frame does not carry the fallback")
    # only a sentence the client saw is retracted: stream-first regenerate
    p.check(("retract" in types) is (cell.does == "regenerate" and cell.runs == "stream_first"),
            "retract frame", types)


def _check_span(p: Problems, span: SpanRecord | None, got: Received, cell: Cell) -> None:
    if not p.check(span is not None, "no stream span: the answer was not judged") or span is None:
        return
    a = span.attributes
    if cell.enforced:
        if a.get(ENFORCED) is False:
            p.check(False, f"{cell.action}/{cell.mode} not enforced", a.get(ENFORCED_REASON))
    else:
        p.check(a.get(ENFORCED) is False and bool(a.get(ENFORCED_REASON)),
                f"{cell.action}/{cell.mode} cannot be enforced here, and the span must say so",
                (a.get(ENFORCED), a.get(ENFORCED_REASON)))
    # the span may name what was asked or what ran instead; anything else: the cell switch did not take
    said = (a.get(semconv.STREAM_ACTION), a.get(semconv.STREAM_MODE))
    if not p.check(said[0] in (cell.action, cell.does) and said[1] in (cell.mode, cell.runs),
                   "the cell switch did not take", said):
        return
    p.check(a.get(semconv.STREAM_ANSWER) == got.shown(), "span answer is not the client's text",
            a.get(semconv.STREAM_ANSWER))
    p.check(a.get(semconv.STREAM_ALERTS) == 1, "span alerts", a.get(semconv.STREAM_ALERTS))
    verdict = {"flag": "flagged", "stop": "stopped", "regenerate": "regenerated"}[cell.does]
    p.check(a.get(semconv.STREAM_VERDICT) == verdict, "span verdict", a.get(semconv.STREAM_VERDICT))
    outcome = "stopped" if cell.does == "stop" else "completed"
    p.check(a.get(semconv.STREAM_OUTCOME) == outcome, "span outcome", a.get(semconv.STREAM_OUTCOME))
    regenerations = 1 if cell.does == "regenerate" else 0
    p.check(a.get(semconv.STREAM_REGENERATIONS) == regenerations, "span regenerations",
            a.get(semconv.STREAM_REGENERATIONS))


def _check_reprompt(p: Problems, llm: ScriptedLLMServer, before: int) -> None:
    """The guard asked the app's model once more, with the accepted prefix as the assistant's turn."""
    asked = [r["body"] for r in llm.model_requests("/chat/completions")[before:]
             if DEFAULT_REGENERATE_INSTRUCTION in json.dumps(r["body"])]
    if p.check(len(asked) == 1, "re-prompts of the app's model", len(asked)):
        p.check(asked[0]["messages"][-2] == {"role": "assistant", "content": GROUNDED},
                "the re-prompt's accepted prefix", asked[0]["messages"][-2])


@pytest.mark.parametrize(("shape", "action", "mode", "events"), _cells())
def test_cell(matrix_apps: Apps, matrix_llm: ScriptedLLMServer, matrix_receiver: OTLPReceiver,
              shape: str, action: str, mode: str, events: str) -> None:
    wire = WIRES[shape]
    url, switch = matrix_apps.get(wire.process, action, mode, events)
    before = len(matrix_llm.model_requests())
    got = wire.request(url, switch)
    cell = Cell.of(shape, action, mode, events)
    p = Problems()
    _check_client(p, wire, got, cell)
    _check_span(p, _stream_span(matrix_receiver, got), got, cell)
    if cell.does == "regenerate":
        _check_reprompt(p, matrix_llm, before)
    p.raise_any()
