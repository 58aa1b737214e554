"""What a live stream needs from the process: settings, a tracer, per-trace inputs, the judging service.

The runtime provides it (and registers itself as the default here when it is imported), so the guard never
imports the runtime: judging depends on this small protocol, not on how the process was wired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol

from opentelemetry import trace

if TYPE_CHECKING:
    from streamjudge._context import ContextStore
    from streamjudge.config import Settings
    from streamjudge.judging.service import JudgingService


class StreamBackend(Protocol):
    """The parts of a runtime a guarded stream uses."""

    settings: Settings
    tracer: trace.Tracer
    contexts: ContextStore
    service: JudgingService


_default: Callable[[], StreamBackend] | None = None
_listeners: list[Callable[[int, object], None]] = []


def on_stream_start(listener: Callable[[int, object], None]) -> None:
    """Call ``listener(trace_id, session)`` whenever a guarded stream starts (instrumentation uses it so an
    app's own ``guard()`` and the zero-code wrappers never judge one answer twice)."""
    if listener not in _listeners:
        _listeners.append(listener)


def stream_started(trace_id: int, session: object) -> None:
    """Tell the listeners a stream of ``trace_id`` started."""
    for listener in tuple(_listeners):
        listener(trace_id, session)


def set_default(factory: Callable[[], StreamBackend]) -> None:
    """Register how to get the process's backend when a stream is given none (the runtime does this)."""
    global _default
    _default = factory


def default_backend() -> StreamBackend:
    """The process's backend (configured with defaults on first use)."""
    if _default is None:
        raise RuntimeError("streamjudge is not configured: import streamjudge and call configure()")
    return _default()
