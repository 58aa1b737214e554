"""What the matrix's app shapes share: the knowledge base, the model client, the wire formats, the switch.

Importable without LangChain (the test module renders the apps' frames with the same functions), so
the heavy imports happen inside :func:`llm`.

The switch: one process serves every (action, mode) of its shape; a request names its cell in the
``x-matrix-cell`` header (``action,mode``; a WebSocket in its ``cell`` query parameter) and the app's
route puts those two settings into the process's runtime before the answer starts. Requests of one
process run one at a time. The stream span records the action and mode it ran with, and every cell
asserts them, so a switch that did not take is a failing cell, never a silently wrong one.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re
from typing import Any

DOCS: tuple[str, ...] = (
    "The Eiffel Tower in Paris is 330 metres tall. It was completed in 1889 for the World's Fair.",
    "The Colosseum in Rome could hold about 50,000 spectators. It was completed in 80 AD.",
)
CELL_HEADER = "x-matrix-cell"


def search(query: str) -> list[str]:
    """The passages sharing a content word with the query (a keyword retriever)."""
    words = {w for w in re.findall(r"[a-z]+", query.lower()) if len(w) > 3}
    return [d for d in DOCS if words & set(re.findall(r"[a-z]+", d.lower()))]


def llm() -> Any:
    """The app's chat model: langchain-openai against the test's scripted server."""
    from langchain_openai import ChatOpenAI

    return ChatOpenAI(model="scripted-app", base_url=os.environ["APP_LLM_BASE_URL"], api_key="test",
                      temperature=0, max_retries=0)  # type: ignore[arg-type]


def port() -> int:
    return int(os.environ["APP_PORT"])


def apply_cell(cell: str | None) -> None:
    """Run the next answer with the cell's action and mode (``"stop,hold_back"``); None: as configured."""
    if not cell:
        return
    from streamjudge.runtime import current_runtime

    rt = current_runtime()
    if rt is None:
        return
    action, mode = cell.split(",")
    rt.settings = dataclasses.replace(rt.settings, action=action, mode=mode)  # type: ignore[arg-type]


# --- the apps' own frames (the test renders the expected bytes with these) --------------------------

def sse_token(token: str) -> str:
    """(a) and the body shape's SSE route: a named event with a JSON payload."""
    return f"event: token\ndata: {json.dumps({'token': token})}\n\n"


SSE_END = "event: end\ndata: {}\n\n"


def ndjson_token(token: str) -> str:
    """(b) and the body shape's NDJSON route: one JSON object per line."""
    return json.dumps({"type": "token", "content": token}) + "\n"


NDJSON_END = json.dumps({"type": "done"}) + "\n"


def data_token(token: str) -> str:
    """(c) the agent-service template: data-only JSON frames."""
    return f"data: {json.dumps({'type': 'token', 'content': token})}\n\n"


DATA_END = "data: [DONE]\n\n"


def langserve_token(token: str) -> str:
    """(d) langserve's stream: ``event: data`` with the token as a JSON string."""
    return f"event: data\ndata: {json.dumps(token)}\n\n"


LANGSERVE_META = f"event: metadata\ndata: {json.dumps({'run_id': 'matrix'})}\n\n"
LANGSERVE_END = "event: end\n\n"


def ws_token(token: str) -> dict[str, str]:
    """The body shape's WebSocket route: one JSON message per token."""
    return {"type": "token", "content": token}


WS_END: dict[str, str] = {"type": "done"}
