"""LangChain runnables without LangGraph, in process: which model call is the chain's answer, the question
from the chain's input, contexts from its retrievers, and what is said when no answer can be found."""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any

import pytest
from langchain_core.callbacks import AsyncCallbackManagerForLLMRun, CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage
from langchain_core.output_parsers import StrOutputParser
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.prompts import ChatPromptTemplate, MessagesPlaceholder
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import Runnable, RunnableLambda, RunnableParallel, RunnablePassthrough

from _fakes import KeywordJudge
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeInstrumentor, _binding, _chains

DOCS = ("The Eiffel Tower is 330 metres tall.", "It was completed in 1889.")
STANDALONE = "How tall is the Eiffel Tower in Paris?"
ANSWER = "The Eiffel Tower is 330 metres tall. It was completed in 1889."


class ScriptedChat(BaseChatModel):
    """Condenses when asked to rephrase, else answers; streams word by word."""

    answer: str = ANSWER

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def _reply(self, messages: list[BaseMessage]) -> str:
        text = " ".join(str(m.content) for m in messages)
        return STANDALONE if "Rephrase" in text else self.answer

    def _generate(self, messages: list[BaseMessage], stop: list[str] | None = None,
                  run_manager: Any = None, **kwargs: Any) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self._reply(messages)))])

    async def _astream(self, messages: list[BaseMessage], stop: list[str] | None = None,
                       run_manager: AsyncCallbackManagerForLLMRun | None = None,
                       **kwargs: Any) -> AsyncIterator[ChatGenerationChunk]:
        for word in re.findall(r"\S+\s*", self._reply(messages)):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=word))
            if run_manager is not None:
                await run_manager.on_llm_new_token(word, chunk=chunk)
            yield chunk


class Docs(BaseRetriever):
    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=d) for d in DOCS]


CONDENSE = ChatPromptTemplate.from_messages([
    MessagesPlaceholder("chat_history"), ("human", "Rephrase as a standalone question: {input}")])
ANSWER_PROMPT = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {input}")


def _format(docs: list[Document]) -> str:
    return "\n".join(d.page_content for d in docs)


def conversational_chain(model: BaseChatModel) -> Runnable[Any, str]:
    """condense-question call -> retriever -> prompt | model | parser (a langserve-style chain)."""
    condense = CONDENSE | model | StrOutputParser()
    return (RunnablePassthrough.assign(context=condense | Docs() | _format)
            | ANSWER_PROMPT | model | StrOutputParser())


@pytest.fixture
def instrumented(harness):  # type: ignore[no-untyped-def]
    rt = harness.configure(judge=KeywordJudge(marker="Napoleon"), end_wait_s=0.5)
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        yield rt
    finally:
        inst.uninstrument()


def _serve(chain: Runnable[Any, str], value: Any, rt: Any) -> tuple[str, int, Any]:
    """The chain streamed inside a request span that has a stream bound, as the ASGI middleware does."""
    from opentelemetry import context as otel_context

    from streamjudge.instrumentation._asgi import finish_stream

    async def go() -> tuple[str, int, Any]:
        with rt.tracer.start_as_current_span("POST /chat") as req:
            trace_id = req.get_span_context().trace_id
            binding = _binding.StreamBinding(trace_id, owner="http", parent=otel_context.get_current())
            _binding.bind(binding)
            try:
                out = "".join([c async for c in chain.astream(value) if isinstance(c, str)])
            finally:
                _binding.unbind(binding)
                await finish_stream(binding)
            return out, trace_id, req

    return asyncio.run(go())


def test_the_final_model_call_is_judged_not_the_condense_call(instrumented, harness) -> None:  # type: ignore[no-untyped-def]
    rt = instrumented
    chain = conversational_chain(ScriptedChat(answer=ANSWER + " It was built by Napoleon."))
    history = [HumanMessage("Where is the Eiffel Tower?"), AIMessage("In Paris.")]
    out, trace_id, _ = _serve(chain, {"input": "how tall is it?", "chat_history": history}, rt)
    assert out == ANSWER + " It was built by Napoleon."
    spans = harness.spans()
    streams = [s for s in spans if s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1
    stream = streams[0]
    assert stream.context.trace_id == trace_id
    assert stream.attributes[semconv.STREAM_ANSWER] == out  # the condense call's text is not in it
    assert stream.attributes[semconv.STREAM_CONTEXT_COUNT] == len(DOCS)
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"
    inputs = rt.contexts.get(trace_id)
    assert inputs is not None and inputs.question == "how tall is it?"  # found under ``input``
    assert inputs.contexts == DOCS
    assert _binding.active_count() == 0


def test_a_chain_run_outside_any_request_is_judged_too(instrumented, harness) -> None:  # type: ignore[no-untyped-def]
    prompt = ChatPromptTemplate.from_template("Context: {context}\nQuestion: {query}")
    chain = (RunnablePassthrough.assign(context=itemgetter("query") | Docs() | _format)
             | prompt | ScriptedChat() | StrOutputParser())

    async def go() -> str:
        return "".join([c async for c in chain.astream({"query": "How tall is it?", "chat_history": []})])

    out = asyncio.run(go())
    streams = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert len(streams) == 1
    assert streams[0].attributes[semconv.STREAM_ANSWER] == out == ANSWER
    inputs = instrumented.contexts.get(streams[0].context.trace_id)
    assert inputs is not None and inputs.question == "How tall is it?"  # found under ``query``


def test_question_from_the_last_human_message(instrumented, harness) -> None:  # type: ignore[no-untyped-def]
    chain = ChatPromptTemplate.from_messages([MessagesPlaceholder("messages")]) | ScriptedChat() \
        | StrOutputParser()
    value = {"messages": [("user", "Where is it?"), ("assistant", "Paris."), ("user", "How tall is it?")]}

    async def go() -> None:
        _ = [c async for c in chain.astream(value)]

    asyncio.run(go())
    stream = next(s for s in harness.spans() if s.name == semconv.SPAN_STREAM)
    assert stream.attributes[semconv.STREAM_ANSWER] == ANSWER
    inputs = instrumented.contexts.get(stream.context.trace_id)
    assert inputs is not None and inputs.question == "How tall is it?"


def test_only_a_streamed_chain_answers_and_only_once_per_request(instrumented, harness) -> None:  # type: ignore[no-untyped-def]
    # a helper chain invoked beside the answer (a title, a rewrite) never takes the request's stream
    helper = ChatPromptTemplate.from_template("Title for: {input}") | ScriptedChat(answer="Title.") \
        | StrOutputParser()
    chain = ChatPromptTemplate.from_template("{input}") | ScriptedChat() | StrOutputParser()
    after = ChatPromptTemplate.from_template("{input}") | ScriptedChat(answer="Follow-up?") \
        | StrOutputParser()

    async def run(value: Any) -> str:
        await helper.ainvoke(value)
        out = "".join([c async for c in chain.astream(value)])
        _ = [c async for c in after.astream(value)]  # streamed too, but the request has its answer
        return out

    from opentelemetry import context as otel_context

    from streamjudge.instrumentation._asgi import finish_stream

    async def go() -> None:
        with instrumented.tracer.start_as_current_span("POST /chat") as req:
            binding = _binding.StreamBinding(req.get_span_context().trace_id, owner="http",
                                             parent=otel_context.get_current())
            _binding.bind(binding)
            try:
                await run({"input": "How tall is it?"})
            finally:
                _binding.unbind(binding)
                await finish_stream(binding)

    asyncio.run(go())
    streams = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert [s.attributes[semconv.STREAM_ANSWER] for s in streams] == [ANSWER]


def test_create_retrieval_chain_with_a_history_aware_retriever(instrumented, harness) -> None:  # type: ignore[no-untyped-def]
    # the LangChain tutorial's shape: the condense call sits in a RunnableBranch before the retriever, the
    # answer in a stuff-documents chain under ``assign(answer=...)``; the chain streams dicts
    chains = pytest.importorskip("langchain_classic.chains")
    stuff = pytest.importorskip("langchain_classic.chains.combine_documents")
    model = ScriptedChat()
    contextualize = ChatPromptTemplate.from_messages([
        ("system", "Rephrase as a standalone question."), MessagesPlaceholder("chat_history"), ("human", "{input}")])
    qa = ChatPromptTemplate.from_messages([
        ("system", "Answer from: {context}"), MessagesPlaceholder("chat_history"), ("human", "{input}")])
    rag = chains.create_retrieval_chain(chains.create_history_aware_retriever(model, Docs(), contextualize),
                                        stuff.create_stuff_documents_chain(model, qa))

    async def go() -> str:
        value = {"input": "how tall is it?", "chat_history": [("human", "Where is it?"), ("ai", "Paris.")]}
        return "".join([c["answer"] async for c in rag.astream(value) if "answer" in c])

    assert asyncio.run(go()) == ANSWER
    streams = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert [s.attributes[semconv.STREAM_ANSWER] for s in streams] == [ANSWER]
    assert streams[0].attributes[semconv.STREAM_CONTEXT_COUNT] == len(DOCS)
    inputs = instrumented.contexts.get(streams[0].context.trace_id)
    assert inputs is not None and inputs.question == "how tall is it?"


def test_question_keys_setting(harness) -> None:  # type: ignore[no-untyped-def]
    rt = harness.configure(judge=KeywordJudge(), question_keys=("ask",))
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    try:
        chain = ChatPromptTemplate.from_template("{ask}") | ScriptedChat() | StrOutputParser()
        _, trace_id, _ = _serve(chain, {"ask": "How tall is it?", "question": "not this"}, rt)
    finally:
        inst.uninstrument()
    inputs = rt.contexts.get(trace_id)
    assert inputs is not None and inputs.question == "How tall is it?"


def test_a_chain_whose_models_all_feed_later_steps_is_reported_once(instrumented, harness, caplog) -> None:  # type: ignore[no-untyped-def]
    # the model's output is consumed by a retriever: no answer, and the request span says why
    chain = CONDENSE | ScriptedChat() | StrOutputParser() | Docs()
    caplog.set_level(logging.INFO, logger="streamjudge.instrumentation._chains")
    for _ in range(2):
        _serve(chain, {"input": "how tall?", "chat_history": []}, instrumented)
    spans = harness.spans()
    assert not [s for s in spans if s.name == semconv.SPAN_STREAM]
    requests = [s for s in spans if s.name == "POST /chat"]
    assert [r.attributes.get(semconv.ANSWER_NOT_FOUND) for r in requests] == [_chains.NOT_RETURNED] * 2
    lines = [r.getMessage() for r in caplog.records if "no answer to judge" in r.getMessage()]
    assert len(lines) == 1 and "POST /chat" in lines[0] and "does not reach" in lines[0]


def test_uninstrument_restores_runnable_sequence(harness) -> None:  # type: ignore[no-untyped-def]
    from langchain_core.runnables import RunnableSequence

    harness.configure(judge=KeywordJudge())
    before = {a: vars(RunnableSequence)[a] for a in ("invoke", "ainvoke", "_transform", "_atransform")}
    inst = StreamJudgeInstrumentor()
    inst.instrument()
    assert vars(RunnableSequence)["_atransform"] is not before["_atransform"]
    inst.uninstrument()
    assert {a: vars(RunnableSequence)[a] for a in before} == before


# --- the structural rule, without callbacks ----------------------------------------------------------

def test_reaching_steps_of_a_sequence() -> None:
    model = ScriptedChat()
    seq = ANSWER_PROMPT | model | StrOutputParser() | RunnableLambda(lambda s: s.strip())
    assert _chains.reaching_steps(seq) == (False, True, True, True)
    condense = CONDENSE | model | StrOutputParser() | Docs()
    assert _chains.reaching_steps(condense) == (False, False, False, True)
    # a later step that holds a model anywhere inside (a map branch) consumes the output
    two = CONDENSE | model | RunnableParallel(a=ANSWER_PROMPT | model) | StrOutputParser()
    assert _chains.reaching_steps(two)[1] is False
