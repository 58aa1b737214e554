"""``make demo`` / ``streamjudge demo``: the product as users run it, and an in-process fallback.

By default (:mod:`streamjudge._demo_app`) the example app (``examples/adaptive_rag/app.py``) is served under
``opentelemetry-instrument`` and questions are streamed at it over HTTP; see there.

``--offline`` (also the fallback when the app cannot start): three built-in answers streamed through the
guard and the judge processor in this process, with the local judge: a grounded answer, a hallucinating
one, and one whose retrieval was weak. Prints the tokens as they arrive, warnings and actions as they
happen, the final scores, and the spans as they are exported. Set ``OTEL_EXPORTER_OTLP_ENDPOINT`` to also
send the spans over OTLP.
"""

from __future__ import annotations

import argparse
import asyncio
import io
import os
import sys
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from opentelemetry.sdk.trace import SpanProcessor, SynchronousMultiSpanProcessor
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SimpleSpanProcessor

import streamjudge
from streamjudge.config import load_settings
from streamjudge.exporters.console import ConsoleSummaryExporter
from streamjudge.judging.guard import RegenerateRequest


@dataclass(frozen=True)
class Case:
    title: str
    question: str
    contexts: tuple[str, ...]
    answer: str


CASES = (
    Case(
        "grounded",
        "When and where was the company founded, and by whom?",
        (
            "The company was founded in 1998 in Palo Alto by two graduate students.",
            "Its first product was a search engine that ranked pages by the links pointing to them.",
        ),
        "The company was founded in 1998 in Palo Alto. Its founders were two graduate students. "
        "Their first product was a search engine that ranked pages by the links pointing to them.",
    ),
    Case(
        "hallucinating",
        "When and where was the company founded, and by whom?",
        ("The company was founded in 1998 in Palo Alto by two graduate students.",),
        "The company was founded in 1998 in Palo Alto by two graduate students. "
        "It later expanded to Europe in 2003. By 2005 it employed more than 4,000 people in Dublin.",
    ),
    Case(
        "weak retrieval",
        "What is the boiling point of water at the top of Mount Everest?",
        (
            "The 2019 annual report lists revenue of 4.2 million euros.",
            "Office hours are Monday to Friday, nine to five.",
        ),
        "At the top of Mount Everest water boils at about 70 degrees Celsius. "
        "This is because the air pressure there is roughly a third of that at sea level.",
    ),
)


async def _tokens(text: str, delay: float) -> AsyncIterator[str]:
    # word-ish chunks like an LLM's: a word and its trailing space
    start = 0
    for i, ch in enumerate(text):
        if ch == " ":
            yield text[start : i + 1]
            start = i + 1
            if delay:
                await asyncio.sleep(delay)
    if start < len(text):
        yield text[start:]


_SPANS = io.StringIO()


def _stick_to_context(delay: float) -> Callable[[RegenerateRequest], AsyncIterator[str]]:
    """A stand-in for re-prompting the model with the accepted prefix and the stick-to-context
    instruction: it continues with what the sources say and the prefix does not."""

    def regenerate(req: RegenerateRequest) -> AsyncIterator[str]:
        missing = [c for c in req.contexts if c not in req.accepted_prefix]
        text = " " + (" ".join(missing) if missing else "That is all the sources say about it.")
        return _tokens(text, delay)

    return regenerate


async def _run_case(case: Case, delay: float) -> None:
    print(f"\n=== {case.title}: {case.question}")
    print(f"    contexts: {list(case.contexts)}")
    print("    stream: ", end="", flush=True)
    stream = streamjudge.guard(
        _tokens(case.answer, delay),
        question=case.question,
        contexts=case.contexts,
        regenerate=_stick_to_context(delay),
    )
    async for ev in stream:
        if ev.type == "token":
            print(ev.text, end="", flush=True)
        elif ev.type == "warning":
            d = ev.data or {}
            print(
                f"\n    [warning] {d.get('metric')}={d.get('score'):.2f} < {d.get('threshold')}"
                f" at chars {d.get('char_start', 0)}-{d.get('char_end', 0)}, action={d.get('action')}:"
                f" {ev.text}\n    stream: ",
                end="",
                flush=True,
            )
        elif ev.type == "retract":
            print(f"\n    [retract] {ev.text!r}\n    stream: ", end="", flush=True)
        elif ev.type == "stop":
            print(f"\n    [stop] {ev.text}", flush=True)
        elif ev.type == "done":
            d = ev.data or {}
            print(
                f"\n    [done] verdict={d.get('verdict')} checkpoints={d.get('checkpoints')}"
                f" alerts={d.get('alerts')} ttft_ms={d.get('ttft_ms')}",
                flush=True,
            )
    final = await asyncio.wrap_future(stream.final)
    if final is not None:
        scores = ", ".join(
            f"{s.name}={s.value:.2f} {s.label}" if s.value is not None else f"{s.name}=skipped({s.skipped})"
            for s in final.scores
        )
        print(f"    [final reconciliation] {scores}")
    # the spans of this case, as exported (judged spans carry their evaluation results)
    streamjudge.get_runtime().force_flush(5_000)
    print("    exported spans:")
    print(_SPANS.getvalue(), end="")
    _SPANS.seek(0)
    _SPANS.truncate()


def _downstream() -> SpanProcessor:
    multi = SynchronousMultiSpanProcessor()  # type: ignore[no-untyped-call]
    multi.add_span_processor(SimpleSpanProcessor(ConsoleSummaryExporter(_SPANS)))
    if os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT") or os.environ.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"):
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter

        multi.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
    return multi


def offline_main(action: str | None = None, delay: float = 0.02) -> int:
    """The in-process demo: three built-in answers through the guard (no app, no HTTP)."""
    overrides: dict[str, Any] = {"action": action} if action else {}
    settings = load_settings(**overrides)
    print(f"streamjudge demo (in-process): judge={settings.judge} threshold={settings.threshold} "
          f"action={settings.action} mode={settings.mode} "
          f"window={settings.window_sentences} sentences/{settings.window_chars} chars")
    rt = streamjudge.configure(settings, downstream=_downstream(), set_global=False)
    try:
        for case in CASES:
            asyncio.run(_run_case(case, delay))
    finally:
        rt.shutdown()
    return 0


def main(argv: list[str] | None = None) -> int:
    """``streamjudge demo`` / ``python -m streamjudge.demo``."""
    from streamjudge import _demo_app

    parser = argparse.ArgumentParser(
        prog="streamjudge demo",
        description="Serve the example RAG app under opentelemetry-instrument, stream questions at it and "
                    "summarise what the exported spans say (--offline: the in-process demo).",
    )
    parser.add_argument("--offline", action="store_true",
                        help="the in-process demo: built-in answers through the guard, no app or HTTP")
    parser.add_argument("--action", choices=("flag", "regenerate", "stop"), default=None,
                        help="only this action (default: flag, then stop, then regenerate)")
    parser.add_argument("--traces", default=None,
                        help="OTLP JSON lines file for the exported spans "
                             f"(default {_demo_app.default_traces()})")
    parser.add_argument("--app", default=None, help="the example app (default examples/adaptive_rag/app.py)")
    parser.add_argument("--token-delay-ms", type=float, default=15.0,
                        help="the example model's delay per token (default 15)")
    parser.add_argument("--startup-timeout", type=float, default=60.0,
                        help="seconds to wait for the app to serve (default 60)")
    parser.add_argument("--delay", type=float, default=0.02,
                        help="--offline: seconds between tokens (default 0.02)")
    args = parser.parse_args(argv)
    if args.offline:
        return offline_main(args.action, args.delay)
    try:
        return _demo_app.run(
            actions=(args.action,) if args.action else _demo_app.ACTIONS,
            traces=args.traces, app=args.app, token_delay_ms=args.token_delay_ms,
            startup_timeout=args.startup_timeout,
        )
    except _demo_app.DemoUnavailable as exc:
        print(f"\nstreamjudge demo: {exc}", file=sys.stderr)
        print("streamjudge demo: running the in-process demo instead (streamjudge demo --offline)\n",
              file=sys.stderr)
        return offline_main(args.action, args.delay)


if __name__ == "__main__":
    sys.exit(main())
