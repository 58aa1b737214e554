"""The seam between the live stream and judging: requests, verdicts about sentences, per-stream settings.

The guard is driven here against a fake judging service that records each request and answers it at once on
the calling thread — no pool, no threads, no sleeps — so what the guard asks for and what it does with the
answer can be checked exactly.
"""

from __future__ import annotations

import ast
import asyncio
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

import streamjudge
from _fakes import GatedJudge
from conftest import Harness
from streamjudge import semconv
from streamjudge._context import ContextStore
from streamjudge.config import Settings
from streamjudge.judging.base import EvalInput, JudgeResult, Score, SentenceScore
from streamjudge.judging.guard import set_fast_paths
from streamjudge.judging.pool import JudgePool
from streamjudge.judging.processor import JudgeSpanProcessor
from streamjudge.judging.service import JudgingService
from streamjudge.results import JobOutcome, JudgeRequest, Verdict
from streamjudge.sentences import split_sentences

CONTEXTS = ("The sky is blue. Grass is green. Water is wet.",)


@pytest.fixture(autouse=True, params=["fast_paths", "plain_paths"])
def _driver_paths(request: pytest.FixtureRequest) -> Iterator[None]:
    """Every seam test runs with the driver's fast paths on and off: they must do what the plain path does."""
    set_fast_paths(request.param == "fast_paths")
    try:
        yield
    finally:
        set_fast_paths(True)
MARK = "HALLUCINATED"


def sentence_scores(text: str) -> tuple[float, tuple[SentenceScore, ...]]:
    """Per sentence: 0 when it carries the marker, else 1; the value is the share of good sentences."""
    sentences = tuple(
        SentenceScore(s.start, s.end, 0.0 if MARK in s.text else 1.0, "contains the marker" if MARK in s.text else "")
        for s in split_sentences(text)
    )
    value = sum(s.value for s in sentences) / len(sentences) if sentences else 1.0
    return value, sentences


class SentenceJudge:
    """Scores each sentence of the judged text (a stand-in for the local judge, exact and instant)."""

    name = "sentences"
    scores_sentences = True

    def __init__(self) -> None:
        self.items: list[EvalInput] = []

    def score(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        self.items.append(item)
        out = []
        for m in metrics:
            if m == semconv.FAITHFULNESS and item.answer:
                value, sentences = sentence_scores(item.answer)
                out.append(Score(m, value, sentences=sentences))
            else:
                out.append(Score(m, 0.9))
        return JudgeResult(self.name, tuple(out))

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        return self.score(item, metrics)

    async def aclose(self) -> None:
        return None


class FakeService:
    """Records requests and posts each verdict synchronously, as the real service would from its thread."""

    def __init__(self, judge: SentenceJudge, *, sampled: bool = True) -> None:
        self.judge = judge
        self.requests: list[JudgeRequest] = []
        self._sampled = sampled

    def sampled(self, trace_id: int) -> bool:
        return self._sampled

    def submit(self, request: JudgeRequest) -> bool:
        self.requests.append(request)
        result = self.judge.score(request.item, request.metrics)
        scores = tuple(s.with_label(request.threshold_for(s.name), shift=request.item.offset) for s in result.scores)
        item = request.item
        assert request.reply is not None
        request.reply(Verdict(request.kind, request.index, JobOutcome("judged", result), scores, item.offset,
                              item.offset + len(item.answer)))
        return True

    def cancel_stream(self, stream_id: int) -> int:
        return 0

    def end_stream(self, stream_id: int) -> None:
        return None

    def stream_opened(self) -> None:
        return None

    def scores_sentences(self, kind: str) -> bool:
        return bool(getattr(self.judge, "scores_sentences", False))

    def stream_closed(self, probe: object = None) -> None:
        return None


class FakeBackend:
    """What a stream needs from the process, with a recording tracer."""

    def __init__(self, service: FakeService, settings: Settings) -> None:
        self.exporter = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(self.exporter))
        self.tracer = provider.get_tracer("test")
        self.settings = settings
        self.contexts = ContextStore()
        self.service = service


def guarded(answer: str, **settings: Any) -> tuple[list[streamjudge.StreamEvent], FakeService]:
    s = Settings(preflight=False, final_reconcile=False, **settings)
    service = FakeService(SentenceJudge())
    backend = FakeBackend(service, s)
    tokens = [w + " " for w in answer.split(" ")]
    events = list(streamjudge.guard(tokens, question="sky", contexts=CONTEXTS, runtime=backend))  # type: ignore[arg-type]
    return events, service


def warnings(events: list[streamjudge.StreamEvent]) -> list[dict[str, Any]]:
    return [dict(e.data or {}) for e in events if e.type == "warning"]


def answer_text(events: list[streamjudge.StreamEvent]) -> str:
    return "".join(e.text for e in events if e.type == "token")


def test_each_checkpoint_asks_about_its_new_sentences_with_the_text_before_as_reference() -> None:
    answer = "The sky is blue. Grass is green. Water is wet. The sky is blue again."
    events, service = guarded(answer)
    text = answer_text(events)
    cps = [r for r in service.requests if r.kind == "checkpoint"]
    assert len(cps) == 2
    # together the requests cover the answer exactly once, each at its offset
    assert "".join(r.item.answer for r in cps) == text
    for r in cps:
        assert text[r.item.offset : r.item.offset + len(r.item.answer)] == r.item.answer
        assert text[: r.item.offset].endswith(r.item.prefix)
    assert cps[1].item.prefix.startswith("The sky is blue.")


def test_a_grounded_sentence_after_a_fabricated_one_is_not_underlined() -> None:
    answer = f"The sky is blue. Grass is {MARK} purple. Water is wet."
    events, _ = guarded(answer, window_sentences=1)
    text = answer_text(events)
    (w,) = warnings(events)
    (bad,) = w["sentences"]
    assert text[bad["start"] : bad["end"]] == f"Grass is {MARK} purple."
    assert (w["char_start"], w["char_end"]) == (bad["start"], bad["end"])


def test_a_window_underlines_only_its_failing_sentence_and_says_why() -> None:
    answer = f"The sky is blue. Grass is {MARK} purple. Water is wet. The sky is blue again."
    events, _ = guarded(answer, window_sentences=2)
    text = answer_text(events)
    (w,) = warnings(events)
    assert [text[s["start"] : s["end"]] for s in w["sentences"]] == [f"Grass is {MARK} purple."]
    assert w["sentences"][0]["reason"] == "contains the marker"
    assert w["sentences"][0]["score"] == 0.0


def test_a_late_fabricated_sentence_in_a_long_answer_is_flagged() -> None:
    # on the running text this scored 0.75 (3 of 4 supported) and passed 0.7
    answer = f"The sky is blue. Grass is green. Water is wet. The moon is {MARK} cheese."
    events, _ = guarded(answer, window_sentences=2)
    text = answer_text(events)
    (w,) = warnings(events)
    assert [text[s["start"] : s["end"]] for s in w["sentences"]] == [f"The moon is {MARK} cheese."]


def test_a_streams_own_thresholds_label_its_scores() -> None:
    # one sentence in two fails at 0.5 -> the window's share is 0.5; a threshold of 0.4 on the stream must
    # still fail it, because a failing sentence fails the window whatever the average
    answer = f"The sky is blue. Grass is {MARK} purple."
    events, service = guarded(answer, threshold=0.4, window_sentences=2)
    assert warnings(events)
    (req,) = [r for r in service.requests if r.kind == "checkpoint"]
    assert req.threshold_for(semconv.FAITHFULNESS) == 0.4


def test_an_unsampled_stream_sends_no_request_and_never_waits() -> None:
    s = Settings(preflight=False)
    service = FakeService(SentenceJudge(), sampled=False)
    backend = FakeBackend(service, s)
    events = list(streamjudge.guard([f"Grass is {MARK}. ", "Sky. "], question="q", contexts=CONTEXTS,
                                    runtime=backend))  # type: ignore[arg-type]
    assert service.requests == []
    assert [e.type for e in events][-1] == "done"
    (stream,) = [x for x in backend.exporter.get_finished_spans() if x.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.EVAL_STATUS] == "sampled_out"


# --- the real service and processor ------------------------------------------------------------------


class _Script:
    """A judge with a fixed faithfulness value (no sentences): for threshold tests."""

    name = "fixed"

    def __init__(self, value: float) -> None:
        self.value = value

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        return JudgeResult(self.name, tuple(Score(m, self.value) for m in metrics))

    async def aclose(self) -> None:
        return None


async def _words(text: str) -> AsyncIterator[str]:
    for w in text.split(" "):
        yield w + " "
        await asyncio.sleep(0.002)


def _consume(stream: Any) -> list[streamjudge.StreamEvent]:
    async def go() -> list[streamjudge.StreamEvent]:
        return [e async for e in stream]

    return asyncio.run(go())


def test_per_stream_settings_label_scores_on_the_exported_spans(harness: Harness) -> None:
    rt = harness.configure(_Script(0.8), preflight=False)
    strict = replace(rt.settings, threshold=0.9)
    events = _consume(streamjudge.guard(_words("The sky is blue. Grass is green."), question="sky",
                                        contexts=CONTEXTS, settings=strict))
    assert warnings(events), "a 0.8 score must fail this stream's 0.9 threshold"
    spans = harness.spans()
    cps = [s for s in spans if s.name == semconv.SPAN_CHECKPOINT]
    assert cps and all(c.attributes[semconv.label_attribute(semconv.FAITHFULNESS)] == "fail" for c in cps)
    (stream,) = [s for s in spans if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.label_attribute(semconv.FAITHFULNESS)] == "fail"
    # the runtime's own threshold (0.7) still applies to other streams
    events = _consume(streamjudge.guard(_words("The sky is blue."), question="sky", contexts=CONTEXTS))
    assert not warnings(events)


def test_an_answer_with_a_failed_sentence_is_never_labelled_pass(harness: Harness) -> None:
    harness.configure(SentenceJudge(), preflight=False)
    # 4 of 5 sentences supported: 0.8 on average, above 0.7; the fabricated one fails the answer
    answer = f"The sky is blue. Grass is green. Water is wet. Sky is blue. The moon is {MARK} cheese."
    _consume(streamjudge.guard(_words(answer), question="sky", contexts=CONTEXTS))
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.score_attribute(semconv.FAITHFULNESS)] == pytest.approx(0.8)
    assert stream.attributes[semconv.label_attribute(semconv.FAITHFULNESS)] == "fail"
    assert stream.attributes[semconv.sentences_attribute(semconv.FAITHFULNESS, "failed")] == 1
    assert stream.attributes[semconv.sentences_attribute(semconv.FAITHFULNESS, "worst")] == 0.0
    start, end = stream.attributes[semconv.sentences_attribute(semconv.FAITHFULNESS, "ranges")]
    assert answer[start:end] == f"The moon is {MARK} cheese."


def test_configure_twice_keeps_judging_and_exporting() -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    first = streamjudge.configure(Settings(preflight=False), tracer_provider=provider,
                                  downstream=SimpleSpanProcessor(exporter), judge=_Script(0.2), set_global=False)
    second = streamjudge.configure(Settings(preflight=False), tracer_provider=provider, judge=_Script(0.2),
                                   set_global=False)
    try:
        assert second.processor.owns_export, "the second runtime takes the first one's export path"
        from streamjudge import _sdk

        assert first.processor not in _sdk.span_processors(provider)
        events = _consume(streamjudge.guard(_words("The sky is blue. Grass is green."), question="sky",
                                            contexts=CONTEXTS))
        assert warnings(events), "judging goes on after the second configure()"
        second.force_flush(10_000)
        judged = [s for s in exporter.get_finished_spans() if s.attributes.get(semconv.EVAL_STATUS) == "judged"]
        assert judged
    finally:
        second.shutdown()


def test_a_trace_the_tracing_sampler_dropped_is_not_judged_and_never_waits(harness: Harness) -> None:
    rt = harness.configure(SentenceJudge(), preflight=False)
    parent = trace.set_span_in_context(NonRecordingSpan(SpanContext(0xABC, 0xDEF, is_remote=True,
                                                                    trace_flags=TraceFlags(0))))
    answer = f"The sky is blue. Grass is {MARK} purple."
    provider = TracerProvider(sampler=streamjudge_parent_based())
    provider.add_span_processor(rt.processor)
    tracer = provider.get_tracer("t")

    class Backend:
        settings = rt.settings
        contexts = rt.contexts
        service = rt.service

    Backend.tracer = tracer  # type: ignore[attr-defined]
    judge = rt.judge_for("checkpoint")
    assert isinstance(judge, SentenceJudge)
    events = _consume(streamjudge.guard(_words(answer), question="sky", contexts=CONTEXTS, context=parent,
                                        runtime=Backend()))  # type: ignore[arg-type]
    assert answer_text(events).strip() == answer and events[-1].type == "done"
    assert judge.items == [], "sampling is decided once at the start: a dropped trace is not judged"
    assert rt.processor.held == 0


def streamjudge_parent_based() -> Any:
    from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased

    return ParentBased(TraceIdRatioBased(1.0))


def _request(kind: str, text: str, offset: int, index: int, reply: Any) -> JudgeRequest:
    """A request of stream 7; checkpoints may be coalesced, as the guard's are outside hold-back."""
    return JudgeRequest(item=EvalInput("q", CONTEXTS, text, kind, offset=offset),  # type: ignore[arg-type]
                        metrics=(semconv.FAITHFULNESS,), thresholds={}, index=index, stream_id=7,
                        coalesce=kind == "checkpoint", reply=reply)


def test_coalescing_covers_every_sentence_of_the_superseded_request() -> None:
    gate = threading.Event()
    blocker = GatedJudge(gate)
    judge = SentenceJudge()
    pool = JudgePool(concurrency=1)
    processor = JudgeSpanProcessor()
    got: list[Verdict] = []
    judges = {"preflight": blocker}
    service = JudgingService(pool=pool, processor=processor, judges=lambda kind: judges.get(kind, judge))  # type: ignore[arg-type,return-value]

    try:
        service.submit(_request("preflight", "", 0, -1, got.append))  # occupies the only slot
        a, b = f"Grass is {MARK}. ", "Water is wet. "
        service.submit(_request("checkpoint", a, 0, 0, got.append))
        service.submit(_request("checkpoint", b, len(a), 1, got.append))  # supersedes 0 while it waits
        gate.set()
        assert pool.force_flush(10_000)
    finally:
        pool.shutdown(5_000)
    by_index = {v.index: v for v in got}
    assert by_index[0].status == "superseded"
    merged = by_index[1]
    assert (merged.start, merged.end) == (0, len(a) + len(b))
    (score,) = merged.scores
    failing = [s for s in score.sentences if s.label == "fail"]
    assert [(a + b)[s.start : s.end] for s in failing] == [f"Grass is {MARK}."]


class TextJudge:
    """One score per judged text, as a framework's metric gives (no ``scores_sentences``)."""

    name = "text"

    def __init__(self) -> None:
        self.answers: list[str] = []

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        self.answers.append(item.answer)
        return JudgeResult(self.name, tuple(Score(m, 0.0 if MARK in item.answer else 1.0) for m in metrics))

    async def aclose(self) -> None:
        return None


def test_a_judge_with_one_score_per_text_gets_no_merged_checkpoints() -> None:
    # merged, "Water is wet." would share the failing score of its neighbour's window and be underlined
    gate = threading.Event()
    judge = TextJudge()
    pool = JudgePool(concurrency=1)
    got: list[Verdict] = []
    judges = {"preflight": GatedJudge(gate)}
    service = JudgingService(pool=pool, processor=JudgeSpanProcessor(),
                             judges=lambda kind: judges.get(kind, judge))  # type: ignore[arg-type,return-value]
    a, b = f"Grass is {MARK}. ", "Water is wet. "
    try:
        service.submit(_request("preflight", "", 0, -1, got.append))  # occupies the only slot
        service.submit(_request("checkpoint", a, 0, 0, got.append))
        service.submit(_request("checkpoint", b, len(a), 1, got.append))
        gate.set()
        assert pool.force_flush(10_000)
    finally:
        pool.shutdown(5_000)
    by_index = {v.index: v for v in got}
    assert judge.answers == [a, b], "each window judged on its own"
    assert by_index[0].status == by_index[1].status == "judged"
    assert (by_index[0].start, by_index[0].end, by_index[1].start, by_index[1].end) == (0, len(a), len(a),
                                                                                        len(a) + len(b))
    assert by_index[0].scores[0].label == "fail" and by_index[1].scores[0].label == "pass"


def test_the_public_api_is_pinned() -> None:
    assert sorted(streamjudge.__all__) == sorted([
        "ConfigError", "EvalInput", "GuardedStream", "Judge", "JudgeError", "JudgeResult",
        "RegenerateRequest", "Runtime", "Score", "SentenceScore", "Settings", "StreamEvent",
        "TransientJudgeError", "Verdict", "__version__", "configure", "current_runtime", "get_runtime", "guard",
        "instrument_app", "load_settings",
    ])
    for name in streamjudge.__all__:
        assert getattr(streamjudge, name) is not None


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module:
            out.add(node.module)
            # ``from streamjudge.judging import _backend`` reaches a private module as surely as its path
            out.update(f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_"))
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return out


@pytest.mark.parametrize(
    ("stage", "forbidden"),
    [
        ("judging", ("streamjudge.runtime", "streamjudge.instrumentation", "streamjudge.exporters.langfuse",
                     "streamjudge.exporters.phoenix")),
        ("exporters", ("streamjudge.runtime", "streamjudge.instrumentation", "streamjudge.judging")),
        # instrumentation drives streams through judging's public API only (``judging.guard``), never its
        # private modules, and knows nothing of where results go
        ("instrumentation", ("streamjudge.judging._", "streamjudge.judging.pool", "streamjudge.judging.service",
                             "streamjudge.exporters")),
        # the worker judges spans it receives: no app instrumentation, no live streams
        ("worker", ("streamjudge.instrumentation", "streamjudge.judging._", "streamjudge.judging.guard")),
        # offline harnesses run apps and streams through the public API
        ("offline", ("streamjudge.judging._", "streamjudge.judging.pool", "streamjudge.exporters")),
        # the top-level modules reach the stages through their public modules; runtime.py, which wires the
        # stages together, is the one exception (it sets judging's default backend)
        (".", ("streamjudge.judging._", "streamjudge.instrumentation._", "streamjudge.exporters._")),
    ],
)
def test_imports_run_one_way(stage: str, forbidden: tuple[str, ...]) -> None:
    root = Path(streamjudge.__file__).parent / stage
    files = [p for p in root.glob("*.py") if p.name != "runtime.py"] if stage == "." else root.rglob("*.py")
    bad = {
        str(p.relative_to(root)): sorted(m for m in _imports(p) if m.startswith(forbidden))
        for p in files
    }
    assert {k: v for k, v in bad.items() if v} == {}


def test_results_imports_no_stage() -> None:
    mods = _imports(Path(streamjudge.__file__).parent / "results.py")
    assert not [m for m in mods if m.startswith("streamjudge.") and m != "streamjudge.semconv"]


def test_a_deferred_final_pass_leaves_what_a_worker_needs_on_the_answer_span(harness: Harness) -> None:
    judge = SentenceJudge()
    harness.configure(judge, preflight=False, final_pass="deferred")
    answer = "The sky is blue. Grass is green."
    _consume(streamjudge.guard(_words(answer), question="sky", contexts=CONTEXTS))
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.EVAL_STATUS] == "deferred"
    assert stream.attributes[semconv.STREAM_ANSWER].strip() == answer
    assert tuple(stream.attributes[semconv.STREAM_CONTEXTS]) == CONTEXTS
    assert stream.attributes[semconv.STREAM_QUESTION] == "sky"
    # checkpoints are still judged live, the answer is not judged here
    assert all(i.kind == "checkpoint" for i in judge.items)


def test_a_sampled_out_stream_splits_no_sentences_and_holds_nothing_back(harness: Harness) -> None:
    harness.configure(SentenceJudge(), sample_rate=0.0, mode="hold_back")
    answer = f"The sky is blue. Grass is {MARK} purple. Water is wet."
    events = _consume(streamjudge.guard(_words(answer), question="sky", contexts=CONTEXTS))
    assert answer_text(events).strip() == answer
    assert not warnings(events)
    spans = harness.spans()
    assert not [s for s in spans if s.name == semconv.SPAN_CHECKPOINT], "no windows when nothing is judged"
    (stream,) = [s for s in spans if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.EVAL_STATUS] == "sampled_out"
    assert stream.attributes[semconv.STREAM_ANSWER].strip() == answer


class _Chunk:
    def __init__(self, content: str) -> None:
        self.content = content


# plain ASCII runs broken by every kind of token the guard has to decode or skip: the sampled-out driver
# appends plain tokens itself and hands the rest to the session, and the two must interleave in order
_MIXED: tuple[Any, ...] = (
    "The ", "sky ", "", None, "is ", b"caf\xc3", b"\xa9 ", "blue. ", "Gr\u00fcn ", "\ud800 ", _Chunk("chunk "),
    "grass", " is", " green.", bytearray(b" Water "), "is ", "", "wet.",
)


async def _tokens(items: Sequence[Any]) -> AsyncIterator[Any]:
    for t in items:
        yield t


def _stream_figures(harness: Harness, sample_rate: float) -> tuple[list[str], dict[str, Any]]:
    harness.configure(SentenceJudge(), sample_rate=sample_rate, preflight=False)
    events = _consume(streamjudge.guard(_tokens(_MIXED), question="sky", contexts=CONTEXTS))
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    attrs = stream.attributes
    assert attrs is not None
    keys = (semconv.STREAM_TOKENS, semconv.STREAM_CHARS, semconv.STREAM_ANSWER, semconv.STREAM_SKIPPED_TOKENS)
    figures = {k: attrs.get(k) for k in keys}
    figures["first_token_events"] = sum(e.name == semconv.EVENT_FIRST_TOKEN for e in stream.events)
    figures["ttft"] = semconv.STREAM_TTFT_MS in attrs
    return [e.text for e in events if e.type == "token"], figures


def test_a_sampled_out_stream_passes_every_kind_of_token_as_a_judged_one_does(harness: Harness) -> None:
    judged_tokens, judged = _stream_figures(harness, 1.0)
    tokens, figures = _stream_figures(harness, 0.0)
    assert tokens == judged_tokens
    assert "".join(tokens) == judged[semconv.STREAM_ANSWER]
    assert figures == judged
    assert figures[semconv.STREAM_TOKENS] == len(tokens) and figures["first_token_events"] == 1
    assert figures[semconv.STREAM_SKIPPED_TOKENS] == 1  # the None (an empty string is no token at all)


def test_a_sampled_out_stream_left_mid_answer_counts_what_it_sent(harness: Harness) -> None:
    harness.configure(SentenceJudge(), sample_rate=0.0, preflight=False)
    words = [f"w{i} " for i in range(50)]

    async def go() -> list[str]:
        got: list[str] = []
        stream = streamjudge.guard(_tokens(words), question="sky", contexts=CONTEXTS).__aiter__()
        async for ev in stream:
            got.append(ev.text)
            if len(got) == 20:
                break
        await stream.aclose()  # type: ignore[attr-defined]  # the client went away
        return got

    got = asyncio.run(go())
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert stream.attributes is not None
    assert stream.attributes[semconv.STREAM_OUTCOME] == "disconnected"
    assert stream.attributes[semconv.STREAM_TOKENS] == 20
    assert stream.attributes[semconv.STREAM_ANSWER] == "".join(got)


class _Raises:
    name = "raises"

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        raise RuntimeError("judge down")

    async def aclose(self) -> None:
        return None


def test_a_failed_evaluation_still_emits_its_result_event_with_an_error_type(harness: Harness) -> None:
    harness.configure(_Raises(), preflight=False, max_retries=0)
    _consume(streamjudge.guard(_words("The sky is blue."), question="sky", contexts=CONTEXTS))
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.EVAL_STATUS] == "error"
    events = [e for e in stream.events if e.name == semconv.EVENT_EVALUATION_RESULT]
    assert {e.attributes[semconv.GEN_AI_EVALUATION_NAME] for e in events} == set(Settings().final_metrics)
    assert {e.attributes[semconv.ERROR_TYPE] for e in events} == {"error"}


def test_streamjudge_spans_carry_openinference_kinds_and_input_output(harness: Harness) -> None:
    harness.configure(SentenceJudge(), preflight=False)
    _consume(streamjudge.guard(_words("The sky is blue."), question="What colour is the sky?", contexts=CONTEXTS))
    spans = harness.spans()
    (stream,) = [s for s in spans if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.OPENINFERENCE_SPAN_KIND] == "CHAIN"
    assert stream.attributes[semconv.INPUT_VALUE] == "What colour is the sky?"
    assert stream.attributes[semconv.OUTPUT_VALUE].strip() == "The sky is blue."
    cps = [s for s in spans if s.name == semconv.SPAN_CHECKPOINT]
    assert cps and {c.attributes[semconv.OPENINFERENCE_SPAN_KIND] for c in cps} == {"GUARDRAIL"}


@pytest.mark.parametrize("driver", ["async", "sync"])
def test_a_failing_last_window_is_regenerated_after_the_source_ended(harness: Harness, driver: str) -> None:
    # the failing window is closed by the end of the source (a two-sentence answer, the default window):
    # the retraction must be followed by the continuation, not by `done`
    harness.configure(SentenceJudge(), preflight=False, action="regenerate", end_wait_s=2.0)
    answer = f"The sky is blue. Grass is {MARK} purple."
    calls: list[str] = []

    def regenerate(req: streamjudge.RegenerateRequest) -> Any:
        calls.append(req.accepted_prefix)
        if driver == "async":
            return _words(" Water is wet.")
        return [" Water ", "is ", "wet."]

    if driver == "async":
        events = _consume(streamjudge.guard(_words(answer), question="sky", contexts=CONTEXTS,
                                            regenerate=regenerate))
    else:
        events = list(streamjudge.guard([w + " " for w in answer.split(" ")], question="sky",
                                        contexts=CONTEXTS, regenerate=regenerate))
    kinds = [e.type for e in events]
    assert "retract" in kinds and calls == ["The sky is blue."]
    after = events[kinds.index("retract") + 1 :]
    assert "".join(e.text for e in after if e.type == "token").strip() == "Water is wet."
    done = events[-1]
    assert done.type == "done" and done.data is not None and done.data["regenerations"] == 1


@pytest.mark.parametrize("action", ["stop", "regenerate"])
def test_hold_back_releases_the_passing_sentences_of_the_failing_window(action: str) -> None:
    # one window of three sentences, the second fabricated: the verdict names it alone, so the first goes
    # out before the warning and the third never does
    answer = f"The sky is blue. Grass is {MARK} purple. Water is wet."
    s = Settings(preflight=False, final_reconcile=False, mode="hold_back", action=action, window_sentences=3)
    backend = FakeBackend(FakeService(SentenceJudge()), s)
    tokens = [w + " " for w in answer.split(" ")]
    asked: list[str] = []

    def again(req: Any) -> list[str]:
        asked.append(req.accepted_prefix)
        return [" Water is wet."]

    events = list(streamjudge.guard(tokens, question="sky", contexts=CONTEXTS, runtime=backend,  # type: ignore[arg-type]
                                    regenerate=again))
    kinds = [e.type for e in events]
    first_warning = kinds.index("warning")
    # up to the sentence's end: the continuation (or the fallback) brings its own separator
    assert answer_text(events[:first_warning]) == "The sky is blue."
    assert MARK not in answer_text(events)
    assert "retract" not in kinds  # nothing shown is taken back
    (stream,) = [x for x in backend.exporter.get_finished_spans() if x.name == semconv.SPAN_STREAM]
    assert stream.attributes is not None
    assert stream.attributes[semconv.STREAM_ANSWER] == answer_text(events)  # what the client received
    if action == "stop":
        assert kinds[-2:] == ["stop", "done"]
        assert MARK in str(stream.attributes[semconv.STREAM_MODEL_ANSWER])  # the model's, kept apart
    else:
        assert asked == ["The sky is blue."]
        assert answer_text(events) == "The sky is blue. Water is wet."


def test_an_action_that_cannot_be_enforced_says_so_on_the_span() -> None:
    # regenerate without a callback: the guard flags instead, and the span says the action did not happen
    answer = f"The sky is blue. Grass is {MARK} purple."
    s = Settings(preflight=False, final_reconcile=False, action="regenerate", window_sentences=1)
    backend = FakeBackend(FakeService(SentenceJudge()), s)
    events = list(streamjudge.guard([w + " " for w in answer.split(" ")], question="sky", contexts=CONTEXTS,
                                    runtime=backend))  # type: ignore[arg-type]
    assert warnings(events)[0]["action"] == "flag"
    (stream,) = [x for x in backend.exporter.get_finished_spans() if x.name == semconv.SPAN_STREAM]
    assert stream.attributes is not None
    assert stream.attributes[semconv.ACTION_ENFORCED] is False
    assert "regenerate" in str(stream.attributes[semconv.ACTION_ENFORCED_REASON])
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"


def test_hold_back_never_shows_the_failing_sentence_even_quoted_in_the_warning() -> None:
    class QuotingJudge(SentenceJudge):
        def score(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
            result = super().score(item, metrics)
            quoted = tuple(replace(sc, explanation=f'unsupported: "{item.answer.strip()}"') for sc in result.scores)
            return JudgeResult(result.judge, quoted)

    answer = f"The sky is blue. Grass is {MARK} purple."
    s = Settings(preflight=False, final_reconcile=False, mode="hold_back", action="stop", window_sentences=1)
    backend = FakeBackend(FakeService(QuotingJudge()), s)
    events = list(streamjudge.guard([w + " " for w in answer.split(" ")], question="sky", contexts=CONTEXTS,
                                    runtime=backend))  # type: ignore[arg-type]
    assert warnings(events)
    assert all(MARK not in (e.text + repr(e.data)) for e in events), [e for e in events if e.type != "token"]
