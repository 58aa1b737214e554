"""Threshold calibration: which checkpoint threshold separates the cases that should alert from the rest.

Every case is replayed once through the real guard with a threshold of 1.0, so each checkpoint that is not
perfect reports its score; a case fires at threshold ``t`` exactly when its lowest checkpoint score is below
``t``. The sweep then costs nothing per threshold.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from dataclasses import dataclass

from streamjudge.config import Settings
from streamjudge.offline.replay import ReplayCase, replay


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


def lowest_scores(cases: Sequence[ReplayCase], settings: Settings, *, chunk_size: int = 8) -> list[float]:
    """Each case's lowest checkpoint faithfulness score (1.0 when every checkpoint was perfect)."""
    results = replay(cases, settings.replace(threshold=1.0, thresholds={}), chunk_size=chunk_size)
    return [1.0 if r.min_failing_score is None else r.min_failing_score for r in results]


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
