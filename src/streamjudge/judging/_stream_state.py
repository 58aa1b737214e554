"""What verdicts do to one stream: a pure state machine, no spans, no threads, no clock.

A stream's closed windows are registered here as checkpoints (with their tokens in hold-back mode); each
checkpoint verdict then comes back as the actions to take, in the order they must happen:

- :class:`Release`: hold-back tokens that may go out now, in window order;
- :class:`Unjudged`: the checkpoint was not judged (its window goes out fail-open in hold-back);
- :class:`Alert`: a sentence failed: warn the reader, with the action that will actually be taken (the
  configured one, or the fallback when it cannot be: ``reason`` says why);
- :class:`Stop`: stop the answer (the session then calls :meth:`StreamState.stop`);
- :class:`Regenerate`: retract ``keep..shown`` and continue after ``keep`` (the accepted prefix).

The session turns them into stream events and span events; this module decides, the session reports.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import NamedTuple

from streamjudge.judging._actions import PassedPrefix, failing_sentences, passed_until
from streamjudge.judging._windows import ReleaseOrder, head_tokens
from streamjudge.results import Score, Verdict


@dataclass(slots=True)
class Checkpoint:
    """One closed window waiting for its verdict: ``start``..``end`` of the stream's text, and in hold-back
    mode the tokens it releases once it passed (None once they went out or were dropped)."""

    index: int
    start: int
    end: int
    tokens: list[str] | None


class Release(NamedTuple):
    """Hold-back: these tokens go out now, in this order."""

    tokens: list[str]


class Unjudged(NamedTuple):
    """The checkpoint's judge gave no verdict (``status`` says why): the stream goes on unjudged there."""

    status: str


class Alert(NamedTuple):
    """``score`` of ``verdict`` failed. ``action`` is what will be done (``flag``, ``stop`` or
    ``regenerate``); ``reason`` is set when it differs from the configured action, and why."""

    verdict: Verdict
    score: Score
    action: str
    reason: str | None = None


class Stop(NamedTuple):
    """Stop the answer here: nothing more of it goes out."""


class Regenerate(NamedTuple):
    """Retract the text from ``keep`` to ``shown`` (what the reader saw past the accepted prefix) and ask
    for a continuation of ``text[:keep]``; ``checkpoint`` is the failing checkpoint's index."""

    keep: int
    shown: int
    checkpoint: int


Action = Release | Unjudged | Alert | Stop | Regenerate


class StreamState:
    """Which sentences of one stream passed or failed, what is released, and what a failure does.

    Inputs: :meth:`open` for every closed window, :meth:`on_verdict` for every checkpoint verdict,
    :meth:`stop` and :meth:`restart` when the stream stops or continues with regenerated text. Outputs: the
    actions :meth:`on_verdict` returns, the counters, and :attr:`verdict`. Each checkpoint is decided
    once: a verdict for a checkpoint that is not open (retracted, or decided already) does nothing.
    """

    __slots__ = (
        "_failed",
        "_good",
        "_judged_any",
        "_order",
        "_verdict",
        "action",
        "alerts",
        "can_regenerate",
        "checkpoints",
        "first_alert_char",
        "hold_back",
        "max_regenerations",
        "regenerations",
    )

    def __init__(self, *, hold_back: bool = False, action: str = "flag", can_regenerate: bool = False,
                 max_regenerations: int = 1) -> None:
        #: tokens go out only once their window passed, windows in order
        self.hold_back = hold_back
        self.action = action
        self.can_regenerate = can_regenerate
        self.max_regenerations = max_regenerations
        #: checkpoints waiting for their verdict, by index (drivers read its truthiness: verdicts in flight)
        self.checkpoints: dict[int, Checkpoint] = {}
        self._order: ReleaseOrder | None = ReleaseOrder() if hold_back else None
        self._good: PassedPrefix | None = None
        self._failed = False  # a sentence failed since the last regeneration: the good prefix ends there
        self._verdict = "unjudged"
        self._judged_any = False
        self.alerts = 0
        self.regenerations = 0
        self.first_alert_char: int | None = None

    # --- windows ------------------------------------------------------------------------------------

    def open(self, index: int, start: int, end: int, tokens: list[str] | None = None) -> None:
        """Window ``index`` (``start``..``end``) waits for its verdict; hold-back holds ``tokens``."""
        self.checkpoints[index] = Checkpoint(index, start, end, tokens if self.hold_back else None)

    def extend(self, index: int, end: int) -> None:
        """The next window was joined to checkpoint ``index``: it now ends at ``end``."""
        cp = self.checkpoints.get(index)
        if cp is not None:
            cp.end = end

    def pass_unjudged(self, index: int) -> list[str]:
        """Checkpoint ``index`` will get no verdict (nothing judges it): its held tokens may go out."""
        cp = self.checkpoints.pop(index, None)
        return self._release(cp) if cp is not None else []

    def release_all(self) -> list[str]:
        """The stream ends: every window still held goes out, fail-open, in order."""
        out: list[str] = []
        for index in sorted(self.checkpoints):
            out.extend(self._release(self.checkpoints[index]))
        return out

    # --- verdicts -----------------------------------------------------------------------------------

    def on_verdict(self, verdict: Verdict, text: Callable[[], str], *, quiet: bool = False) -> list[Action]:
        """What checkpoint ``verdict`` does to the stream, as actions in order. ``text`` gives the stream's
        text (asked for only to regenerate); ``quiet``: failures are recorded as passes (checks skipped)."""
        cp = self.checkpoints.pop(verdict.index, None)
        if cp is None or verdict.status == "superseded":
            # retracted since, or a newer checkpoint covers these sentences (never in hold-back: no
            # coalescing there)
            return []
        if verdict.status != "judged":
            return [Unjudged(verdict.status), *self._released(cp)]
        self._judged_any = True
        if not self._failed:
            self._passed().mark(verdict.start, passed_until(verdict))
        failed = verdict.failed if not quiet else ()
        if not failed:
            if self._verdict == "unjudged":
                self._verdict = "pass"
            return self._released(cp)
        return self._alert(verdict, failed[0], cp, text)

    def _alert(self, verdict: Verdict, score: Score, cp: Checkpoint, text: Callable[[], str]) -> list[Action]:
        self.alerts += 1
        self._failed = True
        if self.first_alert_char is None:
            self.first_alert_char = max(s["end"] for s in failing_sentences(verdict, score))
        action, reason = self.action, None
        if action == "regenerate":
            if not self.can_regenerate:
                action, reason = "flag", "no_regenerate_callback"
            elif self.regenerations >= self.max_regenerations:
                action, reason = "stop", "max_regenerations"
        out: list[Action] = []
        if self.hold_back and action in ("stop", "regenerate"):
            # the sentences before the first failing one passed: they go out, the failing one never does
            out.extend(self._released_head(cp, passed_until(verdict)))
        out.append(Alert(verdict, score, action, reason))
        if action == "stop":
            out.append(Stop())
        elif action == "regenerate":
            self._verdict = "regenerated"
            out.append(self._regeneration(verdict.index, text()))
        else:
            self._verdict = "flagged"
            out.extend(self._released(cp))
        return out

    def _regeneration(self, index: int, text: str) -> Regenerate:
        keep = self._passed().end
        while keep > 0 and text[keep - 1].isspace():
            keep -= 1  # the continuation brings its own separator
        shown = len(text)
        if self.hold_back:
            # nothing past the last released window was shown, and what was not shown is not kept either
            shown = self._release_order().released_end
            keep = min(keep, shown)
        return Regenerate(keep, shown, index)

    # --- the stream's course ------------------------------------------------------------------------

    def stop(self) -> None:
        """The answer stops: nothing held goes out any more."""
        self._verdict = "stopped"
        for cp in self.checkpoints.values():
            cp.tokens = None

    def restart(self, prefix_chars: int, next_index: int) -> None:
        """A regeneration continues after the first ``prefix_chars`` chars; its first window will be
        ``next_index``. Verdicts of the retracted text are ignored from here on."""
        self.regenerations += 1
        self.checkpoints.clear()
        self._good = PassedPrefix(prefix_chars)
        self._failed = False
        if self._order is not None:
            self._order.restart(next_index)

    def close(self) -> None:
        """The stream is over: no checkpoint waits, nothing is held."""
        self.checkpoints.clear()
        self._order = None
        self._good = None

    @property
    def verdict(self) -> str:
        """``unjudged``, ``pass``, ``flagged``, ``stopped`` or ``regenerated`` (the last decision wins)."""
        if self._verdict == "unjudged" and self._judged_any:
            return "pass"
        return self._verdict

    @property
    def released_end(self) -> int | None:
        """Hold-back: how far the reader has seen the answer (None when nothing is held back)."""
        return self._order.released_end if self._order is not None else None

    # --- internals ----------------------------------------------------------------------------------

    def _released(self, cp: Checkpoint) -> list[Action]:
        tokens = self._release(cp)
        return [Release(tokens)] if tokens else []

    def _release(self, cp: Checkpoint) -> list[str]:
        # windows go out in order: a passed window waits for the windows before it
        tokens, cp.tokens = cp.tokens, None
        if tokens is None:
            return []
        return self._release_order().release(cp.index, cp.end, tokens)

    def _released_head(self, cp: Checkpoint, until: int) -> list[Action]:
        # the window's text before ``until`` (a sentence boundary) goes out, in order
        tokens = cp.tokens
        if tokens is None or until <= cp.start:
            return []
        cp.tokens = None
        head = head_tokens(tokens, until - cp.start)
        # up to the sentence's end: a continuation or a fallback brings its own separator
        while head and head[-1][-1:].isspace():
            last = head.pop().rstrip()
            if last:
                head.append(last)
        released = self._release_order().release(cp.index, cp.start + sum(map(len, head)), head)
        return [Release(released)] if released else []

    def _passed(self) -> PassedPrefix:
        good = self._good
        if good is None:
            good = self._good = PassedPrefix()
        return good

    def _release_order(self) -> ReleaseOrder:
        order = self._order
        if order is None:
            order = self._order = ReleaseOrder()
        return order


__all__ = ["Action", "Alert", "Checkpoint", "Regenerate", "Release", "Stop", "StreamState", "Unjudged"]
