"""The adaptive-RAG graph behind FastAPI: SSE (sse-starlette and a plain StreamingResponse) and WebSocket.

Run it bare, under zero-code instrumentation, or with the one-line setup::

    python examples/adaptive_rag/app.py                              # no telemetry
    opentelemetry-instrument python examples/adaptive_rag/app.py     # zero code
    python examples/adaptive_rag/app.py --instrument-app             # streamjudge.instrument_app(app)

The page (``GET /``) underlines the failing sentences from the guard's client events (reason and score on
hover) and shows a retraction or a stop. By default a client receives exactly the app's bytes: with
``--instrument-app`` the example switches the events on for its own page
(``instrument_app(app, client_events=True)``); under ``opentelemetry-instrument`` the settings are read before
the app's code runs, so set ``STREAMJUDGE_CLIENT_EVENTS=on`` there.

Endpoints: ``GET /chat?q=...&hallucinate=1`` (sse-starlette ``EventSourceResponse``), ``GET /chat/raw``
(the same frames through ``StreamingResponse``), ``WS /ws`` (JSON messages) and ``GET /`` (a page that
shows the answer and underlines sentences streamjudge flags).

SSE frames, in order: ``thread``, then ``status`` / ``sources`` / ``token`` (``{"token": "..."}``)
interleaved, then ``done``. Only the ``generate`` node's tokens are sent as ``token`` frames.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from fastapi import FastAPI, WebSocket, WebSocketDisconnect
from fastapi.responses import HTMLResponse, StreamingResponse
from sse_starlette import EventSourceResponse

sys.path.insert(0, str(Path(__file__).resolve().parent))
import rag


def create_app() -> FastAPI:
    """The FastAPI application. The graph is compiled once at startup."""
    app = FastAPI(title="adaptive-rag example")
    graph = rag.build_graph()

    async def frames(q: str, hallucinate: bool, thread_id: str) -> AsyncIterator[tuple[str, dict[str, Any]]]:
        yield "thread", {"thread_id": thread_id}
        async for event, payload in rag.stream_answer(graph, q, hallucinate=hallucinate):
            yield event, payload
        yield "done", {"thread_id": thread_id}

    @app.get("/chat")
    async def chat(q: str, hallucinate: bool = False, thread_id: str | None = None) -> EventSourceResponse:
        tid = thread_id or uuid.uuid4().hex

        async def events() -> AsyncIterator[dict[str, str]]:
            async for event, payload in frames(q, hallucinate, tid):
                yield {"event": event, "data": json.dumps(payload)}

        return EventSourceResponse(events(), ping=600)

    @app.get("/chat/raw")
    async def chat_raw(q: str, hallucinate: bool = False, thread_id: str | None = None) -> StreamingResponse:
        tid = thread_id or uuid.uuid4().hex

        async def body() -> AsyncIterator[str]:
            async for event, payload in frames(q, hallucinate, tid):
                yield f"event: {event}\ndata: {json.dumps(payload)}\n\n"

        return StreamingResponse(body(), media_type="text/event-stream")

    @app.websocket("/ws")
    async def ws(socket: WebSocket) -> None:
        await socket.accept()
        try:
            while True:
                request = await socket.receive_json()
                tid = request.get("thread_id") or uuid.uuid4().hex
                async for event, payload in frames(str(request["q"]), bool(request.get("hallucinate")), tid):
                    await socket.send_json({"type": event, **payload})
        except WebSocketDisconnect:
            return

    page_html = (Path(__file__).resolve().parent / "index.html").read_text()

    @app.get("/")
    async def page() -> HTMLResponse:
        return HTMLResponse(page_html)

    return app


app = create_app()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default=os.environ.get("EXAMPLE_HOST", "127.0.0.1"))
    parser.add_argument("--port", type=int, default=int(os.environ.get("EXAMPLE_PORT", "8000")))
    parser.add_argument(
        "--instrument-app", action="store_true",
        help="call streamjudge.instrument_app(app, client_events=True) "
        "(configured by OTEL_* / STREAMJUDGE_* variables)",
    )
    args = parser.parse_args(argv)
    if args.instrument_app:
        import streamjudge

        # the page is this app's own client: it reads the guard's warning / retract / stop frames
        streamjudge.instrument_app(app, client_events=True)

    import uvicorn

    uvicorn.run(app, host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
