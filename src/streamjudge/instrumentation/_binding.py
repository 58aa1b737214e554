"""One answer stream of one request, shared by whoever produces its tokens and whoever delivers them.

Two places see the answer: the LangGraph callbacks (exact: only the answer nodes' LLM tokens) and the HTTP
body / WebSocket wrapper (what the client receives). The first one to deliver a token becomes the stream's
source and the other is ignored for that stream, so no token is counted twice; LangGraph callbacks fire
before the app can forward the same token, so when the graph is instrumented it always wins. The wrapper
owns delivery: it injects the guard's events (warning / retract / stop) between the app's frames.

Bindings are found by trace id: the request span's trace is the graph's trace.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from streamjudge.judging.guard import GuardSession, StreamEvent

Source = Literal["graph", "body"]

_lock = threading.Lock()
_bindings: dict[int, StreamBinding] = {}


class StreamBinding:
    """The guard session of one answer stream, opened lazily at its first token."""

    __slots__ = ("_attributes", "_lock", "_name", "_parent", "_pending", "closed", "owner", "session",
                 "source", "trace_id")

    def __init__(
        self,
        trace_id: int,
        *,
        owner: str,
        parent: otel_context.Context | None = None,
        name: str | None = None,
        attributes: Mapping[str, Any] | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.owner = owner  # "http" / "websocket" / "graph": who finishes the stream
        self.session: GuardSession | None = None
        self.source: Source | None = None
        self.closed = False
        self._parent = parent
        self._name = name
        self._attributes = dict(attributes or {})
        self._pending: list[StreamEvent] = []
        self._lock = threading.Lock()

    # -- hot path --------------------------------------------------------------------------------
    def feed(self, token: str, source: Source) -> None:
        """Record one token of the answer (ignored unless ``source`` is this stream's source)."""
        if self.source is not source:
            if self.source is not None or self.closed:
                return
            self.source = source
        with self._lock:
            session = self.session
            if session is None:
                if self.closed:
                    return  # finished or aborted (client gone): a late token must not open a second stream
                session = self._open()
            if not session.stopped:
                session.accept(token)
                if self.owner == "graph" and session.has_events:
                    # nobody delivers a graph-only stream's events: apply verdicts now so alerts count
                    self._pending.extend(session.drain())

    @property
    def has_events(self) -> bool:
        """True when guard events wait to be delivered (cheap: checked after every frame)."""
        s = self.session
        return bool(self._pending) or (s is not None and s.has_events)

    def take_events(self) -> list[StreamEvent]:
        """Guard events ready now, in order."""
        with self._lock:
            out, self._pending = self._pending, []
            s = self.session
            if s is not None and s.has_events:
                out.extend(s.drain())
            return out

    @property
    def stopped(self) -> bool:
        """True after the guard's stop action: the wrapper ends the body."""
        s = self.session
        return s is not None and s.stopped

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self, source: Source) -> None:
        """Open the stream now (an answer node started) and make ``source`` its token source.

        Opening before the first token lets the pre-flight gate run on the contexts first and makes time
        to first token mean what users feel: from the start of generation to the first token.
        """
        with self._lock:
            if self.closed or self.session is not None:
                return
            if self.source is None:
                self.source = source
            self._open()

    def _open(self) -> GuardSession:
        from streamjudge.judging.guard import GuardSession

        token = otel_context.attach(self._parent) if self._parent is not None else None
        try:
            session = GuardSession(name=self._name, attributes=self._attributes or None)
            self._pending.extend(session.start())
        finally:
            if token is not None:
                otel_context.detach(token)
        self.session = session
        return session

    def finish(self) -> list[StreamEvent]:
        """End the stream normally: tail checkpoint, final reconciliation; returns the last events."""
        with self._lock:
            out, self._pending = self._pending, []
            s, self.session = self.session, None
            self.closed = True
        if s is not None:
            out.extend(s.finish())
        return out

    def abort(self, outcome: str = "disconnected") -> None:
        """End the stream because the client went away or the app failed; queued judge work is dropped."""
        with self._lock:
            s, self.session = self.session, None
            self._pending = []
            self.closed = True
        if s is not None:
            s.abort(outcome=outcome)

    def reset(self) -> list[StreamEvent]:
        """Finish the current answer and accept a new one (a WebSocket carries many answers)."""
        out = self.finish()
        self.closed = False
        self.source = None
        return out


def bind(binding: StreamBinding) -> None:
    """Make ``binding`` the stream of its trace (the latest wins)."""
    with _lock:
        _bindings[binding.trace_id] = binding


def unbind(binding: StreamBinding) -> None:
    """Forget ``binding`` if it is still the stream of its trace."""
    with _lock:
        if _bindings.get(binding.trace_id) is binding:
            del _bindings[binding.trace_id]


def lookup(trace_id: int) -> StreamBinding | None:
    """The stream bound to ``trace_id``, if any."""
    return _bindings.get(trace_id)


def active_count() -> int:
    """How many streams are bound (tests assert nothing leaks)."""
    return len(_bindings)
