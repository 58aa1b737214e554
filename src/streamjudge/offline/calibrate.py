"""Calibration: how often the guard cries wolf, and how much it catches, at each setting.

Per strictness (``lenient``, ``default``, ``strict``), every case is replayed through the real guard at
the configured threshold: the false-alarm rate is the share of the grounded cases (``expect_alert``
false) that alerted, the catch rate the share of the others that did. A judge whose sentences carry
three-way verdicts decides its alerts itself; the threshold matters for judges that give scores only.

The threshold sweep: every case is replayed once more with a threshold of 1.0, so each checkpoint that
is not perfect reports its score; a case fires at threshold ``t`` exactly when its lowest checkpoint
score is below ``t``. The sweep then costs nothing per threshold.
"""

from __future__ import annotations

import csv
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from streamjudge.config import STRICTNESS, Settings
from streamjudge.judging.base import Judge
from streamjudge.offline.replay import CaseResult, ReplayCase, replay

#: the CSV's columns, one row per threshold
CSV_COLUMNS: tuple[str, ...] = (
    "threshold", "tp", "fp", "fn", "tn", "precision", "recall", "specificity", "balanced_accuracy",
)


@dataclass(frozen=True, slots=True)
class ThresholdRow:
    """How the cases fare at one threshold."""

    threshold: float
    true_positives: int
    false_positives: int
    false_negatives: int
    true_negatives: int

    @property
    def recall(self) -> float | None:
        """Share of the cases expected to alert that did."""
        pos = self.true_positives + self.false_negatives
        return self.true_positives / pos if pos else None

    @property
    def precision(self) -> float | None:
        """Share of the alerts that were expected."""
        fired = self.true_positives + self.false_positives
        return self.true_positives / fired if fired else None

    @property
    def specificity(self) -> float | None:
        """Share of the cases expected to stay quiet that did."""
        neg = self.true_negatives + self.false_positives
        return self.true_negatives / neg if neg else None

    @property
    def balanced_accuracy(self) -> float | None:
        """Mean of recall and specificity (robust to unbalanced case sets)."""
        r, s = self.recall, self.specificity
        return None if r is None or s is None else (r + s) / 2


def lowest_scores(
    cases: Sequence[ReplayCase],
    settings: Settings,
    *,
    chunk_size: int = 8,
    concurrency: int = 1,
    on_result: Callable[[CaseResult], None] | None = None,
    judge: Judge | None = None,
    checkpoint_judge: Judge | None = None,
) -> list[float]:
    """Each case's lowest checkpoint faithfulness score (1.0 when every checkpoint was perfect)."""
    results = replay(
        cases, settings.replace(threshold=1.0, thresholds={}), chunk_size=chunk_size,
        concurrency=concurrency, on_result=on_result, judge=judge, checkpoint_judge=checkpoint_judge,
    )
    return [1.0 if r.min_failing_score is None else r.min_failing_score for r in results]


@dataclass(frozen=True, slots=True)
class StrictnessRow:
    """How the cases fare at one strictness, at the configured threshold."""

    strictness: str
    counts: ThresholdRow

    @property
    def false_alarm_rate(self) -> float | None:
        """Share of the grounded cases (expected to stay quiet) that alerted."""
        s = self.counts.specificity
        return None if s is None else 1.0 - s

    @property
    def catch_rate(self) -> float | None:
        """Share of the cases expected to alert that did."""
        return self.counts.recall


def by_strictness(
    cases: Sequence[ReplayCase],
    settings: Settings,
    *,
    chunk_size: int = 8,
    concurrency: int = 1,
    judges: Callable[[Settings], tuple[Judge | None, Judge | None]] | None = None,
    on_result: Callable[[CaseResult], None] | None = None,
) -> list[StrictnessRow]:
    """Replay ``cases`` once per strictness at ``settings.threshold`` and count the alerts. ``judges``
    builds the (final, checkpoint) judges for each strictness's settings (default: from the settings)."""
    expected = [bool(c.expect_alert) for c in cases]
    rows = []
    for strictness in STRICTNESS:
        st = settings.replace(strictness=strictness)
        final, checkpoint = judges(st) if judges is not None else (None, None)
        results = replay(cases, st, chunk_size=chunk_size, concurrency=concurrency, on_result=on_result,
                         judge=final, checkpoint_judge=checkpoint)
        tp = sum(r.fired and e for r, e in zip(results, expected, strict=True))
        fp = sum(r.fired and not e for r, e in zip(results, expected, strict=True))
        fn = sum(e and not r.fired for r, e in zip(results, expected, strict=True))
        rows.append(StrictnessRow(strictness, ThresholdRow(settings.threshold, tp, fp, fn,
                                                           len(cases) - tp - fp - fn)))
    return rows


def sweep(
    scores: Sequence[float], expected: Sequence[bool], thresholds: Sequence[float] | None = None
) -> list[ThresholdRow]:
    """The confusion counts at each threshold (default: 0, 1 and the midpoints between distinct scores,
    the thresholds that generalise best between two observed scores)."""
    if thresholds is None:
        distinct = sorted(set(scores))
        mids = [round((a + b) / 2, 4) for a, b in itertools.pairwise(distinct)]
        thresholds = sorted({0.0, 1.0, *mids})
    rows = []
    for t in thresholds:
        tp = fp = fn = tn = 0
        for s, exp in zip(scores, expected, strict=True):
            fired = s < t
            if fired and exp:
                tp += 1
            elif fired:
                fp += 1
            elif exp:
                fn += 1
            else:
                tn += 1
        rows.append(ThresholdRow(t, tp, fp, fn, tn))
    return rows


def best(rows: Sequence[ThresholdRow]) -> ThresholdRow | None:
    """The row with the highest balanced accuracy (ties: the lower threshold, which alerts less)."""
    scored = [r for r in rows if r.balanced_accuracy is not None]
    if not scored:
        return None
    return max(scored, key=lambda r: (r.balanced_accuracy or 0.0, -r.threshold))


def write_csv(rows: Sequence[ThresholdRow], path: str | Path) -> Path:
    """The sweep as CSV (:data:`CSV_COLUMNS`); empty cells where a rate is undefined."""
    out = Path(path)

    def cell(v: float | None) -> str:
        return "" if v is None else f"{v:.4f}"

    with out.open("w", newline="", encoding="utf-8") as fh:
        w = csv.writer(fh)
        w.writerow(CSV_COLUMNS)
        for r in rows:
            w.writerow([f"{r.threshold:.4f}", r.true_positives, r.false_positives, r.false_negatives,
                        r.true_negatives, cell(r.precision), cell(r.recall), cell(r.specificity),
                        cell(r.balanced_accuracy)])
    return out


def write_chart(
    rows: Sequence[ThresholdRow], path: str | Path, *, best_row: ThresholdRow | None = None,
    current: float | None = None,
) -> Path | None:
    """Precision, recall and balanced accuracy against the threshold as a PNG.

    Returns None (and writes nothing) when matplotlib is not installed: it is not a dependency.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")  # no display needed
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    xs = [r.threshold for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4), dpi=100)
    for label, values in (
        ("precision", [r.precision for r in rows]),
        ("recall", [r.recall for r in rows]),
        ("balanced accuracy", [r.balanced_accuracy for r in rows]),
    ):
        ax.plot(xs, [float("nan") if v is None else v for v in values], marker="o", label=label)
    if best_row is not None:
        ax.axvline(best_row.threshold, color="green", linestyle="--", label=f"best {best_row.threshold:.3f}")
    if current is not None:
        ax.axvline(current, color="grey", linestyle=":", label=f"current {current:.3f}")
    ax.set_xlabel("checkpoint threshold (alert when a score is below it)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("streamjudge calibrate")
    ax.legend(loc="best")
    ax.grid(alpha=0.3)
    out = Path(path)
    fig.tight_layout()
    fig.savefig(out)
    plt.close(fig)
    return out
