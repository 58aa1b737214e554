"""How well the ``local`` judge separates hallucinated answers from grounded ones, and how early it alerts.

Data (read in place from ``../shared/benchdata`` relative to the repository root; ``--data`` to point
elsewhere, never copied into the repository):

* ``faithbench-dev/batch_*.json``: 250 summaries; each sample's ``source`` is the single context, its
  ``summary`` the answer; hallucinated when any annotation label starts with ``Unwanted``. The scores
  other detectors gave (stored in each sample's ``metadata``) are printed beside ours at their 0.5.
* ``halueval-qa-dev/cases.jsonl``: 500 replay cases (question, one context, a right or a hallucinated
  answer, ``expect_alert``).

* ``tests/data/local_judge_cases.json``: the hand-written RAG cases of the repository (grounded
  paraphrases and fabricated numbers, names, dates, units, role swaps and negations).

A judgement predicts "hallucinated" when its faithfulness score, labelled at ``--threshold`` (default
0.7, the package's default, chosen a priori), fails (:meth:`Score.with_label`): the local judge's
sentences carry three-way verdicts and decide their own labels (a fail alerts; an uncertain sentence
alerts only at the ``strict`` strictness). A skipped judgement (no checkable claim) predicts "faithful".
Reported per strictness (``lenient``, ``default``, ``strict``) on each data set: the false-alarm rate
(grounded answers flagged, 1 - TNR), the catch rate (hallucinated answers flagged, TPR) and balanced
accuracy; and what a cascade would send to its strong judge at each strictness: the judged texts with
at least one uncertain sentence (and with ``--confirm-fails`` one failed too), against sending every
text, and the sentences among them.

Earliness (FaithBench): each summary is streamed as checkpoints would send it, one sentence at a time
(``EvalInput(answer=<new sentence>, prefix=<text before it>, kind="checkpoint")``); the first failing
checkpoint is the alert. For the hallucinated summaries it reports how many are caught while streaming,
how many characters after the start of the first annotated ``Unwanted`` span the alert came (the end
of the alerting sentence; negative when an earlier sentence was flagged), and the share of the answer
not yet streamed at that point.

    python benchmarks/bench_judge_accuracy.py [--data DIR] [--threshold 0.7] [--json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from streamjudge import semconv
from streamjudge.config import STRICTNESS
from streamjudge.judging.base import EvalInput, Score
from streamjudge.judging.judges.local import LocalJudge
from streamjudge.sentences import split_sentences

REPO = Path(__file__).resolve().parent.parent
DEFAULT_DATA = REPO.parent / "shared" / "benchdata"
HAND_CASES = REPO / "tests" / "data" / "local_judge_cases.json"
DETECTORS = ("hhem-2.1", "trueteacher", "true_nli", "gpt-3.5-turbo", "gpt-4-turbo", "gpt_4o")
QUESTION = "Summarize the passage."
DEFAULT_THRESHOLD = 0.7  # the package's default faithfulness threshold, not fitted here
F = (semconv.FAITHFULNESS,)


def load(data_dir: Path) -> list[dict[str, Any]]:
    """All FaithBench samples of every ``batch_*.json`` under ``data_dir``, in file and sample order."""
    files = sorted(data_dir.glob("batch_*.json"), key=lambda p: (len(p.name), p.name))
    if not files:
        raise SystemExit(f"no batch_*.json under {data_dir} (use --data to point at the benchmark data)")
    samples: list[dict[str, Any]] = []
    for f in files:
        samples.extend(json.loads(f.read_text(encoding="utf-8"))["samples"])
    return samples


def load_halueval(path: Path) -> list[dict[str, Any]]:
    """The HaluEval QA replay cases, one JSON object a line."""
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def hallucinated(sample: dict[str, Any]) -> bool:
    """True when any annotator marked an ``Unwanted`` span."""
    return any(
        str(label).startswith("Unwanted") for a in sample.get("annotations") or [] for label in a["label"]
    )


def first_unwanted(sample: dict[str, Any]) -> int | None:
    """Where the first ``Unwanted`` span of a summary starts (annotators' spans merged), if any."""
    starts = [
        int(a["summary_start"])
        for a in sample.get("annotations") or []
        if a.get("summary_start") is not None
        and any(str(label).startswith("Unwanted") for label in a["label"])
    ]
    return min(starts) if starts else None


def rates(predicted: Sequence[bool], truth: Sequence[bool]) -> dict[str, float]:
    """Balanced accuracy, TPR (hallucinated predicted hallucinated), TNR (faithful predicted faithful)."""
    pos = [p for p, t in zip(predicted, truth, strict=True) if t]
    neg = [p for p, t in zip(predicted, truth, strict=True) if not t]
    tpr = sum(pos) / len(pos) if pos else float("nan")
    tnr = (len(neg) - sum(neg)) / len(neg) if neg else float("nan")
    return {"balanced_accuracy": (tpr + tnr) / 2, "tpr": tpr, "tnr": tnr, "n": float(len(truth))}


def fails(score: Score | None, threshold: float) -> bool:
    """The prediction "hallucinated": the labelled score fails (a skip never does)."""
    return score is not None and score.value is not None and score.with_label(threshold).label == "fail"


def judge_set(judge: LocalJudge, items: Sequence[EvalInput], truth: Sequence[bool],
              threshold: float) -> dict[str, Any]:
    """Judge every item as a final answer and sum the predictions up, with what a cascade would ask its
    strong judge about (texts and sentences with an uncertain verdict; with a failed one too)."""
    scores = [judge.evaluate_sync(item, F).get(semconv.FAITHFULNESS) for item in items]
    predicted = [fails(s, threshold) for s in scores]
    out: dict[str, Any] = rates(predicted, truth)
    out["false_alarm_rate"] = 1.0 - out["tnr"]
    out["skipped"] = sum(s is None or s.value is None for s in scores)
    sentences = [x for sc in scores if sc is not None for x in sc.sentences]
    uncertain = [sc for sc in scores
                 if sc is not None and any(x.verdict == "uncertain" for x in sc.sentences)]
    unsure_or_failed = [sc for sc in scores if sc is not None
                        and any(x.verdict in ("uncertain", "fail") for x in sc.sentences)]
    out["cascade"] = {
        "texts": len(items),
        "sentences": len(sentences),
        "escalated_texts": len(uncertain),
        "escalated_sentences": sum(x.verdict == "uncertain" for x in sentences),
        "escalated_texts_confirming_fails": len(unsure_or_failed),
        "escalated_sentences_confirming_fails": sum(x.verdict in ("uncertain", "fail") for x in sentences),
    }
    return out


def load_hand_cases(path: Path) -> tuple[list[EvalInput], list[bool]]:
    """The repository's hand-written grounded and fabricated RAG cases."""
    data = json.loads(path.read_text(encoding="utf-8"))
    items: list[EvalInput] = []
    truth: list[bool] = []
    for group, bad in (("grounded", False), ("fabricated", True)):
        for c in data[group]:
            items.append(EvalInput("", tuple(c["contexts"]), c["answer"]))
            truth.append(bad)
    return items, truth


def earliness(judge: LocalJudge, samples: Sequence[dict[str, Any]], threshold: float) -> dict[str, Any]:
    """Stream each hallucinated summary sentence by sentence; where does the first alert come?"""
    caught = 0
    late: list[int] = []  # chars from the first Unwanted span's start to the end of the alerting sentence
    unseen: list[float] = []  # share of the answer not yet streamed at the alert
    early = 0  # alerts on a sentence that ends before the first Unwanted span starts
    total = 0
    for s in samples:
        onset = first_unwanted(s)
        if not hallucinated(s) or onset is None:
            continue
        total += 1
        summary = s["summary"]
        for sent in split_sentences(summary):
            item = EvalInput(QUESTION, (s["source"],), summary[sent.start : sent.end], kind="checkpoint",
                             prefix=summary[: sent.start], offset=sent.start)
            if fails(judge.evaluate_sync(item, F).get(semconv.FAITHFULNESS), threshold):
                caught += 1
                late.append(sent.end - onset)
                early += sent.end <= onset
                unseen.append((len(summary) - sent.end) / max(1, len(summary)))
                break
    return {
        "hallucinated_with_span": total,
        "caught_while_streaming": caught,
        "alert_before_span": early,
        "median_chars_after_onset": statistics.median(late) if late else None,
        "median_share_not_streamed": statistics.median(unseen) if unseen else None,
        "mean_share_not_streamed": statistics.fmean(unseen) if unseen else None,
    }


def by_strictness(items: Sequence[EvalInput], truth: Sequence[bool], threshold: float) -> dict[str, Any]:
    """:func:`judge_set` with a local judge of each strictness."""
    return {s: judge_set(LocalJudge(strictness=s), items, truth, threshold)  # type: ignore[arg-type]
            for s in STRICTNESS}


def run(data_dir: Path, threshold: float) -> dict[str, Any]:
    """Judge the data sets and gather the numbers the report prints."""
    judge = LocalJudge()
    report: dict[str, Any] = {"data": os.path.relpath(data_dir.resolve(), REPO), "threshold": threshold}

    fb = load(data_dir / "faithbench-dev")
    fb_items = [EvalInput(QUESTION, (s["source"],), s["summary"]) for s in fb]
    fb_truth = [hallucinated(s) for s in fb]
    detectors: dict[str, dict[str, float]] = {}
    for name in DETECTORS:
        pairs = [
            (float(s["metadata"][name]) < 0.5, t)
            for s, t in zip(fb, fb_truth, strict=True)
            if isinstance((s.get("metadata") or {}).get(name), int | float)
        ]
        if pairs:
            detectors[name] = rates([p for p, _ in pairs], [t for _, t in pairs])
    report["faithbench"] = {
        "samples": len(fb),
        "hallucinated": sum(fb_truth),
        "local": by_strictness(fb_items, fb_truth, threshold),
        "detectors_at_0.5": detectors,
        "earliness": earliness(judge, fb, threshold),
    }

    he_path = data_dir / "halueval-qa-dev" / "cases.jsonl"
    if he_path.is_file():
        he = load_halueval(he_path)
        he_items = [EvalInput(c["question"], tuple(c["contexts"]), c["answer"]) for c in he]
        he_truth = [bool(c["expect_alert"]) for c in he]
        report["halueval"] = {
            "samples": len(he),
            "hallucinated": sum(he_truth),
            "local": by_strictness(he_items, he_truth, threshold),
        }
    if HAND_CASES.is_file():
        items, truth = load_hand_cases(HAND_CASES)
        report["hand_written"] = {"samples": len(items), "hallucinated": sum(truth),
                                  "local": by_strictness(items, truth, threshold)}
    return report


def _row(name: str, r: dict[str, Any], threshold: float) -> str:
    return (f"{name:<24} {threshold:>9.2f} {r['balanced_accuracy']:>8.3f} {r['tpr']:>6.3f} "
            f"{1 - r['tnr']:>7.3f} {int(r['n']):>5}")


def _cascade_line(name: str, r: dict[str, Any]) -> str:
    c = r["cascade"]
    saved = 1 - c["escalated_texts"] / c["texts"] if c["texts"] else 0.0
    saved_confirm = 1 - c["escalated_texts_confirming_fails"] / c["texts"] if c["texts"] else 0.0
    return (f"  cascade at {name}: strong judge asked about {c['escalated_texts']}/{c['texts']} texts "
            f"({c['escalated_sentences']}/{c['sentences']} sentences): {100 * saved:.0f}% of its calls "
            f"saved; confirming fails too: {c['escalated_texts_confirming_fails']}/{c['texts']} texts "
            f"({100 * saved_confirm:.0f}% saved)")


def _set_table(title: str, block: dict[str, Any], t: float, extra: dict[str, Any] | None = None) -> None:
    head = f"{'detector':<24} {'threshold':>9} {'bal.acc':>8} {'catch':>6} {'f.alarm':>7} {'n':>5}"
    default = block["local"]["default"]
    print(f"{title}: {block['samples']} answers, {block['hallucinated']} hallucinated; "
          f"{default['skipped']} without checkable claims (scored as faithful)")
    print(head)
    print("-" * len(head))
    for strictness, r in block["local"].items():
        print(_row(f"local ({strictness})", r, t))
    for name, r in (extra or {}).items():
        print(_row(name, r, 0.5))
    for strictness, r in block["local"].items():
        print(_cascade_line(strictness, r))


def print_table(report: dict[str, Any]) -> None:
    """A human-readable table of :func:`run`'s report."""
    t = report["threshold"]
    fb = report["faithbench"]
    _set_table("FaithBench dev", fb, t, fb["detectors_at_0.5"])
    e = fb["earliness"]
    print(f"streamed sentence by sentence (default strictness): {e['caught_while_streaming']}/"
          f"{e['hallucinated_with_span']} hallucinated summaries alerted ({e['alert_before_span']} on a "
          f"sentence before the first Unwanted span)")
    if e["median_chars_after_onset"] is not None:
        print(f"  at the alert: median {e['median_chars_after_onset']:.0f} chars after the span's start, "
              f"median {100 * e['median_share_not_streamed']:.0f}% (mean "
              f"{100 * e['mean_share_not_streamed']:.0f}%) of the answer not yet streamed")
    for key, title in (("halueval", "HaluEval QA dev"), ("hand_written", "hand-written RAG cases")):
        if key in report:
            print()
            _set_table(title, report[key], t)


def main(argv: Sequence[str] | None = None) -> int:
    """Command-line entry point."""
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA,
                        help="directory holding faithbench-dev/ and halueval-qa-dev/")
    parser.add_argument("--threshold", type=float, default=DEFAULT_THRESHOLD,
                        help="faithfulness below this = hallucinated")
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
