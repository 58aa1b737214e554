"""The ``llm`` judge: any OpenAI-compatible endpoint or Anthropic, with our own prompts, no framework.

One model call per metric: faithfulness extracts the claims and judges each against the contexts in the
same JSON answer (ragas needs 2 calls for it, deepeval 4). The metrics of one evaluation run concurrently.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import Any, ClassVar, Literal

from streamjudge import semconv
from streamjudge._redact import redact
from streamjudge.config import JudgeLLMSettings, Settings, Strictness
from streamjudge.judging.base import (
    EvalInput,
    JudgeError,
    JudgeResult,
    Score,
    SentenceScore,
    TransientJudgeError,
)
from streamjudge.judging.judges import _prompts as P
from streamjudge.judging.judges._clients import ChatClient, make_chat_client, metering, parse_json_object
from streamjudge.results import SentenceVerdict
from streamjudge.sentences import Sentence, split_sentences

Tier = Literal["checkpoint", "final"]

_SUPPORTED = frozenset({"supported", "yes", "true", "1", "entailed"})
_NOT_SUPPORTED = frozenset({"unsupported", "contradicted", "no", "false", "0", "not_supported",
                            "not supported", "idk", "unknown"})
# a faithfulness verdict that says the model cannot decide: the sentence is uncertain, not failed
_CANNOT_TELL = frozenset({"cannot_tell", "cannot tell", "can't tell", "unsure", "uncertain", "idk",
                          "unknown", "not sure", "undetermined"})
_MAX_EXPLAINED = 3


def llm_settings_for(settings: Settings, tier: Tier) -> JudgeLLMSettings:
    """The judge-LLM settings of ``tier`` (checkpoint settings already fall back to the final ones)."""
    return settings.checkpoint_llm if tier == "checkpoint" else settings.eval_llm


def skip_reason(metric: str, item: EvalInput) -> str | None:
    """Why ``metric`` cannot be computed for ``item``, or ``None`` when it can."""
    needs_contexts = (semconv.FAITHFULNESS, semconv.CONTEXT_PRECISION, semconv.CONTEXT_RECALL)
    if metric in needs_contexts and not any(c.strip() for c in item.contexts):
        return "no_contexts"
    if metric in (semconv.FAITHFULNESS, semconv.ANSWER_RELEVANCY) and not item.answer.strip():
        return "no_answer"
    if metric in (semconv.ANSWER_RELEVANCY, semconv.CONTEXT_PRECISION) and not item.question.strip():
        return "no_question"
    if metric == semconv.CONTEXT_RECALL and not (item.reference or "").strip():
        return "no_reference"
    return None


def _bool(value: Any, field: str) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, int | float):
        return value >= 0.5
    if isinstance(value, str):
        v = value.strip().lower()
        if v in _SUPPORTED or v in ("relevant", "useful", "attributed"):
            return True
        if v in _NOT_SUPPORTED or v in ("irrelevant", "not relevant", "not useful"):
            return False
    raise JudgeError(f"judge LLM answer has an unusable {field!r} value: {value!r}")


def _items(data: dict[str, Any], key: str) -> list[dict[str, Any]]:
    items = data.get(key)
    if not isinstance(items, list) or not all(isinstance(i, dict) for i in items):
        raise JudgeError(
            f"judge LLM answer does not follow the schema: expected a list of objects under {key!r}, "
            f"got keys {sorted(data)[:8]}"
        )
    return items


def average_precision(useful: Sequence[bool]) -> float:
    """Rank-aware precision of the retrieved passages (same formula as ragas' context precision)."""
    hits = 0
    total = 0.0
    for i, u in enumerate(useful, 1):
        if u:
            hits += 1
            total += hits / i
    return total / hits if hits else 0.0


class LLMJudge:
    """LLM-as-judge over an OpenAI-compatible or Anthropic endpoint, with prompts fenced against injection.

    Build it with :meth:`from_settings` (``EVAL_*`` / ``EVAL_CHECKPOINT_*``) or pass any
    :class:`~streamjudge.judging.judges._clients.ChatClient`.
    """

    name = "llm"
    #: faithfulness names each failing sentence (see :class:`~streamjudge.judging.base.Judge`)
    scores_sentences = True

    def __init__(self, client: ChatClient, *, fence_factory: Callable[[], P.DataFence] = P.DataFence,
                 max_tokens: int = 1024, strictness: Strictness = "default") -> None:
        """``strictness``: whether a sentence the model cannot tell about alerts (``strict``) or not."""
        self.client = client
        self._fence_factory = fence_factory
        self._max_tokens = max_tokens
        self.strictness = strictness

    @classmethod
    def from_settings(cls, settings: Settings, tier: Tier = "final") -> LLMJudge:
        """A judge using the checkpoint or final judge-LLM settings."""
        return cls(make_chat_client(llm_settings_for(settings, tier)), strictness=settings.strictness)

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item`` on ``metrics``; one model call per computable metric, run concurrently."""
        wanted = list(dict.fromkeys(metrics))
        scores: dict[str, Score] = {}
        runs: dict[str, Any] = {}
        for metric in wanted:
            reason = skip_reason(metric, item)
            handler = self._handlers.get(metric)
            if handler is None:
                scores[metric] = Score(metric, None, skipped="unsupported_metric")
            elif reason:
                scores[metric] = Score(metric, None, skipped=reason)
            else:
                runs[metric] = handler
        with metering() as meter:
            results = await asyncio.gather(*(h(self, item) for h in runs.values()), return_exceptions=True)
        errors: list[JudgeError] = []
        for metric, res in zip(runs, results, strict=True):
            if isinstance(res, TransientJudgeError):
                raise res  # the pool retries the whole evaluation
            if isinstance(res, asyncio.CancelledError):
                raise res
            if isinstance(res, JudgeError):
                errors.append(res)
                scores[metric] = Score(metric, None, skipped=redact(f"judge_error: {res}")[:300])
            elif isinstance(res, BaseException):
                raise res
            else:
                scores[metric] = res
        if errors and len(errors) == len(runs):
            raise errors[0]
        return JudgeResult(self.name, tuple(scores[m] for m in wanted), meter.snapshot())

    async def aclose(self) -> None:
        """Close the client's connections."""
        await self.client.aclose()

    # --- metrics ---------------------------------------------------------------------------------

    async def _ask(self, system: str, user: str) -> dict[str, Any]:
        text = await self.client.complete(system, user, json_mode=True, max_tokens=self._max_tokens)
        return parse_json_object(text)

    async def _faithfulness(self, item: EvalInput) -> Score:
        fence = self._fence_factory()
        # numbered sentences, so each claim says which sentence it is about; the earlier answer text only
        # resolves references (a checkpoint's sentences are judged once, not the running total again)
        sentences = split_sentences(item.answer)
        numbered = "\n".join(f"[{i}] {s.text}" for i, s in enumerate(sentences, 1)) or item.answer
        prefix = fence.wrap(item.prefix, "earlier answer") if item.prefix.strip() else "(none)"
        system, user = P.build(P.FAITHFULNESS_SYSTEM, P.FAITHFULNESS_USER, fence,
                               contexts=P.fence_contexts(fence, item.contexts), prefix=prefix,
                               answer=fence.wrap(numbered, "answer"))
        claims = _items(await self._ask(system, user), "claims")
        if not claims:
            return Score(semconv.FAITHFULNESS, None, skipped="no_claims")
        classes = [_claim_class(c.get("verdict")) for c in claims]
        verdicts = [k == "supported" for k in classes]
        bad = [str(c.get("claim", ""))[:120] for c, ok in zip(claims, verdicts, strict=True) if not ok]
        explanation = f"{sum(verdicts)}/{len(verdicts)} claims supported"
        unsure = classes.count("uncertain")
        if unsure:
            explanation += f", {unsure} the model cannot tell"
        if bad:
            explanation += "; unsupported: " + P.short_json(bad[:_MAX_EXPLAINED])
        return Score(semconv.FAITHFULNESS, sum(verdicts) / len(verdicts), explanation=explanation,
                     sentences=_sentence_scores(sentences, claims, classes, self.strictness))

    async def _answer_relevancy(self, item: EvalInput) -> Score:
        fence = self._fence_factory()
        system, user = P.build(P.ANSWER_RELEVANCY_SYSTEM, P.ANSWER_RELEVANCY_USER, fence,
                               question=fence.wrap(item.question, "question"),
                               answer=fence.wrap(item.answer, "answer"))
        data = await self._ask(system, user)
        statements = _items(data, "statements")
        if data.get("noncommittal") is not None and _bool(data.get("noncommittal"), "noncommittal"):
            return Score(semconv.ANSWER_RELEVANCY, 0.0, explanation="noncommittal answer")
        if not statements:
            return Score(semconv.ANSWER_RELEVANCY, None, skipped="no_statements")
        rel = [_bool(s.get("relevant"), "relevant") for s in statements]
        return Score(semconv.ANSWER_RELEVANCY, sum(rel) / len(rel),
                     explanation=f"{sum(rel)}/{len(rel)} statements relevant")

    async def _context_precision(self, item: EvalInput) -> Score:
        fence = self._fence_factory()
        system, user = P.build(P.CONTEXT_PRECISION_SYSTEM, P.CONTEXT_PRECISION_USER, fence,
                               question=fence.wrap(item.question, "question"),
                               contexts=P.fence_contexts(fence, item.contexts))
        passages = _items(await self._ask(system, user), "passages")
        if len(passages) != len(item.contexts):
            raise JudgeError(f"judge LLM judged {len(passages)} passages, expected {len(item.contexts)}")
        try:
            ordered = sorted(passages, key=lambda p: int(p.get("index", 0)))
        except (TypeError, ValueError):
            ordered = passages
        useful = [_bool(p.get("useful"), "useful") for p in ordered]
        return Score(semconv.CONTEXT_PRECISION, average_precision(useful),
                     explanation=f"{sum(useful)}/{len(useful)} passages useful")

    async def _context_recall(self, item: EvalInput) -> Score:
        fence = self._fence_factory()
        system, user = P.build(P.CONTEXT_RECALL_SYSTEM, P.CONTEXT_RECALL_USER, fence,
                               question=fence.wrap(item.question, "question"),
                               contexts=P.fence_contexts(fence, item.contexts),
                               reference=fence.wrap(item.reference or "", "reference"))
        statements = _items(await self._ask(system, user), "statements")
        if not statements:
            return Score(semconv.CONTEXT_RECALL, None, skipped="no_statements")
        att = [_bool(s.get("attributed"), "attributed") for s in statements]
        return Score(semconv.CONTEXT_RECALL, sum(att) / len(att),
                     explanation=f"{sum(att)}/{len(att)} reference statements found in the contexts")

    _handlers: ClassVar[dict[str, Callable[[LLMJudge, EvalInput], Any]]] = {
        semconv.FAITHFULNESS: _faithfulness,
        semconv.ANSWER_RELEVANCY: _answer_relevancy,
        semconv.CONTEXT_PRECISION: _context_precision,
        semconv.CONTEXT_RECALL: _context_recall,
    }


def _claim_class(value: Any) -> SentenceVerdict:
    """A claim's verdict as one of the three sentence verdicts: "cannot tell" is ``uncertain``."""
    if isinstance(value, str) and value.strip().lower().replace("-", "_") in _CANNOT_TELL:
        return "uncertain"
    return "supported" if _bool(value, "verdict") else "fail"


def _sentence_scores(
    sentences: Sequence[Sentence], claims: Sequence[dict[str, Any]], classes: Sequence[SentenceVerdict],
    strictness: str = "default",
) -> tuple[SentenceScore, ...]:
    """Per numbered sentence: its supported claims over its claims, the unsupported ones as the reason,
    and its three-way verdict (the worst of its claims'; an uncertain one alerts only when strict).
    Claims without a usable sentence number count for the score but name no sentence."""
    per: dict[int, list[tuple[SentenceVerdict, str]]] = {}
    for claim, verdict in zip(claims, classes, strict=True):
        n = claim.get("sentence")
        if isinstance(n, str) and n.strip().isdigit():
            n = int(n)
        if isinstance(n, int) and not isinstance(n, bool) and 1 <= n <= len(sentences):
            why = str(claim.get("reason") or claim.get("claim") or "")[:160]
            per.setdefault(n, []).append((verdict, why))
    # the sentences decide the label only when every claim names its sentence: a claim that names none
    # still weighs in the score's value, which the threshold then labels
    decides = sum(len(marks) for marks in per.values()) == len(claims)
    out: list[SentenceScore] = []
    for n in sorted(per):
        marks = per[n]
        s = sentences[n - 1]
        reasons = "; ".join(why for v, why in marks if v != "supported" and why)
        kinds = {v for v, _ in marks}
        worst: SentenceVerdict = (
            "fail" if "fail" in kinds else "uncertain" if "uncertain" in kinds else "supported")
        value = sum(v == "supported" for v, _ in marks) / len(marks)
        alert = worst == "fail" or (worst == "uncertain" and strictness == "strict")
        out.append(SentenceScore(s.start, s.end, value, reasons, verdict=worst,
                                 alert=alert if decides else None, tier="llm",
                                 kind=None if worst == "supported" else "llm"))
    return tuple(out)
