"""(e) A plain FastAPI app, no LangChain: its model is the OpenAI SDK; the guard reads the response body.

Set up in code with ``instrument_app(app, token_extractor=...)`` (run with plain ``python``). The app
registers its question and retrieved passages for the trace (what an instrumented retriever would do)
and streams the same answer three ways: ``GET /sse`` (``event: token`` + JSON, ``event: end``),
``GET /ndjson`` (``{"type": "token", "content": ...}`` lines, ``{"type": "done"}``) and the WebSocket
``/ws`` (one JSON message per token, ``{"type": "done"}`` after each answer).

One process serves the app twice, instrumented with client events off under ``/off`` and on under
``/on`` (``instrument_app`` takes ``client_events`` per app).
"""

from __future__ import annotations

import json
import os
from collections.abc import AsyncIterator

import uvicorn
from _kit import (
    CELL_HEADER,
    NDJSON_END,
    SSE_END,
    WS_END,
    apply_cell,
    ndjson_token,
    port,
    search,
    sse_token,
    ws_token,
)
from fastapi import FastAPI, Request, WebSocket, WebSocketDisconnect
from fastapi.responses import StreamingResponse
from openai import AsyncOpenAI
from opentelemetry import trace
from starlette.applications import Starlette
from starlette.responses import JSONResponse
from starlette.routing import Mount, Route

from streamjudge import instrument_app
from streamjudge.instrumentation import SSEFrame
from streamjudge.runtime import get_runtime

client = AsyncOpenAI(base_url=os.environ["APP_LLM_BASE_URL"], api_key="test", max_retries=0)


def token_of(frame: SSEFrame) -> str | None:
    """The app's SSE token frames: ``event: token`` with ``{"token": ...}``."""
    if frame.event != "token":
        return None
    return str(json.loads(frame.data)["token"])


async def answer(question: str) -> AsyncIterator[str]:
    docs = search(question)
    trace_id = trace.get_current_span().get_span_context().trace_id
    get_runtime().contexts.register(trace_id, question=question, contexts=docs)
    context = "\n\n".join(docs)
    stream = await client.chat.completions.create(
        model="scripted-app", stream=True,
        messages=[{"role": "system", "content": f"Answer from the context only.\nContext:\n{context}"},
                  {"role": "user", "content": question}])
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            yield chunk.choices[0].delta.content


def build(client_events: bool) -> FastAPI:
    """The app, instrumented with client events on or off."""
    app = FastAPI()

    @app.get("/sse")
    async def sse(q: str, request: Request) -> StreamingResponse:
        apply_cell(request.headers.get(CELL_HEADER))

        async def frames() -> AsyncIterator[str]:
            async for tok in answer(q):
                yield sse_token(tok)
            yield SSE_END

        return StreamingResponse(frames(), media_type="text/event-stream")

    @app.get("/ndjson")
    async def ndjson(q: str, request: Request) -> StreamingResponse:
        apply_cell(request.headers.get(CELL_HEADER))

        async def lines() -> AsyncIterator[str]:
            async for tok in answer(q):
                yield ndjson_token(tok)
            yield NDJSON_END

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        await socket.accept()
        try:
            while True:
                request = await socket.receive_json()
                apply_cell(socket.query_params.get("cell"))
                async for tok in answer(request["question"]):
                    await socket.send_json(ws_token(tok))
                await socket.send_json(WS_END)
        except WebSocketDisconnect:
            return

    return instrument_app(app, token_extractor=token_of, client_events=client_events)  # type: ignore[no-any-return]


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


root = Starlette(routes=[Route("/healthz", healthz), Mount("/off", build(False)), Mount("/on", build(True))])

if __name__ == "__main__":
    uvicorn.run(root, host="127.0.0.1", port=port(), log_level="warning")
