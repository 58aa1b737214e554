"""The searchable form of one set of contexts, and claim verification against it.

A :class:`ContextIndex` is built once per contexts tuple (the contexts are fixed for a whole stream) from
per-context analyses (:class:`ContextPart`, shared between tuples), keeps a bounded cache of claim
verdicts, and remembers for recent running texts the claim tally of their final sentences and where to
split on, so re-judging a growing running text costs only its new sentences.
"""

from __future__ import annotations

import bisect
import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

from streamjudge.judging.judges._local_text import (
    MONTHS,
    NUMBER_WORDS,
    START,
    Facts,
    Number,
    Resume,
    Span,
    analyze,
    claims_with_facts,
    normalize,
    sentences,
    split_from,
    term,
    word_keys,
)

# A claim is supported when all its hard facts (numbers, names, dates) occur in the contexts, its polarity
# agrees with the context sentence that matches it best, and at least this share of its other content
# words occur. 0.6 lets a paraphrase swap one word in three ("started" for "founded") and catches a claim
# whose content is mostly new. Fixed a priori; not fitted to a benchmark.
CONTENT_COVERAGE = 0.6
# the postings of very common terms say little about which sentence a claim comes from; skip them so
# sentence matching stays bounded on huge contexts
_MAX_POSTINGS = 64
_MAX_LOOKUP_TERMS = 8
#: unsupported claims a :class:`ClaimTally` keeps for an explanation (the first ones, in text order)
LISTED = 3
# Running texts are told apart by their first characters; each keeps its latest few split states (two
# answers may start alike). Texts longer than _MAX_RUN_CHARS are judged whole, never remembered.
_RUN_HEAD = 64
_RUN_STATES = 4
_MAX_RUNS = 64
_MAX_RUN_CHARS = 1 << 18


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    """Whether one claim is grounded in the contexts, and if not, what is missing."""

    supported: bool
    filler: bool  # no checkable content ("Here is what I found."): counted neither way
    missing: tuple[str, ...] = ()
    negation_mismatch: bool = False
    coverage: float = 1.0


# a question asserts nothing: like filler, it counts neither way
_QUESTION = ClaimVerdict(supported=True, filler=True)


@dataclass(frozen=True, slots=True)
class ClaimTally:
    """The claim verdicts of a text, summed: what a faithfulness score and its explanation need."""

    checked: int = 0
    supported: int = 0
    unsupported: int = 0
    listed: tuple[tuple[str, ClaimVerdict], ...] = ()  # the first LISTED unsupported claims

    def add(self, results: Sequence[tuple[tuple[str, ClaimVerdict], ...]]) -> ClaimTally:
        """This tally plus the claims of ``results`` (one entry per sentence), fillers left out."""
        checked, supported, unsupported = self.checked, self.supported, self.unsupported
        listed = list(self.listed)
        for sentence in results:
            for claim in sentence:
                verdict = claim[1]
                if verdict.filler:
                    continue
                checked += 1
                if verdict.supported:
                    supported += 1
                else:
                    unsupported += 1
                    if len(listed) < LISTED:
                        listed.append(claim)
        return ClaimTally(checked, supported, unsupported, tuple(listed))


@dataclass(frozen=True, slots=True)
class _Run:
    """How far a running text has been judged: its final sentences summed, and where to split on.

    ``pending`` is a final span that may still be dropped as "unfinished": a line without terminal
    punctuation is only counted at a checkpoint once anything follows it.
    """

    text: str
    resume: Resume
    tally: ClaimTally
    pending: Span | None


@dataclass(frozen=True, slots=True)
class ContextPart:
    """The analysis of one context, the same in every contexts tuple it appears in."""

    raw: frozenset[str]  # lowercase words
    keys: frozenset[str]  # comparison keys of the words
    values: tuple[float, ...]  # numbers of its sentences
    sentences: tuple[tuple[bool, frozenset[str]], ...]  # per sentence: negated, fact keys
    all_keys: frozenset[str]  # words, keys and fact keys: what context precision matches against

    @classmethod
    def of(cls, context: str) -> ContextPart:
        """Analyse one context."""
        text = normalize(context)
        raw, keys = word_keys(text)
        values: list[float] = []
        per_sentence: list[tuple[bool, frozenset[str]]] = []
        facts_keys: set[str] = set()
        for span in sentences(text):
            facts = analyze(span.text, sentence_start=span.sentence_start)
            values.extend(n.value for n in facts.numbers)
            s_keys = fact_keys(facts)
            facts_keys |= s_keys
            per_sentence.append((facts.negated, s_keys))
        return cls(
            frozenset(raw), frozenset(keys), tuple(values), tuple(per_sentence),
            frozenset(keys | raw | facts_keys),
        )


class PartCache:
    """A small thread-safe LRU of :class:`ContextPart` by context text, shared by the indexes of one
    judge: retrieval returns the same documents for many questions, and a tuple may repeat one."""

    def __init__(self, size: int = 128, max_chars: int = 1 << 16) -> None:
        self._size = size
        self._max_chars = max_chars  # huge contexts are analysed each time rather than pinned in memory
        self._lock = threading.Lock()
        self._data: OrderedDict[str, ContextPart] = OrderedDict()

    def get(self, context: str) -> ContextPart:
        """The analysis of ``context``, computed on first use."""
        if len(context) > self._max_chars:
            return ContextPart.of(context)
        with self._lock:
            part = self._data.get(context)
            if part is not None:
                self._data.move_to_end(context)
                return part
        part = ContextPart.of(context)
        with self._lock:
            self._data[context] = part
            if len(self._data) > self._size:
                self._data.popitem(last=False)
        return part


class ContextIndex:
    """Words, numbers and sentences of a contexts tuple, with a claim-verdict cache. Thread-safe."""

    def __init__(
        self, contexts: Sequence[str], *, claim_cache_size: int = 4096, parts: PartCache | None = None
    ) -> None:
        raw: set[str] = set()
        keys: set[str] = set()
        values: list[float] = []
        self.context_keys: list[frozenset[str]] = []
        self.sentence_negated: list[bool] = []
        postings: dict[str, list[int]] = {}
        seen: dict[str, ContextPart] = {}
        for ctx in contexts:
            part = seen.get(ctx)
            if part is None:
                part = seen[ctx] = parts.get(ctx) if parts is not None else ContextPart.of(ctx)
                raw |= part.raw  # a repeated context adds no words or numbers
                keys |= part.keys
                values.extend(part.values)
            for negated, s_keys in part.sentences:
                sid = len(self.sentence_negated)
                self.sentence_negated.append(negated)
                for k in s_keys:
                    plist = postings.setdefault(k, [])
                    if len(plist) <= _MAX_POSTINGS:
                        plist.append(sid)
            self.context_keys.append(part.all_keys)
        for w in raw:
            if w in NUMBER_WORDS:
                values.append(NUMBER_WORDS[w])
        self.raw_words = frozenset(raw)
        self.any_negated = any(self.sentence_negated)
        self.months = frozenset(w[:3] for w in raw if w in MONTHS)
        self.keys = frozenset(keys)
        self.numbers = sorted(set(values))
        self._postings = postings
        self._verdicts: OrderedDict[tuple[str, bool], tuple[tuple[str, ClaimVerdict], ...]] = OrderedDict()
        self._cache_size = claim_cache_size
        self._runs: OrderedDict[str, list[_Run]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def empty(self) -> bool:
        """True when the contexts hold no words or numbers at all."""
        return not self.keys and not self.numbers

    # --- facts ------------------------------------------------------------------------------------

    def has_number(self, n: Number) -> bool:
        """Whether a number equal to ``n`` (within its written precision) occurs in the contexts."""
        tol = max(n.tolerance, abs(n.value) * 1e-9)
        i = bisect.bisect_left(self.numbers, n.value - tol)
        return i < len(self.numbers) and self.numbers[i] <= n.value + tol

    def has_word(self, lower: str, key: str) -> bool:
        """Whether a word (lowercase form or comparison key) occurs in the contexts."""
        return lower in self.raw_words or key in self.keys

    # --- claims -----------------------------------------------------------------------------------

    def tally(self, text: str, *, drop_tail: bool) -> ClaimTally:
        """The claim verdicts of ``text`` (normalised), summed; ``drop_tail`` leaves out a last sentence
        that is not finished yet.

        A running text is re-judged at every checkpoint; when ``text`` extends one judged before, only
        what follows that text's last final sentence is split and judged again, so a checkpoint costs
        about its new sentences, not the whole prefix.
        """
        head = text[:_RUN_HEAD]
        run: _Run | None = None
        with self._lock:
            runs = self._runs.get(head)
            if runs is not None:
                self._runs.move_to_end(head)
                for r in runs:
                    if text.startswith(r.text) and (run is None or len(r.text) > len(run.text)):
                        run = r
        split = split_from(text, run.resume) if run is not None else None
        if split is None:
            run = None
            split = split_from(text, START)
            assert split is not None  # a split from the start always succeeds
        spans, stable, resume = split
        base = run.tally if run is not None else ClaimTally()
        if run is not None and run.pending is not None:
            spans.insert(0, run.pending)
            stable += 1
        results = [self.verify_sentence(span) for span in spans]
        # the last final span waits while nothing follows it: it may be an unfinished last line
        if stable and not spans[stable - 1].terminated:
            settled, pending = base.add(results[: stable - 1]), spans[stable - 1]
        else:
            settled, pending = base.add(results[:stable]), None
        if len(text) <= _MAX_RUN_CHARS:
            self._remember(head, run, _Run(text, resume, settled, pending))
        if drop_tail and spans and not spans[-1].terminated:
            results.pop()
        # every span but the last counts as finished (see ``sentences``), so the rest adds up as it is
        return base.add(results)

    def _remember(self, head: str, old: _Run | None, new: _Run) -> None:
        with self._lock:
            runs = self._runs.get(head)
            if runs is None:
                runs = self._runs[head] = []
                if len(self._runs) > _MAX_RUNS:
                    self._runs.popitem(last=False)
            # a stream only grows: its shorter state is not needed again
            runs[:] = [r for r in runs if r is not old]
            runs.insert(0, new)
            del runs[_RUN_STATES:]

    def verify_sentence(self, span: Span) -> tuple[tuple[str, ClaimVerdict], ...]:
        """The claims of one sentence with their verdicts, from the cache when the sentence was judged
        before (a running text repeats all earlier sentences at every checkpoint). Questions and filler
        come back with ``filler=True``."""
        cache_key = (span.text, span.sentence_start)
        with self._lock:
            hit = self._verdicts.get(cache_key)
            if hit is not None:
                self._verdicts.move_to_end(cache_key)
                return hit
        result = tuple(
            (c.text, _QUESTION if c.text.endswith("?") else self._verify(
                facts if facts is not None else analyze(c.text, c.sentence_start)))
            for c, facts in claims_with_facts(span)
        )
        with self._lock:
            self._verdicts[cache_key] = result
            if len(self._verdicts) > self._cache_size:
                self._verdicts.popitem(last=False)
        return result

    def _verify(self, facts: Facts) -> ClaimVerdict:
        if facts.meta_only:
            return ClaimVerdict(supported=True, filler=True)
        missing: list[str] = []
        hard_miss = False
        for surface, tokens in facts.entities:
            if not all(self.has_word(t, term(t)) for t in tokens):
                missing.append(surface)
                hard_miss = True
        for n in facts.numbers:
            if not self.has_number(n):
                missing.append(n.surface)
                hard_miss = True
        for short, surface in facts.dates:
            if short not in self.months:
                missing.append(surface)
                hard_miss = True
        found = 0
        for key, surface in facts.terms:
            if key in self.keys or surface.lower() in self.raw_words:
                found += 1
            else:
                missing.append(surface)
        coverage = found / len(facts.terms) if facts.terms else 1.0
        negation_mismatch = self._negation_mismatch(facts)
        supported = not hard_miss and not negation_mismatch and coverage >= CONTENT_COVERAGE
        return ClaimVerdict(
            supported=supported,
            filler=False,
            missing=tuple(dict.fromkeys(missing)),
            negation_mismatch=negation_mismatch,
            coverage=coverage,
        )

    def _negation_mismatch(self, facts: Facts) -> bool:
        """True when the context sentences that best match the claim have the opposite polarity.

        Only claims that clearly come from one context sentence (half their facts, at least two) are
        checked: "was not founded" against "was founded" is a contradiction, a loosely related negative
        sentence elsewhere is not.
        """
        if not facts.negated and not self.any_negated:
            return False
        claim_keys = fact_keys(facts)
        if len(claim_keys) < 2:
            return False
        # the rarest terms point at the sentences a claim most likely comes from; the overlap is counted
        # on them only, which keeps the cost per claim bounded on huge or repetitive contexts
        ranked = sorted(
            (k for k in claim_keys if k in self._postings),
            key=lambda k: (len(self._postings[k]), k),
        )[:_MAX_LOOKUP_TERMS]
        counts: dict[int, int] = {}
        for k in ranked:
            for sid in self._postings[k]:
                counts[sid] = counts.get(sid, 0) + 1
        best_same = best_opp = 0
        negated = self.sentence_negated
        for sid, overlap in counts.items():
            if negated[sid] == facts.negated:
                if overlap > best_same:
                    best_same = overlap
            elif overlap > best_opp:
                best_opp = overlap
        needed = max(2, (min(len(claim_keys), _MAX_LOOKUP_TERMS) + 1) // 2)
        return best_opp >= needed and best_opp > best_same


def fact_keys(facts: Facts) -> frozenset[str]:
    """Comparable keys of a text's facts: content-word keys, names' words, ``#number``, ``@month``."""
    keys = {k for k, _ in facts.terms}
    keys.update(f"#{n.value:g}" for n in facts.numbers)
    keys.update(t for _, tokens in facts.entities for t in tokens)
    keys.update(f"@{short}" for short, _ in facts.dates)
    return frozenset(keys)


class IndexCache:
    """A small thread-safe LRU of :class:`ContextIndex` by contexts tuple."""

    def __init__(self, size: int = 32, claim_cache_size: int = 4096) -> None:
        self._size = max(1, size)
        self._claim_cache_size = claim_cache_size
        self._parts = PartCache(max(8, 4 * self._size))
        self._lock = threading.Lock()
        self._data: OrderedDict[tuple[str, ...], ContextIndex] = OrderedDict()

    def get(self, contexts: tuple[str, ...]) -> ContextIndex:
        """The index of ``contexts``, built on first use."""
        with self._lock:
            idx = self._data.get(contexts)
            if idx is not None:
                self._data.move_to_end(contexts)
                return idx
        # built outside the lock: a 1 MB context must not stall other streams' lookups
        idx = ContextIndex(contexts, claim_cache_size=self._claim_cache_size, parts=self._parts)
        with self._lock:
            existing = self._data.get(contexts)
            if existing is not None:
                return existing
            self._data[contexts] = idx
            if len(self._data) > self._size:
                self._data.popitem(last=False)
        return idx

    def clear(self) -> None:
        """Forget every index (and with them all cached claim verdicts and context analyses)."""
        with self._lock:
            self._data.clear()
            self._parts = PartCache(max(8, 4 * self._size))

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
