"""The live guard: tokens flow at once, verdicts come back mid-stream, actions apply."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

from _fakes import BrokenJudge, KeywordJudge, SyncKeywordJudge
from conftest import Harness
from streamjudge import RegenerateRequest, StreamEvent, guard, semconv
from streamjudge.judging import _drivers
from streamjudge.judging._drivers import _GAP_SAMPLE as _GAP
from streamjudge.judging._windows import MAX_JOINED_CHARS
from streamjudge.judging.guard import GuardSession
from streamjudge.judging.processor import JudgeSpanProcessor
from streamjudge.sentences import Sentence, SentenceBuffer, split_sentences
from test_seam import MARK, SentenceJudge, _tokens

CONTEXTS = ["The sky is blue. Grass is green. Water is wet."]
GOOD = "The sky is blue. Grass is green. Water is wet. The sky is blue again. "
BAD = "The sky is blue. Grass is green. Then HALLUCINATED facts appear. And more of them. Last one here."


async def words(text: str, delay: float = 0.0) -> AsyncIterator[str]:
    for w in text.split(" "):
        if delay:
            await asyncio.sleep(delay)
        yield w + " "


async def paced(text: str, harness: Harness) -> AsyncIterator[str]:
    """Yields a word, and lets pending verdicts land before the next one (deterministic tests)."""
    for w in text.split(" "):
        yield w + " "
        await asyncio.sleep(0.002)


def run(stream: Any) -> list[StreamEvent]:
    async def collect() -> list[StreamEvent]:
        return [ev async for ev in stream]

    return asyncio.run(collect())


def text_of(events: list[StreamEvent]) -> str:
    return "".join(e.text for e in events if e.type == "token")


def by_name(spans: list[Any], name: str) -> list[Any]:
    return [s for s in spans if s.name == name]


def test_grounded_stream_passes_every_token_through_in_order(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    events = run(guard(words(GOOD), question="sky", contexts=CONTEXTS))
    assert text_of(events) == "".join(w + " " for w in GOOD.split(" "))
    assert [e.type for e in events if e.type != "token"] == ["done"]
    assert events[-1].data is not None and events[-1].data["verdict"] == "pass"
    spans = harness.spans()
    stream = by_name(spans, semconv.SPAN_STREAM)[0]
    cps = by_name(spans, semconv.SPAN_CHECKPOINT)
    assert stream.attributes[semconv.STREAM_TTFT_MS] >= 0
    assert stream.attributes[semconv.STREAM_TOKENS] == len(GOOD.split(" "))
    assert stream.attributes[semconv.STREAM_ALERTS] == 0
    assert cps and all(c.parent.span_id == stream.context.span_id for c in cps)
    # each checkpoint carries its own new sentences: together they are the answer, in order
    ordered = sorted(cps, key=lambda c: c.attributes[semconv.CHECKPOINT_INDEX])
    assert "".join(c.attributes[semconv.CHECKPOINT_TEXT] for c in ordered) == text_of(events)
    assert stream.attributes[semconv.score_attribute("faithfulness")] == 1.0


def test_hallucination_raises_a_warning_mid_stream_with_the_char_range(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    events = run(guard(paced(BAD, harness), question="sky", contexts=CONTEXTS))
    warnings = [e for e in events if e.type == "warning"]
    assert warnings, events
    w = warnings[0]
    assert w.data is not None and w.data["metric"] == "faithfulness" and w.data["score"] == 0.0
    # the warning arrives before the stream is over: tokens follow it
    idx = events.index(w)
    assert any(e.type == "token" for e in events[idx:])
    assert BAD[w.data["char_start"] : w.data["char_end"]].strip()
    assert "HALLUCINATED" in BAD[: w.data["char_end"]]
    done = events[-1]
    assert done.type == "done" and done.data is not None and done.data["verdict"] == "flagged"
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_ALERTS] >= 1
    assert any(e.name == semconv.EVENT_ALERT for e in stream.events)


def test_checkpoint_spans_carry_evaluation_events(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    run(guard(paced(BAD, harness), question="sky", contexts=CONTEXTS))
    judged = [
        c for c in by_name(harness.spans(), semconv.SPAN_CHECKPOINT)
        if c.attributes[semconv.EVAL_STATUS] == "judged"
    ]
    assert judged
    ev = [e for c in judged for e in c.events if e.name == semconv.EVENT_EVALUATION_RESULT]
    assert ev
    assert {e.attributes[semconv.GEN_AI_EVALUATION_NAME] for e in ev} == {"faithfulness"}
    assert {e.attributes[semconv.GEN_AI_EVALUATION_SCORE_LABEL] for e in ev} >= {"fail"}


def test_every_span_is_exported_exactly_once(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    run(guard(words(BAD * 3), question="sky", contexts=CONTEXTS))
    spans = harness.spans()
    ids = [s.context.span_id for s in spans]
    assert len(ids) == len(set(ids))
    stream = by_name(spans, semconv.SPAN_STREAM)[0]
    assert len(by_name(spans, semconv.SPAN_CHECKPOINT)) == stream.attributes[semconv.STREAM_CHECKPOINTS]
    # superseded / judged: each checkpoint says what became of it
    for c in by_name(spans, semconv.SPAN_CHECKPOINT):
        assert c.attributes[semconv.EVAL_STATUS] in ("judged", "superseded")


def test_slow_judge_never_delays_tokens(harness: Harness) -> None:
    harness.configure(KeywordJudge(delay_s=3.0), end_wait_s=0.0)
    t0 = time.monotonic()
    events = run(guard(words(GOOD * 4), question="sky", contexts=CONTEXTS))
    # several checkpoints closed, each judged for 3 s: the stream did not wait for any of them
    assert time.monotonic() - t0 < 2.0
    assert text_of(events).startswith("The sky")


def test_stop_action_ends_the_stream_with_the_fallback(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), action="stop", fallback_message="Sorry, stopping.")
    closed = False

    async def source() -> AsyncIterator[str]:
        nonlocal closed
        try:
            async for w in paced(BAD * 5, harness):
                yield w
        finally:
            closed = True

    events = run(guard(source(), question="sky", contexts=CONTEXTS))
    types = [e.type for e in events]
    assert "stop" in types
    stop = events[types.index("stop")]
    assert stop.text == "Sorry, stopping."
    assert types[types.index("stop") + 1 :] == ["done"]
    assert closed  # the source was closed, the LLM stops generating
    assert len(text_of(events)) < len(BAD * 5)
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_VERDICT] == "stopped"


def test_regenerate_retracts_and_continues_from_the_last_good_checkpoint(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), action="regenerate", window_sentences=1)
    requests: list[RegenerateRequest] = []

    def regenerate(req: RegenerateRequest) -> AsyncIterator[str]:
        requests.append(req)
        return _aiter([" Water", " is", " wet."])

    events = run(guard(paced(BAD, harness), question="sky", contexts=CONTEXTS, regenerate=regenerate))
    types = [e.type for e in events]
    assert "retract" in types
    retract = events[types.index("retract")]
    assert retract.data is not None
    assert len(requests) == 1
    req = requests[0]
    assert req.accepted_prefix == BAD[: retract.data["from"]]
    assert "HALLUCINATED" not in req.accepted_prefix
    assert req.contexts == tuple(CONTEXTS) and "context" in req.instruction
    # the client reconstructs the final text: tokens, minus the retracted range, plus the new tokens
    shown = ""
    for e in events:
        if e.type == "token":
            shown += e.text
        elif e.type == "retract":
            shown = shown[: e.data["from"]]  # type: ignore[index]
    assert "HALLUCINATED" not in shown and shown.endswith("green. Water is wet.")
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_REGENERATIONS] == 1
    assert "HALLUCINATED" not in stream.attributes[semconv.STREAM_ANSWER]


def test_regenerate_after_a_burst_retracts_exactly_what_was_shown(harness: Harness) -> None:
    # every token at hand: they went out before any window was scanned, and the windows were judged as one
    # checkpoint after the source ended; a sentence-level verdict keeps the good sentences before the
    # failing one, and the retraction lines up with what was shown
    harness.configure(SentenceJudge(), action="regenerate", window_sentences=1)
    answer = f"The sky is blue. Grass is green. Then {MARK} facts appear. More text follows here."

    def regenerate(req: RegenerateRequest) -> AsyncIterator[str]:
        assert req.accepted_prefix == "The sky is blue. Grass is green."
        return _aiter([" Water", " is", " wet."])

    events = run(guard(words(answer), question="sky", contexts=CONTEXTS, regenerate=regenerate))
    types = [e.type for e in events]
    retract = events[types.index("retract")]
    assert retract.data is not None
    shown = ""
    for e in events:
        if e.type == "token":
            shown += e.text
        elif e.type == "retract":
            assert shown[e.data["from"] : e.data["to"]] == e.text  # type: ignore[index]
            assert e.data["to"] == len(shown)  # type: ignore[index]
            shown = shown[: e.data["from"]]  # type: ignore[index]
    assert shown == "The sky is blue. Grass is green. Water is wet."
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_ANSWER] == shown


def test_regenerate_without_a_callback_flags(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), action="regenerate")
    events = run(guard(paced(BAD, harness), question="sky", contexts=CONTEXTS))
    w = next(e for e in events if e.type == "warning" and e.data and e.data["metric"] == "faithfulness")
    assert w.data is not None and w.data["reason"] == "no_regenerate_callback"
    assert text_of(events).strip() == BAD.strip()


def test_hold_back_never_shows_unfaithful_text(harness: Harness) -> None:
    harness.configure(KeywordJudge(delay_s=0.01), mode="hold_back", action="stop", window_sentences=1)
    events = run(guard(words(BAD), question="sky", contexts=CONTEXTS))
    shown = text_of(events)
    assert "HALLUCINATED" not in shown
    assert shown.startswith("The sky is blue.")
    assert any(e.type == "stop" for e in events)


def test_hold_back_releases_everything_that_passed(harness: Harness) -> None:
    harness.configure(KeywordJudge(delay_s=0.01), mode="hold_back")
    events = run(guard(words(GOOD), question="sky", contexts=CONTEXTS))
    assert text_of(events) == "".join(w + " " for w in GOOD.split(" "))


def test_preflight_gate_runs_before_the_first_token(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), preflight_action="stop")
    pulled = 0

    async def source() -> AsyncIterator[str]:
        nonlocal pulled
        for w in GOOD.split(" "):
            pulled += 1
            yield w

    events = run(guard(source(), question="unrelated", contexts=CONTEXTS))
    assert [e.type for e in events] == ["stop", "done"]
    assert pulled == 0  # not a single token was generated for the user
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.PREFLIGHT_LABEL] == "fail"


def test_preflight_skip_checks_policy_skips_incremental_checks(harness: Harness) -> None:
    judge = SyncKeywordJudge()
    harness.configure(judge, preflight_action="skip_checks")
    events = run(guard(words(BAD), question="unrelated", contexts=CONTEXTS))
    assert not [e for e in events if e.type == "warning"]
    cps = by_name(harness.spans(), semconv.SPAN_CHECKPOINT)
    assert cps and {c.attributes[semconv.EVAL_SKIP_REASON] for c in cps} == {"preflight_low_context"}
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.EVAL_STATUS] == "judged"  # the final pass still runs


def test_a_weak_context_warning_comes_before_the_first_token_of_a_model_still_thinking(
    harness: Harness,
) -> None:
    harness.configure(SyncKeywordJudge(), preflight_action="warn")

    async def thinking() -> AsyncIterator[str]:
        await asyncio.sleep(0.3)  # the model's time to first token
        for w in GOOD.split(" "):
            yield w + " "

    events = run(guard(thinking(), question="unrelated", contexts=CONTEXTS))
    kinds = [e.type for e in events]
    assert kinds[0] == "warning" and events[0].data["stage"] == "preflight"
    assert kinds.count("token") == len(GOOD.split(" "))


def test_a_source_with_its_tokens_at_hand_sends_the_gate_after_them_and_still_records_it(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    rt = harness.configure(SyncKeywordJudge(), preflight_action="warn")
    order: list[str] = []
    submit = rt.service.submit

    def recording(request: Any) -> Any:
        order.append(request.item.kind)
        return submit(request)

    monkeypatch.setattr(rt.service, "submit", recording)

    async def at_hand() -> AsyncIterator[str]:
        for w in GOOD.split(" "):
            order.append("token")
            yield w + " "

    events = run(guard(at_hand(), question="unrelated", contexts=CONTEXTS))
    # the pool's thread judges nothing while the loop streams tokens it never waits for
    assert order.index("preflight") > max(i for i, k in enumerate(order) if k == "token")
    # the end-of-stream wait still waits for the gate: its warning comes before `done`, its label is on the span
    kinds = [e.type for e in events]
    assert "warning" in kinds and kinds[-1] == "done"
    assert any(e.type == "warning" and e.data["stage"] == "preflight" for e in events)
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.PREFLIGHT_LABEL] == "fail"


def test_sync_iterator(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())

    def source() -> Iterator[str]:
        for w in BAD.split(" "):
            yield w + " "
            time.sleep(0.002)

    events = list(guard(source(), question="sky", contexts=CONTEXTS))
    assert text_of(events).strip() == BAD.strip()
    assert any(e.type == "warning" for e in events)
    assert events[-1].type == "done"


class _Marked(str):
    """A token type of the app's own (a str subclass): its events keep it."""


@pytest.mark.parametrize("sample_rate", [1.0, 0.0])
@pytest.mark.parametrize("at_hand", [True, False])
def test_short_tokens_share_one_event_across_streams_and_the_rest_keep_their_own(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, sample_rate: float, at_hand: bool
) -> None:
    from streamjudge.judging import _session

    harness.configure(SyncKeywordJudge(), sample_rate=sample_rate)
    monkeypatch.setattr(_session, "_TOKEN_EVENTS", {})  # the drivers look it up through their import
    from streamjudge.judging import _drivers

    monkeypatch.setattr(_drivers, "_TOKEN_EVENTS", _session._TOKEN_EVENTS)
    long = "x" * (_session._TOKEN_EVENT_CHARS + 1)
    tokens = ["The ", "sky ", long, _Marked("is "), "blue. "]

    async def source() -> AsyncIterator[str]:
        for t in tokens:
            if not at_hand:
                await asyncio.sleep(0)
            yield t

    first, second = (
        [e for e in run(guard(source(), question="sky", contexts=CONTEXTS)) if e.type == "token"]
        for _ in range(2)
    )
    sync = [e for e in guard(iter(tokens), question="sky", contexts=CONTEXTS) if e.type == "token"]
    for events in (first, second, sync):
        assert events == [StreamEvent("token", t) for t in tokens]
        assert type(events[3].text) is _Marked  # not swapped for an equal str's event
    for i in (0, 1, 4):  # short plain tokens: the one event of their text
        assert first[i] is second[i] is sync[i]
    for i in (2, 3):  # a long token, a subclass: their own
        assert first[i] is not second[i]
    assert set(_session._TOKEN_EVENTS) == {"The ", "sky ", "blue. "}


def test_the_shared_token_events_stay_within_their_bound(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    from streamjudge.judging import _drivers, _session

    harness.configure(SyncKeywordJudge())
    monkeypatch.setattr(_session, "_TOKEN_EVENTS", {})
    monkeypatch.setattr(_drivers, "_TOKEN_EVENTS", _session._TOKEN_EVENTS)
    monkeypatch.setattr(_session, "_TOKEN_EVENTS_MAX", 8)
    sizes: list[int] = []

    async def source() -> AsyncIterator[str]:
        for i in range(50):
            yield f"w{i} "
            sizes.append(len(_session._TOKEN_EVENTS))

    events = run(guard(source(), question="sky", contexts=CONTEXTS))
    assert text_of(events) == "".join(f"w{i} " for i in range(50))
    assert max(sizes) == 8  # emptied when full, and filled again by the tokens after


def test_bad_tokens_are_skipped_or_decoded_never_crash(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    euro = "€".encode()
    tokens: list[Any] = [b"The sky ", euro[:1], euro[1:], b" costs 5", None, "", b"\xff\xfe bad. ",
                         "x" * 1_000_000, "\ud800 lone. ", object(), "End."]
    events = run(guard(_aiter(tokens), question="sky", contexts=CONTEXTS))
    text = text_of(events)
    assert "The sky € costs 5" in text  # a character split across tokens is joined
    assert "\ufffd" in text  # undecodable bytes become U+FFFD, not a crash
    assert events[-1].type == "done"
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_SKIPPED_TOKENS] == 2  # None and object()
    reasons = {e.attributes[semconv.SKIP_REASON] for e in stream.events if e.name == semconv.EVENT_SKIP}
    assert {"token:invalid_utf8", "token:invalid_unicode", "token:non_text_token:object"} <= reasons


def test_empty_contexts_and_question_are_recorded_not_fatal(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    events = run(guard(words(GOOD), question="", contexts=[]))
    assert events[-1].type == "done"
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.PREFLIGHT_LABEL] == "skipped:no_contexts"


def test_failing_judges_never_break_the_stream_and_spans_say_why(harness: Harness) -> None:
    for how, status in (("raise", "error"), ("hang", "timeout"), ("garbage", "error")):
        harness.configure(BrokenJudge(how), judge_timeout_s=0.2, end_wait_s=0.5, preflight=False)
        events = run(guard(words(BAD), question="sky", contexts=CONTEXTS))
        assert text_of(events).strip() == BAD.strip()
        assert events[-1].data is not None and events[-1].data["verdict"] == "unjudged"
        spans = harness.spans()
        statuses = {s.attributes[semconv.EVAL_STATUS] for s in by_name(spans, semconv.SPAN_CHECKPOINT)}
        assert status in statuses, (how, statuses)
        assert by_name(spans, semconv.SPAN_STREAM)[0].attributes[semconv.EVAL_STATUS] == status


def test_disconnect_ends_the_span_with_a_status_and_cancels_judge_work(harness: Harness) -> None:
    harness.configure(KeywordJudge(delay_s=5.0), judge_timeout_s=10)

    async def consume() -> None:
        g = guard(words(BAD * 10), question="sky", contexts=CONTEXTS)
        agen = g.__aiter__()
        for _ in range(20):
            await agen.__anext__()
        await agen.aclose()  # what a server does when the client goes away

    t0 = time.monotonic()
    asyncio.run(consume())
    spans = harness.spans()
    assert time.monotonic() - t0 < 4  # queued judge work did not have to run
    stream = by_name(spans, semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_OUTCOME] == "disconnected"
    assert stream.status.status_code.name == "ERROR"
    assert stream.attributes[semconv.EVAL_STATUS] == "skipped"
    cps = by_name(spans, semconv.SPAN_CHECKPOINT)
    assert cps and {c.attributes[semconv.EVAL_STATUS] for c in cps} <= {"cancelled", "superseded"}


def test_content_capture_off_records_length_and_hash(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), capture_content=False)
    run(guard(words(BAD), question="secret question", contexts=CONTEXTS))
    spans = harness.spans()
    for s in spans:
        for v in s.attributes.values():
            assert "HALLUCINATED" not in str(v) and "secret question" not in str(v)
    cp = by_name(spans, semconv.SPAN_CHECKPOINT)[0]
    assert len(cp.attributes[semconv.CHECKPOINT_TEXT_SHA256]) == 64
    # the judge still saw the text (kept in memory, not on the span)
    judged = [c for c in by_name(spans, semconv.SPAN_CHECKPOINT) if c.attributes[semconv.EVAL_STATUS] == "judged"]
    assert any(c.attributes.get(semconv.score_attribute("faithfulness")) == 0.0 for c in judged) or any(
        s.attributes.get(semconv.score_attribute("faithfulness")) == 0.0 for s in by_name(spans, semconv.SPAN_STREAM)
    )


def test_final_reconciliation_result_is_available(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge())
    g = guard(words(BAD), question="sky", contexts=CONTEXTS)
    run(g)
    final = g.final.result(timeout=5)
    assert final is not None
    f = final.get("faithfulness")
    assert f is not None and f.value == 0.0 and f.label == "fail"


def test_the_final_result_reaches_a_future_asked_for_before_or_after_it_came(harness: Harness) -> None:
    # the future is made on demand: asked for before the stream ran it is resolved by the verdict, asked
    # for after it is made resolved; a stream whose final pass is skipped resolves it with None either way
    harness.configure(SyncKeywordJudge())
    early = guard(words(BAD), question="sky", contexts=CONTEXTS)
    fut = early.final
    assert not fut.done()
    run(early)
    late = guard(words(BAD), question="sky", contexts=CONTEXTS)
    run(late)
    harness.spans()  # every verdict in
    for g in (early, late):
        final = g.final.result(timeout=5)
        assert final is not None and final.get("faithfulness").value == 0.0  # type: ignore[union-attr]
    assert early.final is fut and late.final is late.final
    harness.configure(SyncKeywordJudge(), final_reconcile=False)
    cancelled = guard(words(BAD), question="sky", contexts=CONTEXTS)
    assert cancelled.final.cancel()  # the holder's to cancel: the stream still ends well
    assert run(cancelled)[-1].type == "done"
    for ask_first in (True, False):
        g = guard(words(BAD), question="sky", contexts=CONTEXTS)
        if ask_first:
            g.final  # noqa: B018 - asking makes the future
        run(g)
        assert g.final.result(timeout=5) is None


def test_contexts_registered_for_the_trace_are_used(harness: Harness) -> None:
    rt = harness.configure(SyncKeywordJudge())
    from opentelemetry import trace

    tracer = rt.tracer_provider.get_tracer("app")

    async def main() -> list[StreamEvent]:
        with tracer.start_as_current_span("request") as span:
            rt.contexts.register(span.get_span_context().trace_id, question="sky", contexts=CONTEXTS)
            return [e async for e in guard(paced(BAD, harness))]

    events = asyncio.run(main())
    assert any(e.type == "warning" for e in events)
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == 1
    assert trace.get_current_span() is not None


async def _aiter(items: list[Any]) -> AsyncIterator[Any]:
    for i in items:
        yield i


def _warning_and_last_token(source: AsyncIterator[str]) -> tuple[float, float]:
    """Seconds from the start to the first warning and to the last token ("Done.") of a guarded stream."""

    async def main() -> tuple[float, float]:
        t0 = time.monotonic()
        warned = last_token = 0.0
        async for ev in guard(source, question="sky", contexts=CONTEXTS):
            if ev.type == "warning" and not warned:
                warned = time.monotonic() - t0
            elif ev.type == "token" and ev.text == "Done.":
                last_token = time.monotonic() - t0
        return warned, last_token

    return asyncio.run(main())


def test_a_warning_does_not_wait_for_a_slow_next_token(harness: Harness) -> None:
    # the model stalls after the hallucinated sentence: the warning must reach the client during the
    # stall, not with the next token
    harness.configure(SyncKeywordJudge(), window_sentences=1)

    async def source() -> AsyncIterator[str]:
        # "More" decides the sentence end before it: the checkpoint closes before the stall
        text = "The sky is blue. Water is wet. Then HALLUCINATED facts appear. More"
        for w in text.split():
            yield w + " "
            await asyncio.sleep(0.02)  # a slow model: racing verdicts against tokens is on
        await asyncio.sleep(1.0)
        yield "Done."

    warned, last_token = _warning_and_last_token(source())
    assert 0 < warned < last_token - 0.5


def test_a_fast_source_is_timed_on_a_sample_of_its_tokens(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # verdicts stay in flight (1 s judge) while a fast source streams: the guard keeps measuring the
    # source's pace, but timing every token would cost more than the rest of its work per token
    from streamjudge.judging import _drivers

    harness.configure(KeywordJudge(delay_s=1.0), window_sentences=1, preflight=False, end_wait_s=0.0)
    calls = 0
    real = _drivers.perf_counter

    def counting() -> float:
        nonlocal calls
        calls += 1
        return real()

    monkeypatch.setattr(_drivers, "perf_counter", counting)
    text = GOOD * 20

    async def fast() -> AsyncIterator[str]:
        # a loop pass before each token, as a model read over the network: each window goes out on its own
        # while the tokens after it come (a source with all its tokens at hand sends them before any)
        for w in text.split(" "):
            await asyncio.sleep(0)
            yield w + " "

    events = run(guard(fast(), question="sky", contexts=CONTEXTS))
    tokens = sum(1 for e in events if e.type == "token")
    assert tokens == len(text.split(" "))
    # two readings per timed token; one token in _GAP_SAMPLE is timed
    assert 0 < calls <= 2 * (tokens // _drivers._GAP_SAMPLE + 2), (calls, tokens)


def test_a_source_that_turns_slow_is_raced_before_its_stall(harness: Harness) -> None:
    # fast tokens while a verdict is in flight, then a model that slows down and stalls: the warning
    # must still reach the client during the stall, not with the token after it
    harness.configure(KeywordJudge(delay_s=0.3), window_sentences=1, preflight=False)

    async def source() -> AsyncIterator[str]:
        for w in ("The sky is blue. " * 6).split():
            yield w + " "  # fast: nothing awaited
        for w in ["Then", "HALLUCINATED", "facts", "appear.", "And"] + ["more"] * 2 * _GAP:
            yield w + " "
            await asyncio.sleep(0.01)
        await asyncio.sleep(1.5)
        yield "Done."

    warned, last_token = _warning_and_last_token(source())
    assert 0 < warned < last_token - 0.5


def test_a_source_whose_steps_are_not_coroutines_is_raced_too(harness: Harness) -> None:
    # an async iterator of the app's own whose __anext__ returns a future (not a coroutine): the loop's
    # create_task refuses it, so racing falls back to ensure_future, and the warning still comes mid-stall
    harness.configure(KeywordJudge(delay_s=0.3), window_sentences=1, preflight=False)

    class Futures:
        def __init__(self) -> None:
            words = ["Then", "HALLUCINATED", "facts", "appear.", "And"] + ["more"] * 2 * _GAP
            self.gaps = [(w + " ", 0.01) for w in words] + [("Done.", 1.5)]

        def __aiter__(self) -> Futures:
            return self

        def __anext__(self) -> asyncio.Future[str]:
            loop = asyncio.get_running_loop()
            fut: asyncio.Future[str] = loop.create_future()
            if not self.gaps:
                fut.set_exception(StopAsyncIteration())
                return fut
            word, gap = self.gaps.pop(0)
            loop.call_later(gap, fut.set_result, word)
            return fut

    warned, last_token = _warning_and_last_token(Futures())  # type: ignore[arg-type]
    assert 0 < warned < last_token - 0.5


def test_checkpoint_span_work_waits_until_the_next_token_was_asked_for(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # verdicts stay in flight (1 s judge) and the source is slow, so the guard races the next token against
    # them: the span work of a closed checkpoint must run after the source's step for the next token has
    # started (its own timer set), not ahead of it
    harness.configure(KeywordJudge(delay_s=1.0), window_sentences=1, preflight=False, end_wait_s=0.0)
    log: list[tuple[str, object]] = []
    real_send = GuardSession._send

    def send(self: GuardSession, window: Any, index: int, start_ns: int, end_ns: int, final: bool) -> None:
        log.append(("span", final))
        real_send(self, window, index, start_ns, end_ns, final)

    monkeypatch.setattr(GuardSession, "_send", send)

    async def source() -> AsyncIterator[str]:
        # the last two words keep the stream going after the last checkpoint that is not the tail
        for w in (GOOD + "Done and done").split():
            log.append(("step", w))
            await asyncio.sleep(0.005)
            yield w + " "

    async def main() -> None:
        async for ev in guard(source(), question="sky", contexts=CONTEXTS):
            if ev.type == "token":
                log.append(("token", ev.text))

    asyncio.run(main())
    mid = [i for i, (kind, final) in enumerate(log) if kind == "span" and not final]
    assert len(mid) >= 3, log
    for i in mid:
        assert [k for k, _ in log[i - 2 : i]] == ["token", "step"], log[i - 3 : i + 1]


class _HeldPoolJudge(KeywordJudge):
    """Holds the pool's thread in its first call (a judge computing in-process) until ``gate`` is set:
    nothing else runs there meanwhile."""

    def __init__(self, gate: threading.Event) -> None:
        super().__init__()
        self.gate = gate

    async def evaluate(self, item: Any, metrics: Any) -> Any:
        self.gate.wait(10)
        return self._score(item, metrics)


@pytest.mark.parametrize("sync", [False, True], ids=["on-a-loop", "sync-source"])
@pytest.mark.parametrize("leave", [False, True], ids=["ends", "client-leaves"])
def test_checkpoints_a_busy_pool_has_not_made_are_made_before_the_stream_span_ends(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, leave: bool, sync: bool
) -> None:
    # a stream (on a loop, or a sync source without one) leaves its checkpoints' spans and requests to the
    # pool's thread; here that thread is held by the first judge call, so the later ones are still waiting
    # for it when the stream ends (or its client leaves): the stream makes them itself, in order, before
    # its own span ends, and a client that left has their requests cancelled
    gate = threading.Event()
    rt = harness.configure(_HeldPoolJudge(gate), window_sentences=1, preflight=False, end_wait_s=0.0)
    ended: list[tuple[str, bool, Any]] = []  # span name, ended on the pool's thread, checkpoint index
    real_on_end = JudgeSpanProcessor.on_end

    def on_end(self: JudgeSpanProcessor, span: Any) -> None:
        on_pool = threading.get_ident() == rt.service.pool._loop_thread
        ended.append((span.name, on_pool, span.attributes.get(semconv.CHECKPOINT_INDEX)))
        real_on_end(self, span)

    monkeypatch.setattr(JudgeSpanProcessor, "on_end", on_end)

    async def main() -> None:
        agen = guard(paced(GOOD * 2, harness), question="sky", contexts=CONTEXTS).__aiter__()
        n = 0
        async for ev in agen:
            n += ev.type == "token"
            if leave and n == 20:
                break
        await agen.aclose()

    def words_sync() -> Iterator[str]:
        for w in (GOOD * 2).split(" "):
            yield w + " "
            time.sleep(0.002)

    def main_sync() -> None:
        gen = iter(guard(words_sync(), question="sky", contexts=CONTEXTS))
        n = 0
        for ev in gen:
            n += ev.type == "token"
            if leave and n == 20:
                break
        gen.close()  # type: ignore[attr-defined]

    try:
        if sync:
            main_sync()
        else:
            asyncio.run(main())
    finally:
        gate.set()
    names = [name for name, _, _ in ended]
    assert names[-1] == semconv.SPAN_STREAM, names
    made = [on_pool for name, on_pool, _ in ended if name == semconv.SPAN_CHECKPOINT]
    assert made[0] and not all(made), ended  # the pool made the first; the stream, those it had not
    order = [index for name, _, index in ended if name == semconv.SPAN_CHECKPOINT]
    assert order == sorted(order), order
    spans = harness.spans()
    stream = by_name(spans, semconv.SPAN_STREAM)[0]
    cps = by_name(spans, semconv.SPAN_CHECKPOINT)
    assert len(cps) == len(made) == stream.attributes[semconv.STREAM_CHECKPOINTS]
    if leave:
        assert stream.attributes[semconv.STREAM_OUTCOME] == "disconnected"
        later = sorted(cps, key=lambda c: c.attributes[semconv.CHECKPOINT_INDEX])[1:]
        assert later and {c.attributes[semconv.EVAL_STATUS] for c in later} <= {"cancelled", "superseded"}
    else:
        assert {c.attributes[semconv.EVAL_STATUS] for c in cps} <= {"judged", "superseded"}


def test_sentences_of_one_burst_share_a_checkpoint_that_names_each_sentence(harness: Harness) -> None:
    # every word at hand (no loop pass between them): nobody could be warned between two windows, so the
    # windows go out as one checkpoint - one span, one judge call - and its verdict still names the failing
    # sentence, not the window
    harness.configure(SentenceJudge(), window_sentences=1, preflight=False)
    answer = f"The sky is blue. Grass is green. Then {MARK} facts appear. Water is wet. The sky is blue again."
    events = run(guard(words(answer), question="sky", contexts=CONTEXTS))
    spans = harness.spans()
    (cp,) = by_name(spans, semconv.SPAN_CHECKPOINT)
    assert cp.attributes[semconv.CHECKPOINT_CHAR_START] == 0
    assert cp.attributes[semconv.CHECKPOINT_CHAR_END] == len(answer) + 1
    assert cp.attributes[semconv.CHECKPOINT_SENTENCES] == 5
    assert by_name(spans, semconv.SPAN_STREAM)[0].attributes[semconv.STREAM_CHECKPOINTS] == 1
    (warning,) = [e for e in events if e.type == "warning"]
    assert warning.data is not None
    assert [answer[s["start"] : s["end"]] for s in warning.data["sentences"]] == [f"Then {MARK} facts appear."]


def test_a_judge_without_sentence_scores_gets_each_window_of_a_burst_on_its_own(harness: Harness) -> None:
    # a single score per text would fail a joined burst as a whole: with such a judge the guard sends each
    # window as its own checkpoint (the pool may still merge queued ones under load, and says so)
    harness.configure(SyncKeywordJudge(), window_sentences=1, preflight=False)
    run(guard(words(BAD), question="sky", contexts=CONTEXTS))
    cps = sorted(by_name(harness.spans(), semconv.SPAN_CHECKPOINT),
                 key=lambda c: c.attributes[semconv.CHECKPOINT_INDEX])
    assert [c.attributes[semconv.CHECKPOINT_SENTENCES] for c in cps] == [1, 1, 1, 1, 1]
    assert [c.attributes[semconv.CHECKPOINT_TEXT].strip() for c in cps] == [
        "The sky is blue.", "Grass is green.", "Then HALLUCINATED facts appear.", "And more of them.",
        "Last one here.",
    ]


def test_a_source_that_yields_to_the_loop_gets_a_checkpoint_per_window(harness: Harness) -> None:
    # a model's stream (a read per token) lets the loop run between tokens: each window is its own checkpoint
    harness.configure(SyncKeywordJudge(), window_sentences=1, preflight=False)
    run(guard(paced(BAD, harness), question="sky", contexts=CONTEXTS))
    cps = by_name(harness.spans(), semconv.SPAN_CHECKPOINT)
    assert [c.attributes[semconv.CHECKPOINT_SENTENCES] for c in cps] == [1, 1, 1, 1, 1]
    assert [c.attributes[semconv.CHECKPOINT_INDEX] for c in cps] == [0, 1, 2, 3, 4]


def _count_feeds(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    fed: list[str] = []
    feed = SentenceBuffer.feed

    def counting(self: SentenceBuffer, token: str) -> tuple[Sentence, ...]:
        fed.append(token)
        return feed(self, token)

    monkeypatch.setattr(SentenceBuffer, "feed", counting)
    return fed


@pytest.mark.parametrize("preflight", [True, False])
def test_a_burst_is_scanned_for_sentences_once_when_the_loop_runs(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, preflight: bool
) -> None:
    # every token at hand: the pre-flight request waits for the loop's next pass, and the tokens' sentence
    # work waits with it (without a pre-flight request, the same from the first token). The tokens go out
    # untouched, and the windows are found in one scan of their text, the same sentences as feeding token
    # by token
    harness.configure(SyncKeywordJudge(), window_sentences=1, preflight=preflight)
    fed = _count_feeds(monkeypatch)
    text = GOOD * 5
    events = run(guard(words(text), question="sky", contexts=CONTEXTS))
    tokens = [e.text for e in events if e.type == "token"]
    assert "".join(tokens) == "".join(w + " " for w in text.split(" "))
    assert len(fed) <= 2 < len(tokens)  # one scan of the burst (and the tail's flush)
    cps = sorted(by_name(harness.spans(), semconv.SPAN_CHECKPOINT),
                 key=lambda c: c.attributes[semconv.CHECKPOINT_CHAR_START])
    assert "".join(c.attributes[semconv.CHECKPOINT_TEXT] for c in cps) == "".join(tokens)
    assert sum(c.attributes[semconv.CHECKPOINT_SENTENCES] for c in cps) == len(split_sentences(text))


@pytest.mark.parametrize("consumer", ["async for", "a span per step"])
def test_tokens_at_hand_go_out_before_the_stream_starts_and_the_start_takes_them(
    harness: Harness, consumer: str
) -> None:
    # the first tokens are at hand (a replayed answer, a chunk of many tokens): they go out before the
    # stream's start, which runs when the loop next does; the stream is then the same as if it had started
    # first: one span under the request, every token counted and judged, its sentences named
    rt = harness.configure(KeywordJudge(), window_sentences=1)
    at_hand = BAD.split(" ")[:6]  # "The sky is blue. Grass is": ends mid-sentence
    rest = ["green. ", "Then ", "HALLUCINATED ", "facts ", "appear. ", "Déjà ", "vu. "]

    async def source() -> AsyncIterator[str]:
        for w in at_hand:
            yield w + " "
        if consumer == "async for":
            await asyncio.sleep(0)  # the loop's pass: the stream starts
        for w in rest:  # else the start comes with "Déjà ", a token of another kind (not ASCII)
            yield w
            if consumer == "async for":
                await asyncio.sleep(0.002)

    started: list[bool] = []

    async def consume() -> list[StreamEvent]:
        tracer = rt.tracer_provider.get_tracer("app")
        with tracer.start_as_current_span("request"):
            stream = guard(source(), question="sky", contexts=CONTEXTS)
            out = []
            if consumer == "async for":
                async for ev in stream:
                    if ev.type == "token":
                        started.append(stream.session.span is not None)
                    with tracer.start_as_current_span("send"):  # the consumer's own span, per event
                        out.append(ev)
                return out
            steps = aiter(stream)
            while True:
                # each step under a span of the consumer's: the stream belongs under the first, where it
                # began, as when it started on its first step
                with tracer.start_as_current_span("send"):
                    try:
                        ev = await anext(steps)
                    except StopAsyncIteration:
                        return out
                if ev.type == "token":
                    started.append(stream.session.span is not None)
                out.append(ev)

    events = asyncio.run(consume())
    text = "".join(w + " " for w in at_hand) + "".join(rest)
    assert text_of(events) == text
    ahead = len(at_hand) + (0 if consumer == "async for" else rest.index("Déjà "))
    assert started == [False] * ahead + [True] * (len(at_hand) + len(rest) - ahead)
    spans = harness.spans()
    stream = by_name(spans, semconv.SPAN_STREAM)[0]
    request = by_name(spans, "request")[0]
    sends = sorted(by_name(spans, "send"), key=lambda x: x.start_time)
    parent = request if consumer == "async for" else sends[0]
    assert stream.parent.span_id == parent.context.span_id
    assert stream.attributes[semconv.STREAM_TOKENS] == len(at_hand) + len(rest)
    assert stream.attributes[semconv.STREAM_TTFT_MS] >= 0
    cps = sorted(by_name(spans, semconv.SPAN_CHECKPOINT), key=lambda c: c.attributes[semconv.CHECKPOINT_INDEX])
    assert "".join(c.attributes[semconv.CHECKPOINT_TEXT] for c in cps) == text
    warning = next(e for e in events if e.type == "warning")
    assert [text[x["start"]:x["end"]].strip() for x in warning.data["sentences"]] == [
        "Then HALLUCINATED facts appear."
    ]


@pytest.mark.parametrize("how", ["raises", "client leaves"])
def test_a_burst_before_the_start_that_fails_or_is_left_still_ends_its_stream_span(
    harness: Harness, how: str
) -> None:
    harness.configure(KeywordJudge())

    async def source() -> AsyncIterator[str]:
        for w in GOOD.split(" "):
            yield w + " "
        raise ValueError("the model broke")

    async def consume() -> None:
        stream = aiter(guard(source(), question="sky", contexts=CONTEXTS))
        if how == "raises":
            with pytest.raises(ValueError):
                async for _ev in stream:
                    pass
        else:
            for _ in range(3):
                await anext(stream)
            await stream.aclose()  # type: ignore[attr-defined]

    asyncio.run(consume())
    stream_span = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    outcome = "error" if how == "raises" else "disconnected"
    assert stream_span.attributes[semconv.STREAM_OUTCOME] == outcome
    assert stream_span.attributes[semconv.STREAM_TOKENS] == (len(GOOD.split(" ")) if how == "raises" else 3)


@pytest.mark.parametrize("first_step", ["waits", "ends"])
def test_streams_that_begin_together_start_a_slice_a_pass_and_once_each(
    harness: Harness, monkeypatch: pytest.MonkeyPatch, first_step: str
) -> None:
    # streams that begin in one pass queue their starts for the next: a pass runs a slice of them, then the
    # loop's due timers (live streams' tokens) run before the next slice. A stream whose source ended
    # before its queued start ran was started by its driver: the queue skips it
    harness.configure(KeywordJudge())
    monkeypatch.setattr(_drivers, "_START_SLICE_S", 0.0)  # one start a pass
    order: list[str] = []
    real_start = GuardSession.start

    def start(self: GuardSession) -> list[StreamEvent]:
        order.append("start")
        return real_start(self)

    monkeypatch.setattr(GuardSession, "start", start)
    streams = 4

    async def source(i: int) -> AsyncIterator[str]:
        if i == streams - 1:  # a live stream's token, due at the next pass
            asyncio.get_running_loop().call_later(0, order.append, "timer")
        if first_step == "ends":
            return
        await asyncio.sleep(0.01)
        yield "The sky is blue. "

    async def consume(i: int) -> list[StreamEvent]:
        return [ev async for ev in guard(source(i), question="sky", contexts=CONTEXTS)]

    async def main() -> list[list[StreamEvent]]:
        return await asyncio.gather(*(consume(i) for i in range(streams)))

    results = asyncio.run(main())
    if first_step == "waits":
        # all in one pass, the timer would come after every start
        assert order == ["start", "timer", "start", "start", "start"]
        assert [text_of(r) for r in results] == ["The sky is blue. "] * streams
    else:
        # each driver started its stream at the source's end, before the queue's first slice
        assert order == ["start"] * streams + ["timer"]
    stream_spans = by_name(harness.spans(), semconv.SPAN_STREAM)
    assert len(stream_spans) == streams
    assert all(s.attributes[semconv.STREAM_OUTCOME] == "completed" for s in stream_spans)


def test_a_first_token_that_comes_before_its_queued_start_goes_out_first(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # three streams begin in one pass and their sources need a loop pass per token: with one start a pass,
    # the later streams' first tokens come before their starts ran. Those tokens go out first, and each
    # stream is then whole: its span, every token counted, its checkpoints covering the answer, its
    # failing sentence named
    harness.configure(KeywordJudge(), window_sentences=1)
    monkeypatch.setattr(_drivers, "_START_SLICE_S", 0.0)
    words = BAD.split(" ")
    streams = 3

    async def source() -> AsyncIterator[str]:
        for w in words:
            await asyncio.sleep(0)
            yield w + " "

    async def consume() -> tuple[list[StreamEvent], list[bool]]:
        stream = guard(source(), question="sky", contexts=CONTEXTS)
        out, started = [], []
        async for ev in stream:
            if ev.type == "token":
                started.append(stream.session.span is not None)
            out.append(ev)
        return out, started

    async def main() -> list[tuple[list[StreamEvent], list[bool]]]:
        return await asyncio.gather(*(consume() for _ in range(streams)))

    results = asyncio.run(main())
    text = "".join(w + " " for w in words)
    assert [started[0] for _, started in results] == [True, False, False]
    spans = harness.spans()
    stream_spans = by_name(spans, semconv.SPAN_STREAM)
    assert len(stream_spans) == streams
    for events, _ in results:
        assert text_of(events) == text
        warning = next(e for e in events if e.type == "warning")
        assert [text[x["start"]:x["end"]].strip() for x in warning.data["sentences"]] == [
            "Then HALLUCINATED facts appear."
        ]
    for span in stream_spans:
        assert span.attributes[semconv.STREAM_TOKENS] == len(words)
        cps = sorted((c for c in by_name(spans, semconv.SPAN_CHECKPOINT)
                      if c.parent.span_id == span.context.span_id),
                     key=lambda c: c.attributes[semconv.CHECKPOINT_INDEX])
        assert "".join(c.attributes[semconv.CHECKPOINT_TEXT] for c in cps) == text


def test_a_source_that_yields_to_the_loop_feeds_each_token_at_once(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # between a model's tokens the loop runs and sends what was deferred: nothing waits, so each token's
    # sentence work is done as it comes (a window closes at its last token, and its verdict can come
    # before the next token)
    harness.configure(SyncKeywordJudge(), window_sentences=1)
    fed = _count_feeds(monkeypatch)
    events = run(guard(paced(BAD, harness), question="sky", contexts=CONTEXTS))
    assert fed == [e.text for e in events if e.type == "token"]


def test_hold_back_never_joins_windows_and_joined_windows_are_capped(harness: Harness) -> None:
    # hold-back releases each window's tokens on its own verdict: a burst keeps its windows
    harness.configure(SyncKeywordJudge(), window_sentences=1, preflight=False, mode="hold_back")
    run(guard(words(GOOD), question="sky", contexts=CONTEXTS))
    assert len(by_name(harness.spans(), semconv.SPAN_CHECKPOINT)) == 4
    # a long burst: joined windows stop growing at the cap, and together they cover the answer once
    harness.configure(SyncKeywordJudge(), window_sentences=1, preflight=False)
    text = GOOD * 400
    run(guard(words(text), question="sky", contexts=CONTEXTS))
    cps = sorted(by_name(harness.spans(), semconv.SPAN_CHECKPOINT),
                 key=lambda c: c.attributes[semconv.CHECKPOINT_CHAR_START])
    assert len(cps) > 1
    assert all(c.attributes[semconv.CHECKPOINT_CHAR_END] - c.attributes[semconv.CHECKPOINT_CHAR_START]
               <= MAX_JOINED_CHARS for c in cps)
    assert [c.attributes[semconv.CHECKPOINT_CHAR_START] for c in cps[1:]] == [
        c.attributes[semconv.CHECKPOINT_CHAR_END] for c in cps[:-1]]
    assert cps[-1].attributes[semconv.CHECKPOINT_CHAR_END] == len(text) + 1


def _count_rings(monkeypatch: pytest.MonkeyPatch, waker: Any) -> list[int]:
    """Counts the writes to the pipe of ``waker``'s loop bell (one per cross-thread wake-up)."""
    from streamjudge import _wakefd

    fd = waker._bell._fd
    assert fd is not None
    rings = [0]
    real = _wakefd.write_nonblocking

    def counting(target: int, data: Any) -> int:
        rings[0] += target == fd._w
        return real(target, data)

    monkeypatch.setattr(_wakefd, "write_nonblocking", counting)
    return rings


def test_only_a_verdict_the_reader_sees_wakes_a_stream_waiting_for_its_next_token(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a model that pauses after each sentence, long enough for its checkpoint's verdict to land: a pass
    # (or the pre-flight gate's pass) has nothing to tell the reader, so it waits for the next token
    # instead of waking the loop; a failure wakes it at once, and at the end of the stream every verdict
    # does (the end wait counts them)
    from streamjudge.judging._drivers import _LoopBell

    harness.configure(KeywordJudge(delay_s=0.01), window_sentences=1, end_wait_s=5.0)
    rings: list[float] = []
    real = _LoopBell.ring

    def counting(self: _LoopBell, waker: Any) -> None:
        rings.append(time.perf_counter())
        real(self, waker)

    monkeypatch.setattr(_LoopBell, "ring", counting)
    arrived: dict[str, float] = {}

    async def source() -> AsyncIterator[str]:
        # a sentence ends where the next one starts: each pause comes after the next sentence's first word
        for sentence, first in (("The sky is blue. ", "Grass "), ("is green. ", "Water "), ("is wet. ", "Then ")):
            yield sentence
            yield first
            await asyncio.sleep(0.15)  # the sentence's verdict lands here
        yield "HALLUCINATED facts appear. "
        yield "And "
        await asyncio.sleep(0.3)  # its warning comes during this pause
        arrived["last"] = time.perf_counter()
        yield "more."

    async def consume() -> list[StreamEvent]:
        out = []
        async for ev in guard(source(), question="sky", contexts=CONTEXTS):
            arrived.setdefault(ev.type, time.perf_counter())
            out.append(ev)
        return out

    t0 = time.perf_counter()
    events = asyncio.run(consume())
    ended = time.perf_counter()
    assert ended - t0 < 3.0  # the end wait ended with the last verdict, not after its 5 s
    assert [e.type for e in events].count("warning") == 1
    done = events[-1].data
    assert done is not None and done["checkpoints"] == 5 and done["alerts"] == 1
    assert arrived["warning"] < arrived["last"]  # during the pause, not with the next token
    # the failure's; not the pre-flight gate's pass, not the three passes
    assert len([t for t in rings if t < arrived["last"]]) == 1


def _verdict(kind: str, status: str, value: float | None) -> Any:
    from streamjudge.results import JobOutcome, JudgeResult, Score, Verdict

    metric = semconv.CONTEXT_PRECISION if kind == "preflight" else "faithfulness"
    label = None if value is None else ("pass" if value >= 0.5 else "fail")
    scores = () if value is None else (Score(metric, value, label=label),)
    result = JudgeResult("t", scores) if status == "judged" else None
    return Verdict(kind, 0, JobOutcome(status, result), scores)  # type: ignore[arg-type]


@pytest.mark.parametrize(("mode", "kind", "status", "value", "wakes"), [
    ("stream_first", "checkpoint", "judged", 1.0, False),  # a pass: nothing to show
    ("stream_first", "checkpoint", "error", None, False),  # not judged: recorded on the span only
    ("stream_first", "checkpoint", "judged", 0.0, True),  # a failure: a warning
    ("stream_first", "preflight", "judged", 1.0, False),  # the gate passes
    ("stream_first", "preflight", "judged", 0.0, True),  # the gate warns
    ("hold_back", "checkpoint", "judged", 1.0, True),  # a pass releases the window's tokens
    ("hold_back", "checkpoint", "error", None, True),  # so does a window that could not be judged
])
def test_a_hushed_session_wakes_its_driver_only_for_what_the_reader_sees(
    harness: Harness, mode: str, kind: str, status: str, value: float | None, wakes: bool
) -> None:
    harness.configure(KeywordJudge(), mode=mode, preflight_threshold=0.5)
    session = GuardSession(question="sky", contexts=CONTEXTS)
    woken: list[bool] = []
    session.set_notify(lambda: woken.append(True))
    session.start()
    session.hush_passes(True)
    session.post(_verdict(kind, status, value))
    assert bool(woken) is wakes
    assert session.has_events  # drained with the next token either way
    session.hush_passes(False)  # the end wait: every verdict wakes
    session.post(_verdict(kind, status, value))
    assert woken
    session.finish()


def test_verdicts_posted_together_wake_the_waiting_stream_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # the pool often posts several verdicts at once (a merged job's and those it superseded): one
    # cross-thread wake-up of the loop is enough; a verdict after the stream woke wakes it again
    from streamjudge.judging._drivers import AsyncWaker

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        waker = AsyncWaker(loop)
        rings = _count_rings(monkeypatch, waker)

        waiting = asyncio.ensure_future(waker.wait(None, 5.0))
        await asyncio.sleep(0)  # the stream now waits
        # five verdicts before the loop can run the first wake-up (posted here, between two awaits, so the
        # loop cannot run in between; the pool's thread posts them the same way while it holds the GIL)
        for _ in range(5):
            waker.notify()
        await asyncio.wait_for(waiting, 1.0)
        first = rings[0]
        waiting = asyncio.ensure_future(waker.wait(None, 5.0))
        await asyncio.sleep(0)
        await asyncio.to_thread(waker.notify)
        await asyncio.wait_for(waiting, 1.0)
        return first, rings[0]

    first, total = asyncio.run(main())
    assert first == 1
    assert total == 2


def test_verdicts_for_many_streams_posted_together_wake_their_loop_once(monkeypatch: pytest.MonkeyPatch) -> None:
    # a worker's replies for many streams arrive in one read: the pool's thread rings one wake-up for all
    # the streams of a loop (each call_soon_threadsafe is a self-pipe write), and every stream wakes
    from streamjudge.judging._drivers import AsyncWaker

    async def main() -> tuple[int, int]:
        loop = asyncio.get_running_loop()
        wakers = [AsyncWaker(loop) for _ in range(20)]
        rings = _count_rings(monkeypatch, wakers[0])
        waiting = [asyncio.ensure_future(w.wait(None, 5.0)) for w in wakers]
        await asyncio.sleep(0)  # every stream now waits

        def pool_thread() -> None:
            for w in wakers:
                w.notify()

        # the loop is busy (blocked here) while the pool's thread posts: as under load, it runs the
        # wake-up only after the last verdict came
        thread = threading.Thread(target=pool_thread)
        thread.start()
        thread.join(5)
        await asyncio.wait_for(asyncio.gather(*waiting), 1.0)
        first = rings[0]
        # and later verdicts ring again
        again = asyncio.ensure_future(wakers[3].wait(None, 5.0))
        await asyncio.sleep(0)
        await asyncio.to_thread(wakers[3].notify)
        await asyncio.wait_for(again, 1.0)
        return first, rings[0]

    first, total = asyncio.run(main())
    assert first == 1
    assert total == 2


# --- the source is asked for its first token before the stream opens -----------------------------------


def test_the_source_is_asked_for_its_first_token_before_the_stream_span_is_made(harness: Harness) -> None:
    rt = harness.configure(SyncKeywordJudge(), preflight_action="warn")
    order: list[str] = []
    submit = rt.service.submit

    def recording(request: Any) -> Any:
        order.append(request.item.kind)
        return submit(request)

    rt.service.submit = recording  # type: ignore[method-assign]
    holder: list[Any] = []
    asked_ns: list[int] = []

    async def thinking() -> AsyncIterator[str]:
        asked_ns.append(time.time_ns())
        order.append("asked" if holder[0].session.span is None else "asked after the span")
        await asyncio.sleep(0.05)  # the model's time to first token
        for w in GOOD.split(" "):
            order.append("token")
            yield w + " "

    stream = guard(thinking(), question="unrelated", contexts=CONTEXTS)
    holder.append(stream)
    events = run(stream)
    # the span is made (and the gate's request sent) while the model works on its first token, not before
    # the request for it
    assert order[:2] == ["asked", "preflight"] and order[2] == "token"
    assert text_of(events) == "".join(w + " " for w in GOOD.split(" "))
    span = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    # its start and the time to first token still count from the request for that token
    assert span.start_time <= asked_ns[0]
    assert span.attributes[semconv.STREAM_TTFT_MS] >= 50
    first = [e for e in span.events if e.name == semconv.EVENT_FIRST_TOKEN]
    assert len(first) == 1 and first[0].timestamp - span.start_time >= 50_000_000


def test_a_source_that_fails_before_its_first_token_still_has_its_stream_span(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), preflight=False)

    async def failing() -> AsyncIterator[str]:
        await asyncio.sleep(0.01)
        raise RuntimeError("model down")
        yield "never"  # pragma: no cover

    with pytest.raises(RuntimeError, match="model down"):
        run(guard(failing(), question="q", contexts=CONTEXTS))
    span = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert span.attributes[semconv.STREAM_OUTCOME] == "error"
    assert span.attributes[semconv.STREAM_TOKENS] == 0
    assert any(e.name == "exception" for e in span.events)


def test_a_client_that_leaves_before_the_first_token_ends_the_stream_as_disconnected(harness: Harness) -> None:
    harness.configure(SyncKeywordJudge(), preflight=False)

    async def slow() -> AsyncIterator[str]:
        await asyncio.sleep(5)
        yield "late"  # pragma: no cover

    async def leave() -> None:
        task = asyncio.ensure_future(run_async(guard(slow(), question="q", contexts=CONTEXTS)))
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave())
    span = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert span.attributes[semconv.STREAM_OUTCOME] == "disconnected"


async def run_async(stream: Any) -> list[StreamEvent]:
    return [ev async for ev in stream]


def test_an_app_guarded_answer_is_claimed_before_its_source_runs(harness: Harness) -> None:
    # zero-code wrappers learn that the app guards this answer itself before the source's first step can
    # reach the model (whose tap would otherwise open a second session for it)
    from streamjudge.judging import _backend

    rt = harness.configure(SyncKeywordJudge(), preflight=False)
    claims: list[tuple[int, bool]] = []
    holder: list[Any] = []

    def listener(trace_id: int, session: object) -> None:
        claims.append((trace_id, bool(holder) and holder[0].session.span is not None))

    _backend.on_stream_start(listener)
    try:
        async def source() -> AsyncIterator[str]:
            claims.append((-1, False))  # the source's first step
            await asyncio.sleep(0.01)
            yield "The sky is blue. "

        with rt.tracer.start_as_current_span("request") as request:
            stream = guard(source(), question="q", contexts=CONTEXTS)
            holder.append(stream)
            run(stream)
            trace_id = request.get_span_context().trace_id
    finally:
        _backend._listeners.remove(listener)
    # the claim names the request's trace, and comes before the source's first step and the stream's span
    assert claims[0] == (trace_id, False) and claims[1] == (-1, False)


async def _burst_after_a_failing_sentence(pulled: list[int]) -> AsyncIterator[str]:
    """A failing sentence, sent to the judge on a loop pass, then a long burst (no loop pass) during which
    its verdict lands; ``pulled`` gets one entry per burst token asked for."""
    yield "Then HALLUCINATED facts appear. "
    yield "Grass "  # the failing sentence is complete: its window closes
    await asyncio.sleep(0)  # the loop's pass sends it to the judge
    yield "is green. "
    yield "Water "  # closes the next window: its tokens are held from here, a burst
    for i in range(200):
        pulled.append(i)
        time.sleep(0.01)  # no loop pass, the pool's thread answers meanwhile
        yield f"w{i} "


def test_a_verdict_that_lands_during_a_burst_is_acted_on_before_the_next_token(harness: Harness) -> None:
    """A burst's tokens skip the per-token checks (the session holds them for the loop's next pass); a
    verdict posted by the pool's thread meanwhile still stops the stream before the token after it."""
    # the verdict lands a few tokens into the burst
    harness.configure(KeywordJudge(delay_s=0.05), action="stop", window_sentences=1, preflight=False)
    pulled: list[int] = []
    events = run(guard(_burst_after_a_failing_sentence(pulled), question="sky", contexts=CONTEXTS))
    types = [e.type for e in events]
    assert "stop" in types
    assert types[types.index("stop") + 1 :] == ["done"]  # no token after the stop
    assert 1 < len(pulled) < 200  # the stop came mid-burst, not at its start or end
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_TOKENS] == types.count("token")


@pytest.mark.parametrize("leave_at", [None, 40])
def test_a_judged_burst_counts_and_keeps_every_token_it_sent(harness: Harness, leave_at: int | None) -> None:
    """Tokens at hand are held for the loop's next pass and appended by the driver: the stream span
    counts each one and its answer is what the client got, whether it read to the end or left."""
    harness.configure(SentenceJudge())
    words_ = [f"w{i}{'.' if i % 9 == 8 else ''} " for i in range(100)]

    async def go() -> list[str]:
        got: list[str] = []
        stream = guard(_tokens(words_), question="sky", contexts=CONTEXTS).__aiter__()
        async for ev in stream:
            if ev.type == "token":
                got.append(ev.text)
            if len(got) == leave_at:
                break
        await stream.aclose()  # type: ignore[attr-defined]
        return got

    got = asyncio.run(go())
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_TOKENS] == len(got) == (leave_at or len(words_))
    assert stream.attributes[semconv.STREAM_ANSWER] == "".join(got)
    assert stream.attributes[semconv.STREAM_OUTCOME] == ("disconnected" if leave_at else "completed")
    if leave_at is None:  # every sentence reached a checkpoint
        cps = by_name(harness.spans(), semconv.SPAN_CHECKPOINT)
        assert max(c.attributes[semconv.CHECKPOINT_CHAR_END] for c in cps) == len("".join(words_))


def test_a_source_that_fails_mid_burst_counts_the_tokens_it_sent(harness: Harness) -> None:
    harness.configure(SentenceJudge())

    async def source() -> AsyncIterator[str]:
        for i in range(30):
            yield f"w{i}{'.' if i % 9 == 8 else ''} "
        raise RuntimeError("model connection reset")

    got: list[str] = []

    async def go() -> None:
        async for ev in guard(source(), question="sky", contexts=CONTEXTS):
            if ev.type == "token":
                got.append(ev.text)

    with pytest.raises(RuntimeError, match="connection reset"):
        asyncio.run(go())
    stream = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert stream.attributes[semconv.STREAM_OUTCOME] == "error"
    assert stream.attributes[semconv.STREAM_TOKENS] == len(got) == 30
    assert stream.attributes[semconv.STREAM_ANSWER] == "".join(got)


def test_a_regeneration_asked_for_mid_burst_drops_the_token_that_saw_the_verdict(harness: Harness) -> None:
    """The verdict lands during a burst: the token pulled with it belongs to the retracted answer, so the
    regenerated answer starts with its own first token, not with that one."""
    harness.configure(KeywordJudge(delay_s=0.05), action="regenerate", window_sentences=1, preflight=False)

    def regenerate(req: RegenerateRequest) -> AsyncIterator[str]:
        return _aiter(["Fixed", " answer."])

    events = run(guard(_burst_after_a_failing_sentence([]), question="sky", contexts=CONTEXTS,
                       regenerate=regenerate))
    types = [e.type for e in events]
    assert "retract" in types
    after = [e.text for e in events[types.index("retract") + 1 :] if e.type == "token"]
    assert after == ["Fixed", " answer."]


def test_hold_back_time_to_first_token_is_when_the_client_got_it(harness: Harness) -> None:
    # the first window waits 50 ms for its verdict: the client's first token leaves after it, and that is
    # the stream's time to first token; the model's is kept as its own attribute
    harness.configure(KeywordJudge(delay_s=0.05), mode="hold_back", window_sentences=1, preflight=False)
    events = run(guard(_tokens([w + " " for w in GOOD.split(" ")]), question="q", contexts=CONTEXTS))
    assert text_of(events).strip() == GOOD.strip()
    span = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    client, model = span.attributes[semconv.STREAM_TTFT_MS], span.attributes[semconv.STREAM_MODEL_TTFT_MS]
    assert client >= model + 50
    (first,) = [e for e in span.events if e.name == semconv.EVENT_FIRST_TOKEN]
    assert first.timestamp - span.start_time >= client * 1e6 - 1e3


@pytest.mark.parametrize("mode", ["stream_first", "hold_back"])
def test_a_token_too_large_to_judge_whole_passes_through_and_is_counted(harness: Harness, mode: str) -> None:
    from streamjudge.judging._windows import MAX_TOKEN_CHARS

    judge = SyncKeywordJudge()
    harness.configure(judge, mode=mode, preflight=False, final_reconcile=False)
    big = "The sky is blue. " * (MAX_TOKEN_CHARS // 17 + 100)
    tokens = ["Grass is green. ", big, "Water is wet."]
    events = run(guard(_tokens(tokens), question="q", contexts=CONTEXTS))
    assert text_of(events) == "".join(tokens)  # every char reached the client, in order
    judged = "".join(c.answer for c in judge.calls)
    assert len(judged) <= len(tokens[0]) + MAX_TOKEN_CHARS + len(tokens[2])
    assert judged.startswith("Grass is green. The sky is blue.")
    span = by_name(harness.spans(), semconv.SPAN_STREAM)[0]
    assert span.attributes[semconv.STREAM_UNJUDGED_CHARS] == len(big) - MAX_TOKEN_CHARS
    assert "token:too_large" in span.attributes[semconv.SKIP_REASONS]


def test_a_stream_fed_after_its_client_left_judges_and_keeps_nothing_more(harness: Harness) -> None:
    # a model the client left runs on (a sync node in a worker thread cannot be cancelled) and its tap
    # still feeds the session: nothing of it may reach the pool, or the pool tracks the stream forever
    judge = SyncKeywordJudge()
    rt = harness.configure(judge, window_sentences=1, preflight=False)
    session = GuardSession(question="q", contexts=CONTEXTS)
    session.start()
    for tok in ("The sky is blue. ", "Grass is green. "):
        session.accept(tok)
    session.abort("disconnected")
    calls = len(judge.calls)
    for _ in range(50):
        session.accept("Water is wet. ")
    session.close_tail()
    assert session.finish() == []
    deadline = time.monotonic() + 5
    while rt.pool.depth and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(judge.calls) == calls
    assert rt.pool.tracked_streams == 0
    (stream,) = by_name(harness.spans(), semconv.SPAN_STREAM)
    assert stream.attributes[semconv.STREAM_OUTCOME] == "disconnected"
    assert len(by_name(harness.spans(), semconv.SPAN_CHECKPOINT)) <= 2
