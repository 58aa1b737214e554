"""A WebSocket answer's binary messages (audio, images, files) are not answer text: passed on, not judged."""

from __future__ import annotations

from opentelemetry import trace
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.routing import WebSocketRoute
from starlette.testclient import TestClient
from starlette.websockets import WebSocket

from conftest import Harness
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeMiddleware
from streamjudge.runtime import get_runtime

CONTEXT = "The Eiffel Tower is 330 metres tall. It was completed in 1889."
TOKENS = ("The Eiffel Tower ", "is 330 metres tall. ", "It was completed in 1889.")
# what a binary frame would say if decoded as text: invented claims a judge would flag
BLOB = b"It was built by Napoleon Bonaparte in 1750 from Norwegian granite. "


async def ws(socket_: WebSocket) -> None:
    await socket_.accept()
    await socket_.receive_json()
    # what a retriever would do: the question and contexts of this trace, for the judge
    trace_id = trace.get_current_span().get_span_context().trace_id
    get_runtime().contexts.register(trace_id, question="How tall is the Eiffel Tower?", contexts=[CONTEXT])
    for tok in TOKENS:
        await socket_.send_json({"type": "token", "token": tok})
        await socket_.send_bytes(BLOB)
    await socket_.send_json({"type": "done"})
    await socket_.close()


def test_binary_messages_pass_through_unjudged(harness: Harness) -> None:
    harness.configure(end_wait_s=1.0, window_sentences=1, preflight=False)
    app = Starlette(routes=[WebSocketRoute("/ws", ws)], middleware=[Middleware(StreamJudgeMiddleware)])
    received: list[object] = []
    with TestClient(app) as client, client.websocket_connect("/ws") as sock:
        sock.send_json({"question": "How tall is the Eiffel Tower?"})
        while True:
            message = sock.receive()
            if message["type"] == "websocket.close":
                break
            received.append(message.get("bytes") or message.get("text"))
            if message.get("text") and '"done"' in message["text"]:
                break
    assert received.count(BLOB) == len(TOKENS)  # every binary message reached the client as it was
    (stream,) = [s for s in harness.spans() if s.name == semconv.SPAN_STREAM]
    assert stream.attributes[semconv.STREAM_ANSWER] == "".join(TOKENS)
    assert stream.attributes[semconv.STREAM_ALERTS] == 0
