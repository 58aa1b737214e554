"""A ReAct agent service: retrieval is a tool of the agent; tokens go out as ``data:`` JSON frames.

Mirrors the public agent-service template: ``create_react_agent`` behind a FastAPI ``StreamingResponse``
emitting ``data: {"type": "token", "content": ...}`` per token of the agent's answer and ``data: [DONE]``.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator

import uvicorn
from _appkit import llm, port, search
from fastapi import FastAPI
from fastapi.responses import PlainTextResponse, StreamingResponse
from langchain_core.messages import AIMessageChunk
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent
from pydantic import BaseModel


@tool
def retrieve(query: str) -> str:
    """Search the knowledge base for passages about the query."""
    return "\n\n".join(search(query))


agent = create_react_agent(llm(), [retrieve], prompt="Answer from the knowledge base. Use the tool.")
app = FastAPI()


class ChatRequest(BaseModel):
    message: str


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


@app.get("/metrics")
async def metrics() -> PlainTextResponse:
    return PlainTextResponse("app_requests_total 1\n")


@app.post("/stream")
async def stream(req: ChatRequest) -> StreamingResponse:
    async def frames() -> AsyncIterator[str]:
        async for msg, meta in agent.astream({"messages": [("user", req.message)]}, stream_mode="messages"):
            if meta.get("langgraph_node") == "agent" and isinstance(msg, AIMessageChunk) and msg.content:
                yield f"data: {json.dumps({'type': 'token', 'content': msg.content})}\n\n"
        yield "data: [DONE]\n\n"

    return StreamingResponse(frames(), media_type="text/event-stream")


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port(), log_level="warning")
