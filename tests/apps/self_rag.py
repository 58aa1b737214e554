"""A self-RAG graph: retrieve -> generate, then a hallucination grader in the edge after ``generate``.

Mirrors LangGraph's self-RAG tutorial: the grader is a structured-output call (``{"binary_score":
"yes"}``) made in the conditional edge, so LangGraph tags its run with the source node's name,
``generate``. Served as SSE (sse-starlette): the app streams every ``generate`` chunk of the ``messages``
stream as ``event: token`` — the grader's JSON included, as such apps do — then ``event: done`` with the
graph's final ``generation``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import TypedDict

import uvicorn
from _appkit import llm, port, search
from fastapi import FastAPI
from langchain_core.messages import AIMessageChunk
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langgraph.graph import END, START, StateGraph
from pydantic import BaseModel, Field
from sse_starlette import EventSourceResponse

PROMPT = ChatPromptTemplate.from_messages([
    ("system", "Answer the question from the context only.\nContext:\n{context}"),
    ("human", "{question}"),
])


class GradeHallucinations(BaseModel):
    """Binary score for hallucination present in generation answer."""

    binary_score: str = Field(description="Answer is grounded in the facts, 'yes' or 'no'")


class State(TypedDict, total=False):
    question: str
    documents: list[str]
    generation: str


async def retrieve(state: State) -> State:
    return {"documents": search(state["question"])}


async def generate(state: State) -> State:
    chain = PROMPT | llm() | StrOutputParser()
    generation = await chain.ainvoke({"context": "\n\n".join(state["documents"]), "question": state["question"]})
    return {"generation": generation}


async def grade_generation(state: State) -> str:
    grader = llm().with_structured_output(GradeHallucinations)
    prompt = f"Set of facts:\n{state['documents']}\n\nLLM generation: {state['generation']}"
    score = await grader.ainvoke([{"role": "user", "content": prompt}])
    return "useful" if score.binary_score == "yes" else "not supported"  # type: ignore[union-attr]


def build_graph():  # type: ignore[no-untyped-def]
    g = StateGraph(State)
    g.add_node("retrieve", retrieve)
    g.add_node("generate", generate)
    g.add_edge(START, "retrieve")
    g.add_edge("retrieve", "generate")
    g.add_conditional_edges("generate", grade_generation, {"useful": END, "not supported": "generate"})
    return g.compile()


app = FastAPI()


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@app.get("/chat")
async def chat(q: str) -> EventSourceResponse:
    graph = build_graph()

    async def events() -> AsyncIterator[dict[str, str]]:
        final: dict[str, object] = {}
        async for mode, item in graph.astream({"question": q}, stream_mode=["messages", "values"]):
            if mode == "values":
                final = dict(item)  # type: ignore[arg-type]
                continue
            msg, meta = item  # type: ignore[misc]
            if meta.get("langgraph_node") == "generate" and isinstance(msg, AIMessageChunk) and msg.content:
                yield {"event": "token", "data": json.dumps({"token": msg.content})}
        yield {"event": "done", "data": json.dumps({"generation": final.get("generation")})}

    return EventSourceResponse(events(), ping=600)


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port(), log_level="warning")
