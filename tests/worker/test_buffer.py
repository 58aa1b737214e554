"""The trace buffer: a trace is held until its deferred answer has its outcome, bounded like tail sampling."""

from __future__ import annotations

import pytest

from streamjudge import semconv
from streamjudge.worker._buffer import TraceBuffer
from streamjudge.worker._convert import Received, spans
from worker._spans import app_trace, request


def received(**kw: object) -> list[Received]:
    return list(spans(request(app_trace(**kw))))  # type: ignore[arg-type]


def split(rs: list[Received]) -> tuple[list[Received], Received]:
    answer = next(r for r in rs if (r.span.attributes or {}).get(semconv.SPAN_TYPE) == "stream")
    return [r for r in rs if r is not answer], answer


def test_a_trace_is_held_until_its_answer_has_its_outcome_then_leaves_whole() -> None:
    buf = TraceBuffer()
    others, answer = split(received())
    for r in others:
        assert buf.add(r, now=0.0) == []  # the root arrived, but a checkpoint points at a stream not yet seen
    assert buf.begin_answer(answer.trace_id, answer.span_id, now=0.0)
    assert buf.spans == len(others) and buf.judging == 1
    [release] = buf.end_answer(answer.trace_id, answer.span_id)
    assert release.reason == "judged"
    assert {id(s) for s in release.spans} == {id(r.span) for r in others}
    assert buf.spans == 0 and buf.bytes == 0 and buf.traces == 0


def test_spans_of_a_trace_that_left_pass_straight_through() -> None:
    buf = TraceBuffer()
    others, answer = split(received())
    root = next(r for r in others if r.span.parent is None)
    buf.add(others[0], 0.0)
    buf.begin_answer(answer.trace_id, answer.span_id, 0.0)
    buf.end_answer(answer.trace_id, answer.span_id)
    [late] = buf.add(root, 0.1)
    assert late.reason == "late" and late.spans == (root.span,)
    assert buf.traces == 0
    # an answer arriving after its trace left is judged on its own
    assert not buf.begin_answer(answer.trace_id, 0x99, 0.2)


def test_a_trace_without_a_stream_leaves_when_its_root_arrives() -> None:
    buf = TraceBuffer()
    rs = received(checkpoints=0, answer_attributes={"node": "retrieve"})  # a plain child span, no stream
    child = next(r for r in rs if r.span.parent is not None)
    root = next(r for r in rs if r.span.parent is None)
    assert buf.add(child, 0.0) == []
    [done] = buf.add(root, 0.0)
    assert done.reason == "complete" and len(done.spans) == 2


def test_the_decision_wait_releases_traces_whose_answer_never_came_but_not_those_being_judged() -> None:
    buf = TraceBuffer(decision_wait_s=5.0)
    waiting = received(answer=False)
    for r in waiting:
        buf.add(r, now=0.0)
    others, answer = split(received())
    buf.add(others[0], now=0.0)
    buf.begin_answer(answer.trace_id, answer.span_id, now=0.0)
    assert buf.expire(now=4.9) == []
    [expired] = buf.expire(now=5.0)
    assert expired.reason == "decision_wait" and len(expired.spans) == len(waiting)
    assert buf.traces == 1 and buf.judging == 1  # judging is bounded by the pool, not the decision wait


def test_over_the_span_bound_the_oldest_trace_leaves_as_it_is() -> None:
    buf = TraceBuffer(max_spans=4)
    first = received(answer=False)  # 3 spans: request + 2 checkpoints
    second = received(answer=False)
    for r in first:
        assert buf.add(r, 0.0) == []
    out = []
    for r in second:
        out.extend(buf.add(r, 1.0))
    assert [x.reason for x in out] == ["evicted_spans"]
    assert {id(s) for s in out[0].spans} == {id(r.span) for r in first}
    assert buf.spans == 3


def test_over_the_byte_bound_the_oldest_trace_leaves_too() -> None:
    first, second = received(answer=False), received(answer=False)
    buf = TraceBuffer(max_bytes=sum(r.size for r in first) + 1)
    for r in first:
        buf.add(r, 0.0)
    out = [x for r in second for x in buf.add(r, 1.0)]
    assert out and out[0].reason == "evicted_bytes"
    assert buf.bytes <= buf.max_bytes


def test_drain_hands_everything_over_on_shutdown() -> None:
    buf = TraceBuffer()
    for r in received(answer=False) + received(answer=False):
        buf.add(r, 0.0)
    out = buf.drain()
    assert [x.reason for x in out] == ["shutdown", "shutdown"] and sum(len(x.spans) for x in out) == 6
    assert buf.traces == 0 and buf.spans == 0


def test_bounds_must_make_sense() -> None:
    with pytest.raises(ValueError):
        TraceBuffer(max_spans=0)
    with pytest.raises(ValueError):
        TraceBuffer(decision_wait_s=0)
