"""(d) A langserve-style conversational retrieval chain, no LangGraph: LCEL streamed as SSE.

condense-question LLM call -> retriever -> prompt | model | StrOutputParser, streamed with ``astream``;
``POST /stream`` writes langserve's frames: ``event: metadata``, one ``event: data`` per chunk with the
chunk as a JSON string (``data: "token"``), ``event: end``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from operator import itemgetter
from typing import Any

from _kit import CELL_HEADER, LANGSERVE_END, LANGSERVE_META, apply_cell, langserve_token, llm, search
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from langchain_core.callbacks import CallbackManagerForRetrieverRun
from langchain_core.documents import Document
from langchain_core.output_parsers import StrOutputParser
from langchain_core.prompts import ChatPromptTemplate
from langchain_core.retrievers import BaseRetriever
from langchain_core.runnables import RunnablePassthrough
from pydantic import BaseModel

CONDENSE = ChatPromptTemplate.from_template(
    "Given the following conversation and a follow up question, rephrase the follow up question to be a "
    "standalone question.\nChat History:\n{chat_history}\nFollow Up Input: {question}\nStandalone question:")
ANSWER = ChatPromptTemplate.from_messages([
    ("system", "Answer the question based only on the following context:\n{context}"),
    ("human", "{question}"),
])


class KeywordRetriever(BaseRetriever):
    """The knowledge base as a LangChain retriever."""

    def _get_relevant_documents(self, query: str, *, run_manager: CallbackManagerForRetrieverRun
                                ) -> list[Document]:
        return [Document(page_content=d) for d in search(query)]


def format_docs(docs: list[Document]) -> str:
    return "\n\n".join(d.page_content for d in docs)


standalone = RunnablePassthrough.assign(standalone_question=CONDENSE | llm() | StrOutputParser())
context = {"context": itemgetter("standalone_question") | KeywordRetriever() | format_docs,
           "question": itemgetter("question")}
chain = standalone | context | ANSWER | llm() | StrOutputParser()
router = APIRouter(prefix="/lcel")


class StreamRequest(BaseModel):
    input: dict[str, Any]



@router.post("/stream")
async def stream(req: StreamRequest, request: Request) -> StreamingResponse:
    apply_cell(request.headers.get(CELL_HEADER))

    async def frames() -> AsyncIterator[str]:
        yield LANGSERVE_META
        async for chunk in chain.astream(req.input):
            if chunk:
                yield langserve_token(chunk)
        yield LANGSERVE_END

    return StreamingResponse(frames(), media_type="text/event-stream")

