"""A three-way judge's sentence verdicts reach the exported spans: the uncertain sentences, which do not
alert by default, are counted and located on the span, and every sentence's verdict, deciding tier and
evidence kind ride on the evaluation event."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import streamjudge
from conftest import Harness
from streamjudge import semconv

CONTEXT = "The lab employs about 300 people. It was founded in 1969 in Leeds."


async def _words(text: str) -> AsyncIterator[str]:
    for w in text.split(" "):
        yield w + " "
        await asyncio.sleep(0)


def _consume(stream: Any) -> list[streamjudge.StreamEvent]:
    async def go() -> list[streamjudge.StreamEvent]:
        return [e async for e in stream]

    return asyncio.run(go())


def test_uncertain_and_failed_sentences_are_told_apart_on_the_stream_span(harness: Harness) -> None:
    harness.configure(preflight=False, checkpoint_every=8)
    grounded = "Roughly 300 people work at the lab."
    weak = "The lab's 300 people collaborate extensively internationally."
    wrong = "It was founded in 1712 in Leeds."
    answer = f"{grounded} {weak} {wrong}"
    _consume(streamjudge.guard(_words(answer), question="How big is the lab?", contexts=(CONTEXT,)))
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    attrs = stream.attributes or {}
    f = semconv.FAITHFULNESS
    assert attrs[semconv.sentences_attribute(f, "failed")] == 1
    assert attrs[semconv.sentences_attribute(f, "uncertain")] == 1
    start, end = attrs[semconv.sentences_attribute(f, "uncertain_ranges")]
    assert answer[start:end].strip() == weak
    (ev,) = [e for e in stream.events if e.name == semconv.EVENT_EVALUATION_RESULT
             and (e.attributes or {}).get(semconv.GEN_AI_EVALUATION_NAME) == f]
    ea = ev.attributes or {}
    assert list(ea[semconv.EVAL_SENTENCE_VERDICTS]) == ["supported", "uncertain", "fail"]
    assert list(ea[semconv.EVAL_SENTENCE_TIERS]) == ["local"] * 3
    assert list(ea[semconv.EVAL_SENTENCE_KINDS])[1:] == ["words", "number"]
    bounds = list(ea[semconv.EVAL_SENTENCE_BOUNDS])
    assert [answer[a:b].strip() for a, b in zip(bounds[::2], bounds[1::2], strict=True)] == [grounded, weak, wrong]
