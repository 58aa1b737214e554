"""Checkpoint windows: the sentence buffer, the window policy and the tokens of the open window. Pure.

A window is the text between two checkpoints: its new sentences are what a checkpoint judges, and in
hold-back mode its tokens are what is released once it passed. The tokens of the open window are kept as
they came (a list append per token); closing a window cuts them at the window's end, so no checkpoint ever
copies the running total text, and the text judged per checkpoint does not grow with the answer.
"""

from __future__ import annotations

from dataclasses import dataclass

from streamjudge.sentences import CheckpointPolicy, Sentence, SentenceBuffer

#: chars of the answer before a window that travel with it as reference material (pronouns, "the tower")
PREFIX_CHARS = 600

#: chars of one token that are judged: the rest of a larger token passes through unjudged (see
#: :class:`Unjudged`), so one huge token cannot hold the loop for a sentence scan of all of it
MAX_TOKEN_CHARS = 65_536

#: a window joined with the next (:meth:`Window.joined`) stops growing here: joining copies the text, and
#: one judge call should not get a whole long answer from a fast stream behind a slow judge
MAX_JOINED_CHARS = 8_192


class Unjudged(str):
    """The part of a token past :data:`MAX_TOKEN_CHARS`: kept in the windows' tokens, so hold-back
    releases it in order, but never scanned for sentences nor judged (it has no place in the judged text)."""

    __slots__ = ()


@dataclass(frozen=True, slots=True)
class Window:
    """One closed window: ``text == answer[start:end]``; ``prefix`` is the (tail of the) text before it."""

    start: int
    end: int
    text: str
    prefix: str
    tokens: list[str]
    sentences: int

    def joinable(self, later: Window) -> bool:
        """Whether ``later`` starts where this window ends and the two fit in one judge call."""
        return self.end == later.start and len(self.text) + len(later.text) <= MAX_JOINED_CHARS

    def joined(self, later: Window) -> Window:
        """One window covering this one and ``later`` (see :meth:`joinable`)."""
        return Window(self.start, later.end, self.text + later.text, self.prefix, self.tokens + later.tokens,
                      self.sentences + later.sentences)


class Windows:
    """Cuts a token stream into checkpoint windows on sentence boundaries."""

    __slots__ = ("_buf", "_cut_at", "_policy", "_scanned", "_sentences", "_skip_until", "_tail", "_tokens",
                 "_unjudged", "held", "start")

    def __init__(self, sentences: int, chars: int, every: int, prefix: str = "") -> None:
        self._buf = SentenceBuffer()
        self._policy = CheckpointPolicy(sentences, chars, every)
        self._tokens: list[str] = []
        self._cut_at = 0  # chars of _tokens[0] that belong to windows already cut (never copied off)
        self._unjudged: list[tuple[int, str]] | None = None  # (where in the judged text, the piece)
        self._sentences = 0
        self._tail = prefix[-PREFIX_CHARS:]
        # an accepted prefix re-fed after a regeneration: its sentences were judged already
        self._skip_until = len(prefix)
        if prefix:
            self._buf.feed(prefix)
        self.start = len(prefix)
        #: tokens a caller appended instead of feeding them, until :meth:`scan`
        self.held: list[str] = []
        # sentences of each window scan() found, for cut() to take in order; made by the first such window
        # (a list fewer per live stream for the cyclic GC until then)
        self._scanned: list[int] | None = None

    @property
    def length(self) -> int:
        """Chars of the answer so far (held tokens and unjudged pieces included)."""
        held = self.held
        n = self._buf.length + (sum(map(len, held)) if held else 0)
        return n + sum(len(p) for _, p in self._unjudged) if self._unjudged else n

    def text(self) -> str:
        """The whole answer so far, held tokens included (one join; for the end of the stream, not per
        checkpoint)."""
        held = self.held
        return self._buf.text() + "".join(held) if held else self._buf.text()

    def scan(self) -> list[int]:
        """Feed the held tokens to the sentence buffer as one text; the end of every window they
        completed, in order (each to be :meth:`cut`). One scan of the joined text costs less than a feed
        per token, and the sentences are the same however the text is chunked."""
        held = self.held
        if not held:
            return []
        text = held[0] if len(held) == 1 else "".join(held)
        held.clear()
        self._tokens.append(text)
        add = self._policy.add
        ends: list[int] = []
        n = self._sentences  # the open window's sentences counted before
        for s in self._buf.feed(text):
            if s.end <= self._skip_until:
                continue
            n += 1
            if add(s):
                ends.append(s.end)
                if self._scanned is None:
                    self._scanned = []
                self._scanned.append(n)
                n = 0
        self._sentences = n  # the window left open
        return ends

    def feed(self, token: str) -> int:
        """Add one token; returns the end of a window it completed, or -1."""
        self._tokens.append(token)
        done = self._buf.feed(token)
        return self._count(done) if done else -1

    def flush(self) -> int:
        """End of the stream: the end of the last window, or -1 when nothing is left to judge."""
        self._count(self._buf.flush())
        if self._sentences > 0 and self._buf.length > self.start:
            return self._buf.length
        return -1

    def _count(self, sentences: tuple[Sentence, ...]) -> int:
        # windows completed by one token (a huge token, a burst) close as one window at the last end
        add = self._policy.add
        close_at = -1
        for s in sentences:
            if s.end <= self._skip_until:
                continue
            self._sentences += 1
            if add(s):
                close_at = s.end
        return close_at

    def cut(self, end: int) -> Window:
        """Close the open window at ``end``; whatever was fed past ``end`` starts the next one.

        Linear in the window's size: a token that runs past ``end`` is not copied, only the window's part
        of it (many windows cut from one huge token each cost their own size, not the rest of it)."""
        tokens = self._tokens
        need = end - self.start
        out: list[str] = []
        i = 0
        at = self._cut_at
        n = len(tokens)
        while i < n:
            tok = tokens[i]
            if tok.__class__ is Unjudged:
                if need <= 0 and out:
                    break  # it follows the window's last judged char: it goes with the next window
                out.append(tok)
                i += 1
                continue
            if need <= 0:
                break
            have = len(tok) - at
            if have <= need:
                out.append(tok[at:] if at else tok)
                need -= have
                i += 1
                at = 0
            else:
                out.append(tok[at:at + need])
                at += need
                need = 0
        del tokens[:i]
        self._cut_at = at
        text = "".join(t for t in out if t.__class__ is not Unjudged)
        if self._scanned:  # a window scan() found: its own count; the open window keeps the rest
            sentences = self._scanned.pop(0)
        else:
            sentences, self._sentences = self._sentences, 0
        window = Window(self.start, end, text, self._tail, out, sentences)
        self._tail = (self._tail + text[-PREFIX_CHARS:])[-PREFIX_CHARS:]
        self.start = end
        return window

    def pass_unjudged(self, rest: str) -> None:
        """The part of a token past :data:`MAX_TOKEN_CHARS`: it goes with the open window's tokens, and
        into :meth:`delivered`, not into the judged text."""
        self._tokens.append(Unjudged(rest))
        if self._unjudged is None:
            self._unjudged = []
        self._unjudged.append((self._buf.length, rest))

    def delivered(self) -> str:
        """The whole answer as it went out: the judged text with the unjudged pieces in their places."""
        text = self.text()
        if not self._unjudged:
            return text
        parts: list[str] = []
        at = 0
        for pos, piece in self._unjudged:
            parts += (text[at:pos], piece)
            at = pos
        parts.append(text[at:])
        return "".join(parts)

    def take_open_tokens(self) -> list[str]:
        """The tokens of the open window (hold-back releases them, fail-open, at the end)."""
        tokens, self._tokens = self._tokens, []
        if tokens and self._cut_at:
            tokens[0] = tokens[0][self._cut_at:]
        self._cut_at = 0
        return tokens


class ReleaseOrder:
    """Hold-back: windows go out in order; a window that passed waits for the windows before it."""

    __slots__ = ("_next", "_ready", "released_end")

    def __init__(self) -> None:
        self._ready: dict[int, tuple[int, list[str]]] = {}
        self._next = 0
        self.released_end = 0  # the reader has seen the answer up to here

    def release(self, index: int, end: int, tokens: list[str]) -> list[str]:
        """Window ``index`` (ending at ``end``) may go out: the tokens that can go out now, in order."""
        ready = self._ready
        ready[index] = (end, tokens)
        out: list[str] = []
        while self._next in ready:
            end, toks = ready.pop(self._next)
            self._next += 1
            self.released_end = end
            out.extend(toks)
        return out

    def restart(self, next_index: int) -> None:
        """After a regeneration: the retracted windows never go out; the next one is ``next_index``."""
        self._ready.clear()
        self._next = next_index


def head_tokens(tokens: list[str], chars: int) -> list[str]:
    """The first ``chars`` chars of ``tokens``, as tokens (the one that crosses the boundary is cut)."""
    out: list[str] = []
    for tok in tokens:
        if chars <= 0:
            break
        if len(tok) > chars:
            tok = tok[:chars]
        out.append(tok)
        chars -= len(tok)
    return out


_NEVER_HELD: list[str] = []


class Transcript(Windows):
    """The answer of a stream that is not judged (sampled out): tokens kept for the answer span, no
    sentence splitting and no windows, so such a stream costs a list append per token."""

    __slots__ = ("_all",)

    def __init__(self) -> None:  # no sentence buffer, no policy
        self._all: list[str] = []
        self.start = 0
        # never holds tokens back (the session holds only a judged stream's), so nothing is ever scanned:
        # one empty list, never appended to, serves every sampled-out stream (a list fewer each for the GC)
        self.held = _NEVER_HELD

    @property
    def length(self) -> int:
        # asked for once, at the end: a running count would be work on every token
        return sum(map(len, self._all))

    @property
    def sink(self) -> list[str]:
        """The list the tokens are kept in: a driver may append a token's text to it instead of
        calling :meth:`feed` (the same effect, without a call per token)."""
        return self._all

    def delivered(self) -> str:
        return self.text()

    def text(self) -> str:
        if len(self._all) > 1:
            # in place: the list stays the one :attr:`sink` handed out
            self._all[:] = ["".join(self._all)]
        return self._all[0] if self._all else ""

    def feed(self, token: str) -> int:
        self._all.append(token)
        return -1

    def flush(self) -> int:
        return -1

    def take_open_tokens(self) -> list[str]:
        return []


class Ended(Transcript):
    """The windows of a stream that ended: a driver that still feeds it (a model the client left, whose
    stream runs on) keeps nothing and closes no window, so nothing of it is judged or kept any more."""

    __slots__ = ()

    def feed(self, token: str) -> int:
        return -1
