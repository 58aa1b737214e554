"""Bodies whose tokens are JSON strings (``data: "token"``, langserve's form; ``"token"`` lines of NDJSON):
the judged answer is the decoded text, never the text with JSON's quotes around each token."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator

import httpx
import pytest
from opentelemetry import trace
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import StreamingResponse
from starlette.routing import Route

from conftest import Harness
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeMiddleware
from streamjudge.instrumentation._sse import (
    JSONLinesParser,
    SSEFrame,
    TerminalFrames,
    extract_from_json,
    make_token_extractor,
)
from streamjudge.runtime import get_runtime

QUESTION = "Who founded the company?"
CONTEXT = "Harrison founded the company in 2022. It later grew to fifty people."
TOKENS = ["Harrison", " later", " founded", ' the "LangChain"', " company."]
ANSWER = "".join(TOKENS)


def test_sse_data_that_is_a_json_string_is_decoded() -> None:
    extract = make_token_extractor()
    assert [extract(SSEFrame(None, json.dumps(t))) for t in TOKENS] == TOKENS
    # langserve's /stream: event "data", each chunk JSON-encoded
    assert extract(SSEFrame("data", '"Harrison"')) == "Harrison"
    assert extract(SSEFrame("data", '{"content": " later", "type": "AIMessageChunk"}')) == " later"
    # text that only starts with a quote is not JSON: it is the token as sent
    assert extract(SSEFrame(None, '"Quoted" she said')) == '"Quoted" she said'
    assert extract(SSEFrame(None, '""')) is None  # an empty JSON string carries no token
    # a configured path reads into objects only
    assert make_token_extractor("token")(SSEFrame(None, '"x"')) is None


def test_ndjson_lines_that_are_json_strings_are_tokens() -> None:
    parser = JSONLinesParser(TerminalFrames())
    body = "".join(json.dumps(t) + "\n" for t in TOKENS).encode()
    _, tokens, _ = parser.feed_split(body)
    assert tokens == TOKENS
    assert extract_from_json("x", ("token",)) is None
    assert extract_from_json({"token": "x"}, None) == "x"


async def _tokens(request: Request) -> AsyncIterator[str]:
    trace_id = trace.get_current_span().get_span_context().trace_id
    get_runtime().contexts.register(trace_id, question=QUESTION, contexts=[CONTEXT])
    for tok in TOKENS:
        await asyncio.sleep(0)
        yield tok


async def sse_unnamed(request: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        async for tok in _tokens(request):
            yield f"data: {json.dumps(tok)}\n\n".encode()

    return StreamingResponse(body(), media_type="text/event-stream")


async def sse_langserve(request: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        yield b'event: metadata\r\ndata: {"run_id": "r1"}\r\n\r\n'
        async for tok in _tokens(request):
            yield f"event: data\r\ndata: {json.dumps(tok)}\r\n\r\n".encode()
        yield b"event: end\r\n\r\n"

    return StreamingResponse(body(), media_type="text/event-stream")


async def ndjson(request: Request) -> StreamingResponse:
    async def body() -> AsyncIterator[bytes]:
        async for tok in _tokens(request):
            yield (json.dumps(tok) + "\n").encode()

    return StreamingResponse(body(), media_type="application/x-ndjson")


@pytest.mark.parametrize("path", ["/sse", "/langserve", "/ndjson"])
def test_the_judged_answer_of_a_json_string_body_has_no_quotes(harness: Harness, path: str) -> None:
    harness.configure(None)  # the local judge
    app = Starlette(routes=[
        Route("/sse", sse_unnamed), Route("/langserve", sse_langserve), Route("/ndjson", ndjson),
    ], middleware=[Middleware(StreamJudgeMiddleware)])

    async def go() -> str:
        transport = httpx.ASGITransport(app=app)
        async with httpx.AsyncClient(transport=transport, base_url="http://app") as client:
            r = await client.get(path)
            return r.text

    text = asyncio.run(go())
    assert json.dumps("Harrison") in text  # the client's bytes are the app's, quotes included
    streams = [s for s in harness.spans()
               if (s.attributes or {}).get(semconv.SPAN_TYPE) == semconv.SPAN_TYPE_STREAM]
    assert len(streams) == 1
    assert streams[0].attributes[semconv.STREAM_ANSWER] == ANSWER
