"""The four zero-code shapes in one FastAPI app, run under ``opentelemetry-instrument``.

Each shape keeps its own module and routes (``/async_graph/chat``, ``/sync_graph/ask``, ``/react/stream``,
``/lcel/stream``); serving them from one process saves three start-ups per client-events setting. The
answer nodes of both graph shapes (``generate``) and of the agent (``agent``) are configured together.
"""

from __future__ import annotations

import uvicorn
from _kit import port
from app_async_graph import router as async_graph
from app_lcel import router as lcel
from app_react import router as react
from app_sync_graph import router as sync_graph
from fastapi import FastAPI

app = FastAPI()
for router in (async_graph, sync_graph, react, lcel):
    app.include_router(router)


@app.get("/healthz")
async def healthz() -> dict[str, bool]:
    return {"ok": True}


if __name__ == "__main__":
    uvicorn.run(app, host="127.0.0.1", port=port(), log_level="warning")
