"""Run in its own process: configure, judge a stream, then fork workers (as gunicorn / uvicorn --workers
do after the app was imported) that judge their own streams. Prints one JSON line of what each saw."""

from __future__ import annotations

import asyncio
import json
import os
import sys
import time

from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import streamjudge
from streamjudge import semconv
from streamjudge.config import Settings

CONTEXTS = ["The sky is blue. Grass is green."]
WORKERS, STREAMS = 3, 5


async def _stream(i: int) -> list[str]:
    text = f"The sky is blue {i}. Grass is green. The sky is blue. Grass is HALLUCINATED green {i}."
    kinds = []
    async for ev in streamjudge.guard(_words(text), question="sky", contexts=CONTEXTS):
        kinds.append(ev.type)
    return kinds


async def _words(text: str):  # type: ignore[no-untyped-def]
    for w in text.split(" "):
        yield w + " "
        await asyncio.sleep(0.001)


def _judge_some(exporter: InMemorySpanExporter, rt: streamjudge.Runtime, n: int) -> dict[str, object]:
    exporter.clear()

    async def main() -> list[list[str]]:
        return list(await asyncio.gather(*(_stream(i) for i in range(n))))

    kinds = asyncio.run(main())
    flushed = rt.force_flush(10_000)
    spans = exporter.get_finished_spans()
    ids = [s.context.span_id for s in spans]
    return {
        "pid": os.getpid(),
        "flushed": flushed,
        "warned": sum("warning" in k for k in kinds),
        "streams": sum(1 for s in spans if s.name == semconv.SPAN_STREAM),
        "statuses": sorted({str(s.attributes.get(semconv.EVAL_STATUS)) for s in spans
                            if s.name in (semconv.SPAN_STREAM, semconv.SPAN_CHECKPOINT)}),
        "unique": len(ids) == len(set(ids)),
        "held": rt.processor.held,
    }


def main() -> None:
    exporter = InMemorySpanExporter()
    rt = streamjudge.configure(Settings(preflight=False), downstream=SimpleSpanProcessor(exporter),
                               set_global=False, backends_from_env=False, sinks=())
    print(json.dumps({"role": "parent-before", **_judge_some(exporter, rt, 2)}), flush=True)
    children = []
    for _ in range(WORKERS):
        pid = os.fork()
        if pid == 0:
            code = 0
            try:
                # one write of the whole line: the workers share the pipe, and print() may split a line
                # into two writes that another worker's line lands between
                os.write(1, (json.dumps({"role": "worker", **_judge_some(exporter, rt, STREAMS)}) + "\n").encode())
                rt.shutdown(5_000)
            except BaseException:
                import traceback

                traceback.print_exc()
                code = 1
            finally:
                sys.stdout.flush()
                os._exit(code)
        children.append(pid)
    deadline = time.monotonic() + 45
    codes = []
    for pid in children:
        while True:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes.append(os.waitstatus_to_exitcode(status))
                break
            if time.monotonic() > deadline:
                os.kill(pid, 9)
                os.waitpid(pid, 0)
                codes.append(-9)
                break
            time.sleep(0.02)
    print(json.dumps({"role": "parent-after", "codes": codes, **_judge_some(exporter, rt, 2)}), flush=True)
    rt.shutdown(5_000)


if __name__ == "__main__":
    main()
