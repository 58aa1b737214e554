"""Zero-code cost on the app shapes of ``tests/apps``: requests/s, time to first token, hold-back delay.

Each shape (a ReAct agent over SSE ``data:`` frames, an agentic RAG over NDJSON, a self-RAG graph over
SSE) runs in its own process, one configuration after the other, against the scripted OpenAI-compatible
server (real ``langchain-openai`` client; the model waits ``--first-token-ms`` before its first token
and ``--token-ms`` between tokens):

- ``none``: the app alone (``python app.py``);
- ``streamjudge``: ``opentelemetry-instrument python app.py`` (stream-first, local judge, OTLP/HTTP to a
  local receiver);
- ``hold_back``: the same with ``STREAMJUDGE_MODE=hold_back``.

``--concurrency`` clients loop for ``--seconds`` per configuration. Figures per configuration: requests/s,
client-side time to first answer token (p50/p95), and, for hold-back, the added latency per window: when the
client sees each sentence complete, minus when it saw it in the stream-first run of the same shape (the
scripted model's timing is the same in both), against the judge's latency on the checkpoint spans.

    python benchmarks/bench_app_shapes.py [--seconds 5] [--concurrency 4] [--shapes a,b,c] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from apps import conftest as apps  # noqa: E402
from instrumentation.otlp_receiver import OTLPReceiver  # noqa: E402
from judges.scripted_server import ScriptedLLMServer  # noqa: E402

SHAPES: dict[str, tuple[str, dict[str, str]]] = {
    "a": ("react_sse.py", {"answer_nodes": "agent"}),
    "b": ("agentic_ndjson.py", {"answer_nodes": "generate_answer"}),
    "c": ("self_rag.py", {}),
}
# where each sentence of the scripted answer ends
SENTENCE_ENDS = [i + 1 for i, ch in enumerate(apps.ANSWER) if ch == "." and
                 (i + 1 == len(apps.ANSWER) or apps.ANSWER[i + 1] == " ")]


async def _one(client: httpx.AsyncClient, shape: str, url: str) -> tuple[float, list[float]]:
    """(time to first answer token, times each sentence was complete), seconds from the request."""
    t0 = time.perf_counter()
    text = ""
    first = 0.0
    done: list[float] = []

    def seen(piece: str) -> None:
        nonlocal text, first
        if not piece:
            return
        first = first or time.perf_counter() - t0
        text += piece
        while len(done) < len(SENTENCE_ENDS) and len(text) >= SENTENCE_ENDS[len(done)]:
            done.append(time.perf_counter() - t0)

    if shape == "a":
        async with client.stream("POST", f"{url}/stream", json={"message": apps.QUESTION}) as r:
            async for line in r.aiter_lines():
                if line.startswith("data: {"):
                    frame = json.loads(line[6:])
                    if frame.get("type") == "token":
                        seen(frame["content"])
    elif shape == "b":
        async with client.stream("POST", f"{url}/ask", json={"question": apps.QUESTION}) as r:
            async for line in r.aiter_lines():
                if line.strip():
                    seen(str(json.loads(line).get("generate_answer") or ""))
    else:
        async with client.stream("GET", f"{url}/chat", params={"q": apps.QUESTION}) as r:
            event = ""
            async for line in r.aiter_lines():
                if line.startswith("event:"):
                    event = line[6:].strip()
                elif line.startswith("data:") and event == "token" and len(text) < len(apps.ANSWER):
                    seen(str(json.loads(line[5:])["token"]))  # the grader's chunks follow the answer
    return first, done


async def _load(shape: str, url: str, seconds: float, concurrency: int) -> dict[str, Any]:
    ttfts: list[float] = []
    sentences: list[list[float]] = []
    deadline = time.perf_counter() + seconds
    async with httpx.AsyncClient(timeout=60) as client:
        await _one(client, shape, url)  # warm-up

        async def worker() -> None:
            while time.perf_counter() < deadline:
                ttft, done = await _one(client, shape, url)
                ttfts.append(ttft)
                sentences.append(done)

        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
    ttfts.sort()
    return {
        "requests": len(ttfts),
        "rps": round(len(ttfts) / elapsed, 2),
        "ttft_p50_ms": round(statistics.median(ttfts) * 1e3, 1),
        "ttft_p95_ms": round(ttfts[int(0.95 * (len(ttfts) - 1))] * 1e3, 1),
        "sentence_ms": [round(statistics.median(s[k] for s in sentences if len(s) > k) * 1e3, 1)
                        for k in range(len(SENTENCE_ENDS))],
    }


def _judge_ms(receiver: OTLPReceiver) -> float | None:
    lat = [s.attributes["streamjudge.eval.latency_ms"] for s in receiver.snapshot()
           if s.name == "streamjudge.checkpoint" and "streamjudge.eval.latency_ms" in s.attributes]
    return round(statistics.median(lat), 3) if lat else None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seconds", type=float, default=5.0)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--shapes", default="a,b,c")
    p.add_argument("--first-token-ms", type=float, default=50.0)
    p.add_argument("--token-ms", type=float, default=5.0)
    p.add_argument("--json", action="store_true")
    args = p.parse_args(argv)
    server = ScriptedLLMServer().start()
    server.app_responder = apps.app_model
    server.first_token_delay_s = args.first_token_ms / 1e3
    server.token_delay_s = args.token_ms / 1e3
    results: dict[str, dict[str, Any]] = {}
    try:
        for shape in args.shapes.split(","):
            script, settings = SHAPES[shape]
            out: dict[str, Any] = {}
            for config in ("none", "streamjudge", "hold_back"):
                receiver = OTLPReceiver().start()
                extra = dict(settings, **({"mode": "hold_back"} if config == "hold_back" else {}))
                try:
                    with apps.serve(script, server, receiver, instrumented=config != "none", **extra) as app:
                        out[config] = asyncio.run(_load(shape, app.url, args.seconds, args.concurrency))
                    if config != "none":
                        time.sleep(0.5)  # the last batch of spans
                        out[config]["judge_p50_ms"] = _judge_ms(receiver)
                finally:
                    receiver.stop()
            held = [h - f for h, f in zip(out["hold_back"]["sentence_ms"], out["streamjudge"]["sentence_ms"],
                                         strict=True)]
            out["hold_back"]["added_per_window_ms"] = [round(x, 1) for x in held]
            results[shape] = out
    finally:
        server.stop()
    if args.json:
        print(json.dumps(results, indent=2))
        return 0
    print(f"first token after {args.first_token_ms} ms per model call, {args.token_ms} ms between tokens, "
          f"{args.concurrency} clients, {args.seconds} s per configuration")
    for shape, out in results.items():
        print(f"\n({shape}) {SHAPES[shape][0]}")
        for config, r in out.items():
            line = (f"  {config:12s} {r['rps']:7.2f} req/s  ttft p50 {r['ttft_p50_ms']:7.1f} ms"
                    f"  p95 {r['ttft_p95_ms']:7.1f} ms")
            if r.get("judge_p50_ms") is not None:
                line += f"  judge p50 {r['judge_p50_ms']} ms"
            if "added_per_window_ms" in r:
                line += f"  hold-back added per window {r['added_per_window_ms']} ms"
            print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
