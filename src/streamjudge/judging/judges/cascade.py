"""The ``cascade`` judge: a cheap judge for every sentence, a strong one only where the cheap one is unsure.

The cheap judge (the local judge by default) gives every sentence a three-way verdict. The sentences it
marks ``uncertain`` (and, with ``confirm_fails``, the ones it fails, so that a stop or a regeneration
waits for a second opinion) go to the strong judge (``model``, ``llm`` or any other) in one call per
judged text: the sentences are sent together, each on a line of its own, with the text before the first
of them as the prefix that resolves references. The strong judge's verdict replaces the cheap one for
those sentences; every sentence records the tier that decided it (``SentenceScore.tier``). Everything
else (other metrics, the supported sentences) is the cheap judge's.

Settings: ``STREAMJUDGE_JUDGE=cascade`` (or ``STREAMJUDGE_CHECKPOINT_JUDGE=cascade``),
``STREAMJUDGE_CASCADE_JUDGE`` (the strong judge, default ``llm``), ``STREAMJUDGE_CASCADE_CONFIRM_FAILS``,
``STREAMJUDGE_STRICTNESS`` (whether an uncertain verdict alerts, for both tiers).

A strong judge that fails (an error, a timeout, a transient error after the cheap verdicts are known)
leaves the cheap verdicts in place and says so in the explanation: the sentences keep ``tier="local"``.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any

from streamjudge import semconv
from streamjudge.config import Strictness
from streamjudge.judging.base import EvalInput, Judge, JudgeResult, Score, SentenceScore
from streamjudge.results import SentenceVerdict

_log = logging.getLogger(__name__)

#: a sentence's value by its verdict, as the local judge gives it
_VALUES: dict[str, float] = {"supported": 1.0, "uncertain": 0.5, "fail": 0.0}
# a strong judge that gives no verdict of its own: its value decides, read with the model judge's band
# (below the lower bound: fail; from the upper one on: supported)
_BAND = (0.3, 0.5)


@dataclass
class CascadeStats:
    """What the cascade saved: judged texts and sentences seen, and how many went to the strong judge."""

    calls: int = 0
    escalated_calls: int = 0
    sentences: int = 0
    escalated_sentences: int = 0

    @property
    def calls_saved(self) -> float:
        """The share of strong-judge calls saved against sending every judged text to it."""
        return 1.0 - self.escalated_calls / self.calls if self.calls else 0.0

    @property
    def sentences_saved(self) -> float:
        """The share of sentences the strong judge never saw."""
        return 1.0 - self.escalated_sentences / self.sentences if self.sentences else 0.0


class CascadeJudge:
    """A :class:`~streamjudge.judging.base.Judge` over a cheap and a strong judge (see the module doc)."""

    name = "cascade"
    #: faithfulness names each failing sentence, as both tiers' do
    scores_sentences = True

    def __init__(self, cheap: Judge, strong: Judge, *, strictness: Strictness = "default",
                 confirm_fails: bool = False) -> None:
        """``cheap`` must give sentence verdicts (``SentenceScore.verdict``); ``strictness`` decides
        whether an uncertain verdict of the strong judge alerts; ``confirm_fails``: ask the strong judge
        about the cheap judge's fails too."""
        self.cheap = cheap
        self.strong = strong
        self.strictness = strictness
        self.confirm_fails = confirm_fails
        self.stats = CascadeStats()

    @classmethod
    def from_settings(cls, settings: Any, tier: str = "final") -> CascadeJudge:
        """The local judge as the cheap tier, ``settings.cascade_judge`` as the strong one."""
        from streamjudge.judging.judges import create_judge

        cheap = create_judge("local", settings, tier="checkpoint" if tier == "checkpoint" else "final")
        strong = create_judge(settings.cascade_judge, settings,
                              tier="checkpoint" if tier == "checkpoint" else "final")
        return cls(cheap, strong, strictness=settings.strictness,
                   confirm_fails=settings.cascade_confirm_fails)

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """The cheap judge's result, with the sentences it is unsure about decided by the strong judge."""
        first = await self.cheap.evaluate(item, metrics)
        scores = list(first.scores)
        usage = first.usage
        for i, score in enumerate(scores):
            if score.name != semconv.FAITHFULNESS or not score.sentences:
                continue
            self.stats.calls += 1
            self.stats.sentences += len(score.sentences)
            ask = [s for s in score.sentences if self._escalates(s)]
            if not ask:
                continue
            self.stats.escalated_calls += 1
            self.stats.escalated_sentences += len(ask)
            try:
                second = await self._ask_strong(item, ask)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # the cheap verdicts stand; the explanation says why
                _log.debug("cascade: the strong judge failed", exc_info=True)
                note = f"escalation to {self.strong.name} failed ({type(exc).__name__}): local verdicts kept"
                scores[i] = replace(score, explanation=f"{score.explanation}; {note}")
                continue
            usage = usage + second.usage
            strong_score = second.get(semconv.FAITHFULNESS)
            scores[i] = self._merge(score, ask, strong_score)
        return JudgeResult(self.name, tuple(scores), usage)

    async def aclose(self) -> None:
        """Close both tiers."""
        await asyncio.gather(self.cheap.aclose(), self.strong.aclose(), return_exceptions=True)

    # --- helpers ----------------------------------------------------------------------------------

    def _alerts(self, verdict: str) -> bool:
        return verdict == "fail" or (verdict == "uncertain" and self.strictness == "strict")

    def _escalates(self, s: SentenceScore) -> bool:
        return s.verdict == "uncertain" or (self.confirm_fails and s.verdict == "fail")

    async def _ask_strong(self, item: EvalInput, ask: Sequence[SentenceScore]) -> JudgeResult:
        """One call about the sentences of ``ask``, each on a line of its own."""
        text = "\n\n".join(item.answer[s.start : s.end] for s in ask)
        prefix = item.prefix + item.answer[: ask[0].start]
        # judged as a whole text: the sentences are complete (a checkpoint's judge may leave an
        # unterminated last sentence to the next checkpoint)
        sub = EvalInput(item.question, item.contexts, text, kind="answer", prefix=prefix[-2000:])
        return await self.strong.evaluate(sub, (semconv.FAITHFULNESS,))

    def _merge(self, score: Score, ask: Sequence[SentenceScore], strong: Score | None) -> Score:
        """``score`` with the sentences of ``ask`` decided by the strong judge's ``strong`` score."""
        if strong is None or strong.value is None:
            why = strong.skipped if strong is not None else "no faithfulness score"
            return replace(score, explanation=f"{score.explanation}; {self.strong.name} gave no verdict "
                           f"({why}): local verdicts kept")
        # where each asked sentence sits in the text the strong judge saw
        spans: list[tuple[int, int]] = []
        pos = 0
        for s in ask:
            spans.append((pos, pos + s.end - s.start))
            pos += s.end - s.start + 2
        decided: dict[int, SentenceScore] = {}
        for k, (s, (a, b)) in enumerate(zip(ask, spans, strict=True)):
            mine = [x for x in strong.sentences if x.start < b and x.end > a]
            if strong.sentences and not mine:
                decided[k] = s  # the strong judge said nothing about it: the local verdict stands
                continue
            verdict, value, reason = _strong_verdict(mine, strong)
            decided[k] = SentenceScore(
                s.start, s.end, value, f"{self.strong.name}: {reason or verdict}; local: {s.reason}"[:300],
                verdict=verdict, alert=self._alerts(verdict),
                tier=self.strong.name, kind=s.kind if verdict != "supported" else None,
            )
        by_range = {(s.start, s.end): decided[k] for k, s in enumerate(ask)}
        sentences = tuple(by_range.get((s.start, s.end), s) for s in score.sentences)
        value = sum(_VALUES.get(s.verdict or "", s.value) for s in sentences) / len(sentences)
        changed = sum(1 for s in ask if by_range[(s.start, s.end)].verdict != s.verdict)
        kept = sum(1 for s in ask if by_range[(s.start, s.end)] is s)
        note = (f"; {len(ask)} sentence(s) escalated to {self.strong.name}, {changed} verdict(s) changed"
                + (f", {kept} it said nothing about kept" if kept else ""))
        return replace(score, value=value, explanation=score.explanation + note, sentences=sentences)


def _strong_verdict(mine: Sequence[SentenceScore], whole: Score) -> tuple[SentenceVerdict, float, str]:
    """The strong judge's verdict on one asked sentence: its sentences' verdicts (the worst; a value
    without a verdict read with the model band), or (a judge without sentences) its whole score."""
    if mine:
        verdicts = [x.verdict or _band(x.value) for x in mine]
        worst: SentenceVerdict = ("fail" if "fail" in verdicts else "uncertain" if "uncertain" in verdicts
                                  else "supported")
        value = min(x.value for x in mine)
        return worst, value, "; ".join(x.reason for x in mine if x.reason)
    assert whole.value is not None
    return _band(whole.value), whole.value, whole.explanation[:160]


def _band(value: float) -> SentenceVerdict:
    low, high = _BAND
    return "fail" if value < low else "uncertain" if value < high else "supported"
