"""Streaming sentence buffer and checkpoint window policy.

Pure text: no telemetry imports. The instrumentation uses it to decide when a checkpoint span closes, the
judges and the live guard use it to know which sentence a verdict is about.

Tokens go in, complete sentences come out. A possible boundary after ``.`` ``!`` ``?`` often cannot be
decided from the text seen so far (``"3."`` + ``"14"``, ``"Dr."`` + ``" Smith"``): the buffer holds the
decision until enough following characters exist, then emits. Every decision reads a bounded window
after the candidate, and returns "undecided" while that window runs past the text seen so far, so the
sentences do not depend on how the text was chunked: ``feed`` per token + ``flush`` gives exactly what
:func:`split_sentences` gives for the whole text.

Rules (one test each in ``tests/test_sentences.py``):

* ``.`` ends a sentence before whitespace + a character that is not lowercase, except after
  abbreviations (``Dr.``, ``e.g.`` ...: never; ``No.``, ``Fig.``, ``Jan.`` ...: not before a digit),
  initials and dotted acronyms (``J.``, ``U.S.``; ``Inc.``, ``Jr.``: only before a common sentence-opening
  word such as ``The``) and a list number at the start of a sentence (``1. First``).
* No whitespace after the stop, no boundary (``3.14``, ``v1.2.3``, ``example.com/a.b?x=1``).
* ``!`` / ``?`` end a sentence before whitespace + a non-lowercase character; an ellipsis (``...``,
  ``…``) only before whitespace + an uppercase letter; ``。！？`` always (no whitespace needed).
* Closing quotes and brackets (and ``**``) after the stop and citation markers like ``[1]`` belong to the
  sentence that ends there.
* A stop followed by a line break always ends the sentence. A line break without a stop ends it when the
  next line is blank, starts a list item, heading, quote, table row or code fence, or when the sentence
  itself is such a block line; otherwise the line break is a soft wrap.
* A fenced code block (```` ``` ```` at the start of a line up to the closing fence) is one unit.
* A run-on longer than ``max_sentence_chars`` is cut at its last whitespace (or hard at the limit) so that
  nothing escapes judging; the undecided tail the buffer keeps is bounded by it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Final

__all__ = ["CheckpointPolicy", "Sentence", "SentenceBuffer", "split_sentences"]


@dataclass(frozen=True, slots=True)
class Sentence:
    """One sentence (or list item, heading, code block) of the running text.

    ``text == total_text[start:end]``; leading and trailing whitespace is never part of it.
    """

    text: str
    start: int
    end: int


# --- character classes -------------------------------------------------------------------------------
# A token without any of these can only extend the current sentence: the hot path (see feed()).
# Backticks and quotes are not here on purpose: they only matter right after a stop or a line break,
# and then the buffer is already waiting for lookahead and takes the slow path anyway.
# (frozenset.isdisjoint measured ~2x faster than a precompiled character-class search on short tokens.)
_NO_SPECIAL: Final = frozenset(".!?\n…。！？").isdisjoint
# candidates the scanner stops at, in prose and inside a code fence
_CANDIDATE: Final = re.compile(r"[.!?\n`…。！？]")
_NONSPACE: Final = re.compile(r"\S")
# greedy: the match ends just after the last whitespace character
_LAST_SPACE: Final = re.compile(r".*\s", re.DOTALL)

_STOPS: Final = frozenset(".!?…。！？")
_CJK_STOPS: Final = frozenset("。！？")
_BANG_QUESTION: Final = frozenset("!?")
_CLOSERS: Final = frozenset("\"'”’)]}»」』）】〉》〕*")
_OPENERS: Final = "([{\"'“‘«*_"
_INDENT: Final = frozenset(" \t\r")

# bounds on every look-ahead / look-behind, so that deciding a candidate costs O(1) and re-deciding an
# undecided one on the next token does not make the buffer quadratic
_MAX_RUN: Final = 16  # stop characters, closing characters
_MAX_SPACE: Final = 64  # whitespace after a stop, indentation of a line
_MAX_WORD: Final = 40  # the word before a stop (abbreviations are short)
_MAX_NEXT_WORD: Final = 20  # the word after a stop, for the sentence-opener test
_LINE_WINDOW: Final = 8  # enough to see any block marker at the start of a line

_CITATION: Final = re.compile(r"\[[\w^,;\-–\s]{1,16}\]")
_CITATION_PREFIX: Final = re.compile(r"\[[\w^,;\-–\s]{0,16}")
# list item, heading, quote, table row, code fence at the start of a line (matched on a bounded window)
_BLOCK_LINE: Final = re.compile(r"(?:#{1,6}|[-*+•]|\d{1,3}[.)])(?=\s|\Z)|>|\||```")
_LIST_NUMBER: Final = re.compile(r"\d{1,3}")
_DOTTED: Final = re.compile(r"(?:[^\W\d_]\.)+[^\W\d_]")


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# never the end of a sentence when followed by whitespace and more text on the same line
_NEVER_END: Final = _words(
    "mr mrs ms mx dr prof st mt ft rev hon gen col capt cmdr lt sgt gov sen rep pres messrs mme mlle "
    "vs cf viz e.g i.e approx ca dept esp"
)
# not the end before a number: "No. 5", "Fig. 3", "Jan. 15", "pp. 12"
_BEFORE_NUMBER: Final = _words(
    "no nos nr fig figs eq eqs vol vols ch chap sec sect art pp p para op ref refs tab ver "
    "jan feb mar apr jun jul aug sep sept oct nov dec"
)
# may end a sentence, but usually continues into a name ("U.S. Army", "Acme Inc. CEO", "J. R. R. Tolkien"):
# the end only before a word that commonly opens a sentence
_OPENER_ONLY: Final = _words("inc ltd co corp llc plc jr sr bros esq al")
_SENTENCE_OPENERS: Final = _words(
    "The This That These Those There Their They Them Then Thus Therefore It Its He His Her She We Our "
    "You Your My In On At As Also And But Or So Yet For To By From With Without After Before During "
    "Since Although Though Because While When Where Which Who Whose What Why How If Unless Once However "
    "Moreover Furthermore Additionally Finally First Second Third Next Meanwhile Instead Overall Today "
    "Here Some Many Most Several Each Every All Both Neither Either One Other Another Such Only Even "
    "Still Please Note According Unlike Despite Under Over Between Among"
)

# decisions of the scanner
_WAIT: Final = -1  # not decidable from the text seen so far


class SentenceBuffer:
    """Turns a stream of tokens into complete sentences, incrementally.

    ``feed`` returns the sentences a token completed (usually none); ``flush`` returns the rest at the end
    of the stream. Offsets are character offsets in the running total text (all tokens concatenated),
    which ``text()`` returns. The buffer keeps only the undecided tail for splitting, so the cost per token
    does not grow with the length of the answer.
    """

    __slots__ = (
        "_base",
        "_base_at_line_start",
        "_buf",
        "_fast_limit",
        "_fence_len",
        "_in_fence",
        "_length",
        "_max",
        "_parts",
        "_scan",
        "_start",
    )

    def __init__(self, max_sentence_chars: int = 1000) -> None:
        if max_sentence_chars < 1:
            raise ValueError(f"max_sentence_chars must be >= 1, got {max_sentence_chars!r}")
        self._max = max_sentence_chars
        self._parts: list[str] = []  # every token, for text(); collapsed to one string by text()
        self._length = 0  # chars fed so far
        self._buf = ""  # the undecided tail, text[_base:_base + len(_buf)]; may lag behind _length
        self._base = 0
        self._base_at_line_start = True  # only spaces/tabs between the last line break and _base
        self._scan = 0  # absolute: every candidate before it is decided
        self._start: int | None = None  # absolute start of the current sentence, once it has one
        self._in_fence = False
        self._fence_len = 0
        # the hot path's only bound: -1 while a candidate waits for lookahead (the next token must take
        # the slow path), else the length at which a run-on must be cut
        self._fast_limit = max_sentence_chars

    @property
    def length(self) -> int:
        """Number of characters fed so far."""
        return self._length

    def text(self) -> str:
        """The running total text so far (all tokens concatenated; cached until the next token)."""
        parts = self._parts
        if len(parts) > 1:
            joined = "".join(parts)
            parts.clear()
            parts.append(joined)
            return joined
        return parts[0] if parts else ""

    def feed(self, token: str) -> tuple[Sentence, ...]:
        """Add one token; return the sentences it completed (``()`` almost always)."""
        if token.__class__ is not str and not isinstance(token, str):
            raise TypeError(
                f"SentenceBuffer.feed() takes str, not {type(token).__name__}; decode bytes first"
            )
        # hot path: nothing in this token can end a sentence, nothing waits for it, no run-on cut due
        length = self._length + len(token)
        if length <= self._fast_limit and _NO_SPECIAL(token):
            self._parts.append(token)
            self._length = length
            return ()
        if not token:
            return ()
        self._parts.append(token)
        self._length = length
        return self._run(final=False)

    def flush(self) -> tuple[Sentence, ...]:
        """End of stream: decide everything still pending and return the remaining sentences.

        Feeding after ``flush`` starts a new segment: offsets continue, no sentence spans the flush.
        """
        out = self._run(final=True)
        self._in_fence = False
        self._fence_len = 0
        return out

    # --- slow path -------------------------------------------------------------------------------------
    def _pull(self) -> str:
        """Append the tokens not yet in the undecided tail to it and return the tail."""
        need = self._length - self._base - len(self._buf)
        if need:
            parts = self._parts
            i = len(parts)
            got = 0
            while got < need:
                i -= 1
                got += len(parts[i])
            new = parts[i] if i == len(parts) - 1 else "".join(parts[i:])
            if got > need:
                new = new[got - need :]
            self._buf += new
        return self._buf

    def _run(self, final: bool) -> tuple[Sentence, ...]:
        buf = self._pull()
        base = self._base
        n = len(buf)
        limit_len = self._max
        out: list[Sentence] = []
        scan = self._scan - base
        s = None if self._start is None else self._start - base
        waiting = False
        while True:
            if s is None:
                m = _NONSPACE.search(buf, scan)
                if m is None:
                    scan = n
                    break
                s = m.start()
                scan = max(scan, s)
            limit = s + limit_len
            # only candidates whose cut can stay within the limit matter; bounding the search also keeps
            # a huge token linear (no re-search of the whole rest after each forced cut)
            if self._in_fence:
                p = buf.find("\n", scan, limit + 1)
            else:
                m = _CANDIDATE.search(buf, scan, limit + 1)
                p = -1 if m is None else m.start()
            if p < 0:
                if n > limit:
                    scan = self._force_cut(buf, s, base, out)
                    s = None
                    continue
                if final:
                    if s < n:
                        _emit(buf, s, n, base, out)
                    s = None
                    scan = n
                break
            ch = buf[p]
            min_cut = p if ch == "\n" or ch == "`" else p + 1
            if min_cut > limit:
                scan = self._force_cut(buf, s, base, out)
                s = None
                continue
            if self._in_fence:
                cut, nxt = self._decide_fence_close(buf, p, final)
            elif ch == "\n":
                cut, nxt = _decide_line_break(buf, s, p, final)
            elif ch == "`":
                cut, nxt = self._decide_fence_open(buf, s, p, final)
            else:
                cut, nxt = _decide_stop(buf, s, p, final)
            if nxt == _WAIT:
                waiting = True
                scan = p
                break
            if cut < 0:
                scan = nxt
                continue
            if cut - s > limit_len:
                scan = self._force_cut(buf, s, base, out)
                s = None
                continue
            if self._in_fence:
                self._in_fence = False
            _emit(buf, s, cut, base, out)
            s = None
            scan = cut
        self._compact(buf, scan, s)
        self._fast_limit = -1 if waiting else self._base + limit_len
        return tuple(out)

    def _force_cut(self, buf: str, s: int, base: int, out: list[Sentence]) -> int:
        """Cut a run-on at its last whitespace within the limit (hard at the limit if it has none)."""
        window = buf[s : s + self._max]
        m = _LAST_SPACE.match(window)
        cut = s + (m.end() - 1 if m is not None else self._max)
        _emit(buf, s, cut, base, out)
        return cut

    def _compact(self, buf: str, scan: int, s: int | None) -> None:
        """Drop the decided head of the tail; remember whether the tail starts at the start of a line."""
        old_base = self._base
        keep = scan if s is None else s  # everything before is decided and is not the current sentence
        if keep:
            dropped = buf[:keep]
            nl = dropped.rfind("\n")
            if nl >= 0:
                self._base_at_line_start = not dropped[nl + 1 :].strip(" \t")
            else:
                self._base_at_line_start = self._base_at_line_start and not dropped.strip(" \t")
            self._buf = buf[keep:]
            self._base = old_base + keep
        self._scan = old_base + scan
        self._start = None if s is None else old_base + s

    # --- code fences -----------------------------------------------------------------------------------
    def _decide_fence_open(self, buf: str, s: int, p: int, final: bool) -> tuple[int, int]:
        j = p - 1
        while j >= 0 and buf[j] in " \t":
            j -= 1
        at_line_start = buf[j] == "\n" if j >= 0 else self._base_at_line_start
        if not at_line_start:
            return -1, p + 1
        run = _run_length(buf, p, "`", _MAX_SPACE)
        if p + run == len(buf) and run < _MAX_SPACE and not final:
            return -1, _WAIT
        if run < 3:
            return -1, p + run
        if s < p:
            # the text before the fence is a sentence of its own: cut here, the fence is re-read next
            return p, p
        self._in_fence = True
        self._fence_len = run
        return -1, p + run

    def _decide_fence_close(self, buf: str, p: int, final: bool) -> tuple[int, int]:
        n = len(buf)
        j = p + 1
        while j < n and buf[j] in _INDENT and j - p <= _MAX_SPACE:
            j += 1
        if j == n:
            return (-1, _WAIT) if not final else (-1, n)
        run = _run_length(buf, j, "`", _MAX_SPACE)
        if j + run == n and 0 < run < _MAX_SPACE and not final:
            return -1, _WAIT
        if run >= self._fence_len:
            return j + run, 0
        return -1, p + 1


def _emit(buf: str, s: int, cut: int, base: int, out: list[Sentence]) -> None:
    text = buf[s:cut].rstrip()
    out.append(Sentence(text, base + s, base + s + len(text)))


def _run_length(buf: str, i: int, chars: str, cap: int) -> int:
    j = i
    n = len(buf)
    while j < n and j - i < cap and buf[j] in chars:
        j += 1
    return j - i


def _line_kind(buf: str, i: int, final: bool) -> str | None:
    """What the line starting at ``i`` is: ``blank``, ``block`` (list item, heading ...), ``text``."""
    n = len(buf)
    j = i
    while j < n and buf[j] in _INDENT and j - i < _MAX_SPACE:
        j += 1
    if j == n:
        if final:
            return "blank"
        return None if j - i < _MAX_SPACE else "text"
    if buf[j] == "\n":
        return "blank"
    if buf[j] not in "#-*+•0123456789>|`~":
        return "text"
    window = buf[j : j + _LINE_WINDOW]
    nl = window.find("\n")
    if nl >= 0:
        window = window[:nl]
    elif len(window) < _LINE_WINDOW and not final:
        return None
    return "block" if _BLOCK_LINE.match(window) else "text"


def _decide_line_break(buf: str, s: int, p: int, final: bool) -> tuple[int, int]:
    """A line break without a stop before it: paragraph, list or block boundary, or a soft wrap."""
    kind = _line_kind(buf, p + 1, final)
    if kind is None:
        return -1, _WAIT
    if kind != "text":
        return p, 0
    head = buf[s : min(s + _LINE_WINDOW, p)]
    if _BLOCK_LINE.match(head):
        return p, 0
    return -1, p + 1


def _decide_stop(buf: str, s: int, p: int, final: bool) -> tuple[int, int]:
    """A run of stop characters at ``p``: return ``(cut, 0)`` for a boundary, ``(-1, next_scan)`` if not."""
    n = len(buf)
    j = p
    while j < n and j - p < _MAX_RUN and buf[j] in _STOPS:
        j += 1
    if j == n and j - p < _MAX_RUN and not final:
        return -1, _WAIT
    run = buf[p:j]
    q = j
    while q < n and q - j < _MAX_RUN and buf[q] in _CLOSERS:
        q += 1
    if q == n and q - j < _MAX_RUN and not final:
        return -1, _WAIT
    # citation markers glued to the stop belong to the sentence: "... is blue.[1] The ..."
    while q < n and buf[q] == "[":
        m = _CITATION.match(buf, q)
        if m is None:
            if not final and _CITATION_PREFIX.fullmatch(buf, q):
                return -1, _WAIT
            break
        q = m.end()
    if q == n:
        return (q, 0) if final else (-1, _WAIT)
    if not _CJK_STOPS.isdisjoint(run):
        return q, 0
    if not buf[q].isspace():
        return -1, j
    w = q
    while w < n and w - q < _MAX_SPACE and buf[w].isspace():
        if buf[w] == "\n":
            return q, 0
        w += 1
    if w == n and w - q < _MAX_SPACE:
        return (q, 0) if final else (-1, _WAIT)
    if w - q >= _MAX_SPACE:
        return q, 0
    y = buf[w]
    if not _BANG_QUESTION.isdisjoint(run):
        return (-1, j) if y.islower() else (q, 0)
    if len(run) > 1 or run == "…":
        # an ellipsis trails off inside a sentence unless a capitalised word follows
        return (q, 0) if (y.isupper() or (y.isalpha() and not y.islower())) else (-1, j)
    if y.islower():
        return -1, j
    # a single "." before whitespace and a non-lowercase character: look at the word before it
    i = p
    while i > s and p - i < _MAX_WORD and not buf[i - 1].isspace():
        i -= 1
    if p - i >= _MAX_WORD:
        return q, 0
    raw = buf[i:p]
    if i == s and _LIST_NUMBER.fullmatch(raw):
        return -1, j  # "1. First": a list number, not a sentence
    word = raw.lstrip(_OPENERS).lower()
    if word in _NEVER_END:
        return -1, j
    if word in _BEFORE_NUMBER and y.isdigit():
        return -1, j
    if (len(word) == 1 and word.isalpha()) or word in _OPENER_ONLY or _DOTTED.fullmatch(word):
        if y.isdigit():
            return -1, j
        if not y.isalpha():
            return q, 0  # an opening quote or bracket: a new sentence
        e = w
        while e < n and e - w < _MAX_NEXT_WORD and buf[e].isalpha():
            e += 1
        if e == n and e - w < _MAX_NEXT_WORD and not final:
            return -1, _WAIT
        return (q, 0) if buf[w:e] in _SENTENCE_OPENERS else (-1, j)
    return q, 0


def split_sentences(text: str, max_sentence_chars: int = 1000) -> list[Sentence]:
    """Split a whole text at once: the same sentences as feeding it token by token and flushing."""
    buffer = SentenceBuffer(max_sentence_chars)
    out = list(buffer.feed(text))
    out.extend(buffer.flush())
    return out


class CheckpointPolicy:
    """When a checkpoint closes: after ``sentences`` sentences or ``chars`` characters, whichever first.

    The window's size in characters is measured over the running text it covers (first sentence start to
    last sentence end). With ``every=N`` (N > 0) a checkpoint closes at every N-th sentence regardless of
    length; "every sentence" is ``sentences=1``.
    """

    __slots__ = ("_chars", "_count", "_every", "_sentences", "_window_start")

    def __init__(self, sentences: int = 2, chars: int = 200, every: int = 0) -> None:
        if sentences < 1 or chars < 1 or every < 0:
            raise ValueError(
                f"CheckpointPolicy needs sentences >= 1, chars >= 1, every >= 0; "
                f"got sentences={sentences!r}, chars={chars!r}, every={every!r}"
            )
        self._sentences = sentences
        self._chars = chars
        self._every = every
        self._count = 0
        self._window_start = 0

    @property
    def pending(self) -> int:
        """Sentences added since the last checkpoint closed (not covered by any checkpoint yet)."""
        return self._count

    def add(self, sentence: Sentence) -> bool:
        """Count one completed sentence; True when a checkpoint closes after it."""
        if self._count == 0:
            self._window_start = sentence.start
        self._count += 1
        if self._every:
            close = self._count >= self._every
        else:
            close = self._count >= self._sentences or sentence.end - self._window_start >= self._chars
        if close:
            self._count = 0
        return close

    def reset(self) -> None:
        """Forget the open window (e.g. after the guard retracted text)."""
        self._count = 0
