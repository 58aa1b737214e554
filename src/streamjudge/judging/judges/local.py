"""The ``local`` judge: claim-level grounding without a network, a model, or randomness.

Faithfulness splits the judged text into sentences and each sentence into claims (clauses joined by
"and", "but" or ";" when each side carries its own facts) and checks each claim against the contexts:
named entities and numbers (with scale words, "1,000" == "1000", rounding to the written precision, and
the unit written after them: "5 mg" is not "5 g") stated in a context sentence the claim comes from (a
year is checked against the event it is said of, a name against the role it is given), month and day
names, content words (lowercased, lemma-like keys so inflections meet, small synonym groups; stopwords
and a tier of light words such as "called" or "several" left out) and negation against the best
matching context clause (a negation reaches the end of its clause; "no fewer than" is no negation; a
tie between a negated and a plain clause counts as a contradiction). Each sentence with at least one
checkable claim gets a :class:`SentenceScore` (supported claims / checkable claims, and a reason naming
what is unsupported); sentences of assistant filler ("Here is what I found.") or questions carry no
claim, are not listed and count neither way. The score is supported claims / checkable claims of the
whole judged text; a labelled score fails when any sentence does.

A checkpoint sends only its new sentences (``EvalInput.answer``) with the text before them
(``EvalInput.prefix``); only the new sentences are scored. A sentence that opens with a pronoun ("It was
completed in 1889.") is tied to the words of the first clause of the sentence before it (the prefix's
last sentence, for a checkpoint's first sentence): those words may connect the sentence's names and
numbers to the context sentence they come from, and are never themselves required to be in the contexts
(they were checked where they were stated). Context sentences that open with a pronoun are tied to the
first name of the sentence before them in the same way. Nothing else is resolved: a definite reference
("the tower") carries its own content word, which is checked like any other.

Context precision ranks the contexts by how much of the question's focus terms each holds and averages
precision over the ranks (the rank-weighted average precision of ragas' ContextPrecisionWithoutReference,
with term overlap in place of an LLM verdict). Answer relevancy is the share of the question's focus
terms the answer takes up, and 0 for a refusal. Context recall is the share of reference claims the
contexts support, with per-sentence scores of the reference.

Contexts are indexed once per contexts tuple (a small LRU; each context's analysis is shared between
tuples) and sentence verdicts are cached per index, so the final pass pays little for the sentences its
checkpoints judged: the local judges built from settings in one process (the checkpoint tier, the final
tier, a worker's) share one index cache.
"""

from __future__ import annotations

import asyncio
import functools
import re
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from streamjudge import semconv
from streamjudge._fork import after_fork_in_child
from streamjudge.config import NamesPolicy, Strictness
from streamjudge.judging.base import EvalInput, JudgeResult, Score, SentenceScore
from streamjudge.judging.judges._local_index import (
    CONTENT_COVERAGE,
    ClaimVerdict,
    ContextIndex,
    IndexCache,
    fact_keys,
)
from streamjudge.judging.judges._local_text import (
    PRONOUN_RE,
    Span,
    analyze,
    normalize,
    scopes,
    word_keys,
)
from streamjudge.sentences import split_units

# inputs larger than this are judged in a worker thread by ``evaluate`` so the pool's loop stays responsive
_THREAD_OFFLOAD_CHARS = 100_000
_MAX_LISTED = 3  # unsupported claims quoted in an explanation
_MAX_QUOTE = 160
_MAX_REASON = 200
# a sentence that opens with a pronoun is tied to the first clause of the sentence before it (the
# prefix's last sentence for a checkpoint's first sentence); only this much of the prefix is read
_PREFIX_TAIL = 400
# at most this many sentences back for the subject of a chain of pronoun sentences
_CHAIN_SENTENCES = 4

_REFUSAL_RE = re.compile(
    r"\b(?:i (?:do not|don't|cannot|can't|am unable to|'m unable to|am not able to|'m not able to)"
    r" (?:know|answer|help|find|say|tell|provide|determine|access)"
    r"|i(?: am|'m) sorry|as an ai\b"
    r"|no (?:relevant )?information (?:is |was )?(?:available|provided|given)"
    r"|(?:context|passage|documents?|sources?|text) (?:does|do) not (?:contain|mention|provide|say|include)"
    r"|not (?:mentioned|provided|specified|stated|covered) in the"
    r" (?:context|passage|documents?|sources?|text))",
    re.IGNORECASE,
)


class _SharedIndexes:
    """The index cache of the local judges built from settings in this process.

    The checkpoint and final tiers judge the same contexts: with a cache each, every context set was
    indexed twice (half of the judge's time with distinct contexts per stream) and the final pass found
    none of its checkpoints' sentence verdicts. The cache is bounded by chars as before, and cleared when
    the last judge using it closes.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._cache: IndexCache | None = None
        self._users = 0
        after_fork_in_child(self, _SharedIndexes._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # the cache re-initialises itself (see IndexCache)

    def acquire(self) -> IndexCache:
        with self._lock:
            if self._cache is None:
                self._cache = IndexCache()
            self._users += 1
            return self._cache

    def release(self) -> None:
        with self._lock:
            self._users -= 1
            if self._users <= 0 and self._cache is not None:
                self._cache.clear()
                self._cache = None
                self._users = 0


_SHARED = _SharedIndexes()


class LocalJudge:
    """Deterministic claim-level judge. Thread-safe; ``evaluate_sync`` is cheap enough for a hot path."""

    name = "local"
    #: faithfulness names each failing sentence (see :class:`~streamjudge.judging.base.Judge`)
    scores_sentences = True

    def __init__(
        self, *, index_cache_size: int = 512, claim_cache_size: int = 4096, shared: bool = False,
        strictness: Strictness = "default", names_absent: NamesPolicy | None = None,
    ) -> None:
        """``shared``: use the process's index cache (what :meth:`from_settings` builds) instead of one of
        this judge's own (whose size the other arguments set). ``strictness``: ``lenient`` fails only
        numbers, dates, units and flipped negations; ``default`` also names absent from the contexts and
        role swaps; ``strict`` alerts on uncertain sentences too. ``names_absent``: ``fail`` or
        ``uncertain`` (default: ``uncertain`` when lenient, else ``fail``)."""
        if strictness not in ("lenient", "default", "strict"):
            raise ValueError(f"strictness must be lenient, default or strict, not {strictness!r}")
        if names_absent is None:
            names_absent = "uncertain" if strictness == "lenient" else "fail"
        if names_absent not in ("fail", "uncertain"):
            raise ValueError(f"names_absent must be fail or uncertain, not {names_absent!r}")
        self._shared = shared
        self._open = True
        self._indexes = _SHARED.acquire() if shared else IndexCache(index_cache_size, claim_cache_size)
        self.policy = Policy(strictness, names_absent)

    @classmethod
    def from_settings(cls, settings: Any, tier: str = "final") -> LocalJudge:
        """Both tiers get the same deterministic judge (``strictness`` and ``names_absent`` from the
        settings) and one index cache, so the final pass reuses its checkpoints' context indexes and
        sentence verdicts."""
        del tier
        return cls(shared=True, strictness=getattr(settings, "strictness", "default"),
                   names_absent=getattr(settings, "names_absent", None))

    async def evaluate(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item`` on ``metrics``. Large inputs are judged off the event loop thread."""
        size = len(item.answer) + sum(len(c) for c in item.contexts) + len(item.reference or "")
        if size > _THREAD_OFFLOAD_CHARS:
            return await asyncio.to_thread(self.evaluate_sync, item, metrics)
        return self.evaluate_sync(item, metrics)

    def evaluate_sync(self, item: EvalInput, metrics: Sequence[str]) -> JudgeResult:
        """Score ``item`` on ``metrics`` inline. Never raises on odd input; unknown metrics are skipped."""
        scores: list[Score] = []
        for metric in metrics:
            fn = _METRICS.get(metric)
            if fn is None:
                scores.append(Score(metric, None, skipped="unsupported_metric"))
                continue
            try:
                scores.append(fn(self, item))
            except Exception as exc:  # a bug here must not take the guard down; it shows on the span
                scores.append(
                    Score(metric, None, explanation=f"{type(exc).__name__}: {exc}"[:300], skipped="error")
                )
        return JudgeResult(self.name, tuple(scores))

    async def aclose(self) -> None:
        """Drop the cached indexes (the shared cache once no judge uses it); nothing else to release."""
        if not self._shared:
            self._indexes.clear()
        elif self._open:
            _SHARED.release()
        self._open = False

    # --- metrics ----------------------------------------------------------------------------------

    def _index(self, contexts: tuple[str, ...]) -> ContextIndex:
        return self._indexes.get(tuple(contexts))

    def _faithfulness(self, item: EvalInput) -> Score:
        name = semconv.FAITHFULNESS
        if not item.answer or not item.answer.strip():
            return Score(name, None, skipped="empty_answer")
        if not _has_text(item.contexts):
            return Score(name, None, skipped="no_contexts")
        return _claims_score(name, self._index(item.contexts), item.answer, what="sentences",
                             prefix=item.prefix, policy=self.policy)

    def _context_recall(self, item: EvalInput) -> Score:
        name = semconv.CONTEXT_RECALL
        if item.reference is None or not item.reference.strip():
            return Score(name, None, skipped="no_reference")
        if not _has_text(item.contexts):
            return Score(name, None, skipped="no_contexts")
        return _claims_score(name, self._index(item.contexts), item.reference, what="reference sentences",
                             policy=self.policy)

    def _context_precision(self, item: EvalInput) -> Score:
        name = semconv.CONTEXT_PRECISION
        if not _has_text(item.contexts):
            return Score(name, None, skipped="no_contexts")
        if not item.question or not item.question.strip():
            return Score(name, None, skipped="empty_question")
        focus = fact_keys(analyze(normalize(item.question)))
        if not focus:
            return Score(name, None, skipped="no_question_terms")
        index = self._index(item.contexts)
        relevance = [len(focus & keys) / len(focus) for keys in index.context_keys]
        # rank-weighted average precision with graded relevance: a relevant context near the top
        # counts more than the same context further down
        num = 0.0
        running = 0.0
        for k, rel in enumerate(relevance, start=1):
            running += rel
            num += (running / k) * rel
        total = sum(relevance)
        value = num / total if total > 0 else 0.0
        shown = ", ".join(f"{r:.2f}" for r in relevance[:10])
        more = ", ..." if len(relevance) > 10 else ""
        return Score(name, _clamp(value), explanation=f"per-context relevance by rank: [{shown}{more}]")

    def _answer_relevancy(self, item: EvalInput) -> Score:
        name = semconv.ANSWER_RELEVANCY
        if not item.answer or not item.answer.strip():
            return Score(name, None, skipped="empty_answer")
        if not item.question or not item.question.strip():
            return Score(name, None, skipped="empty_question")
        answer = normalize(item.answer)
        if _REFUSAL_RE.search(answer[:2000]):
            return Score(name, 0.0, explanation="the answer is a refusal or says the sources lack it")
        focus = fact_keys(analyze(normalize(item.question)))
        if not focus:
            return Score(name, 1.0, explanation="no focus terms in the question; the answer is not a refusal")
        answer_keys = fact_keys(analyze(answer)) | _words_of(answer)
        hit = focus & answer_keys
        value = len(hit) / len(focus)
        missed = sorted(k.lstrip("#@") for k in focus - hit)
        expl = f"{len(hit)}/{len(focus)} question terms addressed"
        if missed:
            expl += f"; not addressed: {', '.join(missed[:8])}"
        return Score(name, _clamp(value), explanation=expl)


_METRICS = {
    semconv.FAITHFULNESS: LocalJudge._faithfulness,
    semconv.ANSWER_RELEVANCY: LocalJudge._answer_relevancy,
    semconv.CONTEXT_PRECISION: LocalJudge._context_precision,
    semconv.CONTEXT_RECALL: LocalJudge._context_recall,
}


@functools.lru_cache(maxsize=4096)
def _subject(sentence: str) -> frozenset[str]:
    """The words of the first clause of ``sentence`` (normalised): what a following "it" may stand for.
    They only tie the next sentence's names and numbers to context sentences (a pronoun leaves a claim
    with little to tie them to); they are never required to be in the context."""
    piece, start = scopes(sentence)[0]
    return fact_keys(analyze(piece, start))


def _chain(prefix: str) -> list[frozenset[str]]:
    """The subjects a pronoun at the start of the judged text may refer to, from the prefix's tail: its last
    sentence, and the ones before it while they open with a pronoun too."""
    if not prefix.strip():
        return []
    tail = split_units(normalize(prefix[-_PREFIX_TAIL:]))
    out: list[frozenset[str]] = []
    for sent in reversed(tail[-_CHAIN_SENTENCES:]):
        out.append(_subject(sent.text))
        if not PRONOUN_RE.match(sent.text):
            break
    return out


# a sentence's value by its verdict: what the average over sentences (the metric's value) is made of
_VALUES: dict[str, float] = {"supported": 1.0, "uncertain": 0.5, "fail": 0.0}
# content words the contexts lack weigh as a weak signal only when the claim's coverage is below
# CONTENT_COVERAGE and one of them is long enough to be specific (word length stands in for rarity:
# common words are short); below this coverage any missing words do
_RARE_LETTERS = 7
_RARE_LETTERS_STRICT = 5
# the most words a context heading glued to the front of a sentence is looked for in
_HEADING_WORDS = 10
_LOW_COVERAGE = 0.5


@dataclass(frozen=True, slots=True)
class Policy:
    """How evidence becomes a verdict: the strictness and what a name absent from the contexts is."""

    strictness: Strictness = "default"
    names_absent: NamesPolicy = "fail"

    def alerts(self, verdict: str) -> bool:
        """Whether a sentence with ``verdict`` alerts: fails always, uncertain ones when strict."""
        return verdict == "fail" or (verdict == "uncertain" and self.strictness == "strict")


def _evidence(verdict: ClaimVerdict, policy: Policy) -> list[tuple[str, str, str]]:
    """(class, kind, reason) of every piece of evidence against one claim, hard evidence first."""
    hard = "fail"
    # lenient: only what a reader checks at a glance fails (numbers, dates, units, a flipped negation)
    soft_hard = "uncertain" if policy.strictness == "lenient" else "fail"
    names = "fail" if policy.names_absent == "fail" else "uncertain"
    out: list[tuple[str, str, str]] = []
    if verdict.missing_numbers:
        out.append((hard, "number", "number not in context: " + ", ".join(verdict.missing_numbers[:6])))
    if verdict.missing_dates:
        out.append((hard, "date", "date not in context: " + ", ".join(verdict.missing_dates[:6])))
    if verdict.units:
        out.append((hard, "unit", "unit differs from the context: " + ", ".join(verdict.units[:4])))
    if verdict.negation_mismatch and not verdict.negation_tie:
        out.append((hard, "negation", "negation differs from the context"))
    if verdict.role_swaps:
        out.append((soft_hard, "role_swap", "role swap: " + "; ".join(verdict.role_swaps[:3])))
    if verdict.missing_names:
        out.append((names, "name", "name not in context: " + ", ".join(verdict.missing_names[:6])))
    if verdict.detached:
        out.append(("uncertain", "detached",
                    "said of something else in the context: " + ", ".join(verdict.detached[:4])))
    if verdict.negation_tie:
        out.append(("uncertain", "negation_tie", "negation tie: a negated and a plain context clause match"))
    words = verdict.missing_words
    # a shortfall of content words is a weak signal when it is large or a missing word is specific
    # (long); strict counts shorter words as specific
    rare = _RARE_LETTERS_STRICT if policy.strictness == "strict" else _RARE_LETTERS
    if words and verdict.coverage < CONTENT_COVERAGE and (
        verdict.coverage < _LOW_COVERAGE or any(len(w) >= rare for w in words)
    ):
        out.append(("uncertain", "words", "content words not in context: " + ", ".join(words[:8])))
    out.sort(key=lambda e: e[0] != "fail")
    return out


def _claims_score(name: str, index: ContextIndex, text: str, *, what: str, prefix: str = "",
                  policy: Policy = Policy()) -> Score:
    per_sentence: list[SentenceScore] = []
    listed: list[str] = []
    counts = {"supported": 0, "uncertain": 0, "fail": 0}
    # what a leading pronoun may stand for: the subjects of the sentences before it, back to the last one
    # that names its subject ("The tower is in Paris. It opened in 1889. It is 330 m tall.": the third "it"
    # is still the tower); read from the prefix for a checkpoint's first sentence
    chain: list[frozenset[str]] | None = None
    for unit in split_units(text):
        norm = _without_heading(normalize(unit.text), index)
        antecedent: frozenset[str] = frozenset()
        opens_with_pronoun = bool(PRONOUN_RE.match(norm))
        if opens_with_pronoun:
            if chain is None:
                chain = _chain(prefix)
            antecedent = frozenset().union(*chain)
        verdicts = index.verify_sentence(Span(norm, True, True), antecedent)
        subject = _subject(norm)
        chain = [*(chain or []), subject] if opens_with_pronoun else [subject]
        checkable = [v for _, v in verdicts if not v.filler]
        if not checkable:
            continue
        evidence = [e for v in checkable for e in _evidence(v, policy)]
        evidence.sort(key=lambda e: e[0] != "fail")
        verdict = evidence[0][0] if evidence else "supported"
        reason = "; ".join(dict.fromkeys(e[2] for e in evidence))
        if len(reason) > _MAX_REASON:
            reason = reason[: _MAX_REASON - 3] + "..."
        counts[verdict] += 1
        if evidence and len(listed) < _MAX_LISTED:
            quote = unit.text if len(unit.text) <= _MAX_QUOTE else unit.text[: _MAX_QUOTE - 3] + "..."
            listed.append(f'"{quote}" ({verdict}: {reason})')
        per_sentence.append(SentenceScore(
            unit.start, unit.end, _VALUES[verdict], reason, verdict=verdict,  # type: ignore[arg-type]
            alert=policy.alerts(verdict), tier="local", kind=evidence[0][1] if evidence else None,
        ))
    if not per_sentence:
        return Score(name, None, skipped="no_claims")
    value = sum(s.value for s in per_sentence) / len(per_sentence)
    head = f"{counts['fail']} of {len(per_sentence)} {what} unsupported, {counts['uncertain']} uncertain"
    if not listed:
        return Score(name, value, explanation=head, sentences=tuple(per_sentence))
    extra = counts["uncertain"] + counts["fail"] - len(listed)
    more = f"; and {extra} more" if extra > 0 else ""
    return Score(name, _clamp(value), explanation=f"{head}: {'; '.join(listed)}{more}",
                 sentences=tuple(per_sentence))


def _without_heading(sentence: str, index: ContextIndex) -> str:
    """``sentence`` without a context's heading glued to its front ("Refund Policy Customers may ..."): a
    heading is a label, not a claim, and would tie the sentence's names to the heading's line."""
    if not index.headings:
        return sentence
    words = sentence.split(" ", _HEADING_WORDS + 1)
    for k in range(min(len(words) - 1, _HEADING_WORDS), 0, -1):
        rest = words[k]
        if rest[:1].isupper() and " ".join(words[:k]).lower().rstrip(":") in index.headings:
            return sentence.split(" ", k)[k]
    return sentence


def _words_of(text: str) -> frozenset[str]:
    raw, keys = word_keys(text)
    return frozenset(raw | keys)


def _has_text(contexts: Sequence[str]) -> bool:
    return any(c and c.strip() for c in contexts)


def _clamp(v: float) -> float:
    return 0.0 if v < 0.0 else 1.0 if v > 1.0 else v
