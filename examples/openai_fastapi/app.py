"""A plain FastAPI app (no LangGraph) streaming an OpenAI-compatible model's answer over SSE, judged live.

The app does its own retrieval and calls the model with the OpenAI SDK (``AsyncOpenAI``); it hands the
token stream to :func:`streamjudge.guard` together with the question and the retrieved contexts — the
public way to tell streamjudge what an answer must stick to when no instrumented graph registers it.
The guard yields every token at once, plus ``warning`` / ``retract`` / ``stop`` events, which become SSE
frames of their own::

    OPENAI_BASE_URL=http://127.0.0.1:8000/v1 OPENAI_MODEL=my-model python examples/openai_fastapi/app.py
    curl -N 'http://127.0.0.1:8001/chat?q=How+tall+is+the+Eiffel+Tower%3F'

Environment: ``OPENAI_BASE_URL`` / ``OPENAI_API_KEY`` / ``OPENAI_MODEL`` (default ``gpt-4o-mini``) for the
app's model; ``STREAMJUDGE_*`` for the judge (local by default) and the action (flag, stop, regenerate:
the guard calls :func:`regenerate` with the accepted prefix); ``OTEL_EXPORTER_OTLP_[TRACES_]ENDPOINT``
to export the spans (answer span with its checkpoints and scores). ``PORT`` (default 8001).

SSE frames: ``sources`` (the retrieved passages' ids), ``token`` (``{"token": "..."}``), ``warning``,
``retract``, ``stop`` (the guard's event data as JSON), then ``done``.

Run as is, the app configures streamjudge itself. Under ``opentelemetry-instrument`` the runtime the
configurator built is used; the app judges its stream with ``guard()``, and streamjudge's zero-code
wrappers step aside for an answer the app guards itself (it is judged once).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.responses import StreamingResponse
from openai import AsyncOpenAI
from openai.types.chat import ChatCompletionMessageParam

import streamjudge

CORPUS: dict[str, str] = {
    "eiffel": (
        "The Eiffel Tower is a wrought-iron lattice tower on the Champ de Mars in Paris, France. It was "
        "built between 1887 and 1889 for the 1889 World's Fair. The tower is 330 metres tall including "
        "its antennas."
    ),
    "kilimanjaro": (
        "Mount Kilimanjaro is a dormant volcano in Tanzania. Its highest peak, Uhuru, rises 5,895 metres "
        "above sea level, which makes it the highest mountain in Africa."
    ),
    "danube": (
        "The Danube is the second-longest river in Europe, after the Volga. It flows for about 2,850 "
        "kilometres from the Black Forest in Germany to the Black Sea."
    ),
}
SYSTEM = "Answer the question using only the sources below. Keep it short.\nSources:\n{sources}"
_WORD = re.compile(r"[a-z0-9]+")
_STOP = frozenset(re.findall(r"\S+", "a an and are as at be by did does for from how in is it its of on or "
                                    "the to was what when where which who why with tall high long"))


def retrieve(question: str, k: int = 2) -> list[tuple[str, str]]:
    """(id, passage) of the passages sharing content words with ``question``, best first."""
    q = {w for w in _WORD.findall(question.lower()) if w not in _STOP}
    scored = sorted(((len(q & set(_WORD.findall(text.lower()))), doc_id, text)
                     for doc_id, text in CORPUS.items()), reverse=True)
    return [(doc_id, text) for score, doc_id, text in scored[:k] if score > 0]


def _sse(event: str, data: Any) -> str:
    return f"event: {event}\ndata: {json.dumps(data, default=str)}\n\n"


def create_app() -> FastAPI:
    """The FastAPI application."""
    client = AsyncOpenAI(
        base_url=os.environ.get("OPENAI_BASE_URL") or None,
        api_key=os.environ.get("OPENAI_API_KEY") or "not-needed",  # a local server needs none
    )
    model = os.environ.get("OPENAI_MODEL", "gpt-4o-mini")

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        rt = streamjudge.current_runtime()
        owned = rt is None
        if owned:  # run as is: streamjudge set up from STREAMJUDGE_* / OTEL_* here
            exporter = None
            if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get(
                    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
                from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

                exporter = OTLPSpanExporter()
            rt = streamjudge.configure(exporter=exporter)
        try:
            yield
        finally:
            await client.close()
            if owned and rt is not None:
                rt.shutdown()

    app = FastAPI(title="openai + fastapi example", lifespan=lifespan)

    async def tokens(messages: list[ChatCompletionMessageParam]) -> AsyncIterator[str]:
        stream = await client.chat.completions.create(model=model, messages=messages, stream=True)
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                yield chunk.choices[0].delta.content

    @app.get("/chat")
    async def chat(q: str) -> StreamingResponse:
        found = retrieve(q)
        contexts = [text for _id, text in found]
        messages: list[ChatCompletionMessageParam] = [
            {"role": "system", "content": SYSTEM.format(sources="\n".join(contexts) or "(none)")},
            {"role": "user", "content": q},
        ]

        def regenerate(req: streamjudge.RegenerateRequest) -> AsyncIterator[str]:
            # re-prompt with what the reader already has and the stick-to-context instruction
            return tokens([*messages, {"role": "assistant", "content": req.accepted_prefix},
                           {"role": "user", "content": req.instruction}])

        guarded = streamjudge.guard(tokens(messages), question=q, contexts=contexts, regenerate=regenerate)

        async def body() -> AsyncIterator[str]:
            yield _sse("sources", {"sources": [doc_id for doc_id, _text in found]})
            async for ev in guarded:
                if ev.type == "token":
                    yield _sse("token", {"token": ev.text})
                elif ev.type == "done":
                    yield _sse("done", dict(ev.data or {}))
                else:
                    yield _sse(ev.type, {"text": ev.text, **(ev.data or {})})

        return StreamingResponse(body(), media_type="text/event-stream")

    return app


def main() -> None:
    import uvicorn

    uvicorn.run(create_app(), host="127.0.0.1", port=int(os.environ.get("PORT", "8001")), log_level="warning")


if __name__ == "__main__":
    main()
