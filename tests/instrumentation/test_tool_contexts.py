"""Contexts of a trace: each passage once, and a tool's output only when no retriever inside it returned
the documents already (an agent's retrieval tool that joins its retriever's documents into one string)."""

from __future__ import annotations

from typing import Any

from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda
from langchain_core.tools import tool
from opentelemetry.sdk.trace import TracerProvider

from streamjudge._context import ContextStore
from streamjudge.instrumentation._langgraph import StreamJudgeCallbackHandler

DOCS = (
    "The Eiffel Tower is 330 metres tall.",
    "It was completed in 1889.",
    "It stands on the Champ de Mars in Paris.",
)


class Docs(BaseRetriever):
    docs: tuple[str, ...] = DOCS

    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=d) for d in self.docs]


@tool
def retrieve(query: str) -> str:
    """Search the knowledge base (through a retriever)."""
    return "\n\n".join(d.page_content for d in Docs().invoke(query))


@tool
def lookup(query: str) -> str:
    """Search the knowledge base (a plain function, no retriever)."""
    return "The Eiffel Tower weighs 10,100 tonnes."


def _contexts(agent: Any) -> tuple[str, ...] | None:
    """Run ``agent`` (a function calling tools) under a span, with the handler as its callback."""
    store = ContextStore()
    handler = StreamJudgeCallbackHandler(answer_nodes=("agent",), contexts=lambda: store, tracer=None)
    tracer = TracerProvider().get_tracer("test")
    with tracer.start_as_current_span("request") as span:
        RunnableLambda(agent).invoke("How tall is the Eiffel Tower?", {"callbacks": [handler]})
        trace_id = span.get_span_context().trace_id
    inputs = store.get(trace_id)
    return inputs.contexts if inputs is not None else None


def test_a_tool_whose_retriever_returned_the_documents_adds_nothing() -> None:
    def agent(q: str) -> str:
        return str(retrieve.invoke({"query": q}))

    assert _contexts(agent) == DOCS  # 3 passages for 3 documents, not the joined string beside them


def test_a_tool_without_a_retriever_is_a_context_and_calls_accumulate() -> None:
    def agent(q: str) -> str:
        retrieve.invoke({"query": q})
        return str(lookup.invoke({"query": q}))

    assert _contexts(agent) == (*DOCS, "The Eiffel Tower weighs 10,100 tonnes.")


def test_the_same_passage_counts_once() -> None:
    def agent(q: str) -> str:
        lookup.invoke({"query": q})
        return str(lookup.invoke({"query": "again"}))  # the same text a second time

    assert _contexts(agent) == ("The Eiffel Tower weighs 10,100 tonnes.",)

    def twice(q: str) -> Any:
        return Docs(docs=(DOCS[0], DOCS[1], f"  {DOCS[0]}\n")).invoke(q)  # a duplicate chunk

    assert _contexts(twice) == DOCS[:2]


def test_store_keeps_each_passage_once_in_order() -> None:
    store = ContextStore()
    inputs = store.register(1, contexts=["a b", "c", "a  b", "c", "d"])
    assert inputs.contexts == ("a b", "c", "d")
    assert store.chars == len("a b") + len("c") + len("d")
