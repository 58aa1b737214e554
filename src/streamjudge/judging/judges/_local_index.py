"""The searchable form of one set of contexts, and claim verification against it.

A :class:`ContextIndex` is built once per contexts tuple (the contexts are fixed for a whole stream) from
per-context analyses (:class:`ContextPart`, shared between tuples) and keeps a bounded cache of sentence
verdicts: the final pass re-judges the sentences the checkpoints judged, and those come from the cache.

Context sentences are cut into clauses (at ";", "but", "while"...): a negation reaches the end of its
clause, not the end of the sentence, and a claim is compared with the clause that matches it best.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections import OrderedDict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from streamjudge._fork import after_fork_in_child
from streamjudge.judging.judges._local_text import (
    MONTHS,
    NUMBER_WORDS,
    PRONOUN_RE,
    TITLES,
    UNITS,
    Facts,
    Number,
    Span,
    analyze,
    claims_with_facts,
    normalize,
    scopes,
    term,
    word_keys,
)
from streamjudge.sentences import split_units

# A claim is supported when all its hard facts (numbers, names, dates) occur in the contexts, each number
# and date in a context sentence that shares a word with the claim, its polarity agrees with the context
# clause that matches it best, and at least this share of its other content words occur. 0.6 lets a
# paraphrase swap one word in three ("started" for "founded") and catches a claim whose content is mostly
# new. Fixed a priori; not fitted to a benchmark.
CONTENT_COVERAGE = 0.7
# the postings of very common terms say little about which clause a claim comes from; skip them so
# clause matching stays bounded on huge contexts
_MAX_POSTINGS = 64
_MAX_LOOKUP_TERMS = 8
# context sentences a number or month is looked up in when checking what it is said of
_MAX_ATTACH = 64
_SMALL_COUNT = 12
# context sentences a number may be stated in for a role swap to be read from them
_MAX_SWAP_SENTENCES = 8
# how far a hedged number ("about 300") may be from the contexts' (a share of it; "over"/"under": 3 times
# as far, on their side)
_HEDGE_BAND = 0.1
_GLUED_RE = re.compile(r"(?<=[a-z0-9)\]\"'])\.(?=[A-Z][a-z])")


@dataclass(frozen=True, slots=True)
class ClaimVerdict:
    """Whether one claim is grounded in the contexts, and if not, what is missing."""

    supported: bool
    filler: bool  # no checkable content ("Here is what I found."): counted neither way
    missing: tuple[str, ...] = ()
    negation_mismatch: bool = False
    coverage: float = 1.0
    detached: tuple[str, ...] = ()  # names/numbers the contexts state, but of something else
    units: tuple[str, ...] = ()  # numbers the contexts state with another unit ("5 mg" for "5 g")
    # the evidence by kind: hard (numbers, month/day names, names, role swaps, a negation flip) and weak
    missing_numbers: tuple[str, ...] = ()
    missing_dates: tuple[str, ...] = ()
    missing_names: tuple[str, ...] = ()
    missing_words: tuple[str, ...] = ()  # content words (and small counts in words) the contexts lack
    role_swaps: tuple[str, ...] = ()  # "2012 is said of Leeds"
    negation_tie: bool = False  # a negated and a plain context clause match the claim equally well


# a question asserts nothing: like filler, it counts neither way
_QUESTION = ClaimVerdict(supported=True, filler=True)


@dataclass(frozen=True, slots=True)
class _Clause:
    negated: bool
    keys: frozenset[str]
    values: tuple[float, ...]
    units: tuple[str | None, ...]  # the unit written after each value


@dataclass(frozen=True, slots=True)
class _Segment:
    """A piece of a context sentence between commas, ";" and coordinating words: what one number or name
    in it is said of ("opened the Leeds office in 2012 | and the York office in 2016")."""

    sentence: int  # the sentence's position in its context
    keys: frozenset[str]  # fact keys without numbers
    values: tuple[tuple[float, str | None], ...]  # numbers with their units
    names: tuple[tuple[frozenset[str], str], ...]  # (keys, surface) of its names
    terms: tuple[tuple[str, str], ...]  # (key, surface) of its content words


@dataclass(frozen=True, slots=True)
class ContextPart:
    """The analysis of one context, the same in every contexts tuple it appears in."""

    raw: frozenset[str]  # lowercase words
    keys: frozenset[str]  # comparison keys of the words
    # per sentence, its clauses and the words of the sentence before when it opens with a pronoun
    sentences: tuple[tuple[tuple[_Clause, ...], frozenset[str]], ...]
    all_keys: frozenset[str]  # words, keys and fact keys: what context precision matches against
    texts: tuple[str, ...] = ()  # each sentence's text: its segments are analysed when a claim asks
    # capitalised words and the initials of capitalised runs: what an answer's name or acronym may be
    # another form of ("NASA", "French" for "France")
    capitalised: frozenset[str] = frozenset()
    headings: frozenset[str] = frozenset()  # lowercase lines that stand alone without final punctuation
    # numbers the text states in a form the tokenizer does not read as one: the end of a year range
    # written short or long ("2007-11" states 2011, "2007-2011" states 11), a number word inside a
    # hyphenated word ("three-year")
    extra_values: frozenset[float] = frozenset()
    tallies: bool = False  # states a tally such as a score ("4-1")
    years: frozenset[float] = frozenset()  # numbers written as years ("1998", not "1,998")

    @classmethod
    def of(cls, context: str) -> ContextPart:
        """Analyse one context."""
        # documents joined without a blank ("...in 2004.Jesus Camp is...") still end a sentence there
        text = _GLUED_RE.sub(". ", normalize(context))
        raw, keys = word_keys(text)
        per_sentence: list[tuple[tuple[_Clause, ...], frozenset[str]]] = []
        texts: list[str] = []
        facts_keys: set[str] = set()
        before: frozenset[str] = frozenset()  # the first name of the sentence before
        headings: set[str] = set()
        for unit in split_units(text):
            span = Span(unit.text, unit.text[-1] in _TERMINAL, True)
            if not span.terminated and len(unit.text.split()) <= _HEADING_WORDS:
                headings.add(unit.text.lower())
            clauses = []
            subject: frozenset[str] = frozenset()
            for piece, start in scopes(span.text, span.sentence_start):
                facts = analyze(piece, sentence_start=start)
                c_keys = fact_keys(facts)
                facts_keys |= c_keys
                clauses.append(_Clause(facts.negated, c_keys, tuple(n.value for n in facts.numbers),
                                       tuple(n.unit for n in facts.numbers)))
                if not subject and facts.entities:
                    tokens = facts.entities[0][1]
                    subject = frozenset((*tokens, *map(term, tokens)))
            # "The tower is in Paris. It was completed in 1889.": the second sentence is about the tower;
            # so is "The tower is 330 metres tall." after "The Eiffel Tower is in Paris." (a definite
            # description by a word of the name before)
            refers = PRONOUN_RE.match(span.text) is not None or _refers_back(span.text, before)
            carried = before if refers else frozenset()
            # role swaps are read from segments that state numbers: only such sentences keep their text
            texts.append(span.text if any(c.values for c in clauses) else "")
            per_sentence.append((tuple(clauses), carried))
            before = subject or carried
        return cls(frozenset(raw), frozenset(keys), tuple(per_sentence), frozenset(keys | raw | facts_keys),
                   tuple(texts), _capitalised(text), frozenset(headings), _extra_values(text, raw),
                   _TALLY_RE.search(text) is not None,
                   frozenset(float(m.group()) for m in _YEAR_RE.finditer(text)))


_TERMINAL = frozenset(".!?\u3002\uff01\uff1f\u2026")
_HEADING_WORDS = 10
# a comma between a day and a year ("June 28, 2013") does not end a segment
_SEGMENT_RE = re.compile(r"\s*[;:]\s*|(?<!\d)\s*,\s*|\s+(?:and|but|while|whereas|or)\s+", re.IGNORECASE)


def _segments(text: str, sentence: int) -> tuple[_Segment, ...]:
    """The segments of one context sentence that state a number: what a role swap is read from."""
    out: list[_Segment] = []
    start = 0
    bounds = [m.span() for m in _SEGMENT_RE.finditer(text)]
    for a, b in [*bounds, (len(text), len(text))]:
        piece = text[start:a]
        if piece.strip():
            facts = analyze(piece, sentence_start=start == 0)
            if not facts.numbers:
                start = b
                continue
            keys = frozenset(k for k in fact_keys(facts) if not k.startswith("#"))
            names = tuple((frozenset((*toks, *map(term, toks))), surface) for surface, toks in facts.entities)
            out.append(_Segment(sentence, keys, tuple((n.value, n.unit) for n in facts.numbers), names,
                                facts.terms))
        start = b
    return tuple(out)


_YEAR_RE = re.compile(r"(?<![\d,.])(?:1\d{3}|20\d\d)(?![\d,.]\d|\d)")
_TALLY_RE = re.compile(r"(?<![\d.,])\d{1,2} ?[-\u2013\u2014] ?\d{1,2}(?![\d.,]\d)")
_YEAR_RANGE_RE = re.compile(r"\b(1[0-9]|20)(\d\d)\s*(?:-{1,2}|\u2013|\u2014|to)\s*((?:1[0-9]|20)?)(\d\d)\b")


def _extra_values(text: str, raw: set[str]) -> frozenset[float]:
    out: set[float] = set()
    for m in _YEAR_RANGE_RE.finditer(text):
        century, end = m.group(1), m.group(4)
        out.add(float(end))
        out.add(float((m.group(3) or century) + end))
    for w in raw:
        if "-" in w:
            out.update(float(NUMBER_WORDS[p]) for p in w.split("-") if p in NUMBER_WORDS)
    return frozenset(out)


_CAPITAL_RUN_RE = re.compile(r"(?:\b[A-Z][\w'-]*(?:\s+(?:of|the|and|for|de|du|von|van)\b)*\s*)+")


def _capitalised(text: str) -> frozenset[str]:
    """Lowercase capitalised words of ``text`` and the initials of its capitalised runs ("nasa" for
    "National Aeronautics and Space Administration", with or without the small words)."""
    out: set[str] = set()
    for m in _CAPITAL_RUN_RE.finditer(text):
        words = m.group().split()
        caps = [w for w in words if w[:1].isupper()]
        out.update(w.lower().removesuffix("'s") for w in caps)
        # with and without the small words, and without a first word that may only start the sentence
        for k in (0, 1):
            if len(caps) - k >= 2:
                out.add("".join(w[0] for w in caps[k:]).lower())
                out.add("".join(w[0] for w in words[k:] if w[:1].isalpha()).lower())
    return frozenset(out)


_DEFINITE_RE = re.compile(r"the\s+([^\W\d_]+)\b", re.IGNORECASE)


def _refers_back(sentence: str, before: frozenset[str]) -> bool:
    """Whether ``sentence`` opens with "the <word>" where the word belongs to the name ``before``."""
    if not before:
        return False
    m = _DEFINITE_RE.match(sentence)
    if m is None:
        return False
    word = m.group(1)
    return any(w in before for w in (word, word.lower(), word.capitalize(), term(word.lower())))


class PartCache:
    """A small thread-safe LRU of :class:`ContextPart` by context text, shared by the indexes of one
    judge: retrieval returns the same documents for many questions, and a tuple may repeat one."""

    def __init__(self, size: int = 128, max_chars: int = 1 << 16, total_chars: int = 256_000) -> None:
        self._size = size
        self._max_chars = max_chars  # huge contexts are analysed each time rather than pinned in memory
        self._total = total_chars  # and all of them together are bounded by size, not only by count
        self._chars = 0
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
            if context in self._data:
                return self._data[context]
            self._data[context] = part
            self._chars += len(context)
            while len(self._data) > self._size or self._chars > self._total:
                old, _ = self._data.popitem(last=False)
                self._chars -= len(old)
        return part


class ContextIndex:
    """Words, numbers, sentences and clauses of a contexts tuple, with a verdict cache. Thread-safe."""

    def __init__(
        self, contexts: Sequence[str], *, claim_cache_size: int = 4096, parts: PartCache | None = None
    ) -> None:
        raw: set[str] = set()
        keys: set[str] = set()
        self.context_keys: list[frozenset[str]] = []
        self.clause_negated: list[bool] = []
        self.clause_sentence: list[int] = []
        self.sentence_keys: list[frozenset[str]] = []
        postings: dict[str, list[int]] = {}
        value_sentences: dict[float, list[int]] = {}
        value_units: dict[float, set[str | None]] = {}
        carried: dict[str, list[int]] = {}  # sentences a word is carried into by a leading pronoun
        seen: dict[str, ContextPart] = {}
        added: set[str] = set()
        capitalised: set[str] = set()
        tallies = False
        years: set[float] = set()
        extra_values: set[float] = set()
        headings: set[str] = set()
        self._texts: list[str] = []
        for ctx in contexts:
            part = seen.get(ctx)
            if part is None:
                part = seen[ctx] = parts.get(ctx) if parts is not None else ContextPart.of(ctx)
                raw |= part.raw
                keys |= part.keys
            self.context_keys.append(part.all_keys)
            if ctx in added:
                continue  # a repeated context adds no sentence a claim could come from
            added.add(ctx)
            capitalised |= part.capitalised
            tallies = tallies or part.tallies
            years |= part.years
            extra_values |= part.extra_values
            headings |= part.headings
            self._texts.extend(part.texts)
            for clauses, antecedent in part.sentences:
                sent = len(self.sentence_keys)
                s_keys: set[str] = set(antecedent)
                for k in antecedent:
                    alist = carried.setdefault(k, [])
                    if len(alist) <= _MAX_POSTINGS:
                        alist.append(sent)
                for clause in clauses:
                    cid = len(self.clause_negated)
                    self.clause_negated.append(clause.negated)
                    self.clause_sentence.append(sent)
                    s_keys |= clause.keys
                    for k in clause.keys:
                        plist = postings.setdefault(k, [])
                        if len(plist) <= _MAX_POSTINGS:
                            plist.append(cid)
                    for v, unit in zip(clause.values, clause.units, strict=True):
                        value_units.setdefault(v, set()).add(unit)
                        vlist = value_sentences.setdefault(v, [])
                        if len(vlist) <= _MAX_ATTACH and (not vlist or vlist[-1] != sent):
                            vlist.append(sent)
                self.sentence_keys.append(frozenset(s_keys))
        values = set(value_sentences) | extra_values
        for w in raw:
            if w in NUMBER_WORDS:
                values.add(NUMBER_WORDS[w])
        self.raw_words = frozenset(raw)
        # whether the contexts state a tally themselves ("4-1"): then a claim's other tally contradicts
        # them; without one, a tally is the claim's own count of what the contexts narrate
        self.tallies = tallies
        self.years = frozenset(years)
        self.any_negated = any(self.clause_negated)
        self.months = frozenset(w[:3] for w in raw if w in MONTHS)
        self.keys = frozenset(keys)
        self.numbers = sorted(values)
        self._value_sentences = value_sentences
        self._carried = carried
        self._value_units = value_units
        self._postings = postings
        self._roles = _Roles(self._texts, value_sentences, postings, self.clause_sentence, self.sentence_keys)
        self.capitalised = frozenset(capitalised)
        self._forms = _NameForms(self.raw_words, self.keys, self.capitalised)
        self.headings = frozenset(headings)
        self._verdicts: OrderedDict[
            tuple[str, bool, frozenset[str]], tuple[tuple[str, ClaimVerdict], ...]
        ] = OrderedDict()
        self._cache_size = claim_cache_size
        self._lock = threading.Lock()

    @property
    def empty(self) -> bool:
        """True when the contexts hold no words or numbers at all."""
        return not self.keys and not self.numbers

    # --- facts ------------------------------------------------------------------------------------

    def _matching_values(self, n: Number) -> list[float]:
        tol = max(n.tolerance, abs(n.value) * 1e-9)
        lo, hi = n.value - tol, n.value + tol
        if n.hedge is not None and not (n.unit is None and len(n.surface) == 4 and n.surface.isdigit()
                                        and _is_year(n.value)):
            # "about 300" is said of 312, "more than 1,000" of 1,247, "up to 30" of 28: a hedged number
            # matches the contexts' within a band, never a year ("around 1990" is no range of years)
            span = abs(n.value) * _HEDGE_BAND
            if n.hedge == "about":
                lo, hi = min(lo, n.value - span), max(hi, n.value + span)
            elif n.hedge == "over":
                hi = max(hi, n.value + 3 * span)
            else:
                lo = min(lo, n.value - 3 * span)
        i = bisect.bisect_left(self.numbers, lo)
        out = []
        while i < len(self.numbers) and self.numbers[i] <= hi:
            v = self.numbers[i]
            # a hedge's band never reaches a year of the contexts ("about 2,000" is not 2019)
            if abs(v - n.value) <= tol or v not in self.years:
                out.append(v)
            i += 1
        return out

    def has_number(self, n: Number) -> bool:
        """Whether a number equal to ``n`` (within its written precision) occurs in the contexts."""
        return bool(self._matching_values(n))

    def has_word(self, lower: str, key: str) -> bool:
        """Whether a word (lowercase form or comparison key) occurs in the contexts."""
        return lower in self.raw_words or key in self.keys

    # --- claims -----------------------------------------------------------------------------------

    def verify_sentence(
        self, span: Span, antecedent: frozenset[str] = frozenset()
    ) -> tuple[tuple[str, ClaimVerdict], ...]:
        """The claims of one sentence (normalised) with their verdicts, from the cache when the sentence
        was judged before (the final pass repeats the checkpoints' sentences). Questions and filler come
        back with ``filler=True``."""
        cache_key = (span.text, span.sentence_start, antecedent)
        with self._lock:
            hit = self._verdicts.get(cache_key)
            if hit is not None:
                self._verdicts.move_to_end(cache_key)
                return hit
        result = tuple(
            (c.text, _QUESTION if c.text.endswith("?") else self._verify(
                facts if facts is not None else analyze(c.text, c.sentence_start), antecedent))
            for c, facts in claims_with_facts(span)
        )
        with self._lock:
            self._verdicts[cache_key] = result
            if len(self._verdicts) > self._cache_size:
                self._verdicts.popitem(last=False)
        return result

    def _verify(self, facts: Facts, antecedent: frozenset[str] = frozenset()) -> ClaimVerdict:
        """The verdict on one claim; ``antecedent`` holds the words of the name a leading pronoun stands
        for: they tie the claim's names and numbers to context sentences, they are not checked."""
        if facts.meta_only:
            return ClaimVerdict(supported=True, filler=True)
        names: list[str] = []
        numbers: list[str] = []
        dates: list[str] = []
        words: list[str] = []
        detached: list[str] = []
        units: list[str] = []
        swaps: list[str] = []
        soft_missing = 0
        claim_keys = fact_keys(facts)
        tie_keys = claim_keys | antecedent
        self._check_names(facts, tie_keys, names, detached, words)
        for n in facts.numbers:
            values = self._matching_values(n)
            if not values:
                # "two films", "three times": a small count in words is often the summary's own count
                # of what the context lists; it weighs as a content word, not as a hard fact
                if (n.tally and not self.tallies) or (
                        n.value <= _SMALL_COUNT and n.surface.lower() in NUMBER_WORDS
                        and (n.unit is None or not self._roles.count_contradicted(n, claim_keys))):
                    words.append(n.surface)
                    soft_missing += 1
                else:
                    numbers.append(n.surface)
            elif n.unit is not None and (other := self._other_unit(values, n.unit)):
                units.append(f"{n.surface} {n.unit} (context: {other})")
            elif not _small_count(n) and (swap := self._roles.role_swap(n, facts, values)) is not None:
                swaps.append(swap)
            elif not self._attached_number(values, tie_keys - {f"#{n.value:g}"}):
                detached.append(n.surface)
        for short, surface in facts.dates:
            if short not in self.months:
                dates.append(surface)
        found = 0
        for key, surface in facts.terms:
            if key in self.keys or surface.lower() in self.raw_words:
                found += 1
            else:
                words.append(surface)
        counted = len(facts.terms) + soft_missing
        coverage = found / counted if counted else 1.0
        flip, tie = self._negation(facts, claim_keys)
        supported = (
            not (names or numbers or dates or detached or units or swaps or flip or tie)
            and coverage >= CONTENT_COVERAGE
        )
        return ClaimVerdict(
            supported=supported,
            filler=False,
            missing=tuple(dict.fromkeys([*names, *numbers, *dates, *words])),
            negation_mismatch=flip or tie,
            coverage=coverage,
            detached=tuple(dict.fromkeys(detached)),
            units=tuple(dict.fromkeys(units)),
            missing_numbers=tuple(dict.fromkeys(numbers)),
            missing_dates=tuple(dict.fromkeys(dates)),
            missing_names=tuple(dict.fromkeys(names)),
            missing_words=tuple(dict.fromkeys(words)),
            role_swaps=tuple(dict.fromkeys(swaps)),
            negation_tie=tie and not flip,
        )

    def _check_names(self, facts: Facts, tie_keys: frozenset[str], names: list[str], detached: list[str],
                     words: list[str]) -> None:
        """Sort the claim's names into ``names`` (absent from the contexts), ``detached`` (said there of
        something else) and ``words`` (a title alone, or a title the contexts do not write)."""
        groups = facts.groups
        for k, (surface, tokens) in enumerate(facts.entities):
            pairs = list(zip(tokens, surface.split(), strict=False))
            core = [(t, w) for t, w in pairs if t.rstrip(".") not in TITLES] or pairs
            if not all(self._forms.knows(t, w) for t, w in core) and not self._forms.acronym_of(facts, k):
                if core is pairs and all(t.rstrip(".") in TITLES for t in tokens):
                    words.append(surface)  # "the President": a title alone is a word, not a name
                else:
                    names.append(surface)
                continue
            # a title the contexts do not write beside a known name ("President Obama"): a weak signal
            words.extend(w for t, w in pairs if (t, w) not in core and not self.has_word(t, term(t)))
            others = tie_keys
            if len(facts.entities) > 1 and len(groups) == len(facts.entities):
                beside = [e for j, (_, e) in enumerate(facts.entities) if j != k and groups[j] == groups[k]]
                if beside:
                    others = others - {t for e in beside for t in (*e, *map(term, e))}
            if not self._attached_name(tokens, others):
                detached.append(surface)

    def _attached_name(self, tokens: tuple[str, ...], claim_keys: frozenset[str] | set[str]) -> bool:
        """Whether a context sentence that names ``tokens`` also holds another word of the claim:
        "chaired by Cluzet" is not supported by "chaired by Mergault. It starred Cluzet."."""
        own = set(tokens)
        own.update(term(t) for t in tokens)
        others = claim_keys - own
        if not others:
            return True
        plists = [self._postings.get(t) for t in tokens]
        if any(p is None or len(p) > _MAX_POSTINGS for p in plists):
            return True  # known only in another form, or too common to tell: do not judge it
        k = min(range(len(tokens)), key=lambda j: len(plists[j]))  # type: ignore[arg-type]
        candidates = {self.clause_sentence[cid] for cid in plists[k]}  # type: ignore[union-attr]
        candidates.update(self._carried.get(tokens[k], ()))
        s_keys = self.sentence_keys
        for sid in candidates:  # any order: the answer is whether one exists
            keys = s_keys[sid]
            if not others.isdisjoint(keys) and all(t in keys for t in tokens):
                return True
        return False

    def _other_unit(self, values: list[float], unit: str) -> str:
        """The units of the unit's kind the contexts state this number with, when they never state it
        with ``unit`` or bare ("g" when the claim says "5 mg"); "" when the unit is fine."""
        seen: set[str | None] = set()
        for v in values:
            seen |= self._value_units.get(v, {None})
        if None in seen or unit in seen:
            return ""
        group = UNITS[unit][0]
        return ", ".join(sorted(u for u in seen if u is not None and UNITS[u][0] == group))

    def _attached_number(self, values: list[float], others: frozenset[str]) -> bool:
        """Whether a context sentence that states the number is one the claim comes from: it shares two
        words with the claim, or as many as the best matching sentence does. "opened its office in 1998"
        is not supported by "It was founded in 1998. It opened its office in 2004."."""
        others = frozenset(k for k in others if not k.startswith("#"))
        if not others:
            return True
        sentences: list[int] = []
        for v in values:
            sentences.extend(self._value_sentences.get(v, ()))
        if not sentences:
            return True  # a number word known only from the vocabulary: nothing to tie it to
        s_keys = self.sentence_keys
        with_number = max(len(others & s_keys[sid]) for sid in sentences)
        if with_number >= 2:
            return True
        best = 0
        for k in others:
            for cid in self._postings.get(k, ()):
                if cid < len(self.clause_sentence):
                    best = max(best, len(others & s_keys[self.clause_sentence[cid]]))
            if best > with_number:
                return False
        return with_number >= 1 or best == 0

    def _negation(self, facts: Facts, claim_keys: frozenset[str]) -> tuple[bool, bool]:
        """True when the context clauses that best match the claim have the opposite polarity.

        Only claims that clearly come from one context clause (half their facts, at least two) are
        checked: "was not founded" against "was founded" is a contradiction, a loosely related negative
        clause elsewhere is not. When a negated and a plain clause match equally well the claim is
        taken as contradicted: the judge cannot tell which one it restates, and a miss costs more.
        """
        if not facts.negated and not self.any_negated:
            return False, False
        # a bare name or number ("Ford Fusion.") states no predicate a negation could deny
        if len(claim_keys) < 2 or not facts.terms:
            return False, False
        # the rarest terms point at the clauses a claim most likely comes from; the overlap is counted
        # on them only, which keeps the cost per claim bounded on huge or repetitive contexts
        ranked = sorted(
            (k for k in claim_keys if k in self._postings),
            key=lambda k: (len(self._postings[k]), k),
        )[:_MAX_LOOKUP_TERMS]
        counts: dict[int, int] = {}
        # a name pins the clause a claim restates better than a common word does: it counts twice
        names = {t for _, toks in facts.entities for t in (*toks, *map(term, toks))}
        for k in ranked:
            weight = 2 if k in names else 1
            for cid in self._postings[k]:
                counts[cid] = counts.get(cid, 0) + weight
        best_same = best_opp = 0
        negated = self.clause_negated
        for cid, overlap in counts.items():
            if negated[cid] == facts.negated:
                if overlap > best_same:
                    best_same = overlap
            elif overlap > best_opp:
                best_opp = overlap
        needed = max(2, (min(len(claim_keys), _MAX_LOOKUP_TERMS) + 1) // 2)
        if best_opp < needed or best_opp < best_same:
            return False, False
        return best_opp > best_same, best_opp == best_same


class _NameForms:
    """The forms a name of an answer may take in the contexts: as written, hyphenated or not, an acronym,
    a demonym of a place."""

    def __init__(self, raw_words: frozenset[str], keys: frozenset[str], capitalised: frozenset[str]) -> None:
        self.raw_words = raw_words
        self.keys = keys
        self.capitalised = capitalised
        # the parts of hyphenated words: "Coca Cola" is a form of "Coca-Cola"
        self._hyphen_parts = frozenset(p for w in raw_words if "-" in w for p in w.split("-") if p)
        # capitalised words by their first four letters: the only ones a demonym can share a stem with
        self._by_prefix: dict[str, list[str]] | None = None

    def _has_word(self, lower: str, key: str) -> bool:
        return lower in self.raw_words or key in self.keys

    def acronym_of(self, facts: Facts, k: int) -> bool:
        """Whether the name ``facts.entities[k]``, alone or with a neighbouring name (names split at
        "and": "National Aeronautics and Space Administration"), is spelled out from an acronym of at
        least three letters the contexts write ("NASA")."""
        ents = facts.entities
        for lo, hi in ((k, k + 1), (k - 1, k + 1), (k, k + 2), (k - 1, k + 2)):
            if lo < 0 or hi > len(ents) or (hi - lo == 1 and len(ents[k][1]) < 3):
                continue
            initials = "".join(t[0] for _, toks in ents[lo:hi] for t in toks if t[:1].isalpha())
            if len(initials) >= 3 and initials in self.raw_words:
                return True
        return False

    def knows(self, token: str, written: str) -> bool:
        """Whether one word of a name occurs in the contexts, in any of the forms a name takes: as
        written, its key, the parts of a hyphenated name ("Coca-Cola" for "Coca Cola") or the word
        they join into, an acronym of a capitalised run ("NASA"), or a demonym of a place ("French")."""
        if self._has_word(token, term(token)):
            return True
        if "-" in token:
            parts = token.split("-")
            if all(self._has_word(p, term(p)) for p in parts if p) or "".join(parts) in self.raw_words:
                return True
            rest = written[token.index("-") + 1 :]
            if not rest[:1].isupper() and self.knows(parts[0], parts[0]):
                return True  # "Canada-based", "Paris-born": the name is the capitalised part
        if token in self.capitalised or token in self._hyphen_parts:
            return True
        if self._by_prefix is None:  # built on the first name a claim does not find as written
            by_prefix: dict[str, list[str]] = {}
            for w in self.capitalised:
                if len(w) >= 4:
                    by_prefix.setdefault(w[:4], []).append(w)
            self._by_prefix = by_prefix
        return _demonym_base(token, self.capitalised, self._by_prefix.get(token[:4], ()))


class _Roles:
    """What the contexts say each number of: role swaps ("2012 is said of Leeds") and small counts a
    context sentence contradicts. Segments of a context sentence are analysed the first time a claim
    asks about it (a sentence keeps its text only when it states a number)."""

    def __init__(self, texts: list[str], value_sentences: dict[float, list[int]],
                 postings: dict[str, list[int]], clause_sentence: list[int],
                 sentence_keys: list[frozenset[str]]) -> None:
        self._texts = texts
        self._value_sentences = value_sentences
        self._postings = postings
        self.clause_sentence = clause_sentence
        self.sentence_keys = sentence_keys
        # the segments of the sentences a check has read, by sentence
        self._segments: dict[int, tuple[_Segment, ...]] = {}

    def role_swap(self, n: Number, facts: Facts, values: list[float]) -> str | None:
        """When every context segment stating the number ``n`` says it of something the claim does not
        name (a name, else a word), while a name the claim gives, absent from that segment, has another
        number of the same kind: "opened the York office in 2012" against "opened the Leeds office in
        2012 and the York office in 2016". A segment that holds some of the claim's names shows a swap
        only beside a segment of its own sentence that gives the missing name another number ("won the
        Nobel Prize in Chemistry in 1903" against "... in Physics in 1903 and ... in Chemistry in 1911").
        The reason names what the number is said of; ``None`` when no swap shows."""
        names = [frozenset((*toks, *map(term, toks))) for _, toks in facts.entities]
        if not names:
            return None
        wanted = set(values)
        sentences = dict.fromkeys(s for v in values for s in self._value_sentences.get(v, ()))
        if len(sentences) > _MAX_SWAP_SENTENCES:
            return None  # a number stated that often says little about what one claim takes it from
        segs = [(sid, seg) for sid in sentences
                for seg in self._segments_of(sid) if any(v in wanted for v, _ in seg.values)]
        if not segs:
            return None
        claim_keys = fact_keys(facts)
        label = None
        for sid, seg in segs:
            absent = [keys for keys in names if not keys & seg.keys]
            if not absent:
                return None  # every name of the claim is said beside the number
            mine = next((surface for keys, surface in seg.names if not keys & claim_keys), None)
            if mine is None and len(absent) == len(names):  # the role is a word the claim lacks
                mine = next((surface for key, surface in seg.terms if key not in claim_keys), None)
            if mine is None:
                return None
            beside = sid if len(absent) < len(names) else None
            if not self._has_other_number(frozenset().union(*absent), n, facts, beside):
                return None
            label = label or mine
        return f"{n.surface} is said of {label}" if label else None

    def _segments_of(self, sentence: int) -> tuple[_Segment, ...]:
        segs = self._segments.get(sentence)
        if segs is None:  # computed twice at worst when two threads ask at once; the same either way
            text = self._texts[sentence] if sentence < len(self._texts) else ""
            segs = self._segments[sentence] = _segments(text, sentence) if text else ()
        return segs

    def _has_other_number(
        self, names: frozenset[str], n: Number, facts: Facts, sentence: int | None = None
    ) -> bool:
        """Whether a context segment (of ``sentence`` when given) gives one of ``names`` a number of
        ``n``'s kind that the claim does not state."""
        stated = [(c.value - c.tolerance, c.value + c.tolerance) for c in facts.numbers]
        for key in names:
            if sentence is not None:
                candidates: Iterable[int] = (sentence,)
            else:
                candidates = dict.fromkeys(self.clause_sentence[c] for c in self._postings.get(key, ()))
            for sid in candidates:
                for seg in self._segments_of(sid):
                    if key in seg.keys and any(not any(lo <= v <= hi for lo, hi in stated)
                                               for v in _other_number(seg, n)):
                        return True
        return False

    def count_contradicted(self, n: Number, claim_keys: frozenset[str]) -> bool:
        """Whether a context sentence that shares two words with the claim states another small count
        ("never more than twice a day" against "four times a day"; asked of counts with a unit only:
        "two films" is often the claim's own count of what the context lists)."""
        words = frozenset(k for k in claim_keys if not k.startswith(("#", "@")))
        for v in range(1, _SMALL_COUNT + 1):
            if v == n.value:
                continue
            for sid in self._value_sentences.get(float(v), ()):
                if len(words & self.sentence_keys[sid]) >= 2:
                    return True
        return False


def _other_number(seg: _Segment, n: Number) -> list[float]:
    """The numbers of ``n``'s kind (its unit; a year or not) other than ``n`` that ``seg`` states."""
    year = _is_year(n.value) and n.unit is None
    return [
        v for v, unit in seg.values
        if v != n.value and unit == n.unit and (_is_year(v) and unit is None) == year
    ]


def _small_count(n: Number) -> bool:
    """A small count written in words ("four episodes"): often the claim's own count, a weak fact."""
    return n.value <= _SMALL_COUNT and n.surface.lower() in NUMBER_WORDS


def _is_year(v: float) -> bool:
    return 1000 <= v <= 2100 and float(v).is_integer()


# endings a demonym or adjective of a place adds to its name ("Canadian", "Chinese", "British")
_DEMONYM_ENDINGS = ("ian", "ean", "an", "ese", "ish", "ic", "i")
# demonyms that do not share a stem with their place; generic English, not fitted to any data
_IRREGULAR_DEMONYMS: dict[str, str] = {
    "french": "france", "dutch": "netherlands", "swiss": "switzerland", "welsh": "wales",
    "irish": "ireland", "scottish": "scotland", "scots": "scotland", "spanish": "spain",
    "danish": "denmark", "swedish": "sweden", "finnish": "finland", "polish": "poland",
    "greek": "greece", "thai": "thailand", "turkish": "turkey", "english": "england",
    "filipino": "philippines", "norwegian": "norway", "peruvian": "peru", "belgian": "belgium",
    "portuguese": "portugal", "yemeni": "yemen", "british": "britain", "uk": "britain",
}


def _demonym_base(token: str, capitalised: frozenset[str], same_prefix: Sequence[str]) -> bool:
    """Whether ``token`` and a capitalised word of the contexts are a place and its demonym, either way
    round: from a small table ("french" ~ "france"), or a shared stem of at least four letters once the
    demonym's ending is taken off ("italian" ~ "italy", "canadian" ~ "canada", "chinese" ~ "china").
    ``same_prefix``: the capitalised words that share ``token``'s first four letters."""
    place = _IRREGULAR_DEMONYMS.get(token)
    if place is not None and place in capitalised:
        return True
    if any(demonym in capitalised for demonym in _DEMONYMS_OF.get(token, ())):
        return True
    return any(_stem_pair(token, w) or _stem_pair(w, token) for w in same_prefix)


_DEMONYMS_OF: dict[str, list[str]] = {}
for _demonym, _place in _IRREGULAR_DEMONYMS.items():
    _DEMONYMS_OF.setdefault(_place, []).append(_demonym)


def _stem_pair(demonym: str, place: str) -> bool:
    for ending in _DEMONYM_ENDINGS:
        if demonym.endswith(ending) and len(demonym) - len(ending) >= 4:
            base = demonym[: -len(ending)]
            if place != demonym and place.startswith(base) and len(place) <= len(base) + 3:
                return True
    return False


def fact_keys(facts: Facts) -> frozenset[str]:
    """Comparable keys of a text's facts: content-word keys, names' words, ``#number``, ``@month``."""
    keys = {k for k, _ in facts.terms}
    keys.update(f"#{n.value:g}" for n in facts.numbers)
    keys.update(t for _, tokens in facts.entities for t in tokens)
    keys.update(term(t) for _, tokens in facts.entities for t in tokens)  # "Drugs" meets "drug"
    keys.update(f"@{short}" for short, _ in facts.dates)
    return frozenset(keys)


class IndexCache:
    """A thread-safe LRU of :class:`ContextIndex` by contexts tuple, bounded by the chars it indexes.

    An index holds ~17 bytes per char of its contexts: a bound by count alone let 32 large context sets
    keep ~1 GB, and a small count made the cache thrash once more streams with distinct contexts were live
    than it had entries. A contexts tuple over the whole bound is indexed for its stream and not kept.
    """

    def __init__(self, size: int = 512, claim_cache_size: int = 4096, max_chars: int = 1_000_000) -> None:
        self._size = max(1, size)
        self._max_chars = max_chars
        self._chars = 0
        self._claim_cache_size = claim_cache_size
        self._parts = PartCache(max(8, min(4 * self._size, 1024)))
        self._lock = threading.Lock()
        self._data: OrderedDict[tuple[str, ...], ContextIndex] = OrderedDict()
        self._sizes: dict[tuple[str, ...], int] = {}
        after_fork_in_child(self, IndexCache._after_fork)

    def _after_fork(self) -> None:
        # a lock another thread held at fork time stays held forever in the child (a gunicorn worker forked
        # from a parent that judged): new locks, and the indexes (each with its own lock) are rebuilt on use
        self._lock = threading.Lock()
        self._data = OrderedDict()
        self._sizes = {}
        self._chars = 0
        self._parts = PartCache(max(8, min(4 * self._size, 1024)))

    def get(self, contexts: tuple[str, ...]) -> ContextIndex:
        """The index of ``contexts``, built on first use."""
        with self._lock:
            idx = self._data.get(contexts)
            if idx is not None:
                self._data.move_to_end(contexts)
                return idx
        # built outside the lock: a 1 MB context must not stall other streams' lookups
        idx = ContextIndex(contexts, claim_cache_size=self._claim_cache_size, parts=self._parts)
        chars = sum(len(c) for c in contexts)
        if chars > self._max_chars:
            return idx
        with self._lock:
            existing = self._data.get(contexts)
            if existing is not None:
                return existing
            self._data[contexts] = idx
            self._sizes[contexts] = chars
            self._chars += chars
            while len(self._data) > self._size or self._chars > self._max_chars:
                old, _ = self._data.popitem(last=False)
                self._chars -= self._sizes.pop(old)
        return idx

    def clear(self) -> None:
        """Forget every index (and with them all cached claim verdicts and context analyses)."""
        with self._lock:
            self._data.clear()
            self._sizes.clear()
            self._chars = 0
            self._parts = PartCache(max(8, min(4 * self._size, 1024)))

    def __len__(self) -> int:
        with self._lock:
            return len(self._data)
