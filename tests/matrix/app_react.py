"""(c) A ReAct agent service: retrieval is a tool of the agent; data-only JSON SSE frames, ``[DONE]``.

Mirrors the public agent-service template: ``create_react_agent`` behind ``StreamingResponse`` emitting
``data: {"type": "token", "content": ...}`` per token of the agent's answer and ``data: [DONE]``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

from _kit import CELL_HEADER, DATA_END, apply_cell, data_token, llm, search
from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel


@tool
def retrieve(query: str) -> str:
    """Search the knowledge base for passages about the query."""
    return "\n\n".join(search(query))


agent = create_react_agent(llm(), [retrieve], prompt="Answer from the knowledge base. Use the tool.")
router = APIRouter(prefix="/react")


class ChatRequest(BaseModel):
    message: str



@router.post("/stream")
async def stream(req: ChatRequest, request: Request) -> StreamingResponse:
    apply_cell(request.headers.get(CELL_HEADER))

    async def frames() -> AsyncIterator[str]:
        async for msg, meta in agent.astream({"messages": [("user", req.message)]}, stream_mode="messages"):
            if meta.get("langgraph_node") == "agent" and isinstance(msg, AIMessageChunk) and msg.content:
                yield data_token(str(msg.content))
        yield DATA_END

    return StreamingResponse(frames(), media_type="text/event-stream")

