"""A small adaptive-RAG graph: retrieve -> grade -> (rewrite -> retrieve) -> generate -> reflect.

Runs offline: the corpus is in memory, the retriever is keyword based and both the grader and the
generator are deterministic LangChain chat models that stream token by token (so LangGraph, callbacks and
any instrumentation see exactly what a real model would produce). The generator can be told to
hallucinate (``configurable={"hallucinate": True}``): after one grounded sentence it invents facts the
sources do not contain. Set ``EXAMPLE_LLM_MODEL`` (with ``OPENAI_API_KEY`` / ``OPENAI_BASE_URL``) to use
a real OpenAI-compatible model instead.

Nothing here knows about streamjudge or OpenTelemetry: it is the application being instrumented.
"""

from __future__ import annotations

import asyncio
import os
import re
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, TypedDict

from langchain_core.callbacks import (
    AsyncCallbackManagerForLLMRun,
    AsyncCallbackManagerForRetrieverRun,
    CallbackManagerForLLMRun,
    CallbackManagerForRetrieverRun,
)
from langchain_core.documents import Document
from langchain_core.language_models import BaseChatModel
from langchain_core.messages import AIMessage, AIMessageChunk, BaseMessage, HumanMessage, SystemMessage
from langchain_core.outputs import ChatGeneration, ChatGenerationChunk, ChatResult
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableConfig
from langgraph.graph import END, START, StateGraph

CORPUS: tuple[Document, ...] = (
    Document(
        page_content=(
            "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. "
            "It was designed by the engineering company of Gustave Eiffel and built between 1887 and 1889 "
            "for the 1889 World's Fair. The tower is 330 metres tall including its antennas."
        ),
        metadata={"id": "eiffel", "title": "Eiffel Tower"},
    ),
    Document(
        page_content=(
            "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak, Uhuru, rises 5,895 metres "
            "above sea level, which makes it the highest mountain in Africa. The first recorded ascent was "
            "made by Hans Meyer and Ludwig Purtscheller in 1889."
        ),
        metadata={"id": "kilimanjaro", "title": "Mount Kilimanjaro"},
    ),
    Document(
        page_content=(
            "The Great Barrier Reef lies off the coast of Queensland, Australia. It is the world's largest "
            "coral reef system, made of about 2,900 individual reefs spread over roughly 344,400 square "
            "kilometres. Rising sea temperatures have caused several mass bleaching events since 1998."
        ),
        metadata={"id": "reef", "title": "Great Barrier Reef"},
    ),
    Document(
        page_content=(
            "The Danube is the second-longest river in Europe, after the Volga. It flows for about 2,850 "
            "kilometres from the Black Forest in Germany to the Black Sea, passing through ten countries "
            "and four capital cities: Vienna, Bratislava, Budapest and Belgrade."
        ),
        metadata={"id": "danube", "title": "Danube"},
    ),
)

_STOP = frozenset(re.findall(r"\S+",
    "a an and are as at be by did does for from has have how in is it its many much of on or the this "
    "to was were what when where which who whom why with tell me about long tall high"
))
_WORD = re.compile(r"[A-Za-z0-9][A-Za-z0-9'-]*")
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z])")

# invented facts for the hallucinating generator: none of these names or numbers is in CORPUS
_INVENTIONS = (
    "It was originally painted bright green by Leonardo Marconi in 1712.",
    "Every year about 94 million visitors arrive there by submarine from Lisbon.",
    "Its official height was reduced to 1,204 metres by a royal decree of King Harald Bluetooth.",
)


def content_words(text: str) -> set[str]:
    """Lower-cased words of ``text`` that carry meaning (stop words removed)."""
    return {w.lower() for w in _WORD.findall(text) if w.lower() not in _STOP}


def _token_delay() -> float:
    return float(os.environ.get("EXAMPLE_TOKEN_DELAY_MS", "2")) / 1000.0


class KeywordRetriever(BaseRetriever):
    """Ranks CORPUS by content-word overlap with the query; returns the top ``k`` with any overlap."""

    k: int = 2

    def _get_relevant_documents(
        self, query: str, *, run_manager: CallbackManagerForRetrieverRun
    ) -> list[Document]:
        q = content_words(query)
        ranked = sorted(CORPUS, key=lambda d: len(q & content_words(d.page_content)), reverse=True)
        return [d for d in ranked[: self.k] if q & content_words(d.page_content)]

    async def _aget_relevant_documents(
        self, query: str, *, run_manager: AsyncCallbackManagerForRetrieverRun
    ) -> list[Document]:
        await asyncio.sleep(0.002)  # an index lookup takes a moment
        q = content_words(query)
        ranked = sorted(CORPUS, key=lambda d: len(q & content_words(d.page_content)), reverse=True)
        return [d for d in ranked[: self.k] if q & content_words(d.page_content)]


def _words(text: str) -> list[str]:
    """Split into streaming tokens the way tokenizers do: each word keeps its leading space."""
    return re.findall(r"\s*\S+", text)


class OfflineChatModel(BaseChatModel):
    """A deterministic chat model. ``role`` picks its behaviour from the prompt it is given.

    - ``grader``: answers ``yes``/``no``: does the document (system message) share a content word with
      the question (human message)?
    - ``generator``: an extractive answer from the sources in the system message; with
      ``hallucinate`` in the human message's ``additional_kwargs`` it invents facts after one sentence.
    - ``reflector``: answers ``grounded`` (a self-check whose text must never reach the user).
    """

    role: str = "generator"

    @property
    def _llm_type(self) -> str:
        return f"offline-{self.role}"

    def _reply(self, messages: Sequence[BaseMessage]) -> str:
        system = " ".join(str(m.content) for m in messages if isinstance(m, SystemMessage))
        human = next((m for m in reversed(messages) if isinstance(m, HumanMessage)), None)
        question = str(human.content) if human else ""
        if self.role == "grader":
            return "yes" if content_words(question) & content_words(system) else "no"
        if self.role == "reflector":
            return "grounded"
        q = content_words(question)
        sources = system.split("Sources:", 1)[-1]
        sentences = [s.strip() for s in _SENTENCE.split(sources) if s.strip()]
        scored = sorted(
            ((len(q & content_words(s)), i, s) for i, s in enumerate(sentences)),
            key=lambda t: (-t[0], t[1]),
        )
        picked = [s for score, _, s in scored if score > 0][:3]
        if not picked:
            return "I could not find that in the sources."
        picked.sort(key=sources.find)
        written = " ".join(str(m.content) for m in messages if isinstance(m, AIMessage))
        if written:  # asked to continue its own answer (a regeneration): do not repeat what is written
            rest = [s for s in picked if s not in written]
            return " " + " ".join(rest) if rest else ""
        if human is not None and human.additional_kwargs.get("hallucinate"):
            return " ".join([picked[0], *_INVENTIONS])
        return " ".join(picked)

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        return ChatResult(generations=[ChatGeneration(message=AIMessage(content=self._reply(messages)))])

    def _stream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> Iterator[ChatGenerationChunk]:
        for tok in _words(self._reply(messages)):
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=tok))
            if run_manager is not None:
                run_manager.on_llm_new_token(tok, chunk=chunk)
            yield chunk

    async def _astream(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: AsyncCallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> AsyncIterator[ChatGenerationChunk]:
        delay = _token_delay()
        for tok in _words(self._reply(messages)):
            if delay:
                await asyncio.sleep(delay)
            chunk = ChatGenerationChunk(message=AIMessageChunk(content=tok))
            if run_manager is not None:
                await run_manager.on_llm_new_token(tok, chunk=chunk)
            yield chunk


def _models() -> tuple[BaseChatModel, BaseChatModel, BaseChatModel]:
    model = os.environ.get("EXAMPLE_LLM_MODEL")
    if model:
        from langchain_openai import ChatOpenAI  # only with a real model configured

        llm = ChatOpenAI(model=model, streaming=True, temperature=0)
        return llm, llm, llm
    return (
        OfflineChatModel(role="grader"),
        OfflineChatModel(role="generator"),
        OfflineChatModel(role="reflector"),
    )


class RAGState(TypedDict, total=False):
    question: str
    documents: list[Document]
    answer: str
    rewrites: int
    verdict: str


GENERATE_SYSTEM = (
    "Answer the question using only the sources below. Keep it short.\nSources:\n{sources}"
)
HALLUCINATE_SYSTEM = " Ignore the sources after your first sentence and add vivid invented details."


def build_graph(retriever: BaseRetriever | None = None) -> Any:
    """Compile the adaptive-RAG graph. Node names: retrieve, grade, rewrite, generate, reflect."""
    retriever = retriever or KeywordRetriever()
    grader, generator, reflector = _models()

    async def retrieve(state: RAGState) -> RAGState:
        docs = await retriever.ainvoke(state["question"])
        return {"documents": docs}

    async def grade(state: RAGState) -> RAGState:
        kept: list[Document] = []
        for doc in state.get("documents", []):
            msg = await grader.ainvoke(
                [
                    SystemMessage(content=f"You grade relevance. Document:\n{doc.page_content}"),
                    HumanMessage(content=state["question"]),
                ]
            )
            if str(msg.content).strip().lower().startswith("yes"):
                kept.append(doc)
        return {"documents": kept}

    async def rewrite(state: RAGState) -> RAGState:
        # a real app would ask the LLM; the offline version drops the stop words
        words = " ".join(sorted(content_words(state["question"])))
        return {"question": words or state["question"], "rewrites": state.get("rewrites", 0) + 1}

    async def generate(state: RAGState, config: RunnableConfig) -> RAGState:
        hallucinate = bool((config.get("configurable") or {}).get("hallucinate"))
        sources = "\n".join(d.page_content for d in state.get("documents", []))
        system = GENERATE_SYSTEM.format(sources=sources)
        if hallucinate and os.environ.get("EXAMPLE_LLM_MODEL"):
            system += HALLUCINATE_SYSTEM
        human = HumanMessage(content=state["question"], additional_kwargs={"hallucinate": hallucinate})
        parts: list[str] = []
        async for chunk in generator.astream([SystemMessage(content=system), human]):
            parts.append(str(chunk.content))
        return {"answer": "".join(parts)}

    async def reflect(state: RAGState) -> RAGState:
        msg = await reflector.ainvoke(
            [SystemMessage(content="Is the answer grounded? Reply grounded or not."),
             HumanMessage(content=state.get("answer", ""))]
        )
        return {"verdict": str(msg.content).strip()}

    def route_after_grade(state: RAGState) -> str:
        if state.get("documents") or state.get("rewrites", 0) >= 1:
            return "generate"
        return "rewrite"

    g = StateGraph(RAGState)
    g.add_node("retrieve", retrieve)
    g.add_node("grade", grade)
    g.add_node("rewrite", rewrite)
    g.add_node("generate", generate)
    g.add_node("reflect", reflect)
    g.add_edge(START, "retrieve")
    g.add_edge("retrieve", "grade")
    g.add_conditional_edges("grade", route_after_grade, {"generate": "generate", "rewrite": "rewrite"})
    g.add_edge("rewrite", "retrieve")
    g.add_edge("generate", "reflect")
    g.add_edge("reflect", END)
    return g.compile()


async def stream_answer(
    graph: Any, question: str, *, hallucinate: bool = False
) -> AsyncIterator[tuple[str, dict[str, Any]]]:
    """Run the graph and yield ``(event, payload)`` pairs in the order the SSE endpoint sends them.

    Tokens are filtered to the ``generate`` node, so grading and reflection never reach the answer.
    """
    config: RunnableConfig = {"configurable": {"hallucinate": hallucinate}}
    async for mode, item in graph.astream(
        {"question": question}, config, stream_mode=["messages", "updates"]
    ):
        if mode == "messages":
            chunk, meta = item
            if meta.get("langgraph_node") == "generate" and chunk.content:
                yield "token", {"token": str(chunk.content)}
        else:
            for node, update in item.items():
                yield "status", {"node": node}
                if node == "grade" and update:
                    docs = update.get("documents", [])
                    yield "sources", {"sources": [d.metadata.get("id") for d in docs]}
