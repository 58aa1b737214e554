"""An application process for the scale-out test and benchmark: scripted RAG answers through
``streamjudge.guard`` with the final pass deferred to workers, exported over OTLP/HTTP to
``OTEL_EXPORTER_OTLP_ENDPOINT`` (the collector gateway).

Each trace is a ``request`` root span around one guarded stream (checkpoint spans judged live by the local
judge, the answer span ``deferred``). Every span the app exported is written to ``--out`` as one JSON line
(trace id, span id, name, span type, end time), so a test knows exactly what entered the pipeline.

    python worker_app.py --traces 100 --seed 1 --out spans.jsonl
"""

from __future__ import annotations

import argparse
import asyncio
import json
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.trace import ReadableSpan, SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor

import streamjudge
from streamjudge import semconv

CONTEXTS = (
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 metres tall.",
    "Gustave Eiffel's company designed and built the tower. It was the tallest structure until 1930.",
)
QUESTION = "When was the Eiffel Tower completed and how tall is it?"
GROUNDED = ("The Eiffel Tower was completed in 1889 for the World's Fair. It is 330 metres tall. "
            "Gustave Eiffel's company built it. It was the tallest structure until 1930.")
# the last two sentences are not in the contexts: the final pass scores them low
FABRICATED = ("The Eiffel Tower was completed in 1889 for the World's Fair. It is 330 metres tall. "
              "It was painted gold in 1955 by Picasso. Napoleon opened it with a concert in Rome.")


class Recorder(SpanProcessor):
    """Remembers every span the app exports (after the judge processor: what really left)."""

    def __init__(self) -> None:
        self.lines: list[str] = []
        self._lock = threading.Lock()

    def on_end(self, span: ReadableSpan) -> None:
        ctx = span.context
        assert ctx is not None
        attrs = span.attributes or {}
        line = json.dumps({
            "trace_id": format(ctx.trace_id, "032x"), "span_id": format(ctx.span_id, "016x"),
            "name": span.name, "type": attrs.get(semconv.SPAN_TYPE),
            "status": attrs.get(semconv.EVAL_STATUS), "end_ns": span.end_time,
        })
        with self._lock:
            self.lines.append(line)


async def _tokens(text: str, token_delay: float) -> AsyncIterator[str]:
    for word in text.split(" "):
        yield word + " "
        await asyncio.sleep(token_delay)


async def _trace(tracer: trace.Tracer, seed: int, i: int, token_delay: float) -> None:
    answer = FABRICATED if (seed + i) % 4 == 0 else GROUNDED
    with tracer.start_as_current_span("request", attributes={"app.seed": seed, "app.index": i}):
        stream = streamjudge.guard(_tokens(answer, token_delay), question=QUESTION, contexts=list(CONTEXTS))
        async for _event in stream:
            pass


async def _run(n: int, seed: int, delay: float, token_delay: float) -> None:
    """Trace i starts at i * delay; streams overlap when a stream lasts longer than that."""
    tracer = trace.get_tracer("worker-app")
    tasks = []
    for i in range(n):
        tasks.append(asyncio.create_task(_trace(tracer, seed, i, token_delay)))
        await asyncio.sleep(delay)
    await asyncio.gather(*tasks)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--traces", type=int, default=100)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--delay", type=float, default=0.0, help="seconds between trace starts")
    p.add_argument("--token-delay", type=float, default=0.0, help="seconds between tokens of a stream")
    p.add_argument("--out", type=Path, required=True)
    args = p.parse_args(argv)
    recorder = Recorder()
    downstream = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    downstream.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(), schedule_delay_millis=200))
    downstream.add_span_processor(recorder)
    settings = streamjudge.load_settings(final_pass="deferred", preflight=False, end_wait_s=0.5)
    rt = streamjudge.configure(settings, downstream=downstream, backends_from_env=False)
    started = time.monotonic()
    asyncio.run(_run(args.traces, args.seed, args.delay, args.token_delay))
    rt.shutdown(timeout_millis=10_000)
    args.out.write_text("\n".join(recorder.lines) + "\n")
    summary: dict[str, Any] = {"traces": args.traces, "spans": len(recorder.lines),
                               "seconds": round(time.monotonic() - started, 3)}
    print(json.dumps(summary), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
