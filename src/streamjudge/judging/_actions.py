"""What a verdict means for the stream: which sentences to underline and why. Pure functions.

A checkpoint's verdict names its failing sentences (char ranges in the stream's text, a score and a reason
each); a judge that does not score sentences fails the whole judged range instead.
"""

from __future__ import annotations

from typing import Any

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


def passed_until(verdict: Verdict) -> int:
    """Where the judged range stops being good: its end when nothing failed, else the start of the first
    failing sentence (the sentences before it in the same request passed)."""
    starts = [
        s.start for sc in verdict.failed for s in (sc.sentences or ()) if s.label == "fail"
    ]
    if verdict.failed and not starts:
        return verdict.start
    return min(starts) if starts else verdict.end
