"""Text analysis for the local judge: sentences, claims, terms, numbers, entities, negation.

Everything here is regex and table driven, deterministic and linear in the length of the text. Word lists
are generic English (function words, discourse filler, a few irregular verbs and synonym groups); they
are not fitted to any benchmark.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from dataclasses import dataclass

# --- word lists ----------------------------------------------------------------------------------


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


STOPWORDS: frozenset[str] = _words(
    """
    a about above after again against all also although am an and any are aren't as at be because been
    before being below between both but by can could did didn't do does doesn't doing don't down during
    each either else ever every few for from further had hadn't has hasn't have haven't having he her here
    hers herself him himself his how however i if in into is isn't it it's its itself just least less let
    like made many may me might more most much must my myself neither nor of off often on once one only
    onto or other others otherwise our ours ourselves out over own per perhaps quite rather really same
    several shall she should so some such than that the their theirs them themselves then there therefore
    these they this those though through thus to too toward towards under until up upon us very via was
    wasn't we were weren't what whatever when whenever where whereas wherever whether which while who
    whoever whom whose why will with within without would yet you your yours yourself yourselves
    also later earlier still already even instead meanwhile moreover furthermore additionally overall
    currently recently eventually finally initially namely respectively especially particularly mainly
    around approximately about nearly almost roughly just simply really actually well
    st nd rd th s t d ll ve re m percent pct
    """
)

# Discourse words of an assistant talking about its answer rather than stating facts. A claim made only
# of these (and stopwords) is filler: "Here is what I found.", "Let me know if you need more."
META_WORDS: frozenset[str] = _words(
    """
    here found find hope helps help helpful know let need needs want like further feel free happy glad sure
    certainly course absolutely thanks thank please note question questions answer answers summary
    summarize summarized summarizing summarise passage passages text texts article articles document
    documents source sources context contexts information info provided provide provides following follows
    below above based according concise brief briefly overview key main core piece pieces point points
    detail details mentioned mention mentions states stated describes described discusses discussed
    explains explained says said reports reported notes noted highlights highlighted given
    additional anything else assist clarification clarify more less okay ok great yes
    """
)

# Light words: common English words too general to tell a grounded claim from an invented one ("called",
# "different", "several", "role"); a summary adds them freely when it restates. They are neither
# required nor counted. A generic tier chosen a priori, like the stopwords; not fitted to any benchmark.
LIGHT_WORDS: frozenset[str] = _words(
    """
    called named titled entitled known meaning means include includes included including consist
    consists consisted contain contains contained different separate distinct various certain specific
    particular individual individuals entity entities thing things piece pieces part parts type types
    kind kinds way ways time times number numbers amount total list both another same similar
    notable significant important well-known famous popular actual overall general related involving
    involved regarding appear appears appeared seem seems seemed remain remains remained feature
    features featured serve serves served role roles focus focuses focused cover covers covering offer
    offers offered solely exactly specifically primarily generally respectively unspecified specified
    total totals event events instance example examples aspect aspects fact facts area areas
    stand stands stood lie lies located situated sit sits
    """
)

# titles and forms of address: part of a written name ("President Obama", "Dr. Lopez") but no name of
# their own; an answer may add one the contexts do not write
TITLES: frozenset[str] = _words(
    """
    president vice prime minister king queen prince princess duke duchess lord lady sir dame dr doctor mr
    mrs ms miss prof professor saint pope bishop archbishop cardinal reverend rev general gen colonel col
    captain capt lieutenant lt sergeant sgt admiral commander senator sen governor gov mayor judge
    justice chancellor chairman chairwoman chair ceo coach emperor empress sultan sheikh rabbi imam
    father brother sister president-elect
    """
)

NEGATIONS: frozenset[str] = _words(
    "not no never none nobody nothing neither nor cannot without n't"
)

# irregular past forms -> base, so "grew" meets "grow"; generic English, not data specific
IRREGULAR: dict[str, str] = {
    "began": "begin", "begun": "begin", "became": "become", "built": "build", "bought": "buy",
    "brought": "bring", "came": "come", "chose": "choose", "chosen": "choose", "did": "do", "done": "do",
    "drew": "draw", "drawn": "draw", "drove": "drive", "driven": "drive", "fell": "fall",
    "fallen": "fall", "felt": "feel", "fought": "fight", "flew": "fly", "flown": "fly", "forgot": "forget",
    "gave": "give", "given": "give", "went": "go", "gone": "go", "grew": "grow", "grown": "grow",
    "had": "have", "has": "have", "held": "hold", "hid": "hide", "kept": "keep", "knew": "know",
    "known": "know", "laid": "lay", "led": "lead", "left": "leave", "lost": "lose", "made": "make",
    "meant": "mean", "met": "meet", "paid": "pay", "ran": "run", "rose": "rise", "risen": "rise",
    "said": "say", "saw": "see", "seen": "see", "sold": "sell", "sent": "send", "shot": "shoot",
    "shown": "show", "sang": "sing", "sung": "sing", "sat": "sit", "spoke": "speak", "spoken": "speak",
    "spent": "spend", "stood": "stand", "stole": "steal", "stolen": "steal", "struck": "strike",
    "swam": "swim", "took": "take", "taken": "take", "taught": "teach", "told": "tell", "thought": "think",
    "threw": "throw", "thrown": "throw", "understood": "understand", "woke": "wake", "won": "win",
    "wore": "wear", "worn": "wear", "wrote": "write", "written": "write", "children": "child",
    "men": "man", "women": "woman", "people": "person", "feet": "foot", "teeth": "tooth", "mice": "mouse",
}

# small, generic synonym groups; each word maps to the group's first member (after stemming)
_SYNONYM_GROUPS: tuple[tuple[str, ...], ...] = (
    ("found", "establish", "start", "begin", "launch", "create", "form", "set"),
    ("buy", "purchase", "acquire"),
    ("big", "large", "huge", "major"),
    ("small", "little", "minor"),
    ("end", "finish", "conclude", "complete"),
    ("die", "death", "dead"),
    ("say", "state", "tell", "announce", "report", "claim"),
    ("get", "obtain", "receive", "gain"),
    ("need", "require"),
    ("use", "utilize", "utilise", "employ"),
    ("show", "demonstrate", "reveal", "indicate"),
    ("help", "assist", "aid", "support"),
    ("kill", "slay"),
    ("increase", "rise", "grow", "raise"),
    ("decrease", "fall", "drop", "decline", "reduce"),
    ("make", "produce", "manufacture"),
    ("car", "automobile", "vehicle"),
    ("film", "movie"),
    ("firm", "company", "business", "corporation", "enterprise"),
    ("student", "pupil"),
    ("job", "work", "employment"),
    ("expert", "specialist"),
    ("shop", "store"),
    ("city", "town"),
    ("child", "kid"),
    ("house", "home"),
    ("quick", "fast", "rapid"),
)

MONTHS: frozenset[str] = _words(
    """january february march april may june july august september october november december
    jan feb mar apr jun jul aug sep sept oct nov dec
    monday tuesday wednesday thursday friday saturday sunday"""
)
# month-like words that are common English words when not capitalised
_AMBIGUOUS_MONTHS = frozenset({"may", "march", "mar", "jan", "dec", "sun", "sat", "wed"})

NUMBER_WORDS: dict[str, float] = {
    "two": 2, "three": 3, "four": 4, "five": 5, "six": 6, "seven": 7, "eight": 8, "nine": 9, "ten": 10,
    "eleven": 11, "twelve": 12, "thirteen": 13, "fourteen": 14, "fifteen": 15, "sixteen": 16,
    "seventeen": 17, "eighteen": 18, "nineteen": 19, "twenty": 20, "thirty": 30, "forty": 40,
    "fifty": 50, "sixty": 60, "seventy": 70, "eighty": 80, "ninety": 90, "hundred": 100,
    "thousand": 1000, "dozen": 12, "twice": 2, "double": 2, "triple": 3,
}
SCALES: dict[str, float] = {
    "hundred": 1e2, "thousand": 1e3, "k": 1e3, "million": 1e6, "millions": 1e6, "mn": 1e6, "m": 1e6,
    "billion": 1e9, "billions": 1e9, "bn": 1e9, "b": 1e9, "trillion": 1e12, "tn": 1e12,
}
_OPENERS_RE = re.compile(r'[:"(\u201c\u00ab\[\n]')
_BREAKS_RE = re.compile(r'[,;:()"\u201c\u201d\n|\t]')
_WORD_SCALES = frozenset({"hundred", "thousand", "million", "millions", "billion", "billions", "trillion"})

# --- tokens --------------------------------------------------------------------------------------

_CJK = r"\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uac00-\ud7af\uf900-\ufaff"
# a number ("1,000", "3.5"), a CJK character, or a word with inner apostrophes/hyphens (each followed by a
# letter); a word is written as runs of letters so the regex engine scans each run in one tight loop
_TOKEN_RE = re.compile(
    rf"(?P<num>\d{{1,3}}(?:,\d{{3}})+(?:\.\d+)?|\d+(?:\.\d+)?)"
    rf"|(?P<cjk>[{_CJK}])"
    rf"|(?P<word>[^\W\d_{_CJK}][^\W_{_CJK}]*(?:['\-][^\W_{_CJK}]+)*)"
    rf"|(?P<pct>%)"
)
# characters that show nothing but split a word or number for a regex ("19\u200b69"): zero-width spaces
# and joiners, the word joiner, the BOM, the soft hyphen and the bidirectional controls
_INVISIBLE = "\u00ad\u180e\u200b\u200c\u200d\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2060\u2061\u2062" \
    "\u2063\u2064\u2066\u2067\u2068\u2069\ufeff"
_APOSTROPHES = str.maketrans(
    {"\u2019": "'", "\u2018": "'", "\u02bc": "'", "\u2010": "-", "\u2011": "-", **dict.fromkeys(_INVISIBLE)}
)


def normalize(text: str) -> str:
    """NFKC, unified apostrophes and hyphens, invisible characters removed; keeps length roughly linear
    and never raises."""
    if text.isascii():  # O(1) on str; ASCII is NFKC-stable and holds no character to translate
        return text
    # invisible characters go first: NFKC would otherwise see "19", a soft hyphen and "69"
    return unicodedata.normalize("NFKC", text.translate(_APOSTROPHES)).translate(_APOSTROPHES)


_VOWELS = frozenset("aeiouy")


def _has_vowel(w: str) -> bool:
    return any(c in _VOWELS for c in w)


def stem(word: str) -> str:
    """The lemma-like key of a lowercase word: the inflections of one word meet on one key.

    A rule set in the manner of a lemmatiser rather than a length-guarded suffix stripper: irregular forms
    from a table, then plural/third-person ``-s``, ``-ied``/``-ies`` -> ``y``, ``-ed`` and ``-ing`` when
    what remains still holds a vowel ("used" and "using" meet "use", "sing" stays), a doubled final
    consonant undone ("stopped" -> "stop"), ``-ly`` adverbs, and a final ``e`` dropped so that "make",
    "makes", "making" and "made" share one key. Keys are for comparison only, never shown.
    """
    w = IRREGULAR.get(word, word)
    if w.endswith("'s"):
        w = w[:-2]
    if len(w) <= 2 or not w.isalpha():
        return w
    if w.endswith("ies") and len(w) > 4:
        w = w[:-3] + "y"
    elif w.endswith("ies"):
        w = w[:-1]  # "dies", "ties", "lies"
    elif w.endswith("s") and not w.endswith(("ss", "us", "is", "os")) and len(w) > 3:
        w = w[:-1]
    if w.endswith("ied"):
        w = w[:-3] + ("y" if len(w) > 4 else "ie")  # "studied" -> "study", "died" -> "die"
    elif w.endswith("ying") and len(w) == 5:
        w = w[:-4] + "ie"  # "dying", "lying", "tying"
    elif w.endswith("ed") and len(w) > 3 and _has_vowel(w[:-2]) and not w.endswith("eed"):
        w = _undouble(w[:-2])
    elif w.endswith("eed") and len(w) > 5 and w[:-3] + "ee" not in _EED_BASES:
        w = w[:-1]  # "agreed" -> "agree"; "succeed", "proceed" are bases
    elif w.endswith("ing") and len(w) > 4 and _has_vowel(w[:-3]):
        w = _undouble(w[:-3])
    elif w.endswith("ly") and len(w) > 5:
        w = w[:-2]
        if w.endswith("i"):
            w = w[:-1] + "y"  # "easily" -> "easy"
    if len(w) > 2 and w.endswith("e"):
        w = w[:-1]
    return _american(w)


def _american(w: str) -> str:
    """One key for the British and American spellings of a stem: "colour"/"color", "centre"/"center",
    "organis(e)"/"organiz(e)", "programme"/"program". Applied to both sides alike, so a rare collision
    of two unrelated words is the only cost."""
    if len(w) >= 6 and w.endswith("our"):
        return w[:-3] + "or"
    if len(w) >= 4 and w.endswith(("tr", "br")) and w[-3] not in _VOWELS:
        return w[:-1] + "er"
    if len(w) >= 7 and w.endswith("is"):
        return w[:-2] + "iz"
    if len(w) >= 8 and w.endswith("amm"):
        return w[:-1]
    return w


# words ending in "eed" that are not a past form of a word ending in "ee"
_EED_BASES = frozenset({"succee", "procee", "excee"})


def _undouble(w: str) -> str:
    if len(w) > 2 and w[-1] == w[-2] and w[-1] not in "lsz" and w[-1] not in _VOWELS and w[-1].isalpha():
        return w[:-1]
    return w


SYNONYMS: dict[str, str] = {}
for _group in _SYNONYM_GROUPS:
    for _w in _group:
        SYNONYMS.setdefault(stem(_w), stem(_group[0]))


@functools.lru_cache(maxsize=65536)
def term(word_lower: str) -> str:
    """The comparison key of a lowercase word: stemmed, then mapped onto its synonym group; the forms of
    one unit share a key ("km", "kilometres")."""
    unit = UNITS.get(word_lower)
    if unit is not None:
        return "unit:" + unit[1]
    s = stem(word_lower)
    return SYNONYMS.get(s, s)


@dataclass(frozen=True, slots=True)
class Number:
    """A number as written (``surface``) and its value with scale applied (``1.5 million`` -> 1.5e6)."""

    surface: str
    value: float
    tolerance: float  # half a unit of the last written digit: "181.7 million" matches 181,674,817
    unit: str | None = None  # the unit written after it, by its canonical name ("kg" for "kilograms")
    tally: bool = False  # one side of a small tally such as a score ("won 4-1"): a count, often derived
    # a hedge written before it: "about" ("roughly 300"), "over" ("more than 300"), "under" ("up to 300")
    hedge: str | None = None


@dataclass(frozen=True, slots=True)
class Facts:
    """What one piece of text asserts, in comparable form."""

    terms: tuple[tuple[str, str], ...]  # (comparison key, surface) of content words, in order
    numbers: tuple[Number, ...]
    entities: tuple[tuple[str, tuple[str, ...]], ...]  # (surface, lowercase tokens) in order
    dates: tuple[tuple[str, str], ...]  # (lowercase month/day name, surface)
    negated: bool
    meta_only: bool  # nothing but stopwords and assistant filler words
    # per entity, how many terms, numbers and dates come before it: names with the same count stand
    # side by side ("Columbus, Ohio"; "A and B") and do not vouch for each other
    groups: tuple[int, ...] = ()


def _number_value(raw: str) -> tuple[float, float]:
    digits = raw.replace(",", "")
    value = float(digits)
    decimals = len(digits.split(".", 1)[1]) if "." in digits else 0
    return value, 0.5 * 10.0 ** (-decimals)


@dataclass(frozen=True, slots=True)
class _Word:
    """What :func:`analyze` needs to know about one word token, independent of where it stands."""

    lower: str  # lowercase, without a final "'s"
    negation: bool
    date: str | None  # three-letter month/day key when the token reads as a date
    upper: bool  # first letter upper case: a name unless it starts a sentence or phrase
    acronym: bool
    nameable: bool  # neither a stopword nor "I"
    number: bool  # a number word ("two", "dozen")
    key: str | None  # comparison key when the word is a content term


@functools.lru_cache(maxsize=65536)
def _word(tok: str) -> _Word:
    # the per-word decisions of analyze, cached by token: running texts and contexts repeat words a lot
    lower = tok.lower()
    if lower.endswith("'s"):
        lower = lower[:-2]  # "here's", "Europe's": the base word decides what the token is
    negation = lower in NEGATIONS or lower.endswith("n't")
    upper = tok[0].isupper()
    # "Tuesdays", "Mondays": a plural day name is a date too
    base = lower[:-1] if lower.endswith("days") else lower
    date = lower[:3] if base in MONTHS and (base not in _AMBIGUOUS_MONTHS or upper) else None
    content = not (
        lower in STOPWORDS
        or lower in NEGATIONS
        or lower in META_WORDS
        or lower in LIGHT_WORDS
        or lower.endswith("n't")
        or len(lower) < 2
    )
    return _Word(
        lower=lower,
        negation=negation,
        date=date,
        upper=upper,
        acronym=len(tok) >= 2 and tok.isupper() and tok.isalpha(),
        nameable=lower not in STOPWORDS and lower != "i",
        number=lower in NUMBER_WORDS,
        key=term(lower) if content and lower not in NUMBER_WORDS else None,
    )


# a negation cue followed by one of these is no negation of the sentence: "no fewer than 300", "not only
# ... but also", "not least", "none other than", "no doubt"
_NOT_NEGATING_NEXT = frozenset(
    {"fewer", "less", "more", "greater", "smaller", "larger", "later", "earlier", "sooner", "only", "just",
     "least", "other", "doubt"}
)


def _quantity_phrase(matches: list[re.Match[str]], i: int, n: int, text: str) -> bool:
    """Whether the negation cue at ``matches[i]`` is part of a phrase that negates nothing: "no fewer
    than", "not only", or "No. 32" (the abbreviation of "number")."""
    if i + 1 >= n:
        return False
    nxt = matches[i + 1]
    if nxt.lastgroup == "num":
        return matches[i].group().lower() == "no"
    return nxt.lastgroup == "word" and nxt.group().lower() in _NOT_NEGATING_NEXT


_NAME_GLUE = frozenset({"and", "or", "nor"})

# Units that are easily confused, in groups: the same number with another unit of its group is another
# fact ("5 mg" is not "5 g", "10 km" is not "10 miles", "3%" is not "3 points"). Canonical name first.
_UNIT_GROUPS: tuple[tuple[tuple[str, ...], ...], ...] = (
    (("mg", "milligram", "milligrams"), ("g", "gram", "grams"), ("kg", "kilogram", "kilograms", "kilo",
     "kilos"), ("lb", "lbs", "pound", "pounds"), ("oz", "ounce", "ounces"), ("t", "tonne", "tonnes", "ton",
     "tons"), ("mcg", "microgram", "micrograms", "µg")),
    (("mm", "millimetre", "millimetres", "millimeter", "millimeters"), ("cm", "centimetre", "centimetres",
     "centimeter", "centimeters"), ("m", "metre", "metres", "meter", "meters"), ("km", "kilometre",
     "kilometres", "kilometer", "kilometers"), ("mi", "mile", "miles"), ("ft", "foot", "feet"),
     ("in", "inch", "inches"), ("yd", "yard", "yards")),
    (("ml", "millilitre", "millilitres", "milliliter", "milliliters"), ("l", "litre", "litres", "liter",
     "liters"), ("gal", "gallon", "gallons")),
    (("%", "percent", "per cent", "pct"), ("points", "point", "percentage points")),
    (("s", "sec", "second", "seconds"), ("min", "minute", "minutes"), ("h", "hr", "hour", "hours"),
     ("day", "days"), ("week", "weeks"), ("month", "months"), ("year", "years")),
    (("times",),),  # "four times a day": a count of occurrences, not of things the text lists
)
UNITS: dict[str, tuple[int, str]] = {
    name: (g, forms[0]) for g, group in enumerate(_UNIT_GROUPS) for forms in group for name in forms
}


def _unit_after(matches: list[re.Match[str]], i: int, n: int) -> str | None:
    """The canonical unit written right after the number at ``matches[i]``, if any."""
    if i + 1 >= n:
        return None
    nxt = matches[i + 1]
    if nxt.lastgroup == "pct":
        return "%"
    if nxt.lastgroup != "word" or nxt.start() - matches[i].end() > 1:
        return None
    word = nxt.group().lower()
    if word in ("in", "m", "t", "s", "l", "h") and nxt.start() == matches[i].end():
        pass  # "5m", "3h": a unit glued to its number
    elif word in ("in", "t", "s", "l", "h", "m"):
        return None  # "5 in 2004", "5 s" are rarely units when written apart
    unit = UNITS.get(word)
    return unit[1] if unit is not None else None


def _name_follows(matches: list[re.Match[str]], i: int, n: int, text: str) -> bool:
    """Whether the sentence's capitalised first word starts a name: "John Brown Publishing", "Mumford &
    Sons" (the next word is capitalised, a blank, "&" or "-" between)."""
    if i + 1 >= n or matches[i + 1].lastgroup != "word":
        return False
    if text[matches[i].end() : matches[i + 1].start()].strip(" &-"):
        return False
    nxt = _word(matches[i + 1].group())
    first = _word(matches[i].group())
    # a light word ("Another", "Several") only starts the sentence, it does not start the name
    return nxt.upper and nxt.nameable and nxt.date is None and first.nameable and (
        first.key is not None or first.acronym or first.number)


# a tally's sides are small whole numbers joined by a dash: "4-1", "2–0" (not "2007-11")
_TALLY_MAX = 30
_TALLY_DASHES = frozenset({"-", "\u2013", "\u2014"})


def _in_tally(matches: list[re.Match[str]], i: int, n: int, text: str) -> bool:
    """Whether the number at ``matches[i]`` is one side of a tally ("4-1"): a small whole number joined
    by a dash to another one."""
    def side(j: int) -> bool:
        tok = matches[j].group()
        return matches[j].lastgroup == "num" and tok.isdigit() and int(tok) <= _TALLY_MAX

    if not side(i):
        return False
    if i + 1 < n and side(i + 1) and text[matches[i].end() : matches[i + 1].start()].strip() in _TALLY_DASHES:
        return True
    return i > 0 and side(i - 1) and text[matches[i - 1].end() : matches[i].start()].strip() in _TALLY_DASHES


# words before a number that say it is not exact, by what they allow: about (either side), over, under
_HEDGES: dict[str, str] = {
    "about": "about", "around": "about", "approximately": "about", "roughly": "about", "nearly": "about",
    "almost": "about", "some": "about", "circa": "about", "ca": "about", "approx": "about",
    "estimated": "about", "over": "over", "exceeding": "over", "above": "over", "under": "under",
    "below": "under",
}
_HEDGE_PAIRS: dict[tuple[str, str], str] = {
    ("close", "to"): "about", ("more", "than"): "over", ("at", "least"): "over", ("upwards", "of"): "over",
    ("less", "than"): "under", ("fewer", "than"): "under", ("up", "to"): "under", ("at", "most"): "under",
}


def _hedge_before(matches: list[re.Match[str]], i: int) -> str | None:
    """The hedge written right before the number at ``matches[i]`` ("about", "over", "under"), if any."""
    if i == 0 or matches[i - 1].lastgroup != "word":
        return None
    prev = matches[i - 1].group().lower()
    if i >= 2 and matches[i - 2].lastgroup == "word":
        pair = _HEDGE_PAIRS.get((matches[i - 2].group().lower(), prev))
        if pair is not None:
            # "no fewer than" / "no more than" turn the bound around
            if i >= 3 and matches[i - 3].group().lower() in ("no", "not"):
                return {"over": "under", "under": "over"}.get(pair, pair)
            return pair
    return _HEDGES.get(prev)


def analyze(text: str, sentence_start: bool = True) -> Facts:
    """Extract content terms, numbers, named entities, dates and negation from ``text`` (normalised).

    ``sentence_start`` says whether the first word of ``text`` begins a sentence (its capital letter then
    says nothing about it being a name).
    """
    terms: list[tuple[str, str]] = []
    numbers: list[Number] = []
    entities: list[tuple[str, tuple[str, ...]]] = []
    groups: list[int] = []
    group = 0  # advanced by every token but a name's, "and" and "or"
    dates: list[tuple[str, str]] = []
    negated = False
    meta_only = True
    cjk_prev: str | None = None
    entity_run: list[str] = []
    at_start = sentence_start
    prev_end = 0
    matches = list(_TOKEN_RE.finditer(text))

    i = 0
    n = len(matches)
    while i < n:
        m = matches[i]
        m_start = m.start()
        if m_start != prev_end and (m_start - prev_end != 1 or text[prev_end] != " "):
            gap = text[prev_end:m_start]
            # a quote, colon or bracket opens a new phrase: its first word is capitalised anyway
            if _OPENERS_RE.search(gap):
                at_start = True
            if entity_run and _BREAKS_RE.search(gap):
                entities.append((" ".join(entity_run), tuple(t.lower() for t in entity_run)))
                groups.append(group)
                entity_run.clear()
        prev_end = m.end()
        kind = m.lastgroup
        tok = m.group()
        if kind == "word":
            cjk_prev = None
            w = _word(tok)
            # a title-case "Never" or "No" inside a sentence is part of a name ("Never Shout Never")
            if w.negation and not _quantity_phrase(matches, i, n, text) and (
                at_start or not w.upper or tok.isupper()
            ):
                negated = True
            capitalised = w.upper and (not at_start or _name_follows(matches, i, n, text))
            at_start = False
            if w.date is not None:
                if entity_run:
                    entities.append((" ".join(entity_run), tuple(t.lower() for t in entity_run)))
                    groups.append(group)
                    entity_run.clear()
                dates.append((w.date, tok))
                meta_only = False
                group += 1
                i += 1
                continue
            if (w.acronym or capitalised) and w.nameable:
                entity_run.append(tok)
                meta_only = False
                i += 1
                continue
            if entity_run:
                entities.append((" ".join(entity_run), tuple(t.lower() for t in entity_run)))
                groups.append(group)
                entity_run.clear()
            if w.number:
                first = i
                value, tol, surface = NUMBER_WORDS[w.lower], 0.5, tok
                # "five hundred", "two million"
                if i + 1 < n and matches[i + 1].lastgroup == "word":
                    nxt = matches[i + 1].group().lower()
                    if nxt in _WORD_SCALES and text[m.end() : matches[i + 1].start()].isspace():
                        value *= SCALES[nxt]
                        tol *= SCALES[nxt]
                        surface = text[m_start : matches[i + 1].end()]
                        prev_end = matches[i + 1].end()
                        i += 1
                numbers.append(Number(surface, value, tol, _unit_after(matches, i, n),
                                      hedge=_hedge_before(matches, first)))
                meta_only = False
            elif w.key is not None:
                terms.append((w.key, tok))
                meta_only = False
            if w.lower not in _NAME_GLUE:
                group += 1
            i += 1
            continue
        if kind == "num":
            if entity_run:
                entities.append((" ".join(entity_run), tuple(t.lower() for t in entity_run)))
                groups.append(group)
                entity_run.clear()
            cjk_prev = None
            first = i
            value, tol = _number_value(tok)
            surface = tok
            # a scale word after the number multiplies it: "$160 million", "3.5bn"
            if i + 1 < n and matches[i + 1].lastgroup == "word":
                nxt = matches[i + 1].group().lower()
                between = text[m.end() : matches[i + 1].start()]
                if nxt in SCALES and len(between) <= 1 and not (nxt in ("m", "b") and between):
                    value *= SCALES[nxt]
                    tol *= SCALES[nxt]
                    surface = text[m_start : matches[i + 1].end()]
                    prev_end = matches[i + 1].end()
                    i += 1
            numbers.append(Number(surface, value, tol, _unit_after(matches, i, n),
                                  _in_tally(matches, i, n, text) if value <= _TALLY_MAX else False,
                                  _hedge_before(matches, first)))
            meta_only = False
            at_start = False
            group += 1
            i += 1
            continue
        if kind == "pct":
            i += 1
            continue
        # a CJK character
        if entity_run:
            entities.append((" ".join(entity_run), tuple(t.lower() for t in entity_run)))
            groups.append(group)
            entity_run.clear()
        if cjk_prev is not None and m_start == matches[i - 1].end():
            bigram = cjk_prev + tok
            terms.append((bigram, bigram))
        elif i + 1 >= n or matches[i + 1].lastgroup != "cjk":
            terms.append((tok, tok))  # a lone CJK character
        cjk_prev = tok
        group += 1
        meta_only = False
        at_start = False
        i += 1
    if entity_run:
        entities.append((" ".join(entity_run), tuple(t.lower() for t in entity_run)))
        groups.append(group)
    return Facts(
        tuple(terms), tuple(numbers), tuple(entities), tuple(dates), negated, meta_only, tuple(groups)
    )


@functools.lru_cache(maxsize=65536)
def _word_forms(tok: str) -> tuple[str, str, str | None]:
    # lowercase form, comparison key, and the base of a "'s" form, cached by token like _word
    lower = tok.lower()
    return lower, term(lower), lower[:-2] if lower.endswith("'s") else None


def word_keys(text: str) -> tuple[set[str], set[str]]:
    """All lowercase words of ``text`` and their comparison keys (for the context side of matching)."""
    raw: set[str] = set()
    keys: set[str] = set()
    prev_cjk_end = -1
    prev_cjk = ""
    for m in _TOKEN_RE.finditer(text):
        kind = m.lastgroup
        if kind == "word":
            lower, key, base = _word_forms(m.group())
            raw.add(lower)
            keys.add(key)
            if base is not None:
                raw.add(base)
        elif kind == "cjk":
            tok = m.group()
            keys.add(tok)
            if prev_cjk_end == m.start():
                keys.add(prev_cjk + tok)
            prev_cjk, prev_cjk_end = tok, m.end()
    return raw, keys


# --- claims ------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Span:
    """A sentence or clause of a text: its text and whether it ends with terminal punctuation."""

    text: str
    terminated: bool
    sentence_start: bool = True


_CLAUSE_SPLIT_RE = re.compile(r"\s*;\s*|,?\s+(?:but|whereas|while|although|however,?)\s+|,?\s+and\s+", re.I)
# every match of _CLAUSE_SPLIT_RE holds one of these after str.lower(), unless the text has one of the
# characters re.IGNORECASE matches to a letter they do not lower-case to ("ı", "İ" ~ "i"; "ſ" ~ "s")
_CLAUSE_WORDS = (";", "and", "but", "whereas", "while", "although", "however")
_CASE_ODDITIES = frozenset("\u0130\u0131\u017f")


#: a sentence opening with one of these is about what the sentence before it named
PRONOUN_RE = re.compile(r"(?:it|he|she|they|its|his|her|their|this|these)\b", re.IGNORECASE)

# where the scope of a negation ends: "X was not A, but B" does not deny B
_SCOPE_RE = re.compile(
    r"\s*;\s*|,?\s+(?:but|whereas|while|although|though|however,?|yet)\s+|,\s+(?:which|who)\s+", re.I
)


def scopes(text: str, sentence_start: bool = True) -> list[tuple[str, bool]]:
    """``text`` cut at clause boundaries (``;``, "but", "while", "whereas", "although", ", which"...): the
    pieces a negation cue can reach, each with whether it starts a sentence."""
    out: list[tuple[str, bool]] = []
    start = 0
    for m in _SCOPE_RE.finditer(text):
        if m.start() > start:
            out.append((text[start : m.start()], start == 0 and sentence_start))
        start = m.end()
    if start < len(text):
        out.append((text[start:], start == 0 and sentence_start))
    return out or [(text, sentence_start)]


def _weight(f: Facts) -> int:
    return len(f.terms) + len(f.numbers) + len(f.entities) + len(f.dates)


def claims(span: Span) -> list[Span]:
    """Split a sentence into claims at ``;``, ``but``/``while``/``whereas`` and ``and`` where both sides
    carry their own facts (``and`` needs three facts on each side, so "Tom and Jerry" stays whole).

    Each segment between separators is analysed once, so this stays linear in the sentence length.
    """
    return [claim for claim, _ in claims_with_facts(span)]


def claims_with_facts(span: Span) -> list[tuple[Span, Facts | None]]:
    """:func:`claims`, each with its :func:`analyze` result when splitting already computed it (a claim
    that is exactly one segment between separators), else ``None``."""
    text = span.text
    # most sentences hold no separator at all; the regex engine would try it at every position
    lower = text.lower()
    if not any(word in lower for word in _CLAUSE_WORDS) and _CASE_ODDITIES.isdisjoint(text):
        return [(span, None)]
    seps = list(_CLAUSE_SPLIT_RE.finditer(text))
    if not seps:
        return [(span, None)]
    bounds = [0, *(x for m in seps for x in (m.start(), m.end())), len(text)]
    segments = [(bounds[2 * k], bounds[2 * k + 1]) for k in range(len(seps) + 1)]
    facts = [analyze(text[a:b], a == 0 and span.sentence_start) for a, b in segments]
    weights = [_weight(f) for f in facts]
    suffix = [0] * (len(weights) + 1)
    for k in range(len(weights) - 1, -1, -1):
        suffix[k] = suffix[k + 1] + weights[k]
    parts: list[tuple[Span, Facts | None]] = []
    start = 0
    first = 0  # index of the first segment of the claim being built
    left = 0
    for k, m in enumerate(seps):
        left += weights[k]
        need = 3 if m.group().strip(" ,").lower() == "and" else 2
        if left >= need and suffix[k + 1] >= need:
            claim = Span(text[start : m.start()].strip(), True, start == 0 and span.sentence_start)
            parts.append((claim, _reuse(claim, text, segments[k], span, facts[k]) if first == k else None))
            start = m.end()
            first = k + 1
            left = 0
    if not parts:
        return [(span, None)]
    claim = Span(text[start:].strip(), span.terminated, False)
    last = len(segments) - 1
    parts.append((claim, _reuse(claim, text, segments[last], span, facts[last]) if first == last else None))
    return [p for p in parts if p[0].text]


def _reuse(claim: Span, text: str, segment: tuple[int, int], span: Span, facts: Facts) -> Facts | None:
    # a segment's analysis is the claim's only when both read exactly the same text from the same kind of
    # start (analyze is deterministic)
    a, b = segment
    same = claim.text == text[a:b] and claim.sentence_start == (a == 0 and span.sentence_start)
    return facts if same else None
