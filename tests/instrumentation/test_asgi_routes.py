"""Which responses the middleware judges, and that by default it changes no byte of them."""

from __future__ import annotations

from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.middleware import Middleware
from starlette.requests import Request
from starlette.responses import JSONResponse, PlainTextResponse
from starlette.routing import Route
from starlette.testclient import TestClient

from conftest import Harness
from instrumentation.test_asgi_streams import ndjson, openai_sse, sse
from streamjudge import semconv
from streamjudge.instrumentation import StreamJudgeMiddleware


async def metrics(request: Request) -> PlainTextResponse:
    return PlainTextResponse("app_requests_total 1\n")


async def healthz(request: Request) -> JSONResponse:
    return JSONResponse({"ok": True})


ROUTES = [Route("/sse", sse), Route("/openai", openai_sse), Route("/ndjson", ndjson), Route("/metrics", metrics),
          Route("/healthz", healthz), Route("/status", metrics)]


def _app(**options: Any) -> Starlette:
    middleware = [Middleware(StreamJudgeMiddleware, **options)] if options.get("_on", True) else []
    options.pop("_on", None)
    return Starlette(routes=ROUTES, middleware=middleware)


def _streams(h: Harness) -> list[Any]:
    return [s for s in h.spans() if s.name == semconv.SPAN_STREAM]


@pytest.mark.parametrize("path", ["/sse", "/openai", "/ndjson"])
def test_by_default_the_client_gets_the_apps_bytes_and_the_answer_is_judged(harness: Harness, path: str) -> None:
    harness.configure(None)
    with TestClient(_app(_on=False)) as client:
        plain = client.get(path, params={"answer": "invented", "delay": "0"}).content
    with TestClient(_app()) as client:
        body = client.get(path, params={"answer": "invented", "delay": "0"}).content
    assert body == plain
    (stream,) = _streams(harness)
    assert stream.attributes[semconv.STREAM_VERDICT] == "flagged"  # judged all the same


def test_plain_routes_are_not_judged(harness: Harness) -> None:
    harness.configure(None)
    with TestClient(_app()) as client:
        assert client.get("/metrics").text == "app_requests_total 1\n"
        assert client.get("/healthz").json() == {"ok": True}
        assert client.get("/status").text == "app_requests_total 1\n"  # one text message: not a stream
    assert _streams(harness) == []


@pytest.mark.parametrize(("options", "judged"), [
    ({"routes_exclude": ("/sse*",)}, False),
    ({"routes_include": ("/chat/*",)}, False),
    ({"routes_include": ("/s*",)}, True),
])
def test_route_settings(harness: Harness, options: dict[str, Any], judged: bool) -> None:
    harness.configure(None)
    with TestClient(_app(**options)) as client:
        client.get("/sse", params={"answer": "invented", "delay": "0"})
    assert bool(_streams(harness)) is judged


def test_a_body_fed_stream_counts_time_to_first_token_from_the_request(harness: Harness) -> None:
    # the app waits 50 ms before each token: the stream span opens with the request, not at the first
    # parsed token (which made the first token look instantaneous)
    harness.configure(None)
    with TestClient(_app()) as client:
        client.get("/sse", params={"answer": "grounded", "delay": "0.05"})
    (stream,) = _streams(harness)
    assert stream.attributes[semconv.STREAM_TTFT_MS] >= 50
    assert stream.attributes[semconv.STREAM_TTFT_REQUEST_MS] >= 50
