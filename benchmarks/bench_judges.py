"""LLM judge overhead: framework time per score excluding model latency, and model calls per score.

A scripted OpenAI-compatible server on 127.0.0.1 answers instantly (it runs in other threads of this
process). For each judge (llm, ragas, deepeval) we run sequential evaluations and report per score:

- wall time, and wall time minus ``calls x`` the raw HTTP round trip of one chat call (measured with the
  SDK's own HTTP library, keep-alive, same server). Frameworks that run calls concurrently (deepeval
  extracts truths and claims at once) can come out below zero here; hence also:
- client CPU: CPU time of the event-loop thread during the evaluation, i.e. what the judge, its
  framework, the SDK and the HTTP client cost, with the model (server) excluded. ``raw_cpu_per_call_ms``
  is the same for one bare HTTP call: the floor any judge pays per call.

    python benchmarks/bench_judges.py [--n 30] [--json]
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

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "judges"))

from scripted_server import ScriptedLLMServer  # noqa: E402

from streamjudge.config import load_settings  # noqa: E402
from streamjudge.judging.base import EvalInput  # noqa: E402
from streamjudge.judging.judges import create_judge  # noqa: E402

QUESTION = "When was the Eiffel Tower completed and how tall is it?"
CONTEXTS = (
    "The Eiffel Tower was completed in 1889 for the World's Fair in Paris. It is 330 metres tall.",
    "Gustave Eiffel's company designed and built the tower. It was the tallest structure until 1930.",
    "Bananas are yellow fruit grown in the tropics.",
)
ANSWER = ("The Eiffel Tower was completed in 1889 for the World's Fair. It is 330 metres tall. "
          "It was designed by Gustave Eiffel's company. It was painted gold in 1990.")
REFERENCE = "The Eiffel Tower was completed in 1889 and is 330 metres tall."
SUITE = ("faithfulness", "answer_relevancy", "context_precision", "context_recall")


async def _raw_round_trip(url: str, n: int) -> tuple[float, float]:
    """Median seconds of one chat call with a bare HTTP client (what any judge must pay at minimum)."""
    import openai._base_client as base  # the HTTP library the SDK itself uses

    mod: Any = getattr(base, "httpx2", None) or base.httpx
    body = {"model": "bench", "messages": [
        {"role": "system", "content": "TASK: faithfulness\nAnswer in JSON."},
        {"role": "user", "content": f'<data-00 source="context 1">\n{CONTEXTS[0]}\n</data-00>\n'
                                    f'<data-00 source="answer">\n{ANSWER}\n</data-00>'}],
            "response_format": {"type": "json_object"}}
    times, cpus = [], []
    async with mod.AsyncClient() as client:
        for i in range(n + 5):
            t0, c0 = time.perf_counter(), time.thread_time()
            r = await client.post(f"{url}/chat/completions", json=body)
            json.loads(r.content)
            if i >= 5:
                times.append(time.perf_counter() - t0)
                cpus.append(time.thread_time() - c0)
    return statistics.median(times), statistics.median(cpus)


async def _bench_judge(judge: Any, item: EvalInput, metrics: tuple[str, ...], n: int) -> dict[str, float]:
    await judge.evaluate(item, metrics)  # warm: connections, lazy caches
    times, cpus, calls = [], [], []
    for _ in range(n):
        t0, c0 = time.perf_counter(), time.thread_time()
        res = await judge.evaluate(item, metrics)
        times.append(time.perf_counter() - t0)
        cpus.append(time.thread_time() - c0)
        calls.append(res.usage.calls)
    return {"seconds": statistics.median(times), "cpu": statistics.median(cpus),
            "calls": statistics.median(calls)}


def run(n: int) -> dict[str, Any]:
    out: dict[str, Any] = {"n": n, "judges": {}}
    with ScriptedLLMServer() as srv:
        settings = load_settings({"EVAL_PROVIDER": "openai", "EVAL_MODEL": "bench",
                                  "EVAL_BASE_URL": srv.openai_base_url,
                                  "EVAL_EMBEDDING_MODEL": "bench-embed"})
        rtt, raw_cpu = asyncio.run(_raw_round_trip(srv.openai_base_url, max(n, 20)))
        out["raw_round_trip_ms"] = rtt * 1e3
        out["raw_cpu_per_call_ms"] = raw_cpu * 1e3
        item_f = EvalInput(QUESTION, CONTEXTS, ANSWER)
        item_all = EvalInput(QUESTION, CONTEXTS, ANSWER, reference=REFERENCE)
        for name in ("llm", "ragas", "deepeval"):
            t0 = time.perf_counter()
            try:
                judge = create_judge(name, settings)
            except Exception as exc:  # a missing extra: report it, bench the rest
                out["judges"][name] = {"error": str(exc)}
                continue
            build_s = time.perf_counter() - t0

            async def bench(judge: Any = judge) -> tuple[dict[str, float], dict[str, float]]:
                try:
                    return (await _bench_judge(judge, item_f, ("faithfulness",), n),
                            await _bench_judge(judge, item_all, SUITE, max(5, n // 3)))
                finally:
                    await judge.aclose()

            faith, suite = asyncio.run(bench())
            out["judges"][name] = {
                "first_build_ms": build_s * 1e3,  # includes importing the framework
                "faithfulness_calls": faith["calls"],
                "faithfulness_ms": faith["seconds"] * 1e3,
                "faithfulness_wall_minus_rtt_ms": (faith["seconds"] - faith["calls"] * rtt) * 1e3,
                "faithfulness_client_cpu_ms": faith["cpu"] * 1e3,
                "suite_calls": suite["calls"],
                "suite_ms": suite["seconds"] * 1e3,
                "suite_client_cpu_ms": suite["cpu"] * 1e3,
            }
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=30, help="evaluations per judge (faithfulness)")
    ap.add_argument("--json", action="store_true", help="print one JSON object")
    args = ap.parse_args(argv)
    result = run(args.n)
    if args.json:
        print(json.dumps(result, sort_keys=True))
        return
    print(f"raw HTTP call over loopback: {result['raw_round_trip_ms']:.2f} ms wall, "
          f"{result['raw_cpu_per_call_ms']:.2f} ms client CPU")
    print(f"{'judge':<10}{'build ms':>10}{'faith calls':>12}{'faith ms':>10}{'-calls*rtt':>11}"
          f"{'faith CPU':>11}{'suite calls':>12}{'suite ms':>10}{'suite CPU':>11}")
    for name, r in result["judges"].items():
        if "error" in r:
            print(f"{name:<10} unavailable: {r['error']}")
            continue
        print(f"{name:<10}{r['first_build_ms']:>10.0f}{r['faithfulness_calls']:>12.0f}"
              f"{r['faithfulness_ms']:>10.2f}{r['faithfulness_wall_minus_rtt_ms']:>11.2f}"
              f"{r['faithfulness_client_cpu_ms']:>11.2f}{r['suite_calls']:>12.0f}{r['suite_ms']:>10.2f}"
              f"{r['suite_client_cpu_ms']:>11.2f}")

if __name__ == "__main__":
    main()
