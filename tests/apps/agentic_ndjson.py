"""An agentic RAG API: the model decides to retrieve, a grader in a conditional edge checks the documents.

Mirrors LangGraph's agentic-RAG tutorial served as NDJSON: ``generate_query_or_respond`` (tools bound) ->
``retrieve`` (a ToolNode) -> ``grade_documents`` (a conditional edge, structured output) ->
``generate_answer``; each graph update goes out as one ``{node: content}`` line (``POST /ask``); ``POST /ask_json``
answers in one JSON body.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Literal

import uvicorn
from _appkit import llm, port, search
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from langchain_core.messages import BaseMessage
from langchain_core.tools import tool
from langgraph.graph import END, START, MessagesState, StateGraph
from langgraph.prebuilt import ToolNode, tools_condition
from pydantic import BaseModel, Field

GRADE_PROMPT = ("You are a grader assessing relevance of a retrieved document to a user question.\n"
                "Here is the retrieved document:\n{context}\nHere is the user question: {question}\n"
                "Give a binary score 'yes' or 'no'.")
GENERATE_PROMPT = ("You are an assistant for question-answering tasks. Use the retrieved context to answer.\n"
                   "Question: {question}\nContext: {context}")


@tool
def retrieve_docs(query: str) -> str:
    """Search and return passages about the query."""
    return "\n\n".join(search(query))


class GradeDocuments(BaseModel):
    """Grade documents using a binary score for relevance check."""

    binary_score: str = Field(description="Relevance score: 'yes' if relevant, or 'no' if not relevant")


async def generate_query_or_respond(state: MessagesState) -> dict[str, list[BaseMessage]]:
    response = await llm().bind_tools([retrieve_docs]).ainvoke(state["messages"])
    return {"messages": [response]}


async def grade_documents(state: MessagesState) -> Literal["generate_answer", "rewrite_question"]:
    question = state["messages"][0].content
    context = state["messages"][-1].content
    prompt = GRADE_PROMPT.format(question=question, context=context)
    grade = await llm().with_structured_output(GradeDocuments).ainvoke([{"role": "user", "content": prompt}])
    return "generate_answer" if grade.binary_score == "yes" else "rewrite_question"  # type: ignore[union-attr]


async def rewrite_question(state: MessagesState) -> dict[str, list[dict[str, str]]]:
    return {"messages": [{"role": "user", "content": str(state["messages"][0].content)}]}


async def generate_answer(state: MessagesState) -> dict[str, list[BaseMessage]]:
    question = state["messages"][0].content
    context = state["messages"][-1].content
    prompt = GENERATE_PROMPT.format(question=question, context=context)
    response = await llm().ainvoke([{"role": "user", "content": prompt}])
    return {"messages": [response]}


def build_graph():  # type: ignore[no-untyped-def]
    g = StateGraph(MessagesState)
    g.add_node(generate_query_or_respond)
    g.add_node("retrieve", ToolNode([retrieve_docs]))
    g.add_node(rewrite_question)
    g.add_node(generate_answer)
    g.add_edge(START, "generate_query_or_respond")
    g.add_conditional_edges("generate_query_or_respond", tools_condition, {"tools": "retrieve", END: END})
    g.add_conditional_edges("retrieve", grade_documents)
    g.add_edge("generate_answer", END)
    g.add_edge("rewrite_question", "generate_query_or_respond")
    return g.compile()


graph = build_graph()
app = FastAPI()


class Ask(BaseModel):
    question: str


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@app.post("/ask")
async def ask(req: Ask) -> StreamingResponse:
    async def lines() -> AsyncIterator[str]:
        async for update in graph.astream({"messages": [{"role": "user", "content": req.question}]},
                                          stream_mode="updates"):
            for node, value in update.items():
                message = value["messages"][-1]
                content = message.content if hasattr(message, "content") else message["content"]
                yield json.dumps({node: content}) + "\n"

    return StreamingResponse(lines(), media_type="application/x-ndjson")


@app.post("/ask_json")
async def ask_json(req: Ask) -> dict[str, object]:
    out = await graph.ainvoke({"messages": [{"role": "user", "content": req.question}]})
    return {"answer": out["messages"][-1].content}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port(), log_level="warning")
