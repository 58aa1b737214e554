"""The ``streamjudge`` command: replay, calibrate, cases-from-trace, golden, demo and worker.

Exit status: 0 when every expectation held, 1 when one did not (or balanced accuracy is below
``--fail-under``), 2 when the input or a setting cannot be used (the message says which and how to fix it).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO

from streamjudge import semconv
from streamjudge._version import __version__
from streamjudge.config import ConfigError, Settings, load_settings, parse_judge_name

if TYPE_CHECKING:
    from streamjudge.judging.base import Judge
    from streamjudge.offline.replay import CaseResult, ReplayCase

DEFAULT_CONCURRENCY = 4


class _Exit(Exception):
    """Stop the command with exit status 2 after printing ``message`` on stderr."""

    def __init__(self, message: str) -> None:
        super().__init__(message)


def _settings(args: argparse.Namespace, **overrides: Any) -> Settings:
    """Settings from the environment (``STREAMJUDGE_JUDGE`` included); ``--judge`` wins over it."""
    if args.judge is not None:
        name = parse_judge_name("--judge", args.judge)
        overrides.update(judge=name, checkpoint_judge=name)
    return load_settings(**overrides)


def _judges(settings: Settings, source: str) -> tuple[Judge, Judge]:
    """Both judges, built now: a judge that cannot load stops the command (the app would fall back to
    the local judge; an offline run must not quietly measure another judge than the one asked for)."""
    from streamjudge.judging.judges import create_judge

    built: list[Judge] = []
    for tier, name in (("final", settings.judge), ("checkpoint", settings.checkpoint_judge_name)):
        try:
            built.append(create_judge(name, settings, tier=tier))  # type: ignore[arg-type]
        except Exception as exc:
            raise _Exit(f"the {tier} judge {name!r} ({source}) cannot be used: {exc}") from None
    return built[0], built[1]


def _judge_source(args: argparse.Namespace) -> str:
    if args.judge is not None:
        return "from --judge"
    return "from STREAMJUDGE_JUDGE" if os.environ.get("STREAMJUDGE_JUDGE") else "the default"


def _load(args: argparse.Namespace) -> list[ReplayCase]:
    from streamjudge.offline.replay import CaseError, load_cases

    try:
        return load_cases(args.cases)
    except FileNotFoundError:
        raise _Exit(f"{args.cases}: no such file") from None
    except (OSError, CaseError) as exc:
        raise _Exit(str(exc)) from None


class _Progress:
    """``[done/total]`` on stderr, redrawn in place; only when stderr is a terminal."""

    def __init__(
        self, total: int, stream: TextIO, what: str = "replaying: {done}/{total} cases done"
    ) -> None:
        self.what = what
        self.total = total
        self.done = 0
        self.stream = stream
        self.on = stream.isatty()

    def clear(self) -> None:
        if self.on:
            self.stream.write("\r\033[K")
            self.stream.flush()

    def draw(self) -> None:
        if self.on and self.done < self.total:
            self.stream.write("\r" + self.what.format(done=self.done, total=self.total))
            self.stream.flush()

    def step(self, emit: Callable[[], None]) -> None:
        self.clear()
        emit()
        self.done += 1
        self.draw()


def _cut(text: str, width: int) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


_ROW = "{:<20} {:<6} {:<5} {:>6} {:>5} {:>5}  {:<6} {}"


def _row(r: CaseResult) -> str:
    exp = "-" if r.case.expect_alert is None else ("alert" if r.case.expect_alert else "ok")
    faith = r.final.get("faithfulness")
    return _ROW.format(
        r.case.id[:20], exp, "yes" if r.fired else "no",
        "-" if r.first_alert_char is None else r.first_alert_char,
        "-" if faith is None else f"{faith:.2f}", r.checkpoints,
        "PASS" if r.passed else "FAIL", _cut(r.reason, 70),
    )


def _summary(results: Sequence[CaseResult], settings: Settings) -> dict[str, Any]:
    from streamjudge.offline.calibrate import ThresholdRow

    expected = [r for r in results if r.case.expect_alert is not None]
    tp = sum(1 for r in expected if r.fired and r.case.expect_alert)
    fp = sum(1 for r in expected if r.fired and not r.case.expect_alert)
    fn = sum(1 for r in expected if not r.fired and r.case.expect_alert)
    tn = sum(1 for r in expected if not r.fired and not r.case.expect_alert)
    row = ThresholdRow(settings.threshold, tp, fp, fn, tn)

    def rnd(v: float | None) -> float | None:
        return None if v is None else round(v, 4)

    failed = sum(1 for r in results if not r.passed)
    return {
        "summary": True,
        "cases": len(results),
        "passed": len(results) - failed,
        "failed": failed,
        "true_positives": tp,
        "false_positives": fp,
        "false_negatives": fn,
        "true_negatives": tn,
        "precision": rnd(row.precision),
        "recall": rnd(row.recall),
        "balanced_accuracy": rnd(row.balanced_accuracy),
        "judge": settings.judge,
        "checkpoint_judge": settings.checkpoint_judge_name,
        "threshold": settings.threshold,
    }


def _replay(args: argparse.Namespace) -> int:
    from streamjudge.offline.replay import replay

    cases = _load(args)
    overrides: dict[str, Any] = {}
    if args.threshold is not None:
        overrides["threshold"] = args.threshold
    if args.strictness is not None:
        overrides["strictness"] = args.strictness
    settings = _settings(args, **overrides)
    final_judge, checkpoint_judge = _judges(settings, _judge_source(args))
    print(f"streamjudge replay: {len(cases)} cases, judge={settings.judge} "
          f"(checkpoints: {settings.checkpoint_judge_name}), threshold={settings.threshold}, "
          f"{args.concurrency} at a time", file=sys.stderr)
    progress = _Progress(len(cases), sys.stderr)
    if not args.json:
        head = ("id", "expect", "fired", "first@", "faith", "chkpt", "result", "reason")
        print(_ROW.format(*head), flush=True)

    def emit(r: CaseResult) -> None:
        line = json.dumps(r.to_json(), ensure_ascii=False) if args.json else _row(r)
        progress.step(lambda: print(line, flush=True))

    progress.draw()
    try:
        results = replay(cases, settings, chunk_size=args.chunk_size, concurrency=args.concurrency,
                         on_result=emit, judge=final_judge, checkpoint_judge=checkpoint_judge)
    finally:
        progress.clear()
    summary = _summary(results, settings)
    bal = summary["balanced_accuracy"]
    if args.json:
        print(json.dumps(summary))
    else:
        print(
            f"\n{summary['passed']}/{summary['cases']} passed; precision={summary['precision']} "
            f"recall={summary['recall']} balanced accuracy={bal} "
            f"(judge={settings.judge}, checkpoint judge={settings.checkpoint_judge_name}, "
            f"threshold={settings.threshold})"
        )
    if args.fail_under is not None:
        if bal is None or bal < args.fail_under:
            print(f"streamjudge replay: balanced accuracy {bal} is below --fail-under {args.fail_under}"
                  + (" (it needs cases expected to alert and cases expected not to)" if bal is None else ""),
                  file=sys.stderr)
            return 1
        return 0
    return 1 if summary["failed"] else 0


def _calibrate(args: argparse.Namespace) -> int:
    from streamjudge.config import STRICTNESS
    from streamjudge.offline.calibrate import (
        best,
        by_strictness,
        lowest_scores,
        sweep,
        write_chart,
        write_csv,
    )

    cases = [c for c in _load(args) if c.expect_alert is not None]
    if not cases:
        raise _Exit(f"{args.cases}: no case has expect_alert true/false, so there is nothing to calibrate on")
    settings = _settings(args)
    final_judge, checkpoint_judge = _judges(settings, _judge_source(args))
    print(f"streamjudge calibrate: {len(cases)} cases, judge={settings.judge} "
          f"(checkpoints: {settings.checkpoint_judge_name})", file=sys.stderr)
    progress = _Progress(len(cases), sys.stderr)
    progress.draw()
    try:
        lows = lowest_scores(cases, settings, chunk_size=args.chunk_size, concurrency=args.concurrency,
                             on_result=lambda _r: progress.step(lambda: None),
                             judge=final_judge, checkpoint_judge=checkpoint_judge)
    finally:
        progress.clear()
    expected = [bool(c.expect_alert) for c in cases]
    rows = sweep(lows, expected)
    top = best(rows)
    current = sweep(lows, expected, [settings.threshold])[0]
    progress = _Progress(len(cases) * len(STRICTNESS), sys.stderr)
    progress.draw()
    try:
        strict_rows = by_strictness(
            cases, settings, chunk_size=args.chunk_size, concurrency=args.concurrency,
            judges=lambda st: _judges(st, _judge_source(args)),
            on_result=lambda _r: progress.step(lambda: None))
    finally:
        progress.clear()

    csv_path = write_csv(rows, args.csv)
    print(f"streamjudge calibrate: wrote {csv_path}", file=sys.stderr)
    chart = Path(args.chart) if args.chart else csv_path.with_suffix(".png")
    if write_chart(rows, chart, best_row=top, current=settings.threshold) is None:
        print("streamjudge calibrate: no chart (matplotlib is not installed; pip install matplotlib "
              "to get one)", file=sys.stderr)
    else:
        print(f"streamjudge calibrate: wrote {chart}", file=sys.stderr)

    def fmt(v: float | None) -> str:
        return "-" if v is None else f"{v:.3f}"

    if args.json:
        for r in rows:
            print(json.dumps({
                "threshold": r.threshold, "tp": r.true_positives, "fp": r.false_positives,
                "fn": r.false_negatives, "tn": r.true_negatives, "precision": r.precision,
                "recall": r.recall, "balanced_accuracy": r.balanced_accuracy,
            }))
        for sr in strict_rows:
            print(json.dumps({
                "strictness": sr.strictness, "threshold": settings.threshold,
                "false_alarm_rate": sr.false_alarm_rate, "catch_rate": sr.catch_rate,
                "balanced_accuracy": sr.counts.balanced_accuracy, "tp": sr.counts.true_positives,
                "fp": sr.counts.false_positives, "fn": sr.counts.false_negatives,
                "tn": sr.counts.true_negatives,
            }))
        print(json.dumps({
            "summary": True, "cases": len(cases), "judge": settings.judge,
            "checkpoint_judge": settings.checkpoint_judge_name,
            "best_threshold": top.threshold if top else None,
            "best_balanced_accuracy": top.balanced_accuracy if top else None,
            "current_threshold": settings.threshold,
            "current_balanced_accuracy": current.balanced_accuracy,
            "csv": str(csv_path),
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
    grounded = sum(1 for e in expected if not e)
    print(f"\nat threshold {settings.threshold}, by strictness (STREAMJUDGE_STRICTNESS; now "
          f"{settings.strictness}): false alarms on the {grounded} grounded cases, catches among the "
          f"{len(cases) - grounded} others")
    print("{:>10} {:>13} {:>11} {:>8}".format("strictness", "false alarms", "catch rate", "bal.acc"))
    for sr in strict_rows:
        print(f"{sr.strictness:>10} {fmt(sr.false_alarm_rate):>13} {fmt(sr.catch_rate):>11} "
              f"{fmt(sr.counts.balanced_accuracy):>8}")
    return 0


def _cases_from_trace(args: argparse.Namespace) -> int:
    from streamjudge.offline.from_trace import TraceFormatError, case_json, cases_from_files

    try:
        found = list(cases_from_files(args.traces))
    except FileNotFoundError as exc:
        raise _Exit(f"{exc.filename}: no such file") from None
    except (OSError, TraceFormatError) as exc:
        raise _Exit(str(exc)) from None
    if args.trace_id:
        wanted = {t.lower() for t in args.trace_id}
        found = [e for e in found if e.trace_id in wanted]
    cases = [e for e in found if e.case is not None]
    for e in found:
        if e.case is None:
            print(f"streamjudge cases-from-trace: trace {e.trace_id} span {e.span_id}: skipped, {e.skipped}",
                  file=sys.stderr)
        else:
            print(f"streamjudge cases-from-trace: {e.case.id}: {len(e.case.contexts)} context(s) from "
                  f"{e.contexts_from}; expect_alert={json.dumps(e.case.expect_alert)} ({'; '.join(e.notes)})",
                  file=sys.stderr)
    if not cases:
        where = " with the given --trace-id" if args.trace_id else ""
        raise _Exit(
            f"no answer span{where} to make a case of in {', '.join(args.traces)} (answer spans have "
            f"streamjudge.span.type=stream and need the answer text: record with content capture on)"
        )
    lines = [json.dumps(case_json(e.case), ensure_ascii=False) for e in cases if e.case is not None]
    if args.output in (None, "-"):
        for line in lines:
            print(line)
    else:
        Path(args.output).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
        print(f"streamjudge cases-from-trace: wrote {len(lines)} case(s) to {args.output} "
              f"(streamjudge replay {args.output})", file=sys.stderr)
    return 0


_GOLDEN_SHORT = {semconv.FAITHFULNESS: "faith", semconv.CONTEXT_RECALL: "recall",
                 semconv.CONTEXT_PRECISION: "precis", semconv.ANSWER_RELEVANCY: "relev"}


def _short(metric: str) -> str:
    return _GOLDEN_SHORT.get(metric, metric[:6])


def _fmt(v: Any, sign: bool = False) -> str:
    if not isinstance(v, int | float):
        return "-"
    return f"{v:+.2f}" if sign else f"{v:.2f}"


def _golden(args: argparse.Namespace) -> int:
    from streamjudge.offline import golden

    if args.compare:
        return _golden_compare(args)
    if args.file is None or args.app is None:
        raise _Exit("give a golden FILE and --app module:build_graph (or --compare A.json B.json)")
    try:
        items = golden.load_golden(args.file)
    except FileNotFoundError:
        raise _Exit(f"{args.file}: no such file") from None
    except golden.GoldenError as exc:
        raise _Exit(str(exc)) from None
    metrics = tuple(args.metrics.split(",")) if args.metrics else golden.DEFAULT_METRICS
    settings = _settings(args)
    final_judge, _ = _judges(settings, _judge_source(args))
    try:
        factory = golden.load_factory(args.app)
    except golden.GoldenError as exc:
        raise _Exit(str(exc)) from None
    print(f"streamjudge golden: {len(items)} items through {args.app}, judge={settings.judge}, "
          f"metrics={','.join(metrics)}", file=sys.stderr)
    try:
        config = json.loads(args.config) if args.config else None
    except ValueError as exc:
        raise _Exit(f"--config: not valid JSON ({exc})") from None
    if config is not None and not isinstance(config, dict):
        raise _Exit("--config: expected a JSON object (a RunnableConfig)")
    run = golden.GoldenRun(settings, input_key=args.input_key, answer_key=args.answer_key,
                           contexts_key=args.contexts_key, metrics=metrics, concurrency=args.concurrency,
                           config=config)
    progress = _Progress(len(items), sys.stderr, "golden: {done}/{total} items done")
    progress.draw()
    try:
        results = golden.run_golden(items, factory, run, judge=final_judge,
                                    on_result=lambda _r: progress.step(lambda: None))
    except golden.GoldenError as exc:
        raise _Exit(str(exc)) from None
    finally:
        progress.clear()
    head = ["id", "tag", *(_short(m) for m in metrics), "answer"]
    row = "{:<14} {:<10} " + " ".join("{:>6}" for _ in metrics) + "  {}"
    print(row.format(*head))
    for r in results:
        tail = f"ERROR {r.error}" if r.error else _cut(r.answer, 60)
        print(row.format(r.item.id[:14], (r.item.tag or "-")[:10], *(_fmt(r.scores.get(m)) for m in metrics),
                         tail))
    summary = golden.summarise(results, metrics)
    print("{:<14} {:<10} ".format("mean", "") + " ".join(
        f"{_fmt(summary['metrics'][m]['mean']):>6}" for m in metrics))
    for tag, stats in summary["by_tag"].items():
        print("{:<14} {:<10} ".format("  tag", tag[:10]) + " ".join(
            f"{_fmt(stats[m]['mean']):>6}" for m in metrics))
    print(f"\n{len(results)} items, {summary['errors']} errors (judge={settings.judge}, "
          f"threshold={settings.threshold})")
    if args.json:
        out = golden.write_json(args.json, results, metrics=metrics, app=args.app, golden=str(args.file),
                                judge=settings.judge)
        print(f"streamjudge golden: wrote {out}", file=sys.stderr)
    return 1 if summary["errors"] else 0


def _golden_compare(args: argparse.Namespace) -> int:
    from streamjudge.offline import golden

    path_a, path_b = args.compare
    try:
        c = golden.compare(golden.read_run(path_a), golden.read_run(path_b))
    except golden.GoldenError as exc:
        raise _Exit(str(exc)) from None
    print(f"{'metric':<20} {'A':>6} {'B':>6} {'B-A':>6}")
    for m in c.metrics:
        a, b, d = c.means[m]
        print(f"{m:<20} {_fmt(a):>6} {_fmt(b):>6} {_fmt(d, sign=True):>6}")
    if c.items:
        print("\nper item (B-A): " + " ".join(f"{_short(m):>6}" for m in c.metrics))
        for key, deltas in c.items.items():
            print(f"  {key[:14]:<14} " + " ".join(f"{_fmt(deltas[m][2], sign=True):>6}" for m in c.metrics))
    for side, keys in (("A", c.only_a), ("B", c.only_b)):
        if keys:
            print(f"only in {side}: {', '.join(keys)}")
    chart = Path(args.chart or "streamjudge-golden-compare.png")
    if golden.write_compare_chart(c, chart, (Path(path_a).stem, Path(path_b).stem)) is None:
        print("streamjudge golden: no chart (matplotlib is not installed; pip install matplotlib to get one)",
              file=sys.stderr)
    else:
        print(f"streamjudge golden: wrote {chart}", file=sys.stderr)
    return 0


def _demo(argv: list[str]) -> int:
    from streamjudge import demo

    return demo.main(argv)


def _positive(raw: str) -> int:
    n = int(raw)
    if n < 1:
        raise argparse.ArgumentTypeError(f"expected an integer >= 1, got {raw}")
    return n


def _unit(raw: str) -> float:
    v = float(raw)
    if not 0.0 <= v <= 1.0:
        raise argparse.ArgumentTypeError(f"expected a number from 0 to 1, got {raw}")
    return v


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``streamjudge`` command."""
    parser = argparse.ArgumentParser(prog="streamjudge", description="Live judging of streamed RAG answers.")
    parser.add_argument("--version", action="version", version=f"streamjudge {__version__}")
    sub = parser.add_subparsers(dest="command", required=True,
                                metavar="{replay,calibrate,cases-from-trace,golden,demo,worker}")

    def judge_options(p: argparse.ArgumentParser) -> None:
        p.add_argument("--judge", default=None,
                       help="judge for checkpoints and the final pass: local, model, llm, ragas, deepeval, "
                            "cascade or package.module:ClassName (default: STREAMJUDGE_JUDGE, else local)")
        p.add_argument("--chunk-size", type=_positive, default=8,
                       help="characters per streamed chunk (default 8)")
        p.add_argument("--concurrency", type=_positive, default=DEFAULT_CONCURRENCY,
                       help=f"cases streamed at once (default {DEFAULT_CONCURRENCY})")

    rp = sub.add_parser("replay", help="stream recorded answers through the guard and check expected alerts")
    rp.add_argument("cases", help="JSON Lines file: question, contexts, answer, optional id, expect_alert")
    judge_options(rp)
    rp.add_argument("--threshold", type=_unit, default=None,
                    help="pass threshold for every metric (judges with sentence verdicts, such as local, "
                         "alert on their fails instead; see --strictness)")
    rp.add_argument("--strictness", choices=("lenient", "default", "strict"), default=None,
                    help="what an uncertain sentence does: strict alerts on it too (default: "
                         "STREAMJUDGE_STRICTNESS, else default)")
    rp.add_argument("--json", action="store_true",
                    help="one JSON object per case as it finishes (with the judge's explanations), then a "
                         "summary object")
    rp.add_argument("--fail-under", type=_unit, default=None, metavar="X",
                    help="exit 1 only when balanced accuracy is below X (instead of on any failed case)")
    rp.set_defaults(func=_replay)

    cp = sub.add_parser("calibrate", help="find the checkpoint threshold that best matches expected alerts")
    cp.add_argument("cases", help="JSON Lines file as for replay; cases need expect_alert")
    judge_options(cp)
    cp.add_argument("--json", action="store_true", help="one JSON object per threshold, then a summary")
    cp.add_argument("--csv", default="streamjudge-calibration.csv",
                    help="where to write the sweep as CSV (default ./streamjudge-calibration.csv)")
    cp.add_argument("--chart", default=None,
                    help="where to write the PNG chart (default: the CSV's path with .png; needs matplotlib)")
    cp.set_defaults(func=_calibrate)

    gp = sub.add_parser("golden", help="run a golden set through the app's own LangGraph graph and score it")
    gp.add_argument("file", nargs="?", default=None,
                    help="JSON Lines (or a JSON array): question, reference (expected answer), optional "
                         "id, tag")
    gp.add_argument("--app", default=None, metavar="MODULE:FACTORY",
                    help="the graph factory, module:build_graph or path/to/file.py:build_graph")
    judge_options(gp)
    gp.add_argument("--input-key", default="question", help="the state key the graph reads the question from "
                    "(default question)")
    gp.add_argument("--answer-key", default=None,
                    help="the final state's key holding the answer (default: answer, generation, response, "
                         "output, or the last message)")
    gp.add_argument("--contexts-key", default=None,
                    help="the final state's key holding the contexts (default: what streamjudge's "
                         "instrumentation registered for the run, as the live judge sees them)")
    gp.add_argument("--metrics", default=None,
                    help="comma separated (default faithfulness,context_recall,context_precision)")
    gp.add_argument("--config", default=None, metavar="JSON",
                    help="the RunnableConfig passed to ainvoke, e.g. "
                         "'{\"configurable\": {\"hallucinate\": true}}'")
    gp.add_argument("--json", default=None, metavar="OUT", help="write the run as JSON (for --compare)")
    gp.add_argument("--compare", nargs=2, default=None, metavar=("A.json", "B.json"),
                    help="print the per-metric and per-item deltas B-A of two runs (and a PNG chart)")
    gp.add_argument("--chart", default=None,
                    help="--compare: where to write the chart (default ./streamjudge-golden-compare.png)")
    gp.set_defaults(func=_golden)

    tp = sub.add_parser("cases-from-trace",
                        help="turn recorded traces (OTLP JSON or Jaeger JSON) into replay cases")
    tp.add_argument("traces", nargs="+", metavar="TRACE.json",
                    help="OTLP JSON (the collector's file exporter: one export request per line) or Jaeger "
                         "JSON (/api/traces/ID)")
    tp.add_argument("-o", "--output", default=None,
                    help="JSON Lines file for the cases (default: standard output)")
    tp.add_argument("--trace-id", action="append", default=None, metavar="ID",
                    help="only this trace (32 hex digits; repeatable)")
    tp.set_defaults(func=_cases_from_trace)

    # options after `demo` belong to the demo (streamjudge demo --help lists them)
    sub.add_parser("demo", add_help=False,
                   help="serve the example RAG app under opentelemetry-instrument and stream questions at it "
                        "(--offline: the in-process demo)")

    from streamjudge.worker import _cli as worker_cli  # light: the worker itself is imported on run

    wp = sub.add_parser("worker", help="judge deferred final passes of spans received over OTLP")
    worker_cli.add_arguments(wp)
    wp.set_defaults(func=worker_cli.run)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``streamjudge`` console script."""
    parser = build_parser()
    args, rest = parser.parse_known_args(argv)
    if args.command == "demo":
        return _demo(rest)
    if rest:
        parser.error(f"unrecognized arguments: {' '.join(rest)}")
    try:
        code: int = args.func(args)
    except (_Exit, ConfigError) as exc:
        print(f"streamjudge {args.command}: {exc}", file=sys.stderr)
        return 2
    return code


if __name__ == "__main__":
    sys.exit(main())
