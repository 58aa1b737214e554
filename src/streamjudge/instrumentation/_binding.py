"""One answer stream of one request, shared by whoever produces its tokens and whoever delivers them.

Three places see the answer: the answer node's chat-model stream (``_model``'s tap: the tokens
where they are born, so hold-back, stop and regenerate act on what the node receives), the LangGraph
callbacks (non-streamed answer calls, models the tap cannot wrap) and the HTTP body / WebSocket wrapper
(apps without an instrumented graph). The first one to deliver a token becomes the stream's source and
the others are ignored for that stream, so no token is counted twice; the graph's callbacks and the
model tap run before the app can forward the same token, so when the graph is instrumented it always wins.

The guard session opens at the first token, not earlier: contexts retrieved before it (in a node, or by a
tool of the answer node itself) are known then and the pre-flight gate runs on them before that token is
released. Its span still starts when the answer was asked for (the answer node's start, else the
request's), so time to first token is what users feel. Whoever drives the session applies its events; the
wrapper only delivers the client events, and only when they are switched on (``client_events``).

Bindings are found by trace id: the request span's trace is the graph's trace.
"""

from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import threading
import time
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal

from opentelemetry import context as otel_context

if TYPE_CHECKING:
    from streamjudge.config import Settings
    from streamjudge.judging.guard import GuardSession, RegenerateRequest, StreamEvent, TokenSource

#: ``app``: the application guards this answer itself (its own ``guard()``): the wrappers step aside
Source = Literal["graph", "body", "app"]

_lock = threading.Lock()
_bindings: dict[int, StreamBinding] = {}
# the request's own stream, seen by the graph's callbacks and the model tap that run in its context: two
# concurrent requests that share a client's traceparent share a trace id, never a stream
_current: contextvars.ContextVar[StreamBinding | None] = contextvars.ContextVar("streamjudge_binding",
                                                                                  default=None)
_opening = threading.local()  # the binding whose own session is being opened on this thread


class StreamBinding:
    """The guard session of one answer stream, opened lazily at its first token."""

    __slots__ = ("_attributes", "_lock", "_name", "_parent", "_pending", "client_events", "closed",
                 "ctx_token", "driver", "node_start_ns", "owner", "regenerate", "request_start_ns", "session",
                 "source", "trace_id")

    def __init__(
        self,
        trace_id: int,
        *,
        owner: str,
        parent: otel_context.Context | None = None,
        name: str | None = None,
        attributes: Mapping[str, Any] | None = None,
        request_start_ns: int | None = None,
    ) -> None:
        self.trace_id = trace_id
        self.owner = owner  # "http" / "websocket" / "graph": who finishes the stream
        self.session: GuardSession | None = None
        self.source: Source | None = None
        self.closed = False
        #: when the answer was asked for: the request's start (time to first token counts from here)
        self.request_start_ns = request_start_ns or time.time_ns()
        #: when the first answer node started (the stream span starts here when there is one)
        self.node_start_ns = 0
        #: the model tap currently driving the session (it applies the events; the wrapper only delivers)
        self.driver: object | None = None
        #: set by the model tap while a chat-model stream runs: re-prompts the same model
        self.regenerate: Callable[[RegenerateRequest], TokenSource] | None = None
        self._parent = parent
        self._name = name
        self._attributes = dict(attributes or {})
        self._pending: list[StreamEvent] = []
        self._lock = threading.Lock()
        #: the wrapper delivers the guard's events to the client (a retraction can reach it)
        self.client_events = True
        #: set by :func:`bind`: restores the context's previous stream at :func:`unbind`
        self.ctx_token: contextvars.Token[StreamBinding | None] | None = None

    @property
    def parent(self) -> otel_context.Context | None:
        """The context the stream span starts in (the request's, for a server's stream)."""
        return self._parent

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
                if self.owner == "graph" and self.driver is None and session.has_events:
                    # nobody delivers a graph-only stream's events: apply verdicts now so alerts count
                    self._pending.extend(session.drain())

    @property
    def has_events(self) -> bool:
        """True when guard events wait to be delivered (cheap: checked after every frame)."""
        s = self.session
        return bool(self._pending) or (s is not None and s.has_events and self.driver is None)

    def take_events(self) -> list[StreamEvent]:
        """Guard events ready now, in order (a driving model tap drains the session itself)."""
        with self._lock:
            out, self._pending = self._pending, []
            s = self.session
            if s is not None and s.has_events and self.driver is None:
                out.extend(s.drain())
            return out

    def post(self, events: list[StreamEvent]) -> None:
        """Events the driver applied, for the wrapper to deliver to the client."""
        with self._lock:
            self._pending.extend(events)

    @property
    def stopped(self) -> bool:
        """True after the guard's stop action: the wrapper ends the body."""
        s = self.session
        return s is not None and s.stopped

    # -- lifecycle ---------------------------------------------------------------------------------
    def open(self, source: Source) -> None:
        """An answer node started: ``source`` delivers the tokens; the stream span will start now.

        The session itself opens at the first token (see the module docstring).
        """
        with self._lock:
            if self.closed or self.session is not None:
                return
            if self.source is None:
                self.source = source
            # the latest answer-node run before the first token: an agent's tool-calling turn is not
            # the answer's start (its answer turn is)
            self.node_start_ns = time.time_ns()

    def ensure_session(self) -> GuardSession:
        """The session, opened now if this is the stream's first token."""
        with self._lock:
            return self.session if self.session is not None else self._open()

    def _open(self) -> GuardSession:
        from streamjudge.judging.guard import GuardSession

        token = otel_context.attach(self._parent) if self._parent is not None else None
        _opening.binding = self
        try:
            # only a model tap can re-prompt; without one the guard flags instead (and says so)
            regen = self._regenerate if self.driver is not None else None
            settings, why = self._settings()
            session = GuardSession(name=self._name, attributes=self._attributes or None, regenerate=regen,
                                   start_time_ns=self.node_start_ns or self.request_start_ns,
                                   request_start_ns=self.request_start_ns, settings=settings)
            session.retracts_shown = self.client_events
            if why:
                session.not_enforced(why)
            self._pending.extend(session.start())
        finally:
            _opening.binding = None
            if token is not None:
                otel_context.detach(token)
        self.session = session
        return session

    def _settings(self) -> tuple[Settings | None, str]:
        # a body-fed stream's frames went out before their verdicts: it cannot hold back (it runs
        # stream-first, and says so); nor can it re-prompt a model it does not see
        if self.source != "body":
            return None, ""
        from streamjudge.judging.guard import default_settings

        settings = default_settings()
        if settings is None or settings.mode != "hold_back":
            return None, ""
        return (dataclasses.replace(settings, mode="stream_first"),
                "hold_back: the app's frames carry the tokens and went out before their verdicts")

    def _regenerate(self, req: RegenerateRequest) -> TokenSource:
        regen = self.regenerate
        if regen is None:  # pragma: no cover - the guard only asks while a tap drives it
            raise RuntimeError("no chat-model stream to regenerate from")
        return regen(req)

    def finish(self) -> list[StreamEvent]:
        """End the stream normally: tail checkpoint, final reconciliation; returns the last events."""
        with self._lock:
            out, self._pending = self._pending, []
            s, self.session = self.session, None
            self.closed = True
        if s is not None:
            out.extend(s.finish("stopped" if s.stopped else "completed"))
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
        self.node_start_ns = 0
        self.request_start_ns = time.time_ns()
        return out


def bind(binding: StreamBinding) -> contextvars.Token[StreamBinding | None]:
    """Make ``binding`` the stream of the current context (the request) and of its trace (the latest wins,
    for code that runs outside the request's context). Returns the token for :func:`unbind`."""
    with _lock:
        _bindings[binding.trace_id] = binding
    binding.ctx_token = _current.set(binding)
    return binding.ctx_token


def unbind(binding: StreamBinding) -> None:
    """Forget ``binding`` if it is still the stream of its trace, and as the stream of its context."""
    with _lock:
        if _bindings.get(binding.trace_id) is binding:
            del _bindings[binding.trace_id]
    token, binding.ctx_token = binding.ctx_token, None
    if token is not None:
        with contextlib.suppress(ValueError):  # reset from another context: nothing to undo there
            _current.reset(token)


def lookup(trace_id: int) -> StreamBinding | None:
    """The stream of ``trace_id``: the current request's own when it is of that trace, else the latest one
    bound to it."""
    own = _current.get()
    if own is not None and own.trace_id == trace_id and not own.closed:
        return own
    return _bindings.get(trace_id)


def claim_for_app(trace_id: int, session: object) -> None:
    """A guarded stream started in ``trace_id`` that is not a binding's own: the application guards that
    answer itself, so the body wrapper and the model tap must not judge it a second time."""
    if getattr(_opening, "binding", None) is not None:
        return  # a binding opening its own session (a wrapper's, not the application's guard)
    # the request's own binding first: with two requests sharing a client's traceparent, the trace's latest
    # binding may be the other request's, whose answer would then never be judged (its node not started yet)
    binding = lookup(trace_id)
    if binding is None:
        return
    with binding._lock:
        if binding.session is None and binding.source is None:
            binding.source = "app"


def active_count() -> int:
    """How many streams are bound (tests assert nothing leaks)."""
    return len(_bindings)


def _register() -> None:
    from streamjudge.judging.guard import on_stream_start

    on_stream_start(claim_for_app)


_register()
