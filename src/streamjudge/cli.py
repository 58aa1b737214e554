"""The ``streamjudge`` command."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Any

from streamjudge.config import ConfigError, load_settings


def _replay(args: argparse.Namespace) -> int:
    from streamjudge.offline.replay import CaseError, load_cases, replay

    try:
        cases = load_cases(args.cases)
    except (OSError, CaseError) as exc:
        print(f"streamjudge replay: {exc}", file=sys.stderr)
        return 2
    overrides: dict[str, Any] = {"judge": args.judge, "checkpoint_judge": args.judge}
    if args.threshold is not None:
        overrides["threshold"] = args.threshold
    try:
        settings = load_settings(**overrides)
    except ConfigError as exc:
        print(f"streamjudge replay: {exc}", file=sys.stderr)
        return 2
    results = replay(cases, settings, chunk_size=args.chunk_size)
    failed = [r for r in results if not r.passed]
    expected = [r for r in results if r.case.expect_alert is not None]
    tp = sum(1 for r in expected if r.fired and r.case.expect_alert)
    fp = sum(1 for r in expected if r.fired and not r.case.expect_alert)
    fn = sum(1 for r in expected if not r.fired and r.case.expect_alert)
    summary = {
        "summary": True,
        "cases": len(results),
        "passed": len(results) - len(failed),
        "failed": len(failed),
        "true_positives": tp,
        "false_positives": fp,
        "false_negatives": fn,
        "precision": round(tp / (tp + fp), 4) if tp + fp else None,
        "recall": round(tp / (tp + fn), 4) if tp + fn else None,
        "judge": settings.judge,
        "threshold": settings.threshold,
    }
    if args.json:
        for r in results:
            print(json.dumps(r.to_json(), ensure_ascii=False))
        print(json.dumps(summary))
    else:
        print(f"{'id':<20} {'expect':<7} {'fired':<6} {'first@':>7} {'faith':>6} {'checkpts':>8}  result")
        for r in results:
            exp = "-" if r.case.expect_alert is None else ("alert" if r.case.expect_alert else "ok")
            faith = r.final.get("faithfulness")
            print(
                f"{r.case.id[:20]:<20} {exp:<7} {('yes' if r.fired else 'no'):<6} "
                f"{'-' if r.first_alert_char is None else r.first_alert_char:>7} "
                f"{'-' if faith is None else f'{faith:.2f}':>6} {r.checkpoints:>8}  "
                f"{'PASS' if r.passed else 'FAIL'}"
            )
        print(
            f"\n{summary['passed']}/{summary['cases']} passed; precision={summary['precision']} "
            f"recall={summary['recall']} (judge={settings.judge}, threshold={settings.threshold})"
        )
    return 1 if failed else 0


def _calibrate(args: argparse.Namespace) -> int:
    from streamjudge.offline.calibrate import best, lowest_scores, sweep
    from streamjudge.offline.replay import CaseError, load_cases

    try:
        cases = [c for c in load_cases(args.cases) if c.expect_alert is not None]
        settings = load_settings(judge=args.judge, checkpoint_judge=args.judge)
    except (OSError, CaseError, ConfigError) as exc:
        print(f"streamjudge calibrate: {exc}", file=sys.stderr)
        return 2
    if not cases:
        print("streamjudge calibrate: no case has expect_alert true/false", file=sys.stderr)
        return 2
    expected = [bool(c.expect_alert) for c in cases]
    lows = lowest_scores(cases, settings, chunk_size=args.chunk_size)
    rows = sweep(lows, expected)
    top = best(rows)
    current = sweep(lows, expected, [settings.threshold])[0]

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    if args.json:
        for r in rows:
            print(json.dumps({
                "threshold": r.threshold, "tp": r.true_positives, "fp": r.false_positives,
                "fn": r.false_negatives, "tn": r.true_negatives, "precision": r.precision,
                "recall": r.recall, "balanced_accuracy": r.balanced_accuracy,
            }))
        print(json.dumps({
            "summary": True, "cases": len(cases), "judge": settings.judge,
            "best_threshold": top.threshold if top else None,
            "best_balanced_accuracy": top.balanced_accuracy if top else None,
            "current_threshold": settings.threshold,
            "current_balanced_accuracy": current.balanced_accuracy,
        }))
        return 0
    head = ("threshold", "tp", "fp", "fn", "tn", "precision", "recall", "bal.acc")
    print("{:>9} {:>4} {:>4} {:>4} {:>4} {:>9} {:>7} {:>7}".format(*head))
    for r in rows:
        mark = "  <- best" if r is top else ""
        counts = f"{r.true_positives:>4} {r.false_positives:>4} {r.false_negatives:>4} {r.true_negatives:>4}"
        rates = f"{fmt(r.precision):>9} {fmt(r.recall):>7} {fmt(r.balanced_accuracy):>7}"
        print(f"{r.threshold:>9.3f} {counts} {rates}{mark}")
    if top is not None:
        print(
            f"\nbest threshold {top.threshold:.3f} (balanced accuracy {fmt(top.balanced_accuracy)}); current "
            f"{settings.threshold} gives {fmt(current.balanced_accuracy)}. Set STREAMJUDGE_THRESHOLD to use "
            f"it; tuned on these {len(cases)} cases, so check it on cases you did not tune on."
        )
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``streamjudge`` console script."""
    parser = argparse.ArgumentParser(prog="streamjudge", description="Live judging of streamed RAG answers.")
    sub = parser.add_subparsers(dest="command", required=True)
    rp = sub.add_parser("replay", help="stream recorded answers through the guard and check expected alerts")
    rp.add_argument("cases", help="JSONL file: question, contexts, answer, optional id, expect_alert")
    rp.add_argument("--judge", default="local", help="judge name (default: local)")
    rp.add_argument("--threshold", type=float, default=None, help="pass threshold for every metric")
    rp.add_argument("--json", action="store_true", help="one JSON object per case, then a summary object")
    rp.add_argument("--chunk-size", type=int, default=8, help="characters per streamed chunk (default 8)")
    rp.set_defaults(func=_replay)
    cp = sub.add_parser("calibrate", help="find the checkpoint threshold that best matches expected alerts")
    cp.add_argument("cases", help="JSONL file as for replay; cases need expect_alert")
    cp.add_argument("--judge", default="local", help="judge name (default: local)")
    cp.add_argument("--json", action="store_true", help="one JSON object per threshold, then a summary")
    cp.add_argument("--chunk-size", type=int, default=8, help="characters per streamed chunk (default 8)")
    cp.set_defaults(func=_calibrate)
    sub.add_parser("demo", help="the built-in demo (same as python -m streamjudge.demo)").set_defaults(
        func=lambda _a: __import__("streamjudge.demo", fromlist=["main"]).main([])
    )
    from streamjudge.worker import _cli as worker_cli  # light: the worker itself is imported on run

    wp = sub.add_parser("worker", help="judge deferred final passes of spans received over OTLP")
    worker_cli.add_arguments(wp)
    wp.set_defaults(func=worker_cli.run)
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
