"""A 200 ms check at 20 ms/token: inter-token latency with streamjudge, NeMo Guardrails and Guardrails AI.

    python benchmarks/bench_peers.py [--answers 5] [--repeat 3] [--delay-ms 20] [--check-ms 200] [--json]

Every variant streams the same answers (four FaithBench dev summaries back to back per answer, read in place
from ../shared/benchdata, each answer its own text; a synthetic set otherwise), one token every ``delay`` ms
from a producer process over a pipe (the loop wakes on I/O, as on a model's HTTP stream), and measures the
gaps between the pieces of text the client receives (the first gap counted from one token period before the
model's first token, so a guard that buffers shows its wait) and the time from the model's first token to
the first piece. Variants run in fresh processes, interleaved, each repeated; every ratio is against
``none`` of the same repeat:

- ``none``: the token source alone (the baseline);
- ``streamjudge``: ``streamjudge.guard`` with a judge that answers after ``check`` ms (stream-first, flag);
- ``nemo_chunk20`` / ``nemo_chunk200``: NeMo Guardrails' streaming output rails (``stream_async`` over the
  same token generator, ``stream_first``) with one output rail whose action takes ``check`` ms, chunks of 20
  tokens (context 5) and the default 200 (context 50);
- ``guardrails_ai``: Guardrails AI's ``AsyncGuard`` streaming the same generator through one validator that
  takes ``check`` ms (its default sentence chunking; validators are synchronous and run inline, as a hub
  validator calling a model does).

p99 is over all gaps of a run; a guard that buffers a whole answer (NeMo with chunks longer than the answer)
makes one long gap per answer, which the ``max`` column shows when it is rarer than 1 in 100.

NeMo Guardrails and Guardrails AI run from their own virtualenv (``~/.cache/streamjudge/peers-venv``,
created on first use with the pinned versions below; their dependencies do not fit streamjudge's).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT.parent / "shared" / "benchdata" / "faithbench-dev"
PEERS_VENV = Path(os.environ.get("STREAMJUDGE_CACHE", Path.home() / ".cache" / "streamjudge")) / "peers-venv"
PEERS = ("nemoguardrails==0.24.1", "guardrails-ai==0.11.0")
VARIANTS = ("none", "streamjudge", "nemo_chunk20", "nemo_chunk200", "guardrails_ai")

# every child: argv = delay_s, check_s, answers.json; prints {"gaps": [[...] per answer], "ttft": [...]}
_COMMON = r"""
import asyncio, json, os, sys, time
delay, check_s, answers = float(sys.argv[1]), float(sys.argv[2]), json.load(open(sys.argv[3]))

# the model in another process (run.py's producer, handed over by the parent: the peers' venv cannot import
# run.py): the loop wakes when bytes arrive, as it does on a model's HTTP stream, not on a timer of its own
PRODUCER = os.environ["STREAMJUDGE_BENCH_PRODUCER"]

FIRST = [0.0]

async def source(tokens):
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-c", PRODUCER, str(delay),
        stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE)
    proc.stdin.write((json.dumps([list(tokens)]) + "\n").encode())  # one answer
    await proc.stdin.drain()
    proc.stdin.close()
    first = True
    async for line in proc.stdout:
        if first:  # the clock starts at the model's first token, not at its process start
            first, FIRST[0] = False, time.perf_counter()
        tok = json.loads(line)
        if tok is None:  # the end of the answer
            break
        yield tok
    await proc.wait()

async def measure(stream):
    last, gaps, ttft = None, [], None
    async for piece in stream:
        if not piece:
            continue
        now = time.perf_counter()
        if last is None:
            # from the model's first token: a guard that buffers shows its wait in this first gap
            ttft = now - FIRST[0]
            gaps.append(ttft + delay)
        else:
            gaps.append(now - last)
        last = now
    return gaps, ttft

def run(make_stream):
    out = {"gaps": [], "ttft": []}
    for tokens in answers:
        gaps, ttft = asyncio.run(measure(make_stream(tokens)))
        out["gaps"].append(gaps)
        out["ttft"].append(ttft)
    print(json.dumps(out))
"""

_NONE = _COMMON + r"""
run(source)
"""

_STREAMJUDGE = _COMMON + r"""
sys.path.insert(0, sys.argv[4] + "/src")
import streamjudge
from streamjudge.config import Settings
from streamjudge.judging.base import JudgeResult, Score
from streamjudge.runtime import _Discard

class Slow:
    name = "slow"
    async def evaluate(self, item, metrics):
        await asyncio.sleep(check_s)
        return JudgeResult(self.name, tuple(Score(m, 1.0) for m in metrics))
    async def aclose(self):
        return None

rt = streamjudge.configure(Settings(end_wait_s=0.0, preflight=False), downstream=_Discard(), judge=Slow(),
                           set_global=False)

async def texts(tokens):
    async for ev in streamjudge.guard(source(tokens), question="q", contexts=["c"]):
        if ev.type == "token":
            yield ev.text

run(texts)
rt.shutdown()
"""

_NEMO = _COMMON + r"""
import logging, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from langchain_core.language_models.fake_chat_models import FakeListChatModel
from nemoguardrails import LLMRails, RailsConfig
from nemoguardrails.actions.rail_outcome import RailOutcome
chunk, context = int(sys.argv[4]), int(sys.argv[5])
yaml = f'''
rails:
  output:
    flows:
      - slow check output
    streaming:
      enabled: True
      chunk_size: {chunk}
      context_size: {context}
      stream_first: True
'''
colang = '''
define subflow slow check output
  execute slow_check
'''

async def slow_check(**kwargs):
    await asyncio.sleep(check_s)
    return RailOutcome.allow()

# the model is never called: the output rails run over the token generator handed to stream_async
rails = LLMRails(RailsConfig.from_content(yaml_content=yaml, colang_content=colang),
                 llm=FakeListChatModel(responses=["unused"]))
rails.register_action(slow_check, "slow_check")
run(lambda tokens: rails.stream_async(messages=[{"role": "user", "content": "q"}], generator=source(tokens)))
"""

_GUARDRAILS = _COMMON + r"""
import logging, types, warnings
warnings.filterwarnings("ignore")
logging.disable(logging.WARNING)
from guardrails import AsyncGuard
from guardrails.validator_base import PassResult, Validator, register_validator

@register_validator(name="bench/slow-check", data_type="string")
class SlowCheck(Validator):
    def _validate(self, value, metadata):
        time.sleep(check_s)  # validators are synchronous
        return PassResult()

guard = AsyncGuard().use(SlowCheck(on_fail="noop"))

def make(tokens):
    async def llm(*, messages=None, **kwargs):
        return types.SimpleNamespace(completion_stream=source(tokens))

    async def texts():
        stream = await guard(llm, messages=[{"role": "user", "content": "q"}], stream=True)
        async for chunk in stream:
            yield chunk.validated_output or ""
    return texts()

run(make)
"""


def ensure_peers(install: bool) -> Path | None:
    """The peers' virtualenv's python, created with the pinned versions when missing (None: unavailable)."""
    py = PEERS_VENV / "bin" / "python"
    probe = [str(py), "-c", "import nemoguardrails, guardrails"]
    if py.exists() and subprocess.run(probe, capture_output=True).returncode == 0:
        return py
    if not install:
        return None
    print(f"installing {', '.join(PEERS)} into {PEERS_VENV} (once) ...", file=sys.stderr)
    subprocess.run([sys.executable, "-m", "venv", str(PEERS_VENV)], check=True)
    subprocess.run([str(py), "-m", "pip", "install", "-q", *PEERS], check=True)
    return py if subprocess.run(probe, capture_output=True).returncode == 0 else None


def load(n: int) -> list[list[str]]:
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run import tokenize

    texts: list[str] = []
    for f in sorted(DATA.glob("batch_*.json")):
        for s in json.loads(f.read_text())["samples"]:
            texts.append(s["summary"].strip())
    if not texts:
        texts = [f"Report {i} says the plant in town {i} made {1000 + i} units. It opened in {1990 + i}. "
                 f"Its owner sold it in {2001 + i}." for i in range(n * 4)]
    # answers of chat length: four summaries back to back, each answer its own four
    return [tokenize(" ".join(texts[i * 4:i * 4 + 4])) for i in range(min(n, len(texts) // 4))]


def child(variant: str, peers_py: Path | None, delay_s: float, check_s: float, data: Path) -> dict[str, Any]:
    args = [str(delay_s), str(check_s), str(data)]
    sys.path.insert(0, str(ROOT / "benchmarks"))
    from run import _PRODUCER

    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", "OTEL_SDK_DISABLED": "true",
           "STREAMJUDGE_BENCH_PRODUCER": _PRODUCER}
    if variant in ("none", "streamjudge"):
        code = _NONE if variant == "none" else _STREAMJUDGE
        cmd = [sys.executable, "-c", code, *args, str(ROOT)]
    else:
        assert peers_py is not None
        if variant == "guardrails_ai":
            cmd = [str(peers_py), "-c", _GUARDRAILS, *args]
        else:
            chunk = 20 if variant == "nemo_chunk20" else 200
            cmd = [str(peers_py), "-c", _NEMO, *args, str(chunk), "5" if chunk == 20 else "50"]
        # Guardrails AI reads its settings (hub metrics off) from $HOME/.guardrailsrc
        home = Path(tempfile.gettempdir()) / "streamjudge-bench-peers-home"
        home.mkdir(exist_ok=True)
        (home / ".guardrailsrc").write_text("enable_metrics=false\nuse_remote_inferencing=false\n")
        env["HOME"] = str(home)
    proc = subprocess.run(cmd, capture_output=True, text=True, input="", timeout=900, env=env)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant}: {proc.stderr[-2000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def _pct(values: list[float], q: float) -> float:
    s = sorted(values)
    return s[min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))] if s else float("nan")


def _spread(values: list[float]) -> str:
    return f"{statistics.median(values):.3f} [{min(values):.3f}-{max(values):.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--answers", type=int, default=5)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--delay-ms", type=float, default=20.0)
    ap.add_argument("--check-ms", type=float, default=200.0)
    ap.add_argument("--no-install", action="store_true", help="skip the peers when their venv is missing")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    peers_py = ensure_peers(not args.no_install)
    variants = [v for v in VARIANTS if peers_py is not None or v in ("none", "streamjudge")]
    answers = load(args.answers)
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(answers, f)
        data = Path(f.name)
    runs: dict[str, list[dict[str, Any]]] = {v: [] for v in variants}
    try:
        for rep in range(args.repeat):
            k = rep % len(variants)
            for v in variants[k:] + variants[:k]:  # interleaved, order rotated per repeat
                runs[v].append(child(v, peers_py, args.delay_ms / 1000, args.check_ms / 1000, data))
    finally:
        data.unlink()
    out: dict[str, Any] = {"benchmark": "slow_check_itl", "delay_ms": args.delay_ms,
                           "check_ms": args.check_ms, "answers": len(answers),
                           "tokens": sum(map(len, answers)), "repeat": args.repeat, "variants": {}}
    base_p99 = [_pct([g for a in r["gaps"] for g in a], 99) for r in runs["none"]]
    for v in variants:
        p99 = [_pct([g for a in r["gaps"] for g in a], 99) for r in runs[v]]
        ttft = [statistics.median(r["ttft"]) for r in runs[v]]
        pieces = [sum(len(a) for a in r["gaps"]) for r in runs[v]]
        worst = [max(g for a in r["gaps"] for g in a) for r in runs[v]]
        out["variants"][v] = {
            "itl_p99_ms": [round(x * 1000, 2) for x in p99],
            "itl_max_ms": [round(x * 1000, 1) for x in worst],
            "itl_p99_ratio_vs_none": [round(x / b, 3) for x, b in zip(p99, base_p99, strict=True)],
            "ttft_ms_median": [round(x * 1000, 1) for x in ttft],
            "pieces_received": pieces,
        }
    sj = out["variants"]["streamjudge"]["itl_p99_ratio_vs_none"]
    out["goal"] = "streamjudge ITL p99 <= 1.05x no check"
    out["goal_met"] = statistics.median(sj) <= 1.05
    if args.json:
        print(json.dumps(out))
        return 0
    print(f"== {args.check_ms:g} ms check at {args.delay_ms:g} ms/token: {len(answers)} answers, "
          f"{out['tokens']} tokens, {args.repeat} repeats (median [min-max])")
    for v, r in out["variants"].items():
        print(f"   {v:14s} ITL p99 x{_spread(r['itl_p99_ratio_vs_none'])} vs none   "
              f"p99 {statistics.median(r['itl_p99_ms']):7.1f} ms  "
              f"max {statistics.median(r['itl_max_ms']):7.1f} ms  "
              f"first text after "
              f"{statistics.median(r['ttft_ms_median']):7.1f} ms   pieces {r['pieces_received'][0]}")
    if peers_py is None:
        print("   (NeMo Guardrails / Guardrails AI skipped: their virtualenv is not installed)")
    print(f"   goal {out['goal']}: {'met' if out['goal_met'] else 'NOT met'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
