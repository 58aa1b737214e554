"""(b) A sync LangGraph app: a sync answer node, served by a sync generator over ``graph.stream`` as NDJSON.

``POST /ask`` (a plain ``def`` route: FastAPI runs it and iterates the generator in its thread pool)
writes one ``{"type": "token", "content": ...}`` line per chunk of the ``generate`` node and ends with
``{"type": "done"}``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TypedDict

from _kit import CELL_HEADER, NDJSON_END, apply_cell, llm, ndjson_token, search
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from langchain_core.messages import AIMessageChunk
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel

PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question from the context only.\nContext:\n{context}"),
    ("human", "{question}"),
])


class State(TypedDict, total=False):
    question: str
    documents: list[str]
    answer: str


def retrieve(state: State) -> State:
    return {"documents": search(state["question"])}


def generate(state: State) -> State:
    messages = PROMPT.format_messages(context="\n\n".join(state["documents"]), question=state["question"])
    text = ""
    for chunk in llm().stream(messages):
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
router = APIRouter(prefix="/sync_graph")


class Ask(BaseModel):
    question: str



@router.post("/ask")
def ask(req: Ask, request: Request) -> StreamingResponse:
    apply_cell(request.headers.get(CELL_HEADER))

    def lines() -> Iterator[str]:
        for msg, meta in graph.stream({"question": req.question}, stream_mode="messages"):
            if meta.get("langgraph_node") == "generate" and isinstance(msg, AIMessageChunk) and msg.content:
                yield ndjson_token(str(msg.content))
        yield NDJSON_END

    return StreamingResponse(lines(), media_type="application/x-ndjson")

