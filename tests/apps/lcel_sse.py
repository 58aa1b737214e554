"""A langserve-style conversational retrieval chain (LCEL, no LangGraph) streamed as SSE.

Mirrors the public conversational-retrieval template: a condense-question call rewrites the follow-up
into a standalone question, a retriever fetches passages for it, and ``prompt | model | parser`` answers.
``chain.astream`` goes out as langserve's frames: ``event: data`` with the JSON-encoded chunk, then
``event: end``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any

import uvicorn
from _appkit import llm, port, search
from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnableLambda, RunnableParallel, RunnablePassthrough
from pydantic import BaseModel


class KnowledgeBase(BaseRetriever):
    def _get_relevant_documents(self, query: str, *,
                                run_manager: CallbackManagerForRetrieverRun) -> list[Document]:
        return [Document(page_content=p) for p in search(query)]


CONDENSE_QUESTION_PROMPT = ChatPromptTemplate.from_template(
    "Given the following conversation and a follow up question, rephrase the follow up question to be a "
    "standalone question.\n\nChat History:\n{chat_history}\nFollow Up Input: {input}\nStandalone question:")
ANSWER_PROMPT = ChatPromptTemplate.from_template(
    "Answer the question based only on the following context:\n{context}\n\nQuestion: {question}")


def _format_chat_history(history: list[tuple[str, str]]) -> str:
    return "\n".join(f"{who}: {text}" for who, text in history)


def _combine_documents(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


_inputs = RunnableParallel(
    standalone_question=RunnablePassthrough.assign(
        chat_history=lambda x: _format_chat_history(x["chat_history"]))
    | CONDENSE_QUESTION_PROMPT | llm() | StrOutputParser(),
)
_context = {
    "context": itemgetter("standalone_question") | KnowledgeBase() | _combine_documents,
    "question": RunnableLambda(lambda x: x["standalone_question"]),
}
chain = _inputs | _context | ANSWER_PROMPT | llm() | StrOutputParser()
# a search route: the model only rewrites the query for the retriever, so there is no answer to judge
search_chain = _inputs | itemgetter("standalone_question") | KnowledgeBase()
app = FastAPI()


class ChatRequest(BaseModel):
    input: str
    chat_history: list[tuple[str, str]] = []


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@app.post("/chat/stream")
async def stream(req: ChatRequest) -> StreamingResponse:
    async def frames() -> AsyncIterator[str]:
        value: dict[str, Any] = {"input": req.input, "chat_history": req.chat_history}
        async for chunk in chain.astream(value):
            yield f"event: data\ndata: {json.dumps(chunk)}\n\n"
        yield "event: end\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")


@app.post("/search/stream")
async def search_stream(req: ChatRequest) -> StreamingResponse:
    async def frames() -> AsyncIterator[str]:
        value: dict[str, Any] = {"input": req.input, "chat_history": req.chat_history}
        async for docs in search_chain.astream(value):
            yield f"event: data\ndata: {json.dumps([d.page_content for d in docs])}\n\n"
        yield "event: end\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port(), log_level="warning")
