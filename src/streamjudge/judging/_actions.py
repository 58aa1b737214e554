"""What a verdict means for the stream: which sentences to underline and why. Pure functions.

A checkpoint's verdict names its failing sentences (char ranges in the stream's text, a score and a reason
each); a judge that does not score sentences fails the whole judged range instead.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from opentelemetry.util.types import AttributeValue

from streamjudge import semconv
from streamjudge.results import Score, Verdict


def failing_sentences(verdict: Verdict, score: Score) -> list[dict[str, Any]]:
    """The sentences ``score`` fails, in the stream's coordinates, each with its score and reason."""
    out = [
        {"start": s.start, "end": s.end, "score": s.value, "reason": s.reason}
        for s in score.sentences
        if s.label == "fail"
    ]
    if not out:  # no per-sentence scores (or only the average failed): the judged range as a whole
        out.append({"start": verdict.start, "end": verdict.end, "score": score.value,
                    "reason": score.explanation})
    return out


def warning_data(verdict: Verdict, score: Score, threshold: float, action: str) -> dict[str, Any]:
    """The payload of a ``warning`` event for ``score`` of ``verdict``."""
    sentences = failing_sentences(verdict, score)
    return {
        "metric": score.name,
        "score": score.value,
        "threshold": threshold,
        "checkpoint": verdict.index,
        "char_start": min(s["start"] for s in sentences),
        "char_end": max(s["end"] for s in sentences),
        "sentences": sentences,
        "explanation": score.explanation,
        "action": action,
    }


_QUOTED = re.compile(r'"([^"]+)"|“([^”]+)”')


def withhold(data: dict[str, Any], text: str) -> str:
    """Hold-back: remove the failing sentences' text from a warning's explanation and reasons (a judge
    may quote what it could not support); returns the explanation the client may see."""
    failing = [text[s["start"]:s["end"]] for s in data["sentences"]]

    def clean(value: Any) -> Any:
        if not isinstance(value, str) or not value:
            return value
        for sentence in failing:
            if sentence:
                value = value.replace(sentence, "…")

        def quote(m: re.Match[str]) -> str:
            inner = m.group(1) or m.group(2)
            return '"…"' if any(inner.strip() and inner.strip() in f for f in failing) else m.group(0)

        return _QUOTED.sub(quote, value)

    data["explanation"] = clean(data["explanation"])
    for s in data["sentences"]:
        s["reason"] = clean(s["reason"])
    return str(data["explanation"] or "")


def passed_until(verdict: Verdict) -> int:
    """Where the judged range stops being good: its end when nothing failed, else the start of the first
    failing sentence (the sentences before it in the same request passed)."""
    starts = [
        s.start for sc in verdict.failed for s in (sc.sentences or ()) if s.label == "fail"
    ]
    if verdict.failed and not starts:
        return verdict.start
    return min(starts) if starts else verdict.end


@dataclass(frozen=True, slots=True)
class PreflightGate:
    """What the pre-flight verdict decides: attributes for the stream span, and the policy to apply
    (``""`` when the contexts passed, the gate is off, or no score came)."""

    attributes: dict[str, AttributeValue]
    policy: str = ""
    data: dict[str, Any] = field(default_factory=dict)


def preflight_gate(verdict: Verdict, threshold: float, action: str) -> PreflightGate:
    """Read the context-precision verdict of the pre-flight gate against ``threshold``."""
    result = verdict.outcome.result
    score = result.get(semconv.CONTEXT_PRECISION) if result else None
    if score is None or score.value is None:
        reason = (score.skipped if score else None) or verdict.outcome.error or verdict.status
        return PreflightGate({semconv.PREFLIGHT_LABEL: f"skipped:{reason}"})
    label = "pass" if score.value >= threshold else "fail"
    attributes: dict[str, AttributeValue] = {
        semconv.PREFLIGHT_SCORE: score.value,
        semconv.PREFLIGHT_LABEL: label,
    }
    if label == "pass" or action == "none":
        return PreflightGate(attributes)
    attributes[semconv.PREFLIGHT_POLICY] = action
    data = {
        "metric": semconv.CONTEXT_PRECISION,
        "score": score.value,
        "threshold": threshold,
        "stage": "preflight",
        "explanation": score.explanation,
        "action": action,
    }
    return PreflightGate(attributes, action, data)


class PassedPrefix:
    """How far the answer is judged good, contiguous from its start, from verdicts that may arrive out of
    order: a regeneration continues from here."""

    __slots__ = ("_ranges", "end")

    def __init__(self, start: int = 0) -> None:
        self.end = start
        self._ranges: dict[int, int] = {}  # passed ranges not yet contiguous with ``end``

    def mark(self, start: int, end: int) -> None:
        """``start``..``end`` passed."""
        if end <= start:
            return
        self._ranges[start] = end
        good = self.end
        while good in self._ranges:
            good = self._ranges.pop(good)
        self.end = good
