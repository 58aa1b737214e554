"""FaithBench (dev split): how well the ``local`` judge separates hallucinated summaries, and how fast.

Reads ``../shared/benchdata/faithbench-dev/batch_*.json`` (relative to the repository root; ``--data`` to
point elsewhere). Each sample's ``source`` is the single context, its ``summary`` the answer. A sample is
hallucinated when any annotation label starts with ``Unwanted``. A judgement predicts "hallucinated" when
its faithfulness score is below the threshold.

Reported: balanced accuracy of the local judge at ``--threshold`` (default 0.5), the best threshold on
this split (tuned on the data it is scored on, so optimistic), the detectors stored in each sample's
``metadata`` at threshold 0.5 for comparison, and the mean time per judgement (first pass, with context
indexes shared between summaries of the same source, and a repeat pass served from the claim cache).

    python benchmarks/bench_judge_accuracy.py [--data DIR] [--threshold 0.5] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamjudge import semconv
from streamjudge.judging.base import EvalInput
from streamjudge.judging.judges.local import LocalJudge

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "benchdata" / "faithbench-dev"
DETECTORS = ("hhem-2.1", "trueteacher", "true_nli", "gpt-3.5-turbo", "gpt-4-turbo", "gpt_4o")
QUESTION = "Summarize the passage."


def load(data_dir: Path) -> list[dict[str, Any]]:
    """All samples of every ``batch_*.json`` under ``data_dir``, in file and sample order."""
    files = sorted(data_dir.glob("batch_*.json"), key=lambda p: (len(p.name), p.name))
    if not files:
        raise SystemExit(f"no batch_*.json under {data_dir} (use --data to point at the FaithBench split)")
    samples: list[dict[str, Any]] = []
    for f in files:
        samples.extend(json.loads(f.read_text(encoding="utf-8"))["samples"])
    return samples


def hallucinated(sample: dict[str, Any]) -> bool:
    """True when any annotator marked an ``Unwanted`` span."""
    return any(
        str(label).startswith("Unwanted") for a in sample.get("annotations") or [] for label in a["label"]
    )


def balanced_accuracy(scores: Sequence[float], truth: Sequence[bool], threshold: float) -> float:
    """Mean of recall on hallucinated (score < threshold) and on faithful (score >= threshold) samples."""
    pos = [s for s, t in zip(scores, truth, strict=True) if t]
    neg = [s for s, t in zip(scores, truth, strict=True) if not t]
    if not pos or not neg:
        return float("nan")
    tpr = sum(s < threshold for s in pos) / len(pos)
    tnr = sum(s >= threshold for s in neg) / len(neg)
    return (tpr + tnr) / 2


def best_threshold(scores: Sequence[float], truth: Sequence[bool]) -> tuple[float, float]:
    """The threshold with the highest balanced accuracy on these very samples (ties: the lowest)."""
    candidates = sorted({*scores, 1.0 + 1e-9})
    best = (float("-inf"), 0.0)
    for t in candidates:
        ba = balanced_accuracy(scores, truth, t)
        if ba > best[0]:
            best = (ba, t)
    return best[1], best[0]


def run(data_dir: Path, threshold: float) -> dict[str, Any]:
    """Judge every sample and gather the numbers the report prints."""
    samples = load(data_dir)
    judge = LocalJudge()
    metrics = (semconv.FAITHFULNESS,)
    items = [
        EvalInput(question=QUESTION, contexts=(s["source"],), answer=s["summary"], kind="answer")
        for s in samples
    ]
    truth = [hallucinated(s) for s in samples]

    first_us: list[float] = []
    values: list[float | None] = []
    explanations: list[str] = []
    for item in items:
        t0 = time.perf_counter_ns()
        result = judge.evaluate_sync(item, metrics)
        first_us.append((time.perf_counter_ns() - t0) / 1000)
        score = result.scores[0]
        values.append(score.value)
        explanations.append(score.explanation or score.skipped or "")
    repeat_us: list[float] = []
    for item in items:
        t0 = time.perf_counter_ns()
        judge.evaluate_sync(item, metrics)
        repeat_us.append((time.perf_counter_ns() - t0) / 1000)

    # a skipped judgement (no checkable claim) predicts "faithful": nothing was found to be unsupported
    scores = [1.0 if v is None else v for v in values]
    tuned_t, tuned_ba = best_threshold(scores, truth)
    detectors: dict[str, dict[str, Any]] = {}
    for name in DETECTORS:
        pairs = [
            (float(s["metadata"][name]), t)
            for s, t in zip(samples, truth, strict=True)
            if isinstance((s.get("metadata") or {}).get(name), int | float)
        ]
        if pairs:
            detectors[name] = {
                "balanced_accuracy": balanced_accuracy([p[0] for p in pairs], [p[1] for p in pairs], 0.5),
                "n": len(pairs),
            }
    return {
        "data": os.path.relpath(data_dir.resolve(), REPO),  # no machine-specific absolute path
        "samples": len(samples),
        "hallucinated": sum(truth),
        "skipped": sum(v is None for v in values),
        "local": {
            "threshold": threshold,
            "balanced_accuracy": balanced_accuracy(scores, truth, threshold),
            "tuned_threshold": tuned_t,
            "tuned_balanced_accuracy": tuned_ba,
            "mean_score_hallucinated": statistics.fmean(s for s, t in zip(scores, truth, strict=True) if t),
            "mean_score_faithful": statistics.fmean(s for s, t in zip(scores, truth, strict=True) if not t),
            "mean_us_first_pass": statistics.fmean(first_us),
            "p95_us_first_pass": sorted(first_us)[int(0.95 * (len(first_us) - 1))],
            "mean_us_cached": statistics.fmean(repeat_us),
        },
        "detectors_at_0.5": detectors,
    }


def print_table(report: dict[str, Any]) -> None:
    """A human-readable table of :func:`run`'s report."""
    loc = report["local"]
    print(f"FaithBench dev: {report['samples']} samples, {report['hallucinated']} hallucinated, "
          f"{report['skipped']} without checkable claims (scored as faithful)")
    print(f"{'detector':<36} {'threshold':>9} {'bal.acc':>8} {'n':>5}")
    print("-" * 61)
    n = report["samples"]
    print(f"{'local':<36} {loc['threshold']:>9.3f} {loc['balanced_accuracy']:>8.3f} {n:>5}")
    print(f"{'local (threshold tuned on this split)':<36} {loc['tuned_threshold']:>9.3f} "
          f"{loc['tuned_balanced_accuracy']:>8.3f} {n:>5}")
    for name, d in report["detectors_at_0.5"].items():
        print(f"{name:<36} {0.5:>9.3f} {d['balanced_accuracy']:>8.3f} {d['n']:>5}")
    print()
    print(f"local mean score: hallucinated {loc['mean_score_hallucinated']:.3f}, "
          f"faithful {loc['mean_score_faithful']:.3f}")
    print(f"local time per judgement: mean {loc['mean_us_first_pass']:.0f} us first pass "
          f"(p95 {loc['p95_us_first_pass']:.0f} us), {loc['mean_us_cached']:.0f} us with cached claims")


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="directory with batch_*.json")
    parser.add_argument("--threshold", type=float, default=0.5, help="faithfulness below this = hallucinated")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of a table")
    args = parser.parse_args(argv)
    report = run(args.data, args.threshold)
    if args.json:
        print(json.dumps(report, sort_keys=True))
    else:
        print_table(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
