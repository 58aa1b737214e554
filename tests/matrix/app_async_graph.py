"""(a) An async LangGraph app: retrieve -> generate, the answer node streams its chat model; SSE out.

``GET /chat?q=...`` streams every ``generate`` chunk of the graph's ``messages`` stream as ``event: token``
and ends with ``event: end``. Nothing here knows about streamjudge (it runs under opentelemetry-instrument)
except the test's cell switch (see ``_kit``).
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import TypedDict

from _kit import CELL_HEADER, SSE_END, apply_cell, llm, search, sse_token
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from langchain_core.messages import AIMessageChunk
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, StateGraph

PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question from the context only.\nContext:\n{context}"),
    ("human", "{question}"),
])


class State(TypedDict, total=False):
    question: str
    documents: list[str]
    answer: str


async def retrieve(state: State) -> State:
    return {"documents": search(state["question"])}


async def generate(state: State) -> State:
    messages = PROMPT.format_messages(context="\n\n".join(state["documents"]), question=state["question"])
    text = ""
    async for chunk in llm().astream(messages):
        text += str(chunk.content)
    return {"answer": text}


def build_graph():  # type: ignore[no-untyped-def]
    g = StateGraph(State)
    g.add_node("retrieve", retrieve)
    g.add_node("generate", generate)
    g.add_edge(START, "retrieve")
    g.add_edge("retrieve", "generate")
    g.add_edge("generate", END)
    return g.compile()


graph = build_graph()
router = APIRouter(prefix="/async_graph")



@router.get("/chat")
async def chat(q: str, request: Request) -> StreamingResponse:
    apply_cell(request.headers.get(CELL_HEADER))

    async def frames() -> AsyncIterator[str]:
        async for msg, meta in graph.astream({"question": q}, stream_mode="messages"):
            if meta.get("langgraph_node") == "generate" and isinstance(msg, AIMessageChunk) and msg.content:
                yield sse_token(str(msg.content))
        yield SSE_END

    return StreamingResponse(frames(), media_type="text/event-stream")

