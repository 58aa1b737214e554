"""The guard's client events in stream order: a retraction goes out after the frames that carry the text it
withdraws and before the first frame past it.

The wrapper forwards the app's frames and the guard's events on one wire. The events are made where the
tokens are born (the model tap), which may run ahead of the app's frames (a graph queues its messages) or
in step with them (a chain that writes each chunk as it comes), so when an event arrives says nothing about
where it belongs. Char offsets do: a ``retract`` withdraws ``[from, to)`` of the client's text, so it is due
once the frames forwarded carry ``to`` chars, and from then the client's text is ``from`` chars long. The
other events keep their place in the guard's order around it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from streamjudge.judging.guard import StreamEvent


def _bounds(event: StreamEvent) -> tuple[int, int] | None:
    data = event.data
    if event.type != "retract" or not data:
        return None
    start, end = data.get("from"), data.get("to")
    if isinstance(start, int) and isinstance(end, int):
        return start, end
    return None


class EventOrder:
    """Holds the guard's events until their place among the app's frames: call :meth:`add` with the events
    taken from the stream, :meth:`sent` after each frame with the answer chars it carried, and send
    :meth:`due` before a frame that carries chars (``before_frame=True``) and after frames.

    While no frame has carried answer chars, nothing is held after a frame: the events go out in arrival
    order, as they must where the wrapper cannot read the app's tokens (NDJSON, an SSE format it does not
    know). A retraction made before the app's first token frame went out therefore goes after the next frame
    when that frame carries no answer chars (a metadata frame), wherever its text is.
    """

    __slots__ = ("_held", "chars", "counting")

    def __init__(self) -> None:
        #: the length of the client's text: chars of the frames sent, less what retractions withdrew
        self.chars = 0
        #: a frame carried answer chars: offsets are known
        self.counting = False
        self._held: list[StreamEvent] = []

    @property
    def held(self) -> bool:
        """True while events wait for their place."""
        return bool(self._held)

    def add(self, events: list[StreamEvent]) -> None:
        """Events taken from the stream, in the guard's order."""
        self._held.extend(events)

    def sent(self, chars: int) -> None:
        """A frame carrying ``chars`` chars of the answer went to the client."""
        if chars:
            self.chars += chars
            self.counting = True

    def due(self, *, before_frame: bool = False) -> list[StreamEvent]:
        """The held events whose place is now.

        After a frame: every event up to the first retraction whose text has not all gone out yet. Before a
        frame that carries answer chars: the events up to and including the last retraction whose text all
        went out (the frame lies past it); the others wait until after the frame, where they always were.
        """
        held = self._held
        if not held:
            return []
        chars = self.chars
        cut = 0 if before_frame else len(held)
        for i, event in enumerate(held):
            bounds = _bounds(event)
            if bounds is None:
                continue
            # before a frame that carries chars, offsets are known even if it is the first such frame
            if (self.counting or before_frame) and bounds[1] > chars:
                if not before_frame:
                    cut = i
                break
            chars = bounds[0]
            if before_frame:
                cut = i + 1
        out = held[:cut]
        del held[:cut]
        for event in out:
            bounds = _bounds(event)
            if bounds is not None:
                self.chars = bounds[0]
        return out

    def flush(self, events: Sequence[StreamEvent] = ()) -> list[StreamEvent]:
        """The answer ended: every held event and ``events``, in order."""
        out = self._held + list(events)
        self._held = []
        for event in out:
            bounds = _bounds(event)
            if bounds is not None:
                self.chars = bounds[0]
        return out
