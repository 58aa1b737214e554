"""LangGraph instrumentation in process: node spans, context capture, answer-only tokens, uninstrument."""

from __future__ import annotations

import asyncio
import sys
import threading
from importlib.metadata import version
from pathlib import Path
from typing import Any

import langchain_core.callbacks as cb
import pytest
from openinference.instrumentation.langchain._tracer import OpenInferenceTracer
from typing_extensions import TypedDict

from _fakes import KeywordJudge
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeInstrumentor, _binding
from streamjudge.judging._session import GuardSession
from streamjudge.results import Verdict

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples" / "adaptive_rag"))
import rag

LANGGRAPH_MAJOR = int(version("langgraph").split(".")[0])


def _run(graph: object, question: str, hallucinate: bool = False) -> str:
    async def go() -> str:
        out = []
        async for event, payload in rag.stream_answer(graph, question, hallucinate=hallucinate):
            if event == "token":
                out.append(payload["token"])
        return "".join(out)

    return asyncio.run(go())


def test_node_spans_contexts_and_answer_stream(harness) -> None:  # type: ignore[no-untyped-def]
    from langchain_core.language_models.chat_models import BaseChatModel
    from langgraph.pregel import Pregel

    rt = harness.configure(end_wait_s=0.5)
    original_init = vars(cb.BaseCallbackManager)["__init__"]
    original_start = vars(OpenInferenceTracer)["_start_trace"]
    originals = {(cls, name): vars(cls)[name] for cls, name in (
        (Pregel, "ainvoke"), (Pregel, "astream"), (BaseChatModel, "_agenerate_with_cache"),
        (rag.OfflineChatModel, "_astream"))}
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        graph = rag.build_graph()
        with rt.tracer.start_as_current_span("request") as req:
            answer = _run(graph, "How tall is the Eiffel Tower?", hallucinate=True)
            trace_id = req.get_span_context().trace_id
        inputs = rt.contexts.get(trace_id)
        assert inputs is not None
        assert inputs.question == "How tall is the Eiffel Tower?"
        assert inputs.contexts == (rag.CORPUS[0].page_content,)  # the graded documents, not the query
        spans = harness.spans()
        nodes = {s.attributes[semconv.NODE_NAME]: s for s in spans if semconv.NODE_NAME in s.attributes}
        assert set(nodes) == {"retrieve", "grade", "generate", "reflect"}
        assert all(s.attributes[semconv.NODE_ELAPSED_MS] > 0 for s in nodes.values())
        # the graph-owned stream: only the generate node's tokens, flagged because it invents facts
        stream = next(s for s in spans if s.name == semconv.SPAN_STREAM)
        assert stream.context.trace_id == trace_id
        assert stream.attributes[semconv.STREAM_ANSWER] == answer
        assert stream.attributes[semconv.STREAM_ALERTS] >= 1
        assert stream.attributes[semconv.score_attribute(semconv.FAITHFULNESS)] < 0.5
        assert _binding.active_count() == 0
    finally:
        inst.uninstrument()
    assert vars(cb.BaseCallbackManager)["__init__"] is original_init
    assert vars(OpenInferenceTracer)["_start_trace"] is original_start
    # the model tap (wrapped lazily on the model's class) and the graph's root span are gone too
    assert {key: vars(key[0])[key[1]] for key in originals} == originals
    # after uninstrument nothing of ours runs any more
    harness.exporter.clear()
    _run(rag.build_graph(), "How tall is the Eiffel Tower?")
    assert not [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]


def test_without_content_capture_openinference_spans_carry_no_text_either(harness) -> None:  # type: ignore[no-untyped-def]
    # STREAMJUDGE_CAPTURE_CONTENT=false maps onto openinference's own hiding settings: the LangChain spans
    # streamjudge switches on must not export the question, the documents or the answer
    rt = harness.configure(end_wait_s=0.5, capture_content=False)
    from openinference.instrumentation.langchain import LangChainInstrumentor

    oi = LangChainInstrumentor()
    if oi.is_instrumented_by_opentelemetry:  # an earlier test's: this one must switch it on itself
        oi.uninstrument()
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        question = "How tall is the Eiffel Tower?"
        with rt.tracer.start_as_current_span("request"):
            answer = _run(rag.build_graph(), question, hallucinate=True)
        spans = harness.spans()
    finally:
        inst.uninstrument()
    assert any(semconv.NODE_NAME in s.attributes for s in spans)  # the graph was traced
    leaked = [(s.name, k) for s in spans for k, v in s.attributes.items()
              if isinstance(v, str) and (question in v or "330 metres" in v or answer[:40] in v)]
    assert leaked == []


def test_verdicts_wake_the_loop_only_while_the_tap_waits_for_one(harness, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # stream-first and flag: while tokens flow the tap reads the inbox after every chunk, so a verdict
    # must not cost the app's loop a cross-thread wake-up; at the end, waiting for the last verdicts, it may
    monkeypatch.setenv("EXAMPLE_TOKEN_DELAY_MS", "15")  # verdicts land while the model still streams
    rt = harness.configure(end_wait_s=2.0)
    posted: list[bool] = []  # per verdict: did the tap wait for it when it came
    wakes = 0
    real_post = GuardSession.post
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    real_tsafe = asyncio.BaseEventLoop.call_soon_threadsafe

    def tsafe(self, callback, *args, **kwargs):  # type: ignore[no-untyped-def]
        nonlocal wakes
        # a verdict's wake-up: from the judge pool's thread to the app's loop
        if threading.current_thread().name == "streamjudge-judge-pool":
            wakes += 1
        return real_tsafe(self, callback, *args, **kwargs)

    monkeypatch.setattr(asyncio.BaseEventLoop, "call_soon_threadsafe", tsafe)

    def counting_post(self: GuardSession, verdict: Verdict) -> None:
        posted.append(verdict.kind != "answer")
        real_post(self, verdict)

    monkeypatch.setattr(GuardSession, "post", counting_post)
    try:
        with rt.tracer.start_as_current_span("request"):
            answer = _run(rag.build_graph(), "How tall is the Eiffel Tower?", hallucinate=True)
    finally:
        inst.uninstrument()
    stream = next(s for s in harness.spans() if s.name == semconv.SPAN_STREAM)
    assert stream.attributes[semconv.STREAM_ANSWER] == answer
    assert stream.attributes[semconv.STREAM_ALERTS] >= 1  # the warning still came
    verdicts = sum(posted)
    assert verdicts >= 3  # pre-flight and the checkpoints
    # at most the tail's verdicts find the tap waiting at the end (the pre-flight gate does not hold
    # a stream-first answer with the default policy)
    assert wakes <= 2 < verdicts, (wakes, verdicts)


def _token_callback_threads(monkeypatch) -> set[str]:  # type: ignore[no-untyped-def]
    """The names of the threads openinference's tracer gets its token callbacks on, from now on."""
    threads: set[str] = set()
    real = OpenInferenceTracer.on_llm_new_token

    def recording(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        threads.add(threading.current_thread().name)
        return real(self, *args, **kwargs)

    monkeypatch.setattr(OpenInferenceTracer, "on_llm_new_token", recording)
    return threads


def test_openinference_tracer_runs_in_the_callers_thread_and_is_put_back(harness, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # LangChain hands a sync handler's callbacks to the loop's thread pool unless it runs inline: with
    # streamjudge set up, openinference's tracer must run in the graph's own thread (no hop per token),
    # still make its spans, and be dispatched as before once streamjudge is gone
    rt = harness.configure(end_wait_s=0.5)
    before = OpenInferenceTracer.run_inline
    threads = _token_callback_threads(monkeypatch)
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        assert OpenInferenceTracer.run_inline is True
        with rt.tracer.start_as_current_span("request"):
            answer = _run(rag.build_graph(), "How tall is the Eiffel Tower?")
        spans = harness.spans()
    finally:
        inst.uninstrument()
    assert answer
    assert threads == {threading.current_thread().name}  # every token callback on the graph's thread
    assert {s.attributes.get(semconv.NODE_NAME) for s in spans} >= {"retrieve", "generate"}
    assert OpenInferenceTracer.run_inline is before  # LangChain's own dispatch again without streamjudge


def test_openinference_inline_off_keeps_langchains_dispatch(harness, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    rt = harness.configure(end_wait_s=0.5, openinference_inline=False)
    threads = _token_callback_threads(monkeypatch)
    before = OpenInferenceTracer.run_inline
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        assert OpenInferenceTracer.run_inline is before
        with rt.tracer.start_as_current_span("request"):
            assert _run(rag.build_graph(), "How tall is the Eiffel Tower?")
    finally:
        inst.uninstrument()
    if not before:  # LangChain's own dispatch: the token callbacks ran on the loop's thread pool
        assert threads and threading.current_thread().name not in threads


def test_the_model_tap_joins_the_windows_of_a_chunk_burst(harness, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # a model whose chunks arrive without a loop pass between them (a burst read at once): the tap defers
    # checkpoint spans to the loop's next pass, so the windows of one burst share a checkpoint; paced
    # chunks get a checkpoint per window. Either way the checkpoints tile the answer exactly once.
    rt = harness.configure(end_wait_s=2.0, window_sentences=1, preflight=False)
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    counts = {}
    try:
        for delay in ("0", "2"):
            monkeypatch.setenv("EXAMPLE_TOKEN_DELAY_MS", delay)
            harness.exporter.clear()
            with rt.tracer.start_as_current_span("request"):
                answer = _run(rag.build_graph(), "How tall is the Eiffel Tower?", hallucinate=True)
            spans = harness.spans()
            stream = next(s for s in spans if s.name == semconv.SPAN_STREAM)
            cps = sorted((s for s in spans if s.name == semconv.SPAN_CHECKPOINT),
                         key=lambda s: s.attributes[semconv.CHECKPOINT_CHAR_START])
            assert len(cps) == stream.attributes[semconv.STREAM_CHECKPOINTS]
            assert "".join(s.attributes[semconv.CHECKPOINT_TEXT] for s in cps) == answer
            assert stream.attributes[semconv.STREAM_ALERTS] >= 1
            counts[delay] = (len(cps), sum(s.attributes[semconv.CHECKPOINT_SENTENCES] for s in cps))
    finally:
        inst.uninstrument()
    (burst, burst_sentences), (paced, paced_sentences) = counts["0"], counts["2"]
    assert burst_sentences == paced_sentences == paced > 1
    if LANGGRAPH_MAJOR >= 1:
        assert burst < paced
    else:  # LangGraph 0.x hands each chunk over with a loop pass between them: there is no burst to join
        assert burst <= paced


@pytest.mark.parametrize("mode", ["stream_first", "hold_back"])  # hold-back: the tap races chunks
def test_an_instrumented_graph_run_is_freed_without_the_cyclic_gc(harness, mode: str) -> None:  # type: ignore[no-untyped-def]
    # as for a guarded stream (tests/test_memory.py): objects of ours, or spans, held in a reference cycle
    # would outlive every request until the cyclic GC finds them
    import gc
    from collections import Counter

    from conftest import cyclic_garbage, ours

    # hold-back with a judge slower than the answer: the model's stream ends while a chunk is raced
    judge = KeywordJudge(delay_s=0.15) if mode == "hold_back" else None
    rt = harness.configure(judge, end_wait_s=0.5, mode=mode)
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    loop = asyncio.new_event_loop()  # one loop throughout: a loop's own cycles are not the request's
    try:
        graph = rag.build_graph()

        async def request() -> None:
            with rt.tracer.start_as_current_span("request"):
                async for _ in rag.stream_answer(graph, "How tall is the Eiffel Tower?", hallucinate=True):
                    pass

        for _ in range(2):  # first use: imports, caches
            loop.run_until_complete(request())
            harness.spans()
            gc.collect()
        with cyclic_garbage() as found:
            for _ in range(3):
                loop.run_until_complete(request())
            harness.spans()
    finally:
        loop.close()
        inst.uninstrument()
    left = Counter(ours(found))
    assert not left, left


def test_a_held_back_answer_streams_its_model_in_the_requests_own_task(harness, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    # hold-back races the model's next chunk against the verdicts in flight: the model's stream must still
    # run as it would uninstrumented - in the request's task and context, a context variable it sets kept
    # from chunk to chunk (a reset of it in another context raises)
    import contextvars

    var: contextvars.ContextVar[str] = contextvars.ContextVar("model_client", default="unset")
    tasks: list[set[object]] = []  # per model call: the tasks its chunks were made in
    seen: set[str] = set()
    real = rag.OfflineChatModel._astream

    async def astream(self, messages, stop=None, run_manager=None, **kwargs):  # type: ignore[no-untyped-def]
        token = var.set("open")
        mine: set[object] = set()
        tasks.append(mine)
        async for chunk in real(self, messages, stop, run_manager, **kwargs):
            mine.add(asyncio.current_task())
            seen.add(var.get())
            yield chunk
        var.reset(token)

    monkeypatch.setattr(rag.OfflineChatModel, "_astream", astream)
    monkeypatch.setenv("EXAMPLE_TOKEN_DELAY_MS", "5")
    rt = harness.configure(KeywordJudge(delay_s=0.05), end_wait_s=1.0, mode="hold_back")
    inst = StreamJudgeInstrumentor()
    inst.instrument()

    async def request() -> str:
        out = []
        with rt.tracer.start_as_current_span("request"):
            async for event, payload in rag.stream_answer(rag.build_graph(), "How tall is the Eiffel Tower?"):
                if event == "token":
                    out.append(payload["token"])
        return "".join(out)

    try:
        answer = asyncio.run(request())
    finally:
        inst.uninstrument()
    assert answer and seen == {"open"}
    assert tasks and all(len(t) == 1 for t in tasks)  # each call in its own node's task, as uninstrumented
    stream = next(s for s in harness.spans() if s.name == semconv.SPAN_STREAM)
    assert stream.attributes[semconv.STREAM_OUTCOME] == "completed"
    assert stream.attributes[semconv.STREAM_ANSWER] == answer


class _KeysState(TypedDict, total=False):
    chat_history: list[Any]
    user_input: str
    question: str
    query: str
    answer: str


@pytest.mark.parametrize(("state", "keys", "question"), [
    ({"chat_history": [("user", "Where is it?"), ("assistant", "Paris."), ("user", "How tall is it?")]},
     None, "How tall is it?"),
    ({"user_input": "How tall is it?", "question": ""}, ("user_input",), "How tall is it?"),
    ({"query": "How tall is it?"}, None, "How tall is it?"),
])
def test_the_question_of_a_graph_under_other_keys(harness, state, keys, question) -> None:  # type: ignore[no-untyped-def]
    from langgraph.graph import END, START, StateGraph

    def generate(s: _KeysState) -> _KeysState:
        return {"answer": "It is 330 metres tall."}

    g = StateGraph(_KeysState)
    g.add_node("generate", generate)
    g.add_edge(START, "generate")
    g.add_edge("generate", END)
    graph = g.compile()
    rt = harness.configure(**({"question_keys": keys} if keys else {}))
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        with rt.tracer.start_as_current_span("request") as req:
            asyncio.run(graph.ainvoke(state))
            trace_id = req.get_span_context().trace_id
    finally:
        inst.uninstrument()
    inputs = rt.contexts.get(trace_id)
    assert inputs is not None and inputs.question == question


def test_a_graph_without_an_answer_node_says_so_once_per_route(harness, caplog) -> None:  # type: ignore[no-untyped-def]
    import logging

    from langgraph.graph import END, START, StateGraph
    from opentelemetry import context as otel_context

    def respond(s: _KeysState) -> _KeysState:
        return {"answer": "It is 330 metres tall."}

    g = StateGraph(_KeysState)
    g.add_node("respond", respond)
    g.add_edge(START, "respond")
    g.add_edge("respond", END)
    graph = g.compile()
    graph.name = "support_bot"  # what compile(name=...) sets; LangGraph 0.2's compile takes no name
    rt = harness.configure()
    caplog.set_level(logging.INFO, logger="streamjudge.instrumentation._chains")
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        for _ in range(2):
            with rt.tracer.start_as_current_span("POST /ask") as req:
                binding = _binding.StreamBinding(req.get_span_context().trace_id, owner="http",
                                                 parent=otel_context.get_current())
                _binding.bind(binding)
                try:
                    asyncio.run(graph.ainvoke({"question": "How tall is it?"}))
                finally:
                    _binding.unbind(binding)
                    binding.finish()
    finally:
        inst.uninstrument()
    requests = [s for s in harness.spans() if s.name == "POST /ask"]
    assert [r.attributes.get(semconv.ANSWER_NOT_FOUND) for r in requests] == ["no_answer_node"] * 2
    lines = [r.getMessage() for r in caplog.records if "no answer to judge" in r.getMessage()]
    assert len(lines) == 1
    assert "'support_bot' on POST /ask" in lines[0] and "generate" in lines[0] and "respond" in lines[0]
