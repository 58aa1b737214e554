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
    sub.add_parser("demo", help="the built-in demo (same as python -m streamjudge.demo)").set_defaults(
        func=lambda _a: __import__("streamjudge.demo", fromlist=["main"]).main([])
    )
    args = parser.parse_args(argv)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
