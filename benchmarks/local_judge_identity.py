"""Bit-identity check of the ``local`` judge on FaithBench dev: record its outputs once, check them later.

    python benchmarks/local_judge_identity.py --record FILE   # before a change
    python benchmarks/local_judge_identity.py --check FILE    # after it: exit 1 on the first difference

Reads ``../shared/benchdata/faithbench-dev`` (relative to the repository root; ``--data`` to point
elsewhere) and records ``repr`` of every :class:`JudgeResult` (values, labels, explanations, skips), for

* every sample judged as a final answer on all metrics (its summary doubles as the reference), with a
  shared judge and with a fresh one;
* every sample's summary as checkpoints send it: each sentence as the new text, the text before it as
  the prefix;
* chat-length streams (five consecutive summaries, their five sources as the contexts, as in
  ``benchmarks/run.py``) as checkpoints of one sentence each, then the final pass, on one judge;
* the pre-flight gate (context precision) of each stream.

The record file holds machine-independent data only; keep it outside the repository (for example under
``$HOME/.cache/streamjudge``).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_judge_accuracy import load
from streamjudge import semconv
from streamjudge.judging.base import METRICS, EvalInput
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.sentences import split_sentences

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "benchdata" / "faithbench-dev"
QUESTION = "Summarize the passage."
F = (semconv.FAITHFULNESS,)


def checkpoints(text: str) -> Iterator[tuple[str, str]]:
    """(prefix, new sentence) for every sentence of ``text``: what a checkpoint of one sentence sends."""
    for s in split_sentences(text):
        yield text[: s.start], text[s.start : s.end]


def outputs(samples: list[dict[str, Any]]) -> Iterator[tuple[str, str]]:
    """(case label, repr of the judge's result) for every recorded case, in a fixed order."""
    shared = LocalJudge()
    for n, s in enumerate(samples):
        item = EvalInput(QUESTION, (s["source"],), s["summary"], reference=s["summary"])
        yield f"answer/{n}", repr(shared.evaluate_sync(item, METRICS))
        yield f"answer-fresh/{n}", repr(LocalJudge().evaluate_sync(item, METRICS))
    for n, s in enumerate(samples):
        for k, (prefix, new) in enumerate(checkpoints(s["summary"])):
            item = EvalInput(QUESTION, (s["source"],), new, kind="checkpoint", prefix=prefix,
                             offset=len(prefix))
            yield f"checkpoint/{n}/{k}", repr(shared.evaluate_sync(item, F))
    for g in range(0, len(samples) - 4, 5):
        group = samples[g : g + 5]
        contexts = tuple(s["source"] for s in group)
        answer = " ".join(s["summary"].strip() for s in group)
        judge = LocalJudge()
        pre = EvalInput("Summarize the passages.", contexts, "", kind="preflight")
        yield f"stream/{g}/preflight", repr(judge.evaluate_sync(pre, (semconv.CONTEXT_PRECISION,)))
        for k, (prefix, new) in enumerate(checkpoints(answer)):
            item = EvalInput("Summarize the passages.", contexts, new, kind="checkpoint", prefix=prefix,
                             offset=len(prefix))
            yield f"stream/{g}/{k}", repr(judge.evaluate_sync(item, F))
        final = EvalInput("Summarize the passages.", contexts, answer, reference=group[0]["summary"])
        yield f"stream/{g}/final", repr(judge.evaluate_sync(final, METRICS))


def main(argv: list[str] | None = None) -> int:
    """Record or check; prints the case count, a digest and the time taken."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    mode = parser.add_mutually_exclusive_group(required=True)
    mode.add_argument("--record", type=Path, metavar="FILE")
    mode.add_argument("--check", type=Path, metavar="FILE")
    args = parser.parse_args(argv)
    samples = load(args.data)
    t0 = time.perf_counter()
    got = list(outputs(samples))
    elapsed = time.perf_counter() - t0
    digest = hashlib.sha256("\n".join(r for _, r in got).encode()).hexdigest()[:16]
    print(f"{len(got)} results, digest {digest}, {elapsed:.1f} s")
    if args.record:
        args.record.parent.mkdir(parents=True, exist_ok=True)
        args.record.write_text(json.dumps(got), encoding="utf-8")
        return 0
    expected = [tuple(x) for x in json.loads(args.check.read_text(encoding="utf-8"))]
    if len(expected) != len(got):
        print(f"case count differs: recorded {len(expected)}, now {len(got)}", file=sys.stderr)
        return 1
    diffs = [(e, g) for e, g in zip(expected, got, strict=True) if e != g]
    for (label, want), (_, have) in diffs[:5]:
        print(f"DIFFERS {label}\n  recorded: {want}\n  now:      {have}", file=sys.stderr)
    if diffs:
        print(f"{len(diffs)} of {len(got)} results differ", file=sys.stderr)
        return 1
    print("identical")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
